//! Unit tests of the admit stage without a store: the quotas a tunnel's
//! bytes count against, the refusal once a quota's budget here is spent,
//! and the concurrency leases it takes (the shared counters and limits are
//! away, so this instance's own budgets and leases decide, as in an outage).

use proxynet_store::{AccountLimits, QuotaPeriod};
use std::sync::Arc;
use uuid::Uuid;

use super::Admit;
use crate::error::ErrorKind;
use crate::metrics::Stats;
use crate::pipeline::test_support::{admission, client, keys, refused, store_away, user};
use crate::usage::{QuotaOwner, UsageRecorder};

/// The admit stage with a default cap of `default_user_max` tunnels per
/// user, and the usage recorder whose budgets it reads.
fn stage(default_user_max: usize) -> (Admit, Arc<UsageRecorder>) {
    let usage = Arc::new(UsageRecorder::new(
        Uuid::new_v4(),
        store_away(),
        keys(),
        None,
        16,
        Arc::new(Stats::default()),
    ));
    (
        Admit::new(admission(default_user_max), usage.clone()),
        usage,
    )
}

#[tokio::test]
async fn a_client_without_quotas_is_admitted_with_nothing_to_count_against() {
    let (admit, _) = stage(4);
    let (_leases, quotas) = admit.admit(&client(user("alice"), "alice")).await.unwrap();
    assert!(quotas.is_empty());
}

#[tokio::test]
async fn the_users_and_the_accounts_quotas_go_to_the_meter_in_that_order() {
    let (admit, _) = stage(4);
    let mut record = user("alice");
    record.bandwidth_bytes = Some(1_000);
    record.quota_period = QuotaPeriod::Daily;
    record.account_limits = Some(AccountLimits {
        bandwidth_bytes: Some(5_000),
        quota_period: QuotaPeriod::Monthly,
        ..AccountLimits::default()
    });
    let client = client(record, "alice");
    let (_leases, quotas) = admit.admit(&client).await.unwrap();
    assert_eq!(quotas.len(), 2);
    // With the shared counters away nothing counts as used: this
    // instance's budgets judge alone.
    assert_eq!(quotas[0].owner, QuotaOwner::User(client.user_id));
    assert_eq!(
        (quotas[0].limit, quotas[0].period, quotas[0].used),
        (1_000, QuotaPeriod::Daily, 0)
    );
    assert_eq!(quotas[1].owner, QuotaOwner::Account(client.account_id));
    assert_eq!(
        (quotas[1].limit, quotas[1].period, quotas[1].used),
        (5_000, QuotaPeriod::Monthly, 0)
    );
}

#[tokio::test]
async fn a_users_budget_spent_here_refuses_with_the_quota_named() {
    let (admit, usage) = stage(4);
    let mut record = user("alice");
    record.bandwidth_bytes = Some(100);
    record.quota_period = QuotaPeriod::Daily;
    let client = client(record, "alice");
    let (leases, quotas) = admit.admit(&client).await.unwrap();
    let meter = usage.meter(
        client.account_id,
        client.user_id,
        Uuid::new_v4(),
        None,
        None,
        &quotas,
    );
    assert!(meter.0.charge_datagram(true, 100), "within the budget");
    drop(leases);
    let e = refused(admit.admit(&client).await);
    assert_eq!(e.kind, ErrorKind::QuotaExhausted);
    assert_eq!(e.kind.status().as_u16(), 403);
    assert_eq!(
        e.detail,
        "bandwidth quota exhausted: the user's 100 bytes per daily period"
    );
}

#[tokio::test]
async fn an_accounts_budget_spent_by_one_user_refuses_its_other_users() {
    let (admit, usage) = stage(4);
    let account = AccountLimits {
        bandwidth_bytes: Some(50),
        quota_period: QuotaPeriod::Monthly,
        ..AccountLimits::default()
    };
    let mut alice = user("alice");
    alice.account_limits = Some(account);
    let mut bob = user("bob");
    bob.account_id = alice.account_id;
    bob.account_limits = Some(account);
    let (alice, bob) = (client(alice, "alice"), client(bob, "bob"));
    let (_leases, quotas) = admit.admit(&alice).await.unwrap();
    assert_eq!(quotas.len(), 1);
    let meter = usage.meter(
        alice.account_id,
        alice.user_id,
        Uuid::new_v4(),
        None,
        None,
        &quotas,
    );
    assert!(meter.0.charge_datagram(false, 50));
    let e = refused(admit.admit(&bob).await);
    assert_eq!(e.kind, ErrorKind::QuotaExhausted);
    assert_eq!(
        e.detail,
        "bandwidth quota exhausted: the account's 50 bytes per monthly period"
    );
}

#[tokio::test]
async fn a_quota_refusal_takes_no_lease() {
    // One tunnel at a time for this user: had the refused attempt taken
    // the slot, the next one would be refused too.
    let (admit, _) = stage(1);
    let allowed = client(user("alice"), "alice");
    let mut exhausted = allowed.clone();
    exhausted.limits.bandwidth = Some((0, QuotaPeriod::Daily));
    let e = refused(admit.admit(&exhausted).await);
    assert_eq!(e.kind, ErrorKind::QuotaExhausted);
    assert_eq!(
        e.detail,
        "bandwidth quota exhausted: the user's 0 bytes per daily period"
    );
    assert!(admit.admit(&allowed).await.is_ok());
}

#[tokio::test]
async fn a_concurrency_limit_reached_is_a_429_until_a_lease_is_dropped() {
    let (admit, _) = stage(1);
    let client = client(user("alice"), "alice");
    let (held, _) = admit.admit(&client).await.unwrap();
    let e = refused(admit.admit(&client).await);
    assert_eq!(e.kind, ErrorKind::TooManyRequests);
    assert_eq!(e.retry_after, Some(1));
    drop(held);
    assert!(admit.admit(&client).await.is_ok());
}
