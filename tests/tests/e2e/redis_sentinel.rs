//! Redis under Sentinel: the binaries find the master through the
//! sentinels, keep serving while it dies, follow the promoted replica, and
//! the ledger ends up with exactly the bytes that moved.

use proxynet_tests::client::{
    assert_gateway_error, basic_credential, open_echo_tunnel, raw_request,
};
use proxynet_tests::sentinel::{SentinelGroup, MASTER_NAME};
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, PASSWORD};
use proxynet_tests::targets::{echo_server, pump};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bytes each tunnel of the traffic loop moves each way (after the 4-byte
/// `ping` that proves it open).
const PER_TUNNEL: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_mid_traffic_loses_no_tunnel_and_no_byte() {
    let mut group = SentinelGroup::start().await;
    let stack = Stack::start_with(StackOptions {
        redis_url: Some(group.urls()),
        redis_sentinel_master: Some(MASTER_NAME.to_owned()),
        // The exits' own check is what refuses the data nodes below.
        superproxy_protects_redis: false,
        superproxy_args: SuperproxyArgs::new().usage_flush_ms(200).into(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("sentinel").await;
    let user = stack.create_user(account, "watched", PASSWORD).await;

    // `--redis-url` names only the sentinels; the master and the replica
    // they name are protected all the same.
    for port in [group.master_port, group.replica_port] {
        let auth = basic_credential("watched", PASSWORD);
        let connect = format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
        );
        let r = raw_request(
            stack.proxy_addrs.proxy,
            connect.as_bytes(),
            Duration::from_secs(10),
        )
        .await;
        assert_gateway_error(&r, 403, "destination_ip_prohibited");
    }

    // Tunnels one after another for the whole test, each checked end to end.
    let proxy = stack.proxy_addrs.proxy;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn({
        let (done, stop) = (done.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                pump(open_echo_tunnel(proxy, "watched", echo).await, PER_TUNNEL).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let opened_by = |count: u64| {
        let done = done.clone();
        async move {
            proxynet_tests::process::eventually(
                &format!("{count} tunnels through the gateway"),
                Duration::from_secs(30),
                || async { (done.load(Ordering::Relaxed) >= count).then_some(()) },
            )
            .await
        }
    };
    opened_by(20).await;

    group.kill_master();
    let (killed, at_kill) = (std::time::Instant::now(), done.load(Ordering::Relaxed));
    group.wait_for_failover(Duration::from_secs(30)).await;
    eprintln!(
        "the sentinels promoted the replica {:?} after the master died; {} tunnels opened meanwhile",
        killed.elapsed(),
        done.load(Ordering::Relaxed) - at_kill
    );
    // Tunnels kept opening through the failover and go on after it.
    opened_by(at_kill + 40).await;

    // The control-api writes to the new master and the superproxy reads it
    // there: a user created now logs in.
    let newcomer = stack.create_user(account, "newcomer", PASSWORD).await;
    pump(open_echo_tunnel(proxy, "newcomer", echo).await, 1_000).await;

    stop.store(true, Ordering::Relaxed);
    traffic.await.expect("every tunnel carried its bytes");
    let tunnels = done.load(Ordering::Relaxed);
    let each_way = tunnels * (4 + PER_TUNNEL as u64);
    stack
        .wait_for_usage(account, user, each_way, each_way)
        .await;
    stack.wait_for_usage(account, newcomer, 1_004, 1_004).await;
}
