//! Tests of the tracked meters: what one flush takes from a meter, held
//! or not, finished or not, and on a stopping instance.

use super::meter::Meter;
use super::meters::{Tracked, HELD_AFTER_DONE_FLUSHES};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uuid::Uuid;

fn tracked() -> Tracked {
    Tracked::new(Arc::new(Meter::new(
        Uuid::nil(),
        Uuid::nil(),
        Uuid::nil(),
        None,
        None,
        Vec::new(),
    )))
}

/// Moves `up` and `down` bytes through the meter.
fn moves(t: &Tracked, up: usize, down: usize) {
    assert!(t.meter.charge_datagram(true, up));
    assert!(t.meter.charge_datagram(false, down));
}

fn end(t: &Tracked) {
    t.meter.done.store(true, Ordering::Release);
}

#[test]
fn a_meter_never_held_is_billed_as_its_bytes_move() {
    let mut t = tracked();
    moves(&t, 3, 4);
    let taken = t.take(false);
    assert_eq!(taken.moved, (3, 4));
    assert_eq!(taken.billed, Some(((3, 4), true)));
    assert!(taken.keep);
    end(&t);
    let taken = t.take(false);
    assert_eq!(taken.billed, Some(((0, 0), true)));
    assert!(
        !taken.keep,
        "a finished meter is flushed once more and dropped"
    );
}

#[test]
fn a_held_meter_counts_for_quotas_at_once_and_for_the_ledger_once_settled() {
    let mut t = tracked();
    t.meter.hold_billing();
    moves(&t, 100, 1_000);
    let taken = t.take(false);
    assert_eq!(taken.moved, (100, 1_000), "quotas count what moved");
    assert_eq!(taken.billed, None, "the ledger waits");
    assert!(taken.keep);
    moves(&t, 0, 500);
    t.meter.settle_billing(false);
    let taken = t.take(false);
    assert_eq!(taken.moved, (0, 500));
    assert_eq!(
        taken.billed,
        Some(((100, 1_500), false)),
        "every byte, as not billable"
    );
    end(&t);
    let taken = t.take(false);
    assert_eq!(taken.billed, Some(((0, 0), false)));
    assert!(!taken.keep);
}

#[test]
fn a_meter_that_ends_still_held_waits_a_few_flushes_then_is_billed() {
    let mut t = tracked();
    t.meter.hold_billing();
    moves(&t, 10, 0);
    end(&t);
    for _ in 0..HELD_AFTER_DONE_FLUSHES {
        let taken = t.take(false);
        assert!(taken.keep && taken.billed.is_none(), "{taken:?}");
    }
    let taken = t.take(false);
    assert_eq!(taken.billed, Some(((10, 0), true)));
    assert!(!taken.keep);

    // Settled during the wait: as settled.
    let mut t = tracked();
    t.meter.hold_billing();
    moves(&t, 10, 0);
    end(&t);
    assert!(t.take(false).keep);
    t.meter.settle_billing(false);
    let taken = t.take(false);
    assert_eq!(taken.billed, Some(((10, 0), false)));
    assert!(!taken.keep);

    // A stopping instance bills what is still held.
    let mut t = tracked();
    t.meter.hold_billing();
    moves(&t, 7, 0);
    let taken = t.take(true);
    assert_eq!(taken.billed, Some(((7, 0), true)));
}
