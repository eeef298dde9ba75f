use super::*;
use crate::select::test_support::{cooling, exit, health, view, view_with_udp_only_on};
use proxynet_store::SourceType;
use std::collections::HashMap;
use std::collections::HashSet;
use std::time::{Duration, Instant};

#[test]
fn a_pick_ignores_the_cooling_only_when_it_finds_nothing_else() {
    let (cooled, fine) = (Uuid::new_v4(), Uuid::new_v4());
    let until = Instant::now() + Duration::from_secs(60);
    let cooling = SiteCooling::new(
        "refuser.test".into(),
        HashMap::from([(cooled, (until, 0))]),
        false,
    );
    let now = Instant::now();
    // A pool of `exits`: the first not avoided.
    let pick = |exits: &[Uuid]| {
        let exits = exits.to_vec();
        move |avoid: Option<&SiteCooling>| {
            exits
                .iter()
                .copied()
                .find(|e| !avoid.is_some_and(|a| a.cools(*e, now)))
        }
    };
    assert_eq!(
        unless_all_cooled(Some(&cooling), pick(&[cooled, fine])),
        Some(fine)
    );
    assert_eq!(
        unless_all_cooled(Some(&cooling), pick(&[cooled])),
        Some(cooled),
        "only cooled exits left: one of them"
    );
    assert_eq!(unless_all_cooled(None, pick(&[cooled])), Some(cooled));
    assert_eq!(unless_all_cooled(Some(&cooling), pick(&[])), None);
}

#[test]
fn an_accounts_own_cooldowns_are_skipped_for_its_tunnels_only() {
    use crate::sites::{SiteBook, SiteSettings};
    use proxynet_store::site_cooldowns::{AccountAnnouncement, Announcement};

    let book = SiteBook::new(SiteSettings::default());
    let (by_fleet, reported, fine) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let (account, other) = (Uuid::new_v4(), Uuid::new_v4());
    book.apply(Announcement::Cooled {
        exit: by_fleet,
        site: "shop.test".into(),
        remaining_ms: 60_000,
        level: 0,
    });
    book.apply_account(AccountAnnouncement::Cooled {
        account,
        exit: reported,
        site: "shop.test".into(),
        remaining_ms: 60_000,
    });
    let now = Instant::now();
    let pick = |exits: &[Uuid]| {
        let exits = exits.to_vec();
        move |avoid: Option<&SiteCooling>| {
            exits
                .iter()
                .copied()
                .find(|e| !avoid.is_some_and(|a| a.cools(*e, now)))
        }
    };
    let mine = book.cooling_for(account, "shop.test");
    let theirs = book.cooling_for(other, "shop.test");
    assert_eq!(
        unless_all_cooled(mine.as_deref(), pick(&[by_fleet, reported, fine])),
        Some(fine),
        "the account skips both the fleet's and its own"
    );
    assert_eq!(
        unless_all_cooled(theirs.as_deref(), pick(&[by_fleet, reported, fine])),
        Some(reported),
        "another account skips the fleet's only"
    );
    assert_eq!(
        unless_all_cooled(mine.as_deref(), pick(&[reported])),
        Some(reported),
        "only exits cooled for it left: one of them"
    );
    // A site without any record: nothing skipped, nothing allocated.
    assert!(book.cooling_for(account, "other.test").is_none());
}

fn ids(pool: &PoolView) -> Vec<Uuid> {
    pool.eligible.iter().map(|c| c.record.id).collect()
}

fn de_dc() -> ExitRecord {
    exit("DE", SourceType::Dc, None)
}

