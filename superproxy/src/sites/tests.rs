//! Tests of the site book: streaks and their cooldowns, account-scoped
//! cooldowns, the back-off, panic, announcements, the resync and the
//! judging of a tunnel's end.

use super::*;
use proxynet_store::site_cooldowns::{self, Cooldown};
use rand::Rng;
use std::collections::HashSet;

fn book() -> Arc<SiteBook> {
    Arc::new(SiteBook::new(SiteSettings::default()))
}

fn site(s: &str) -> Arc<str> {
    Arc::from(s)
}

fn cooled(book: &SiteBook, exit: Uuid, site: &str) -> bool {
    book.cooling(site)
        .is_some_and(|c| c.cools(exit, Instant::now()))
}

#[test]
fn failures_in_a_row_cool_an_exit_for_that_site_only() {
    let book = book();
    let (exit, other) = (Uuid::new_v4(), Uuid::new_v4());
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let (refuser, friendly) = (site("refuser.test"), site("friendly.test"));
    assert!(book.cooling("refuser.test").is_none(), "no record: nothing");
    book.record(a, exit, &refuser, Verdict::Refused, false);
    book.record(b, exit, &refuser, Verdict::HandshakeClosed, false);
    assert!(!cooled(&book, exit, "refuser.test"), "two are not three");
    // A success ends the streak: two more are still not three.
    book.record(a, exit, &refuser, Verdict::Ok, false);
    book.record(a, exit, &refuser, Verdict::Refused, false);
    book.record(b, exit, &refuser, Verdict::Refused, false);
    assert!(!cooled(&book, exit, "refuser.test"));
    book.record(b, exit, &refuser, Verdict::Banned, false);
    assert!(
        cooled(&book, exit, "refuser.test"),
        "three, of two accounts"
    );
    assert!(!cooled(&book, other, "refuser.test"), "another exit");
    assert!(book.cooling("friendly.test").is_none(), "another site");
    book.record(a, exit, &friendly, Verdict::Ok, false);
    assert!(book.cooling("friendly.test").is_none());
    // The cooldown: the base, ±20 %.
    let (until, level) = book
        .cooling("refuser.test")
        .and_then(|c| c.cooldown(exit))
        .unwrap();
    assert_eq!(level, 0);
    let left = until.saturating_duration_since(Instant::now());
    assert!(left <= Duration::from_secs(72), "{left:?}");
    assert!(left >= Duration::from_secs(47), "{left:?}");
    assert_eq!(
        book.streak_count.load(Ordering::Relaxed),
        0,
        "no streak left"
    );
}

#[test]
fn one_accounts_failures_cool_the_exit_for_that_account_only() {
    let book = book();
    let exit = Uuid::new_v4();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let s = site("own-site.test");
    for _ in 0..5 {
        book.record(a, exit, &s, Verdict::Refused, false);
    }
    let now = Instant::now();
    assert!(!cooled(&book, exit, "own-site.test"), "not for the fleet");
    assert!(book.cooled_for_account(a, exit, "own-site.test", now));
    assert!(!book.cooled_for_account(b, exit, "own-site.test", now));
    // Another account's failure corroborates: now the fleet's.
    book.record(b, exit, &s, Verdict::Refused, false);
    assert!(cooled(&book, exit, "own-site.test"));
}

#[test]
fn a_forced_cool_needs_one_failure_and_an_ok_never_cools() {
    let book = book();
    let exit = Uuid::new_v4();
    let a = Uuid::new_v4();
    let s = site("banner.test");
    book.record_http(a, exit, &s, false, true);
    assert!(book.cooling("banner.test").is_none());
    assert!(!book.cooled_for_account(a, exit, "banner.test", Instant::now()));
    // A rule's `cool` is one account's word: its own routing only.
    book.record_http(a, exit, &s, true, true);
    assert!(book.cooled_for_account(a, exit, "banner.test", Instant::now()));
    assert!(!cooled(&book, exit, "banner.test"));
}

#[test]
fn the_back_off_doubles_up_to_its_ceiling_within_its_jitter() {
    let (base, max) = (Duration::from_secs(60), Duration::from_secs(6 * 3600));
    assert_eq!(backoff(base, max, 0, 1000), Duration::from_secs(60));
    assert_eq!(backoff(base, max, 1, 1000), Duration::from_secs(120));
    assert_eq!(backoff(base, max, 3, 1000), Duration::from_secs(480));
    assert_eq!(backoff(base, max, 10, 1000), max);
    assert_eq!(backoff(base, max, 200, 1200), max, "no overflow");
    assert_eq!(backoff(base, max, 0, 800), Duration::from_secs(48));
    assert_eq!(backoff(base, max, 0, 1200), Duration::from_secs(72));
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let jitter = rng.gen_range(JITTER_PERMILLE);
        let length = backoff(base, max, 2, jitter);
        assert!(length >= Duration::from_secs(192) && length <= Duration::from_secs(288));
    }
}

