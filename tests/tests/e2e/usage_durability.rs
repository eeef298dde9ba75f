//! Usage loses nothing: batches spill to disk while Redis is away and are
//! replayed once; quota counters advance once per batch.

use proxynet_tests::client::open_echo_tunnel;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, PASSWORD};
use proxynet_tests::stores::OwnRedis;
use proxynet_tests::targets::{echo_server, pump};
use std::time::Duration;

/// Usage outlives a Redis outage longer than memory holds: spilled to
/// disk, replayed, counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_spills_to_disk_during_a_redis_outage_and_is_replayed_once() {
    let spill = tempfile::tempdir().unwrap();
    let mut redis = OwnRedis::start().await;
    let stack = Stack::start_with(StackOptions {
        redis_url: Some(redis.url()),
        superproxy_args: SuperproxyArgs::new()
            .usage_spill_dir(spill.path())
            .usage_memory_batches(1)
            .usage_flush_ms(200)
            .into(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("spill").await;
    let user = stack.create_user(account, "spiller", PASSWORD).await;
    pump(
        open_echo_tunnel(stack.proxy_addrs.proxy, "spiller", echo).await,
        1_000,
    )
    .await;

    redis.stop();
    for _ in 0..5 {
        pump(
            open_echo_tunnel(stack.proxy_addrs.proxy, "spiller", echo).await,
            100_000,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    eventually("batches to be spilled", Duration::from_secs(10), || async {
        let files = std::fs::read_dir(spill.path()).ok()?.count();
        (files > 0).then_some(())
    })
    .await;
    redis.restart().await;
    let total = (4 + 1_000 + 5 * (4 + 100_000)) as u64;
    stack.wait_for_usage(account, user, total, total).await;
    eventually(
        "the spill file to be replayed and removed",
        Duration::from_secs(10),
        || async { (std::fs::read_dir(spill.path()).ok()?.count() == 0).then_some(()) },
    )
    .await;
}

/// A batch re-sent after a lost reply advances a quota counter once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_counters_advance_once_per_batch() {
    let stores = proxynet_tests::stores::TestStores::create().await;
    let mut redis = stores.redis().await;
    let counter = format!("{}quota:{{u1}}:m202611", stores.redis_prefix);
    let applied = format!("{counter}:applied");
    let script = redis::Script::new(superproxy::ADD_ONCE_SCRIPT);
    let mut totals = Vec::new();
    for seq in [1u64, 1, 2] {
        let total: u64 = script
            .key(&counter)
            .key(&applied)
            .arg(1_000)
            .arg(4_102_444_800i64)
            .arg("sp-1")
            .arg(seq)
            .invoke_async(&mut redis)
            .await
            .unwrap();
        totals.push(total);
    }
    let (first, resent, next) = (totals[0], totals[1], totals[2]);
    assert_eq!((first, resent, next), (1_000, 1_000, 2_000));
}
