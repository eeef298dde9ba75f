//! Link versions. A superproxy and an agent of adjacent releases
//! agree on the newest link version both speak; peers restricted with
//! `--link-versions 1` put exactly the v1 wire on the link (no version
//! fields), so these are the previous release as far as the other side can
//! tell. Peers with no version in common refuse each other, and say why.

use proxynet_tests::client::{connect_tunnel, curl};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::targets::echo_server;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn versions(v: &str) -> Vec<String> {
    vec!["--link-versions".into(), v.into()]
}

/// A tunnel through the stack's only exit carries a request and 3 MB each
/// way (more than a stream's credit), half-close included.
async fn tunnels_work(stack: &Stack) {
    let r = curl(&["-x", &stack.proxy_url(), &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let echo = echo_server().await;
    let (mut tunnel, head) =
        connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
    let (mut read, mut write) = tunnel.split();
    let sent = payload.clone();
    let (_, echoed) = tokio::join!(
        async move {
            write.write_all(&sent).await.unwrap();
            write.shutdown().await.unwrap();
        },
        async move {
            let mut echoed = Vec::new();
            read.read_to_end(&mut echoed).await.unwrap();
            echoed
        }
    );
    assert!(echoed == payload, "echoed {} bytes", echoed.len());
}

async fn link_version(stack: &Stack) -> u64 {
    let pool = stack.pool().await;
    pool["eligible"][0]["link_version"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_superproxy_and_agent_speak_v2() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec!["127.0.0.2".parse().unwrap()],
        ..Default::default()
    })
    .await;
    assert_eq!(link_version(&stack).await, 2);
    tunnels_work(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_superproxy_serves_a_v1_agent_in_v1() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec!["127.0.0.2".parse().unwrap()],
        agent_args: versions("1"),
        ..Default::default()
    })
    .await;
    assert_eq!(link_version(&stack).await, 1);
    tunnels_work(&stack).await;
    // Datagrams need the v2 mux: with only a v1 link, UDP ASSOCIATE is
    // refused with "network unreachable" and the detail, not left hanging.
    let mut control =
        proxynet_tests::client::socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
            .await
            .unwrap();
    control
        .write_all(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let mut reply = [0u8; 10];
    tokio::time::timeout(Duration::from_secs(10), control.read_exact(&mut reply))
        .await
        .expect("UDP ASSOCIATE is answered")
        .unwrap();
    assert_eq!(reply[..2], [5, 3], "{reply:?}");
    let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "TCP still works: {}", r.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_agent_serves_a_v1_superproxy_in_v1() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec!["127.0.0.2".parse().unwrap()],
        superproxy_args: versions("1"),
        ..Default::default()
    })
    .await;
    assert_eq!(link_version(&stack).await, 1);
    tunnels_work(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_with_no_common_version_refuse_each_other_and_log_why() {
    let logs = tempfile::tempdir().unwrap();
    let mut stack = Stack::start_with(StackOptions {
        egress_ips: Vec::new(),
        superproxy_args: versions("1"),
        agent_args: versions("2"),
        log_dir: Some(logs.path().to_owned()),
        ..Default::default()
    })
    .await;
    stack.add_agent("127.0.0.2".parse().unwrap()).await;
    let reason = "no common link version: the agent speaks [2], this superproxy speaks [1]";
    let agent_log = logs.path().join("exit-agent-127.0.0.2.log");
    let proxy_log = logs.path().join("superproxy.log");
    eventually(
        "both sides to log the refusal",
        Duration::from_secs(30),
        || {
            let agent = std::fs::read_to_string(&agent_log).unwrap_or_default();
            let proxy = std::fs::read_to_string(&proxy_log).unwrap_or_default();
            async move {
                (agent.contains("superproxy refused the link")
                    && agent.contains(reason)
                    && proxy.contains("agent link refused")
                    && proxy.contains(reason))
                .then_some(())
            }
        },
    )
    .await;
    assert_eq!(stack.eligible_count().await, 0);
}
