use super::*;
use crate::select::sync::Changed;

const GRACE: Duration = Duration::from_secs(600);

fn full(live: &[Uuid], control_present: bool) -> Read {
    Read::Full {
        now_ms: 0,
        cursor: "0-0".into(),
        live: live.iter().copied().collect(),
        agent_draining: HashSet::new(),
        records: HashMap::new(),
        control_present,
    }
}

fn delta(expired: &[Uuid], control_present: bool) -> Read {
    Read::Delta {
        now_ms: 0,
        cursor: "1-0".into(),
        expired: expired.to_vec(),
        changed: Vec::new(),
        control_present,
    }
}

#[test]
fn the_grace_holds_only_exits_live_when_the_control_plane_fell_silent() {
    let (was_live, lapsed_before) = (Uuid::new_v4(), Uuid::new_v4());
    let mut known = Known::default();
    known.apply(full(&[was_live, lapsed_before], true));
    // Its agent stopped beating while the control plane took heartbeats.
    known.apply(delta(&[lapsed_before], true));
    // The control plane falls silent; the other exit lapses after.
    assert!(known.apply(delta(&[], false)), "the silence is news");
    known.apply(delta(&[was_live], false));
    let now = Instant::now();
    assert!(known.held_by_link(&was_live, now, GRACE));
    assert!(
        !known.held_by_link(&lapsed_before, now, GRACE),
        "an exit out before the outage stays out"
    );
    assert!(
        !known.held_by_link(&was_live, now + GRACE, GRACE),
        "not past the grace"
    );
    // The control plane is back: heartbeats alone decide again.
    assert!(known.apply(delta(&[], true)));
    assert!(!known.held_by_link(&was_live, Instant::now(), GRACE));
    // Silent once more: only what was live then counts, and nothing is.
    known.apply(delta(&[], false));
    assert!(!known.held_by_link(&was_live, Instant::now(), GRACE));
}

#[test]
fn liveness_lapsed_while_the_store_was_away_is_held_after_it_returns() {
    // A Redis outage (or a Sentinel failover): no heartbeat could land,
    // so exits that lapse in the reads right after it are not at fault.
    let (lapsed_in_outage, lapsed_long_before) = (Uuid::new_v4(), Uuid::new_v4());
    let mut known = Known::default();
    known.apply(full(&[lapsed_in_outage, lapsed_long_before], true));
    known.apply(delta(&[lapsed_long_before], true));
    known.degraded = true; // reads failed for a while
    known.apply(delta(&[lapsed_in_outage], true));
    let now = Instant::now();
    assert!(known.held_by_link(&lapsed_in_outage, now, GRACE));
    assert!(
        !known.held_by_link(&lapsed_long_before, now, GRACE),
        "an exit out before the outage stays out"
    );
    assert!(
        !known.held_by_link(&lapsed_in_outage, now + RESET_HOLD, GRACE),
        "not past the hold"
    );
    // Its agent beats again: its own news from then on.
    known.apply(Read::Delta {
        now_ms: 0,
        cursor: "2-0".into(),
        expired: Vec::new(),
        changed: vec![Changed {
            id: lapsed_in_outage,
            live: true,
            agent_draining: false,
            record: None,
        }],
        control_present: true,
    });
    assert!(!known.held_by_link(&lapsed_in_outage, Instant::now(), GRACE));
}

#[test]
fn an_exit_lapsing_in_the_read_that_finds_the_silence_was_live_before_it() {
    // One read's window is the resolution: the last read that saw the
    // control plane listed it live.
    let exit = Uuid::new_v4();
    let mut known = Known::default();
    known.apply(full(&[exit], true));
    known.apply(delta(&[exit], false));
    assert!(known.held_by_link(&exit, Instant::now(), GRACE));
}

#[test]
fn a_first_read_during_the_silence_holds_what_the_store_still_lists_live() {
    let (listed, lapsed) = (Uuid::new_v4(), Uuid::new_v4());
    let mut known = Known::default();
    known.apply(full(&[listed], false));
    known.apply(delta(&[listed], false));
    let now = Instant::now();
    assert!(known.held_by_link(&listed, now, GRACE));
    assert!(
        !known.held_by_link(&lapsed, now, GRACE),
        "nothing says it was live when the control plane fell silent"
    );
}
