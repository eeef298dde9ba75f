//! CONNECT tunnels: each holds its connection permit for its whole life,
//! and bytes pipelined behind the request head reach the target.

use proxynet_tests::client::open_echo_tunnel;
use proxynet_tests::client::{connect_tunnel, raw_request, status_of};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, PASSWORD, USERNAME};
use proxynet_tests::targets::echo_server;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// A CONNECT tunnel holds its connection permit for its whole life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connect_tunnels_count_against_max_connections() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new().max_connections(2).into(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let first = open_echo_tunnel(stack.proxy_addrs.proxy, USERNAME, echo).await;
    let _second = open_echo_tunnel(stack.proxy_addrs.proxy, USERNAME, echo).await;
    let third = raw_request(
        stack.proxy_addrs.proxy,
        b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(third.status, 503, "{third:?}");
    assert!(third.header("retry-after").is_some(), "{third:?}");
    assert!(
        third
            .header("proxy-status")
            .unwrap_or_default()
            .contains("connection_limit_reached"),
        "{third:?}"
    );
    // Closing a tunnel frees its permit.
    drop(first);
    eventually("a permit to free", Duration::from_secs(10), || async {
        let (s, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
        head.starts_with("HTTP/1.1 200").then_some(s)
    })
    .await;
}

/// Tunnel bytes pipelined in the CONNECT request's own write arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_bytes_in_the_connect_write_reach_the_target() {
    let stack = Stack::start().await;
    let echo = echo_server().await;
    let mut s = TcpStream::connect(stack.proxy_addrs.proxy).await.unwrap();
    let payload: [u8; 16] = [
        0x16, 0x03, 0x01, 0x00, 0x0a, b'\n', b'\r', 0x00, 0xff, b'G', b'E', b'T', b' ', b'\n',
        b'\n', 0x01,
    ];
    let mut write = format!(
        "CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic(USERNAME, PASSWORD)
    )
    .into_bytes();
    write.extend_from_slice(&payload);
    s.write_all(&write).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert_eq!(status_of(&String::from_utf8_lossy(&head)), 200);
    let mut back = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
        .await
        .expect("the target answered")
        .unwrap();
    assert_eq!(back, payload);
}