#[tokio::test]
async fn the_candidates_are_distinct_exits_of_the_snapshot_at_most_cap_of_them() {
    let pool = Arc::new(view((0..5).map(|_| de_dc()).collect()));
    let health = health();
    let targeting = Targeting::default();
    let three: Vec<Uuid> = Candidates::new(pool.clone(), &health, &targeting, 3)
        .map(|c| c.record.id)
        .collect();
    assert_eq!(three.len(), 3, "the cap bounds the attempts");
    assert_eq!(
        three.iter().collect::<HashSet<_>>().len(),
        3,
        "no exit twice"
    );
    let all: HashSet<Uuid> = Candidates::new(pool.clone(), &health, &targeting, 10)
        .map(|c| c.record.id)
        .collect();
    assert_eq!(
        all,
        ids(&pool).into_iter().collect(),
        "then the pool runs out"
    );
}

#[tokio::test]
async fn only_exits_matching_the_targeting_are_drawn() {
    let pool = Arc::new(view(vec![
        de_dc(),
        exit("US", SourceType::Dc, None),
        exit("DE", SourceType::Res, None),
    ]));
    let health = health();
    let german = Targeting {
        country: Some("DE".into()),
        ..Targeting::default()
    };
    let drawn: Vec<Candidate> = Candidates::new(pool.clone(), &health, &german, 10).collect();
    assert_eq!(drawn.len(), 2);
    assert!(drawn.iter().all(|c| c.record.country == "DE"));
}

#[tokio::test]
async fn a_pin_is_taken_exactly_while_it_is_eligible_and_matches() {
    let pool = Arc::new(view(vec![de_dc(), exit("US", SourceType::Dc, None)]));
    let (de, us) = (pool.eligible[0].record.id, pool.eligible[1].record.id);
    let health = health();
    let german = Targeting {
        country: Some("DE".into()),
        ..Targeting::default()
    };
    let mut candidates = Candidates::new(pool.clone(), &health, &german, 3);
    assert!(
        candidates.exactly(us).is_none(),
        "a pin the targeting excludes"
    );
    assert!(
        candidates.exactly(Uuid::new_v4()).is_none(),
        "a pin not in the pool"
    );
    assert_eq!(candidates.exactly(de).map(|c| c.record.id), Some(de));
    assert!(
        candidates.exactly(de).is_none(),
        "never the same exit twice"
    );
    assert!(
        candidates.draw().is_none(),
        "the pin was the only German exit"
    );
    // A pin costs an attempt like a draw does.
    let anything = Targeting::default();
    let mut one = Candidates::new(pool.clone(), &health, &anything, 1);
    assert!(one.exactly(de).is_some());
    assert!(one.exhausted());
    assert!(one.draw().is_none());
}

#[tokio::test]
async fn exits_a_ban_retry_avoids_are_skipped_and_cost_no_attempt() {
    let pool = Arc::new(view(vec![de_dc(), de_dc(), de_dc()]));
    let all = ids(&pool);
    let health = health();
    let retry = Targeting {
        avoid: vec![all[0], all[1]],
        ..Targeting::default()
    };
    let drawn: Vec<Uuid> = Candidates::new(pool.clone(), &health, &retry, 1)
        .map(|c| c.record.id)
        .collect();
    assert_eq!(
        drawn,
        vec![all[2]],
        "one attempt left for the one exit not avoided"
    );
}

#[tokio::test]
async fn the_preferred_exit_comes_first_and_only_first() {
    let pool = Arc::new(view((0..4).map(|_| de_dc()).collect()));
    let kept = pool.eligible[2].record.id;
    let health = health();
    let rotate_tunnel = Targeting {
        prefer: Some(kept),
        ..Targeting::default()
    };
    for _ in 0..20 {
        let drawn: Vec<Uuid> = Candidates::new(pool.clone(), &health, &rotate_tunnel, 4)
            .map(|c| c.record.id)
            .collect();
        assert_eq!(drawn[0], kept);
        assert_eq!(drawn.len(), 4);
        assert!(!drawn[1..].contains(&kept));
    }
    // A preferred exit at its capacity (2 here) is passed over.
    let _full = (health.start_tunnel(kept), health.start_tunnel(kept));
    let first = Candidates::new(pool.clone(), &health, &rotate_tunnel, 4)
        .next()
        .map(|c| c.record.id);
    assert!(first.is_some_and(|id| id != kept));
}

