//! A tunnel owns what it holds: its holds live exactly as long as it does,
//! and dropping them gives back the connection's permit and drain place,
//! the user's lease, the exit's in-flight count and the revocation
//! registration. Built by hand: no socket, no store.

use super::*;
use crate::open_tunnels::PolicyWatch;
use crate::pipeline::test_support::{admission, peer, user};
use crate::request::{Ingress, UserLimits};
use crate::select::test_support::health;
use crate::usage::Meter;
use std::net::IpAddr;
use tokio::sync::{mpsc, Semaphore};

/// A connection's ticket holding a permit of `permits` and a drain place
/// on the returned channel, registered as a tunnel through `exit`.
fn registered_connection(
    permits: &Arc<Semaphore>,
    open_tunnels: &Arc<OpenTunnels>,
    exit: Uuid,
) -> (ConnectionTicket, Registration, mpsc::Receiver<()>) {
    let (alive, drained) = mpsc::channel::<()>(1);
    let ticket = ConnectionTicket::for_tests(peer(), permits.clone(), alive).unwrap();
    let registration = open_tunnels.register(
        "alice",
        [7; 32],
        exit,
        None,
        PolicyWatch::Nothing,
        None,
        ticket.cut().clone(),
    );
    (ticket, registration, drained)
}

#[tokio::test]
async fn dropping_a_tunnels_holds_gives_back_everything_it_held() {
    let permits = Arc::new(Semaphore::new(1));
    let open_tunnels = Arc::new(OpenTunnels::default());
    let (user_id, account_id, exit_id) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let (ticket, registration, mut drained) =
        registered_connection(&permits, &open_tunnels, exit_id);
    assert_eq!(
        permits.available_permits(),
        0,
        "the ticket holds the permit"
    );

    let admission = admission(1);
    let lease = admission
        .admit(user_id, account_id, UserLimits::default())
        .await
        .unwrap();
    assert!(
        admission
            .admit(user_id, account_id, UserLimits::default())
            .await
            .is_err(),
        "the user's one place is taken"
    );

    let health = health();
    let in_flight = health.start_tunnel(exit_id);
    assert_eq!(health.exit(exit_id).in_flight(), 1);

    let meter = Arc::new(Meter::new(
        account_id,
        user_id,
        exit_id,
        None,
        None,
        Vec::new(),
    ));
    let holds = Holds {
        credential_digest: [7; 32],
        network: None,
        log: AccessLog {
            id: Uuid::new_v4(),
            ingress: Ingress::Connect,
            account_id,
            user_id,
            username: "alice".to_owned(),
            exit_id,
            egress_ip: "203.0.113.9".parse::<IpAddr>().unwrap(),
            target: "example.test:443".to_owned(),
            peer: peer(),
            started: std::time::Instant::now(),
            setup_ms: 1.0,
            meter,
            end: None,
            refused: None,
            attempt: None,
        },
        _lease: lease,
        _in_flight: in_flight,
        _registration: registration,
        ticket,
        record: Arc::new(user("alice")),
        site: None,
    };
    assert_eq!(holds.user_id(), user_id);
    assert_eq!(holds.account_id(), account_id);

    drop(holds);
    assert_eq!(permits.available_permits(), 1, "the connection's permit");
    assert!(
        drained.recv().await.is_none(),
        "the drain place: shutdown no longer waits for it"
    );
    assert_eq!(health.exit(exit_id).in_flight(), 0, "the exit's count");
    assert_eq!(
        open_tunnels.cut_exit(exit_id),
        0,
        "nothing left registered to cut"
    );
    assert!(
        admission
            .admit(user_id, account_id, UserLimits::default())
            .await
            .is_ok(),
        "the user's place"
    );
}

#[tokio::test]
async fn a_cut_reaches_the_tunnel_through_its_registration() {
    let open_tunnels = Arc::new(OpenTunnels::default());
    let exit_id = Uuid::new_v4();
    let (ticket, _registration, _drained) =
        registered_connection(&Arc::new(Semaphore::new(1)), &open_tunnels, exit_id);
    assert!(!ticket.cut().is_cancelled());
    assert_eq!(open_tunnels.cut_exit(exit_id), 1);
    assert!(
        ticket.cut().is_cancelled(),
        "what is open is cut, not only what comes next"
    );
}
