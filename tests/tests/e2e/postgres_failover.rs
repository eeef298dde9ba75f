//! Postgres failover: with the primary and its standby both named in
//! `--database-url`, the control-api serves reads from the standby while the
//! primary is gone, takes writes again once the standby is promoted, and the
//! usage that waited in Redis meanwhile lands in the ledger exactly once.

use proxynet_tests::client::open_echo_tunnel;
use proxynet_tests::postgres_pair::PostgresPair;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, ADMIN_TOKEN, PASSWORD};
use proxynet_tests::targets::{echo_server, pump};
use std::time::{Duration, Instant};

/// The longest the control-api may take to write again after the promotion:
/// its watch asks every second, a probe waits at most 2 s (docs/deploy.md).
const WRITES_AGAIN_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_takes_over_with_no_gap_or_duplicate_in_the_ledger() {
    let pair = PostgresPair::start().await;
    pair.create_database("failover").await;
    let stack = Stack::start_with(StackOptions {
        database_url: Some(pair.url("failover")),
        superproxy_args: SuperproxyArgs::new().usage_flush_ms(200).into(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("failover").await;
    let user = stack.create_user(account, "steady", PASSWORD).await;
    let proxy = stack.proxy_addrs.proxy;
    let tunnel = || async move {
        pump(open_echo_tunnel(proxy, "steady", echo).await, 10_000).await;
        10_004u64
    };
    let mut moved = 0;
    for _ in 0..5 {
        moved += tunnel().await;
    }
    stack.wait_for_usage(account, user, moved, moved).await;

    pair.stop_primary();
    // Reads come from the standby; writes are refused with a 503.
    let account_path = format!("/v1/accounts/{account}");
    eventually(
        "the control-api to read from the standby",
        Duration::from_secs(15),
        || async {
            let r = stack
                .http
                .get(stack.api(&account_path))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    let write = || async {
        stack
            .http
            .post(stack.api("/v1/accounts"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({"name": "after"}))
            .send()
            .await
            .unwrap()
    };
    let refused = write().await;
    assert_eq!(refused.status(), 503, "a write while no host takes writes");
    // Traffic goes on; its usage waits in the Redis stream.
    for _ in 0..5 {
        moved += tunnel().await;
    }

    pair.promote_standby();
    let promoted = Instant::now();
    eventually(
        "the control-api to take writes again",
        WRITES_AGAIN_WITHIN,
        || async { (write().await.status() == 201).then_some(()) },
    )
    .await;
    eprintln!(
        "the control-api took writes {:?} after the promotion",
        promoted.elapsed()
    );
    for _ in 0..5 {
        moved += tunnel().await;
    }
    // Every byte once: nothing lost while Postgres was away, nothing
    // recorded twice when the waiting batches landed.
    stack.wait_for_usage(account, user, moved, moved).await;
}