#[tokio::test]
async fn the_less_loaded_of_two_draws_wins() {
    let pool = Arc::new(view(vec![de_dc(), de_dc()]));
    let (busy, idle) = (pool.eligible[0].record.id, pool.eligible[1].record.id);
    let health = health();
    let _one_in_flight = health.start_tunnel(busy);
    let targeting = Targeting::default();
    let busy_first = (0..200)
        .filter(|_| {
            Candidates::new(pool.clone(), &health, &targeting, 1)
                .next()
                .is_some_and(|c| c.record.id == busy)
        })
        .count();
    // The busy exit wins only when no second exit was found in eight probes
    // (1 in 512 draws): never more than a handful of 200.
    assert!(
        busy_first <= 10,
        "the busy exit came first {busy_first} times"
    );
    assert!(Candidates::new(pool.clone(), &health, &targeting, 2).any(|c| c.record.id == idle));
}

#[tokio::test]
async fn follow_takes_the_pin_another_superproxy_wrote_when_it_can() {
    let pool = Arc::new(view(vec![
        de_dc(),
        de_dc(),
        exit("US", SourceType::Dc, None),
    ]));
    let (a, b, us) = (
        pool.eligible[0].record.id,
        pool.eligible[1].record.id,
        pool.eligible[2].record.id,
    );
    let health = health();
    let german = Targeting {
        country: Some("DE".into()),
        ..Targeting::default()
    };
    let mut candidates = Candidates::new(pool.clone(), &health, &german, 3);
    let drawn = candidates.exactly(a).expect("a is eligible");
    assert_eq!(
        candidates.follow(b, drawn.clone()).record.id,
        b,
        "the pin written first wins"
    );
    assert_eq!(
        candidates.follow(us, drawn.clone()).record.id,
        a,
        "a pin the targeting excludes is not followed"
    );
    assert_eq!(
        candidates.follow(Uuid::new_v4(), drawn).record.id,
        a,
        "nor one the snapshot lacks"
    );
}

#[tokio::test]
async fn an_association_passes_over_exits_without_udp_at_no_cost() {
    let records: Vec<ExitRecord> = (0..3).map(|_| de_dc()).collect();
    let (old_a, old_b) = (records[0].id, records[1].id);
    let pool = Arc::new(view_with_udp_only_on(records, &[old_a, old_b]));
    let with_udp = pool.eligible[2].record.id;
    let health = health();
    let targeting = Targeting::default();
    let mut candidates = Candidates::new(pool.clone(), &health, &targeting, 1).needing_udp(true);
    assert!(candidates.lacks_udp(old_a));
    assert!(!candidates.lacks_udp(with_udp));
    assert!(
        candidates.exactly(old_a).is_none(),
        "a pin without UDP is not usable"
    );
    let drawn = candidates.draw().map(|c| c.record.id);
    assert_eq!(drawn, Some(with_udp), "found within the one attempt");
    // Without UDP anywhere: nothing, and it says why.
    let old: Vec<ExitRecord> = (0..2).map(|_| de_dc()).collect();
    let all: Vec<Uuid> = old.iter().map(|r| r.id).collect();
    let none = Arc::new(view_with_udp_only_on(old, &all));
    let mut candidates = Candidates::new(none, &health, &targeting, 3).needing_udp(true);
    assert!(candidates.draw().is_none());
    assert!(candidates.passed_over_for_udp());
}

