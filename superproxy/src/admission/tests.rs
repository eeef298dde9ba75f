//! Unit tests of admission without a store: the default per-user cap (never
//! Redis), the user's, the account's and the per-domain concurrency limits as
//! they hold while Redis is away (this instance's own leases), leases freed
//! when dropped, and how the scripts' replies become refusals.

use proxynet_store::policy::Limit;
use proxynet_store::{AccountLimits, QuotaPeriod};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::test_support::{admission, refused, LEASE_TTL};
use super::{acquire_refusal, limited, rate_verdict, Leases};
use crate::error::ErrorKind;
use crate::request::UserLimits;
use crate::usage::QuotaOwner;

/// What Redis answers when it is not there.
fn no_reply() -> redis::RedisResult<i64> {
    Err(redis::RedisError::from((
        redis::ErrorKind::Io,
        "connection refused",
    )))
}

/// A user's own concurrency limit, nothing else.
fn at_most(max: u32) -> UserLimits {
    UserLimits {
        max_concurrent_tunnels: Some(max),
        ..UserLimits::default()
    }
}

/// The account's concurrency total, and no limit of the user's own.
fn account_at_most(max: u32) -> UserLimits {
    UserLimits {
        account: Some(AccountLimits {
            max_concurrent_tunnels: Some(max),
            ..AccountLimits::default()
        }),
        ..UserLimits::default()
    }
}

fn concurrency(max: u32) -> Limit {
    Limit {
        new_tunnels_per_second: None,
        max_concurrent_tunnels: Some(max),
    }
}

#[tokio::test]
async fn past_the_default_cap_a_user_without_limits_is_refused_with_a_429() {
    let admission = admission(2);
    let (user, account) = (Uuid::new_v4(), Uuid::new_v4());
    let _first = admission
        .admit(user, account, UserLimits::default())
        .await
        .unwrap();
    let _second = admission
        .admit(user, account, UserLimits::default())
        .await
        .unwrap();
    let e = refused(admission.admit(user, account, UserLimits::default()).await);
    assert_eq!(e.kind, ErrorKind::TooManyRequests);
    assert_eq!(e.kind.status().as_u16(), 429);
    assert_eq!(e.retry_after, Some(1));
    assert_eq!(
        e.detail,
        "default per-user tunnel limit (2) reached on this superproxy"
    );
}

#[tokio::test]
async fn a_dropped_lease_frees_the_users_default_slot() {
    let admission = admission(1);
    let (user, account) = (Uuid::new_v4(), Uuid::new_v4());
    let held = admission
        .admit(user, account, UserLimits::default())
        .await
        .unwrap();
    assert!(admission
        .admit(user, account, UserLimits::default())
        .await
        .is_err());
    drop(held);
    let again = admission.admit(user, account, UserLimits::default()).await;
    assert!(again.is_ok(), "the slot came back with the lease");
    drop(again);
    // Nothing is kept of a user with no tunnels here.
    assert!(admission.local.lock().unwrap().is_empty());
}

#[tokio::test]
async fn each_user_has_a_default_cap_of_their_own() {
    let admission = admission(1);
    let account = Uuid::new_v4();
    let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let _alice = admission
        .admit(alice, account, UserLimits::default())
        .await
        .unwrap();
    assert!(admission
        .admit(alice, account, UserLimits::default())
        .await
        .is_err());
    assert!(admission
        .admit(bob, account, UserLimits::default())
        .await
        .is_ok());
}

#[tokio::test]
async fn a_default_cap_of_zero_still_lets_one_tunnel_in() {
    let admission = admission(0);
    let (user, account) = (Uuid::new_v4(), Uuid::new_v4());
    let _one = admission
        .admit(user, account, UserLimits::default())
        .await
        .unwrap();
    let e = refused(admission.admit(user, account, UserLimits::default()).await);
    assert_eq!(
        e.detail,
        "default per-user tunnel limit (1) reached on this superproxy"
    );
}

#[tokio::test]
async fn with_the_store_away_a_users_limit_counts_the_leases_held_here() {
    let admission = admission(100);
    let (user, account) = (Uuid::new_v4(), Uuid::new_v4());
    let first = admission.admit(user, account, at_most(2)).await.unwrap();
    let _second = admission.admit(user, account, at_most(2)).await.unwrap();
    let e = refused(admission.admit(user, account, at_most(2)).await);
    assert_eq!(e.kind, ErrorKind::TooManyRequests);
    assert_eq!(e.detail, "the user's concurrent tunnel limit (2) reached");
    assert_eq!(e.retry_after, Some(1));
    // A user with a limit of their own is not on the default count.
    assert!(admission.local.lock().unwrap().is_empty());
    let set = admission.keys.leases(user);
    assert_eq!(admission.held_by_us(&set), 2);
    drop(first);
    assert_eq!(
        admission.held_by_us(&set),
        1,
        "dropped: off the count at once"
    );
    assert!(admission.admit(user, account, at_most(2)).await.is_ok());
}

