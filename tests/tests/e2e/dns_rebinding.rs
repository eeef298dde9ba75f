//! DNS rebinding: a name that answers an allowed address once and a denied
//! one the next time never gets a tunnel to the denied one. The exit
//! resolves once per tunnel, vets the answer, and connects to what it
//! vetted.

use proxynet_tests::dns::TestDns;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::targets::echo_round_trip;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_name_never_reaches_its_second_answer() {
    // The allowed target, and a denied one on the same port that counts
    // every connection that reaches it.
    // The agent protects the stack's own services on every loopback address
    // (`localhost:<port>` is `127.0.0.1:<port>`), so the port is also held on
    // 127.0.0.1 for the whole test: no service of the stack can land on it.
    let (allowed, port, _held) = loop {
        let allowed = TcpListener::bind("127.0.0.5:0").await.unwrap();
        let port = allowed.local_addr().unwrap().port();
        if let Ok(held) = TcpListener::bind(("127.0.0.1", port)).await {
            break (allowed, port, held);
        }
    };
    let denied = TcpListener::bind(("127.0.0.66", port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = allowed.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let reached_denied = Arc::new(AtomicUsize::new(0));
    let counter = reached_denied.clone();
    tokio::spawn(async move {
        while let Ok(_conn) = denied.accept().await {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let dns = TestDns::start(vec![
        "127.0.0.5".parse().unwrap(),
        "127.0.0.66".parse().unwrap(),
    ])
    .await;
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec!["127.0.0.2".parse().unwrap()],
        agent_args: vec![
            "--dns-server".into(),
            dns.addr.to_string(),
            "--egress-deny".into(),
            "127.0.0.66/32".into(),
        ],
        ..Default::default()
    })
    .await;
    let target = format!("rebind.test:{port}");
    let connect = |stack: &Stack| {
        let proxy = stack.proxy_addrs.proxy;
        let target = target.clone();
        async move {
            use base64::Engine;
            use tokio::io::AsyncWriteExt;
            let auth =
                base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"));
            let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
            s.write_all(
                format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
            let head = proxynet_tests::client::read_head(&mut s).await;
            (s, head)
        }
    };
    // First answer: allowed, vetted, connected.
    let (mut first, head) = connect(&stack).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_round_trip(&mut first, b"vetted").await.unwrap();
    assert!(dns.a_queries() >= 1);
    // The name now answers the denied address: refused, never dialled.
    let (_, head) = connect(&stack).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("destination_ip_prohibited"), "{head}");
    assert_eq!(reached_denied.load(Ordering::Relaxed), 0);
    // And the tunnel opened before the rebinding still talks to what it vetted.
    echo_round_trip(&mut first, b"same host").await.unwrap();
}
