//! Bounds one client cannot push past: connections that never log in (per
//! source address, and in time), tunnels of a user without limits of its
//! own, live sticky sessions per user; and the IPv4-translated IPv6 spelling
//! of a denied address.

use proxynet_tests::client::{connect_tunnel, raw_request};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

/// Whether the server has closed `s` (EOF or reset), as far as has arrived
/// by now: a non-blocking look, for polling many sockets at once.
fn closed_now(s: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match s.try_read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Whether the server has closed `s`, waiting a little for one still open.
async fn closed(s: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_millis(200), s.read(&mut byte)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

fn basic(user: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{PASSWORD}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_from_one_address_hold_at_most_their_share() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: vec!["--unauthenticated-timeout-ms".into(), "4000".into()],
        ..Default::default()
    })
    .await;
    let proxy = stack.proxy_addrs.proxy;
    let mut silent = Vec::with_capacity(300);
    for _ in 0..300 {
        silent.push(TcpStream::connect(proxy).await.unwrap());
    }
    // Every connection beyond 64 is closed at once.
    let held = eventually(
        "the connections over the bound to be closed",
        Duration::from_secs(5),
        || async {
            let open = silent.iter().filter(|s| !closed_now(s)).count();
            (open <= 64).then_some(open)
        },
    )
    .await;
    assert_eq!(held, 64, "exactly the bound is held");
    // Another address is served at once, beside them.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.9:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(proxy).await.unwrap();
    use tokio::io::AsyncWriteExt;
    other
        .write_all(
            format!(
                "CONNECT {} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
                stack.whoami,
                basic(USERNAME)
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let head = proxynet_tests::client::read_head(&mut other).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The silent ones are let go at the pre-auth deadline; the tunnel stays.
    eventually(
        "the silent connections to be cut at their deadline",
        Duration::from_secs(8),
        || async { silent.iter().all(closed_now).then_some(()) },
    )
    .await;
    assert!(
        !closed(&mut other).await,
        "the authenticated tunnel was cut"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_limits_meets_the_default_cap_and_sessions_are_capped() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: vec![
            "--default-user-max-tunnels".into(),
            "2".into(),
            "--max-sessions-per-user".into(),
            "3".into(),
        ],
        ..Default::default()
    })
    .await;
    let proxy = stack.proxy_addrs.proxy;
    let (_a, h1) = connect_tunnel(proxy, USERNAME, PASSWORD, stack.whoami).await;
    let (_b, h2) = connect_tunnel(proxy, USERNAME, PASSWORD, stack.whoami).await;
    assert!(h1.starts_with("HTTP/1.1 200") && h2.starts_with("HTTP/1.1 200"));
    let (_, refused) = connect_tunnel(proxy, USERNAME, PASSWORD, stack.whoami).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(
        refused.contains("default per-user tunnel limit (2)"),
        "{refused}"
    );
    drop((_a, _b));

    // Three sessions are fine; the fourth is refused; the first still works.
    let tunnel = |session: &str| {
        let user = format!("{USERNAME}-session-{session}");
        let whoami = stack.whoami;
        async move {
            eventually("a tunnel slot", Duration::from_secs(5), || async {
                let (_, head) = connect_tunnel(proxy, &user, PASSWORD, whoami).await;
                (!head.contains("default per-user")).then_some(head)
            })
            .await
        }
    };
    for s in ["s1", "s2", "s3"] {
        let head = tunnel(s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{s}: {head}");
    }
    let head = tunnel("s4").await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(head.contains("live sessions"), "{head}");
    let head = tunnel("s1").await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "an existing session: {head}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ipv4_translated_spelling_of_loopback_is_prohibited() {
    let stack = Stack::start().await;
    let connect = format!(
        "CONNECT [::ffff:0:7f00:1]:80 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic(USERNAME)
    );
    let r = raw_request(
        stack.proxy_addrs.proxy,
        connect.as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert!(
        r.header("proxy-status")
            .unwrap_or_default()
            .contains("destination_ip_prohibited"),
        "{r:?}"
    );
}
