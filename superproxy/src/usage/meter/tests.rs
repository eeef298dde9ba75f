//! Tests of the hot path: metered streams count exactly what crosses them,
//! know which side ended first, never move more than their shared budget;
//! billing holds; two-quota reservations.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn meter(quotas: Vec<QuotaBinding>) -> Arc<Meter> {
    Arc::new(Meter::new(
        Uuid::nil(),
        Uuid::nil(),
        Uuid::nil(),
        None,
        None,
        quotas,
    ))
}

#[tokio::test]
async fn metered_streams_count_exactly_what_crosses_them() {
    let (near, mut far) = tokio::io::duplex(1024);
    let meter = meter(Vec::new());
    let mut metered = Metered::new(near, MeterHandle(meter.clone()));
    let writer = tokio::spawn(async move {
        metered.write_all(&vec![1u8; 100_000]).await.unwrap();
        let mut back = vec![0u8; 3_000];
        metered.read_exact(&mut back).await.unwrap();
        drop(metered);
    });
    let mut got = vec![0u8; 100_000];
    far.read_exact(&mut got).await.unwrap();
    far.write_all(&[2u8; 3_000]).await.unwrap();
    writer.await.unwrap();
    assert_eq!((meter.up(), meter.down()), (100_000, 3_000));
    assert!(
        meter.done.load(Ordering::Acquire),
        "dropping the stream finishes the meter"
    );
}

#[tokio::test]
async fn the_meter_knows_which_side_ended_first() {
    // The far end (the exit) closes first.
    let (near, far) = tokio::io::duplex(64);
    let m = meter(Vec::new());
    let mut metered = Metered::new(near, MeterHandle(m.clone()));
    assert_eq!(m.first_end(), None);
    drop(far);
    let mut buf = [0u8; 8];
    assert_eq!(metered.read(&mut buf).await.unwrap(), 0);
    assert_eq!(m.first_end(), Some(EndSide::Exit));
    let _ = metered.shutdown().await;
    assert_eq!(m.first_end(), Some(EndSide::Exit), "the first stays");
    // The client finishes sending first.
    let (near, mut far) = tokio::io::duplex(64);
    let m = meter(Vec::new());
    let mut metered = Metered::new(near, MeterHandle(m.clone()));
    metered.shutdown().await.unwrap();
    assert_eq!(m.first_end(), Some(EndSide::Client));
    let mut rest = Vec::new();
    far.read_to_end(&mut rest).await.unwrap();
    drop(far);
    assert_eq!(metered.read(&mut buf).await.unwrap(), 0);
    assert_eq!(m.first_end(), Some(EndSide::Client));
}

#[tokio::test]
async fn parallel_streams_never_move_more_than_their_shared_budget() {
    let budget = Arc::new(Budget::new(300_000));
    let binding = QuotaBinding {
        owner: QuotaOwner::User(Uuid::nil()),
        limit: 300_000,
        period: QuotaPeriod::Daily,
        budget: budget.clone(),
    };
    let mut tasks = Vec::new();
    let mut meters = Vec::new();
    for _ in 0..40 {
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        let meter = meter(vec![binding.clone()]);
        meters.push(meter.clone());
        let mut metered = Metered::new(near, MeterHandle(meter));
        tasks.push(tokio::spawn(async move {
            // The far end sends far more than the quota; the metered side
            // reads until it is cut.
            let feeder = tokio::spawn(async move {
                let _ = far.write_all(&vec![7u8; 1_000_000]).await;
            });
            let mut sink = vec![0u8; 256 * 1024];
            while let Ok(n) = metered.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
            feeder.abort();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let moved: u64 = meters.iter().map(|m| m.down()).sum();
    assert_eq!(
        moved, 300_000,
        "exactly the budget, whatever the parallelism"
    );
    assert_eq!(budget.left(), 0);
    assert_eq!(budget.spent(), 300_000);
}

#[test]
fn billing_is_held_until_settled_and_settled_once() {
    let m = meter(Vec::new());
    assert!(m.billable() && !m.billing_held(), "billed by default");
    m.settle_billing(false);
    assert!(m.billable(), "only a held meter can be unbilled");
    m.hold_billing();
    assert!(m.billing_held() && m.billable(), "held counts as billed");
    m.settle_billing(false);
    assert!(!m.billable() && !m.billing_held());
    m.hold_billing();
    m.settle_billing(true);
    assert!(!m.billable(), "settled stays settled");
    let m = meter(Vec::new());
    m.hold_billing();
    m.settle_billing(true);
    assert!(m.billable() && !m.billing_held());
    m.hold_billing();
    assert!(!m.billing_held(), "a settled meter is not held again");
}

#[test]
fn a_two_quota_reservation_takes_the_smaller_grant_from_both() {
    let user = Arc::new(Budget::new(1_000));
    let account = Arc::new(Budget::new(100));
    let bind = |owner, budget: &Arc<Budget>| QuotaBinding {
        owner,
        limit: 0,
        period: QuotaPeriod::Monthly,
        budget: budget.clone(),
    };
    let m = meter(vec![
        bind(QuotaOwner::User(Uuid::nil()), &user),
        bind(QuotaOwner::Account(Uuid::nil()), &account),
    ]);
    assert_eq!(m.reserve(500), 100);
    assert_eq!((user.left(), account.left()), (900, 0));
    assert_eq!(m.reserve(10), 0);
    assert_eq!(user.left(), 900, "a refused reservation takes nothing");
    m.release(40);
    assert_eq!((user.left(), account.left()), (940, 40));
}