#[test]
fn an_ended_cooldown_is_dropped_and_its_pair_cools_again_at_the_first_failure_for_longer() {
    let book = book();
    let exit = Uuid::new_v4();
    let s = site("flaky.test");
    book.apply(Announcement::Cooled {
        exit,
        site: "flaky.test".into(),
        remaining_ms: 10_000,
        level: 0,
    });
    assert!(cooled(&book, exit, "flaky.test"));
    // Twenty seconds on, it has ended.
    book.upkeep_against(Instant::now() + Duration::from_secs(20), 2, |_| true);
    assert!(book.cooling("flaky.test").is_none(), "ended: dropped");
    // Probation: one failure cools again, at the next level (once a
    // second account's corroborates it).
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    book.record(a, exit, &s, Verdict::Refused, false);
    book.record(b, exit, &s, Verdict::Refused, false);
    let (until, level) = book
        .cooling("flaky.test")
        .and_then(|c| c.cooldown(exit))
        .unwrap();
    assert_eq!(level, 1);
    let left = until.saturating_duration_since(Instant::now());
    assert!(
        left >= Duration::from_secs(95) && left <= Duration::from_secs(144),
        "{left:?}"
    );
    // Failures of an exit already cooled change nothing.
    book.record(a, exit, &s, Verdict::Refused, false);
    assert_eq!(
        book.cooling("flaky.test").and_then(|c| c.cooldown(exit)),
        Some((until, 1))
    );
}

#[test]
fn a_site_panics_when_nearly_every_eligible_exit_is_cooled_for_it() {
    assert!(
        !panics(9, 10, 95),
        "90 % cooled: the other 10 % carry the site"
    );
    assert!(panics(10, 10, 95));
    assert!(panics(95, 100, 95));
    assert!(!panics(94, 100, 95));
    assert!(!panics(0, 0, 95), "no pool, no panic");
    assert!(panics(1, 1, 100));
    let book = book();
    let exits: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    let eligible: HashSet<Uuid> = exits.iter().copied().collect();
    for exit in &exits[..3] {
        book.apply(Announcement::Cooled {
            exit: *exit,
            site: "wall.test".into(),
            remaining_ms: 60_000,
            level: 0,
        });
    }
    let now = Instant::now();
    book.upkeep_against(now, eligible.len(), |id| eligible.contains(id));
    assert!(!book.cooling("wall.test").unwrap().in_panic(), "3 of 4");
    book.apply(Announcement::Cooled {
        exit: exits[3],
        site: "wall.test".into(),
        remaining_ms: 60_000,
        level: 0,
    });
    assert!(
        !book.cooling("wall.test").unwrap().in_panic(),
        "until the next round"
    );
    book.upkeep_against(now, eligible.len(), |id| eligible.contains(id));
    assert!(book.cooling("wall.test").unwrap().in_panic(), "4 of 4");
    // An exit that left the pool does not count.
    book.upkeep_against(now, 5, |id| eligible.contains(id) && *id != exits[0]);
    assert!(!book.cooling("wall.test").unwrap().in_panic(), "3 of 5");
}

#[test]
fn announcements_apply_from_memory() {
    let book = book();
    let exit = Uuid::new_v4();
    let cooled_msg = Announcement::Cooled {
        exit,
        site: "198.51.100.0/24".into(),
        remaining_ms: 60_000,
        level: 2,
    };
    book.apply(Announcement::parse(&cooled_msg.encode()).unwrap());
    assert!(cooled(&book, exit, "198.51.100.0/24"));
    assert_eq!(
        book.cooling("198.51.100.0/24")
            .and_then(|c| c.cooldown(exit))
            .map(|c| c.1),
        Some(2)
    );
    let lifted = Announcement::Lifted {
        exit,
        site: "198.51.100.0/24".into(),
    };
    book.apply(Announcement::parse(&lifted.encode()).unwrap());
    assert!(book.cooling("198.51.100.0/24").is_none());
    // A payload cannot set more than a week.
    book.apply(Announcement::Cooled {
        exit,
        site: "far.test".into(),
        remaining_ms: u64::MAX,
        level: u32::MAX,
    });
    let (until, level) = book
        .cooling("far.test")
        .and_then(|c| c.cooldown(exit))
        .unwrap();
    assert!(until <= Instant::now() + LONGEST);
    assert_eq!(level, MAX_LEVEL);
}

