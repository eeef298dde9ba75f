//! Tests of the per-source pre-auth bound ([`super::PreAuth`]): slots,
//! the waiting queue, deadlines and the known-source allowance.

use super::pre_auth::{Admission, PreAuth, PreAuthLimits, PreAuthSlot};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn limits() -> PreAuthLimits {
    PreAuthLimits {
        per_source: 2,
        per_known_source: 4,
        waiting_per_source: 3,
        total: 100,
        waiting_total: 100,
        known_for: Duration::from_secs(300),
        timeout: Duration::from_secs(10),
    }
}

fn peer(last: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, last], 40_000))
}

/// A connection from `from` accepted now, with its own cut token.
fn admit(pre_auth: &Arc<PreAuth>, from: SocketAddr) -> (Admission, CancellationToken) {
    let cut = CancellationToken::new();
    (pre_auth.admit(from, &cut, Instant::now()), cut)
}

fn slot(pre_auth: &Arc<PreAuth>, from: SocketAddr) -> PreAuthSlot {
    match admit(pre_auth, from).0 {
        Admission::Slot(slot) => slot,
        Admission::Wait(_) => panic!("waits, expected a slot"),
        Admission::Refused(why) => panic!("refused ({why}), expected a slot"),
    }
}

/// A waiter of `from` on a task of its own, queued before this returns.
async fn queue_waiter(
    pre_auth: &Arc<PreAuth>,
    from: SocketAddr,
) -> (
    tokio::task::JoinHandle<Option<PreAuthSlot>>,
    CancellationToken,
) {
    let (admission, cut) = admit(pre_auth, from);
    let Admission::Wait(waiting) = admission else {
        panic!("expected to wait");
    };
    let task = {
        let (cut, closing) = (cut.clone(), CancellationToken::new());
        tokio::spawn(async move { waiting.slot(&cut, &closing).await })
    };
    // Let it take its place in the queue: freed slots go in order.
    tokio::task::yield_now().await;
    (task, cut)
}

#[tokio::test(start_paused = true)]
async fn past_the_bound_connections_wait_for_a_slot_instead_of_being_closed() {
    let pre_auth = PreAuth::new(limits());
    let from = peer(1);
    let first = slot(&pre_auth, from);
    let _second = slot(&pre_auth, from);
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(queue_waiter(&pre_auth, from).await.0);
    }
    assert_eq!((pre_auth.held(), pre_auth.waiting()), (2, 3));
    // Waiting is bounded too: the next one is closed at once.
    assert!(matches!(
        admit(&pre_auth, from).0,
        Admission::Refused("unauthenticated_per_source")
    ));
    // Another address is not held up.
    let _other = slot(&pre_auth, peer(2));
    // A slot freed goes to the first waiter, and only to it.
    drop(first);
    let seated = waiters.remove(0).await.unwrap();
    assert!(seated.is_some(), "the first waiter takes the freed slot");
    tokio::task::yield_now().await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    assert_eq!((pre_auth.held(), pre_auth.waiting()), (3, 2));
    // Nor does a newcomer jump the queue.
    assert!(matches!(admit(&pre_auth, from).0, Admission::Wait(_)));
    drop(seated);
    assert!(waiters.remove(0).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_at_its_deadline_from_accept_and_leaves_nothing_behind() {
    let pre_auth = PreAuth::new(limits());
    let from = peer(1);
    let started = Instant::now();
    let held = [slot(&pre_auth, from), slot(&pre_auth, from)];
    let (waiter, _cut) = queue_waiter(&pre_auth, from).await;
    assert!(waiter.await.unwrap().is_none(), "no slot freed in time");
    assert!(started.elapsed() >= limits().timeout);
    assert_eq!(pre_auth.waiting(), 0);
    drop(held);
    let state = pre_auth.state.lock().unwrap();
    assert!(state.per_source.is_empty() && state.pending.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_cut_gives_up_its_place() {
    let pre_auth = PreAuth::new(limits());
    let from = peer(1);
    let _held = [slot(&pre_auth, from), slot(&pre_auth, from)];
    let (waiter, cut) = queue_waiter(&pre_auth, from).await;
    cut.cancel();
    assert!(waiter.await.unwrap().is_none());
    assert_eq!(pre_auth.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_seated_waiter_keeps_the_deadline_counted_from_its_accept() {
    let pre_auth = PreAuth::new(limits());
    let stop = CancellationToken::new();
    tokio::spawn(pre_auth.clone().run_deadlines(stop.clone()));
    let from = peer(1);
    let first = slot(&pre_auth, from);
    let _second = slot(&pre_auth, from);
    let (waiter, cut) = queue_waiter(&pre_auth, from).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    drop(first);
    let _seated = waiter.await.unwrap().expect("a slot freed in time");
    assert!(!cut.is_cancelled());
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert!(
        cut.is_cancelled(),
        "cut 10 s after its accept, not after it got its slot"
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_address_that_logged_in_lately_gets_the_larger_allowance_for_a_while() {
    // A deadline past everything here: only the allowance is at stake.
    let pre_auth = PreAuth::new(PreAuthLimits {
        timeout: Duration::from_secs(3_600),
        ..limits()
    });
    let from = peer(1);
    let first = slot(&pre_auth, from);
    let _second = slot(&pre_auth, from);
    let (waiter, _cut) = queue_waiter(&pre_auth, from).await;
    // The first connection logs in (what `ConnectionTicket::authenticated`
    // does): the waiter is let in, and two more straight away.
    pre_auth.logged_in(first.source);
    drop(first);
    let _seated = waiter.await.unwrap().expect("let in at the login");
    let _third = slot(&pre_auth, from);
    let fourth = slot(&pre_auth, from);
    let (late, _cut) = queue_waiter(&pre_auth, from).await;
    assert_eq!(pre_auth.held(), 4);
    // Past `known_for` without a login, freed slots are taken back to
    // the plain allowance before a waiter gets one.
    tokio::time::advance(Duration::from_secs(301)).await;
    drop(fourth);
    tokio::task::yield_now().await;
    assert!(!late.is_finished(), "4 → 3 slots: still above the plain 2");
    assert_eq!(pre_auth.waiting(), 1);
    // An idle permit is taken back by the sweep's settling.
    let known = peer(2);
    let one = slot(&pre_auth, known);
    pre_auth.logged_in(one.source);
    pre_auth.settle(Instant::now(), false);
    let _more = [slot(&pre_auth, known), slot(&pre_auth, known)];
    tokio::time::advance(Duration::from_secs(301)).await;
    pre_auth.settle(Instant::now(), true);
    assert!(matches!(admit(&pre_auth, known).0, Admission::Wait(_)));
    assert!(pre_auth.state.lock().unwrap().logins.is_empty(), "pruned");
}

#[tokio::test(start_paused = true)]
async fn waiting_from_every_address_together_is_bounded() {
    let pre_auth = PreAuth::new(PreAuthLimits {
        per_source: 1,
        waiting_total: 2,
        ..limits()
    });
    let _a = slot(&pre_auth, peer(1));
    let _waiting_a = [
        queue_waiter(&pre_auth, peer(1)).await,
        queue_waiter(&pre_auth, peer(1)).await,
    ];
    let _b = slot(&pre_auth, peer(2));
    assert!(matches!(
        admit(&pre_auth, peer(2)).0,
        Admission::Refused("unauthenticated_total")
    ));
}
