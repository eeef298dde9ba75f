//! Issue 12: tenant isolation on the link. Tunnels whose clients stopped
//! reading (their targets still streaming) must not freeze the other tunnels
//! through the same exit. Functional: the fresh download must finish; the
//! time limit only stops a hung test.

use proxynet_tests::client::connect_tunnel;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::targets::{download_server, firehose};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::AsyncReadExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_tunnels_cannot_block_a_fresh_one_through_the_same_exit() {
    stalled_tunnels_and_a_fresh_one(Vec::new()).await;
}

/// The same on a v1 (HTTP/2) link, which adjacent releases still speak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_tunnels_cannot_block_a_fresh_one_on_a_v1_link() {
    stalled_tunnels_and_a_fresh_one(vec!["--link-versions".into(), "1".into()]).await;
}

/// The same with the superproxy's receive budget exhausted by the stalled
/// tunnels: windows shrink, nothing freezes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_receive_budget_still_lets_a_fresh_download_through() {
    stalled_tunnels_and_a_fresh_one_with(Vec::new(), vec!["--link-receive-budget-mb".into(), "2".into()]).await;
}

async fn stalled_tunnels_and_a_fresh_one(agent_args: Vec<String>) {
    stalled_tunnels_and_a_fresh_one_with(agent_args, Vec::new()).await;
}

async fn stalled_tunnels_and_a_fresh_one_with(agent_args: Vec<String>, superproxy_args: Vec<String>) {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec!["127.0.0.2".parse().unwrap()],
        agent_args,
        superproxy_args,
        ..Default::default()
    })
    .await;
    let exit = stack.agents[0].addrs.exit_id.simple();
    let user = format!("{USERNAME}-exit-{exit}");
    let (hose, written) = firehose().await;
    // More stalled tunnels than the old 64 MiB link window had room for at
    // 1 MiB per tunnel.
    let mut stalled = Vec::new();
    for _ in 0..80 {
        let (s, head) = connect_tunnel(stack.proxy_addrs.proxy, &user, PASSWORD, hose).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        stalled.push(s); // never read
    }
    // Wait until the targets can write no more: every window is full.
    let mut last = 0;
    eventually(
        "the stalled tunnels to fill their windows",
        Duration::from_secs(60),
        || {
            let now = written.load(Ordering::Relaxed);
            let settled = now > 80 * (1 << 20) && now == last;
            last = now;
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                settled.then_some(())
            }
        },
    )
    .await;
    let buffered = written.load(Ordering::Relaxed);

    let one_mb = download_server(1_000_000).await;
    let (mut fresh, head) = connect_tunnel(stack.proxy_addrs.proxy, &user, PASSWORD, one_mb).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), fresh.read_to_end(&mut got))
        .await
        .expect("the fresh download froze behind the stalled tunnels")
        .unwrap();
    assert_eq!(got.len(), 1_000_000);
    eprintln!("stalled tunnels held {buffered} bytes between targets and clients");
    drop(stalled);
}