#[tokio::test]
async fn leases_of_a_set_no_longer_held_leave_nothing_to_renew() {
    let admission = admission(100);
    let (user, account) = (Uuid::new_v4(), Uuid::new_v4());
    let leases = admission.admit(user, account, at_most(3)).await.unwrap();
    assert!(admission
        .held
        .lock()
        .unwrap()
        .contains_key(&admission.keys.leases(user)));
    drop(leases);
    assert!(admission.held.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_accounts_total_is_shared_by_its_users() {
    let admission = admission(100);
    let account = Uuid::new_v4();
    let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let alices = admission
        .admit(alice, account, account_at_most(1))
        .await
        .unwrap();
    let e = refused(admission.admit(bob, account, account_at_most(1)).await);
    assert_eq!(e.kind, ErrorKind::TooManyRequests);
    assert_eq!(
        e.detail,
        "the account's concurrent tunnel limit (1) reached"
    );
    // Another account's users are not held to it.
    assert!(admission
        .admit(bob, Uuid::new_v4(), account_at_most(1))
        .await
        .is_ok());
    drop(alices);
    assert!(admission
        .admit(bob, account, account_at_most(1))
        .await
        .is_ok());
}

#[tokio::test]
async fn a_refusal_by_the_account_gives_back_the_users_slot_it_took() {
    // Bob's default slot is taken before the account refuses him: it must
    // not stay taken, or his cap of one would refuse him for good.
    let admission = admission(1);
    let account = Uuid::new_v4();
    let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let alices = admission
        .admit(alice, account, account_at_most(1))
        .await
        .unwrap();
    let e = refused(admission.admit(bob, account, account_at_most(1)).await);
    assert_eq!(
        e.detail,
        "the account's concurrent tunnel limit (1) reached"
    );
    assert!(!admission.local.lock().unwrap().contains_key(&bob));
    drop(alices);
    assert!(admission
        .admit(bob, account, account_at_most(1))
        .await
        .is_ok());
}

#[tokio::test]
async fn with_the_store_away_rate_limits_let_tunnels_through() {
    // The rates are counted in Redis alone: while it is away the
    // concurrency limits (here the default cap of 5) hold the line.
    let admission = admission(5);
    let (user, account) = (Uuid::new_v4(), Uuid::new_v4());
    let limits = UserLimits {
        max_new_tunnels_per_second: Some(1),
        account: Some(AccountLimits {
            max_new_tunnels_per_second: Some(1),
            ..AccountLimits::default()
        }),
        ..UserLimits::default()
    };
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(admission.admit(user, account, limits).await.unwrap());
    }
    let e = refused(admission.admit(user, account, limits).await);
    assert!(
        e.detail.starts_with("default per-user tunnel limit (5)"),
        "{e}"
    );
}

#[tokio::test]
async fn per_domain_leases_count_per_owner_and_domain_and_free_when_dropped() {
    let admission = admission(100);
    let lease = admission
        .admit_domain("a:acct", "example.test", concurrency(1), "the account's")
        .await
        .unwrap()
        .expect("a concurrency limit holds a lease");
    let e = refused(
        admission
            .admit_domain("a:acct", "example.test", concurrency(1), "the account's")
            .await,
    );
    assert_eq!(e.kind, ErrorKind::TooManyRequests);
    assert_eq!(
        e.detail,
        "the account's per-domain (example.test) concurrent tunnel limit (1) reached"
    );
    // Another domain, another owner: counted apart.
    for (scope, domain) in [("a:acct", "other.test"), ("u:user", "example.test")] {
        let other = admission
            .admit_domain(scope, domain, concurrency(1), "the user's")
            .await;
        assert!(matches!(other, Ok(Some(_))), "{scope} {domain}");
    }
    // Held beside a tunnel's own leases, released with them.
    let leases = Leases::default().with_domain(vec![lease]);
    drop(leases);
    let again = admission
        .admit_domain("a:acct", "example.test", concurrency(1), "the account's")
        .await;
    assert!(matches!(again, Ok(Some(_))));
}

#[tokio::test]
async fn a_per_domain_rate_alone_holds_no_lease() {
    let admission = admission(100);
    let rate_only = Limit {
        new_tunnels_per_second: Some(10),
        max_concurrent_tunnels: None,
    };
    let admitted = admission
        .admit_domain("a:acct", "example.test", rate_only, "the account's")
        .await;
    assert!(matches!(admitted, Ok(None)));
    assert!(admission.held.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_operators_shared_limit_counts_the_leases_held_here_with_the_store_away() {
    let admission = admission(100);
    let (one, other) = (Uuid::new_v4(), Uuid::new_v4());
    let first = admission
        .admit_shared_domain("example.test", concurrency(2), one, "the operator's")
        .await
        .unwrap()
        .expect("a lease");
    let mut leases = Leases::default();
    leases.add_domain(vec![first]);
    let _second = admission
        .admit_shared_domain("example.test", concurrency(2), other, "the operator's")
        .await
        .unwrap();
    let e = refused(
        admission
            .admit_shared_domain("example.test", concurrency(2), one, "the operator's")
            .await,
    );
    assert_eq!(
        e.detail,
        "the operator's per-domain (example.test) concurrent tunnel limit (2) reached"
    );
    // A shared set is renewed with the per-account counts beside it.
    let stem = admission.keys.shared_domain("example.test");
    {
        let held = admission.held.lock().unwrap();
        let entry = held.get(&format!("{stem}:leases")).expect("held here");
        assert_eq!(entry.ids.len(), 2);
        assert_eq!(
            entry.holders.as_deref(),
            Some(format!("{stem}:holders").as_str())
        );
        // Each member names its account, for the release to decrement.
        assert!(entry
            .ids
            .iter()
            .any(|id| id.starts_with(&format!("{one}|"))));
    }
    drop(leases);
    assert!(admission
        .admit_shared_domain("example.test", concurrency(2), one, "the operator's")
        .await
        .is_ok());
}

#[tokio::test(start_paused = true)]
async fn failed_renewals_keep_the_leases_held_here_and_stop_on_the_signal() {
    let admission = admission(100);
    let (user, account) = (Uuid::new_v4(), Uuid::new_v4());
    let _leases = admission.admit(user, account, at_most(1)).await.unwrap();
    let stop = CancellationToken::new();
    let renewals = tokio::spawn(admission.clone().run_renewals(stop.clone()));
    // Past a whole lease lifetime of renewal rounds, every one failing.
    tokio::time::sleep(LEASE_TTL).await;
    assert_eq!(admission.held_by_us(&admission.keys.leases(user)), 1);
    assert!(refused(admission.admit(user, account, at_most(1)).await)
        .detail
        .contains("(1) reached"));
    stop.cancel();
    tokio::time::timeout(LEASE_TTL, renewals)
        .await
        .expect("renewals stop on the signal")
        .unwrap();
}

#[tokio::test]
async fn the_shared_quota_counter_is_unknown_while_the_store_is_away() {
    let admission = admission(1);
    let used = admission
        .quota_used(QuotaOwner::User(Uuid::new_v4()), QuotaPeriod::Daily)
        .await;
    assert_eq!(used, None);
}

#[test]
fn a_wait_is_told_in_whole_seconds_rounded_up_and_at_least_one() {
    for (ms, secs) in [
        (0, 1),
        (1, 1),
        (999, 1),
        (1000, 1),
        (1001, 2),
        (59_500, 60),
        (u64::MAX, u32::MAX),
    ] {
        let e = limited("limit reached".into(), ms);
        assert_eq!(e.kind, ErrorKind::TooManyRequests);
        assert_eq!(e.retry_after, Some(secs), "{ms} ms");
    }
}

#[test]
fn a_rate_reply_is_a_429_with_its_wait_and_no_reply_lets_the_tunnel_through() {
    let e = refused(rate_verdict(Ok(1500), || "the user's rate".into()));
    assert_eq!(e.kind, ErrorKind::TooManyRequests);
    assert_eq!(e.detail, "the user's rate");
    assert_eq!(e.retry_after, Some(2));
    assert!(rate_verdict(Ok(0), || unreachable!("allowed")).is_ok());
    assert!(rate_verdict(no_reply(), || unreachable!("allowed")).is_ok());
}

#[test]
fn an_acquire_reply_grants_or_says_which_limit_and_no_reply_counts_what_is_held_here() {
    let not_asked = || -> usize { unreachable!("Redis answered") };
    assert_eq!(acquire_refusal(Ok(1), 3, not_asked), None);
    assert_eq!(acquire_refusal(Ok(0), 3, not_asked), Some(" reached"));
    assert_eq!(
        acquire_refusal(Ok(-1), 3, not_asked),
        Some(": the account's fair share is in use")
    );
    assert_eq!(acquire_refusal(no_reply(), 3, || 2), None);
    assert_eq!(acquire_refusal(no_reply(), 3, || 3), Some(" reached"));
}
