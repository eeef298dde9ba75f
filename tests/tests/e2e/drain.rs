//! Draining on SIGTERM: a superproxy drains in order and bills every byte;
//! an agent lets its open tunnels finish.

use proxynet_tests::client::open_echo_tunnel;
use proxynet_tests::client::{connect_tunnel, curl};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::targets::{echo_round_trip, echo_server};
use proxynet_tests::whoami::Seen;
use std::time::Duration;
use tokio::net::TcpStream;

/// SIGTERM: readiness red while still serving, then listeners closed,
/// open tunnels finish, every byte in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superproxy_sigterm_drains_in_order_and_bills_every_byte() {
    let mut stack = Stack::start_with(StackOptions {
        superproxy_env: vec![
            ("PROXYNET_DRAIN_DELAY_MS".into(), "3000".into()),
            ("PROXYNET_DRAIN_TIMEOUT_MS".into(), "20000".into()),
        ],
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("drain").await;
    let user = stack.create_user(account, "drainer", PASSWORD).await;
    let mut tunnel = open_echo_tunnel(stack.proxy_addrs.proxy, "drainer", echo).await;
    stack.proxy.signal(libc::SIGTERM);
    let readyz = format!("http://{}/readyz", stack.proxy_addrs.admin);
    eventually("readiness to go red", Duration::from_secs(2), || async {
        let r = stack.http.get(&readyz).send().await.ok()?;
        (r.status() == 503 && r.text().await.ok()?.contains("draining")).then_some(())
    })
    .await;
    // Still serving during the delay: the open tunnel and a new one.
    echo_round_trip(&mut tunnel, b"during the delay")
        .await
        .unwrap();
    let mut late = open_echo_tunnel(stack.proxy_addrs.proxy, "drainer", echo).await;
    // Then the listeners close: new connections are refused, not queued.
    eventually("the listener to close", Duration::from_secs(10), || async {
        TcpStream::connect(stack.proxy_addrs.proxy)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    echo_round_trip(&mut tunnel, b"after the listeners closed")
        .await
        .unwrap();
    echo_round_trip(&mut late, b"still here").await.unwrap();
    drop(late);
    drop(tunnel);
    let status = stack.proxy.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}");
    let bytes = (4 + 16 + 26 + 4 + 10) as u64;
    stack.wait_for_usage(account, user, bytes, bytes).await;
}

/// An agent's SIGTERM: out of the pool first, open tunnels finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sigterm_lets_open_tunnels_finish() {
    let mut stack = Stack::start().await;
    let echo = echo_server().await;
    // Find a tunnel through agent 0.
    let exit0 = stack.agents[0].addrs.exit_id.to_string();
    let mut tunnel = loop {
        let (mut s, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
        if head.to_ascii_lowercase().contains(&exit0) {
            echo_round_trip(&mut s, b"x").await.unwrap();
            break s;
        }
    };
    stack.agents[0].proc.signal(libc::SIGTERM);
    stack.wait_eligible(1).await;
    for _ in 0..5 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            seen.peer.ip(),
            stack.agents[1].egress_ip,
            "new tunnels avoid the draining exit"
        );
    }
    echo_round_trip(&mut tunnel, b"still flowing while draining")
        .await
        .unwrap();
    drop(tunnel);
    let status = stack.agents[0]
        .proc
        .wait_exit(Duration::from_secs(30))
        .await;
    assert!(status.success(), "{status:?}");
}