#[test]
fn an_accounts_cooldowns_join_the_fleets_for_its_tunnels_only() {
    let book = book();
    let (fleet_cooled, reported) = (Uuid::new_v4(), Uuid::new_v4());
    let (account, other) = (Uuid::new_v4(), Uuid::new_v4());
    assert!(book.cooling_for(account, "shop.test").is_none());
    let own = AccountAnnouncement::Cooled {
        account,
        exit: reported,
        site: "shop.test".into(),
        remaining_ms: 60_000,
    };
    book.apply_account(AccountAnnouncement::parse(&own.encode()).unwrap());
    let now = Instant::now();
    assert!(book.cooled_for_account(account, reported, "shop.test", now));
    let mine = book.cooling_for(account, "shop.test").unwrap();
    assert!(mine.cools(reported, now));
    assert!(book.cooling_for(other, "shop.test").is_none());
    assert!(book.cooling("shop.test").is_none(), "not the fleet's");
    // With the fleet's: both, for the account; the fleet's alone for
    // any other account.
    book.apply(Announcement::Cooled {
        exit: fleet_cooled,
        site: "shop.test".into(),
        remaining_ms: 60_000,
        level: 1,
    });
    let joined = book.cooling_for(account, "shop.test").unwrap();
    assert!(joined.cools(reported, now) && joined.cools(fleet_cooled, now));
    assert_eq!(joined.cooldown(fleet_cooled).map(|c| c.1), Some(1));
    assert_eq!(joined.site(), "shop.test");
    let theirs = book.cooling_for(other, "shop.test").unwrap();
    assert!(theirs.cools(fleet_cooled, now) && !theirs.cools(reported, now));
    // The fleet's cooling in panic is left out; the account's own stays.
    book.upkeep_against(now, 1, |id| *id == fleet_cooled);
    assert!(book.cooling("shop.test").unwrap().in_panic());
    let joined = book.cooling_for(account, "shop.test").unwrap();
    assert!(!joined.in_panic());
    assert!(joined.cools(reported, now) && !joined.cools(fleet_cooled, now));
    // Lifted: the account's tunnels see the fleet's cooling again.
    let lifted = AccountAnnouncement::Lifted {
        account,
        exit: reported,
        site: "shop.test".into(),
    };
    book.apply_account(AccountAnnouncement::parse(&lifted.encode()).unwrap());
    assert!(!book.cooled_for_account(account, reported, "shop.test", now));
    assert!(book.cooling_for(account, "shop.test").unwrap().in_panic());
    // A payload cannot cool for more than a week.
    book.apply_account(AccountAnnouncement::Cooled {
        account,
        exit: reported,
        site: "far.test".into(),
        remaining_ms: u64::MAX,
    });
    let (until, _) = book
        .cooling_for(account, "far.test")
        .and_then(|c| c.cooldown(reported))
        .unwrap();
    assert!(until <= Instant::now() + LONGEST);
}

#[test]
fn a_resync_takes_what_redis_holds() {
    let book = book();
    let (live, ended, lifted) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    book.apply(Announcement::Cooled {
        exit: lifted,
        site: "a.test".into(),
        remaining_ms: 60_000,
        level: 0,
    });
    let now_ms = 1_700_000_000_000_i64;
    let flat: Vec<String> = vec![
        site_cooldowns::field(live, "a.test"),
        Cooldown {
            until_ms: now_ms + 30_000,
            level: 1,
        }
        .encode(),
        site_cooldowns::field(ended, "a.test"),
        Cooldown {
            until_ms: now_ms - 30_000,
            level: 2,
        }
        .encode(),
        "garbage".into(),
        "1 2".into(),
    ];
    book.replace(now_ms, &flat, Instant::now(), false);
    assert!(cooled(&book, live, "a.test"));
    assert!(!cooled(&book, ended, "a.test"));
    assert!(
        !cooled(&book, lifted, "a.test"),
        "what Redis lacks is lifted"
    );
    assert_eq!(
        book.remembered_level(ended, &site("a.test"), Instant::now()),
        Some(2)
    );
    // A change that raced the read is kept.
    book.apply(Announcement::Cooled {
        exit: lifted,
        site: "b.test".into(),
        remaining_ms: 60_000,
        level: 0,
    });
    book.replace(now_ms, &flat, Instant::now(), true);
    assert!(cooled(&book, lifted, "b.test"));
    assert!(cooled(&book, live, "a.test"));
}

#[test]
fn a_tunnels_end_is_judged_by_who_ended_it_and_what_came_down() {
    let short = Duration::from_millis(50);
    assert_eq!(
        tunnel_verdict(0, false, true, short),
        Some(Verdict::HandshakeClosed)
    );
    assert_eq!(
        tunnel_verdict(64, false, true, short),
        Some(Verdict::HandshakeClosed)
    );
    assert_eq!(tunnel_verdict(65, false, true, short), Some(Verdict::Ok));
    assert_eq!(
        tunnel_verdict(5_000, false, false, short),
        Some(Verdict::Ok)
    );
    assert_eq!(
        tunnel_verdict(0, false, false, short),
        None,
        "the client ended it"
    );
    assert_eq!(
        tunnel_verdict(0, true, true, short),
        None,
        "cut from outside"
    );
    assert_eq!(
        tunnel_verdict(10, false, true, Duration::from_secs(60)),
        None,
        "not within the handshake"
    );
}