#[tokio::test]
async fn exits_cooled_for_the_site_are_drawn_only_when_nothing_else_is_left() {
    let pool = Arc::new(view(vec![de_dc(), de_dc(), de_dc()]));
    let all = ids(&pool);
    let health = health();
    let targeting = Targeting::default();
    let cooled = Arc::new(cooling(
        "refuser.test",
        &all[..2],
        std::time::Duration::from_secs(60),
    ));
    let drawn: Vec<Uuid> = Candidates::new(pool.clone(), &health, &targeting, 3)
        .for_site(Some(cooled.clone()))
        .map(|c| c.record.id)
        .collect();
    assert_eq!(drawn[0], all[2], "the exit the site does not refuse first");
    assert_eq!(
        drawn.len(),
        3,
        "then the cooled ones, rather than no tunnel"
    );
    let candidates = Candidates::new(pool.clone(), &health, &targeting, 3).for_site(Some(cooled));
    assert!(candidates.cooled(all[0]));
    assert!(!candidates.cooled(all[2]));
    assert_eq!(candidates.site(), Some("refuser.test"));
}

#[tokio::test]
async fn a_soft_repin_draws_an_exit_like_the_lost_one() {
    let mut berlin = de_dc();
    berlin.city = Some("berlin".into());
    let mut munich = de_dc();
    munich.city = Some("munich".into());
    let pool = Arc::new(view(vec![
        exit("FR", SourceType::Dc, None),
        munich,
        berlin.clone(),
    ]));
    let berlin_now = pool.eligible[2].record.id;
    let health = health();
    let targeting = Targeting::default();
    let mut lost = berlin;
    lost.id = Uuid::new_v4();
    for _ in 0..20 {
        let mut candidates = Candidates::new(pool.clone(), &health, &targeting, 3);
        assert_eq!(
            candidates.draw_like(Some(&lost)).map(|c| c.record.id),
            Some(berlin_now)
        );
        let next = candidates
            .draw_like(Some(&lost))
            .map(|c| c.record.country.clone());
        assert_eq!(next.as_deref(), Some("DE"), "then the same country");
    }
    // Nothing known of the lost exit: any exit will do.
    let mut candidates = Candidates::new(pool.clone(), &health, &targeting, 3);
    assert!(candidates.draw_like(None).is_some());
}

#[tokio::test]
async fn exits_the_pool_dropped_since_the_snapshot_are_passed_over_at_no_cost() {
    let pool = Arc::new(view((0..4).map(|_| de_dc()).collect()));
    let all = ids(&pool);
    let (gone, also_gone) = (all[0], all[1]);
    let health = health();
    let targeting = Targeting::default();
    let still_live = |exit: &Uuid| *exit != gone && *exit != also_gone;
    let drawn: Vec<Uuid> = Candidates::new(pool.clone(), &health, &targeting, 2)
        .checking_live(&still_live)
        .map(|c| c.record.id)
        .collect();
    assert_eq!(
        drawn.iter().collect::<HashSet<_>>(),
        HashSet::from([&all[2], &all[3]]),
        "both attempts go to exits still in the pool"
    );
    let mut candidates =
        Candidates::new(pool.clone(), &health, &targeting, 3).checking_live(&still_live);
    assert!(
        candidates.exactly(gone).is_none(),
        "a pin on a dropped exit is lost"
    );
    assert!(!candidates.exhausted(), "and costs no attempt");
    let drawn = candidates.draw().expect("a live exit");
    assert_eq!(
        candidates.follow(also_gone, drawn.clone()).record.id,
        drawn.record.id,
        "a pin another superproxy wrote to a dropped exit is not followed"
    );
    let preferring_gone = Targeting {
        prefer: Some(gone),
        ..Targeting::default()
    };
    let first = Candidates::new(pool.clone(), &health, &preferring_gone, 3)
        .checking_live(&still_live)
        .next()
        .map(|c| c.record.id);
    assert!(
        first.is_some_and(|id| id != gone),
        "nor is a preferred one taken"
    );
    // A pool that emptied: nothing, after a bounded number of draws.
    let nothing_live = |_: &Uuid| false;
    assert!(Candidates::new(pool.clone(), &health, &targeting, 3)
        .checking_live(&nothing_live)
        .next()
        .is_none());
}
