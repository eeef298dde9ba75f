//! Hostile and broken clients: oversized heads, smuggling-shaped framing,
//! slowloris, too many connections. Each gets a defined answer.

use proxynet_tests::client::{raw_exchange, status_of};
use proxynet_tests::process::Proc;
use proxynet_tests::stack::{spawn_superproxy, SuperproxyArgs};
use proxynet_tests::stores::TestStores;
use std::time::{Duration, Instant};
use superproxy::Addresses;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A superproxy on its own (no exits needed for these answers).
async fn lone_superproxy(extra: SuperproxyArgs) -> (TestStores, Proc, Addresses) {
    let stores = TestStores::create().await;
    let (proc, addrs) = spawn_superproxy(&stores, extra.as_slice()).await;
    (stores, proc, addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_get_431() {
    let (_stores, _proc, addrs) = lone_superproxy(SuperproxyArgs::new()).await;
    let big = format!(
        "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let resp = raw_exchange(addrs.proxy, big.as_bytes(), Duration::from_secs(10)).await;
    assert_eq!(status_of(&resp), 431, "{resp}");
    assert!(
        resp.contains("proxy-status: proxynet; error=http_request_error"),
        "{resp}"
    );

    let many: String = (0..300).map(|i| format!("X-F{i}: v\r\n")).collect();
    let resp = raw_exchange(
        addrs.proxy,
        format!("GET http://example.com/ HTTP/1.1\r\n{many}\r\n").as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status_of(&resp), 431, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_gets_400_with_proxy_status() {
    let (_stores, _proc, addrs) = lone_superproxy(SuperproxyArgs::new()).await;
    for bad in [
        "GET http://example.com/ HTTP/1.1\nHost: example.com\n\n",
        "POST http://example.com/ HTTP/1.1\r\nHost: e\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST http://example.com/ HTTP/1.1\r\nHost: e\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
        "GET http://example.com/ HTTP/1.1\r\nHost: e\r\nX-Folded: a\r\n b\r\n\r\n",
        "GET http://example.com/ HTTP/1.1\r\n: no-name\r\n\r\n",
        "CONNECT example.com:443\r\n HTTP/1.1\r\n\r\n",
        "CONNECT exa\rmple.com:443 HTTP/1.1\r\n\r\n",
    ] {
        let resp = raw_exchange(addrs.proxy, bad.as_bytes(), Duration::from_secs(10)).await;
        assert_eq!(status_of(&resp), 400, "{bad:?}: {resp}");
        assert!(resp.contains("proxy-status: proxynet; error=http_request_error"), "{bad:?}: {resp}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_heads_and_handshakes_are_closed_at_the_header_timeout() {
    let (_stores, _proc, addrs) =
        lone_superproxy(SuperproxyArgs::new().header_read_timeout_ms(700)).await;
    for (what, addr, partial) in [
        (
            "http head",
            addrs.proxy,
            b"GET http://example.com/ HTTP/1.1\r\nHost: exa".as_slice(),
        ),
        ("socks greeting", addrs.socks, b"\x05".as_slice()),
        (
            "socks greeting on the http port",
            addrs.proxy,
            b"\x05\x01".as_slice(),
        ),
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(partial).await.unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 512];
        // The server must close (read returns 0 or an error) well before this bound.
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "{what}: not closed");
        assert!(
            started.elapsed() >= Duration::from_millis(600),
            "{what}: closed before the timeout"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_get_a_clear_503() {
    let (_stores, _proc, addrs) = lone_superproxy(SuperproxyArgs::new().max_connections(2)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addrs.proxy).await.unwrap();
        s.write_all(b"GET").await.unwrap(); // start a head, keep the slot
        held.push(s);
    }
    // Give the accept loop a moment to take both slots: wait until a third is refused.
    let mut refused = String::new();
    for _ in 0..50 {
        refused = raw_exchange(
            addrs.proxy,
            b"GET http://example.com/ HTTP/1.1\r\n\r\n",
            Duration::from_secs(5),
        )
        .await;
        if status_of(&refused) == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status_of(&refused), 503, "{refused}");
    assert!(
        refused.contains("error=connection_limit_reached"),
        "{refused}"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failed_logins_get_429_without_a_password_check() {
    use proxynet_tests::client::curl;
    use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new().auth_failures_per_minute(3).into(),
        ..Default::default()
    })
    .await;
    let wrong = format!(
        "http://{USERNAME}:not-the-password@{}",
        stack.proxy_addrs.proxy
    );
    // Every failed attempt counts, repeated ones too: three are answered 407...
    for _ in 0..3 {
        let r = curl(&["-p", "-x", &wrong, &stack.whoami_url()]).await;
        assert!(r.headers.contains(" 407"), "{}", r.headers);
    }
    // ...and the fourth is over the budget.
    let r = curl(&["-p", "-x", &wrong, &stack.whoami_url()]).await;
    assert!(r.headers.contains(" 429"), "{}", r.headers);
    // Now even the right password is refused from this address until the budget refills.
    let right = format!(
        "http://{USERNAME}:{}@{}",
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.proxy
    );
    let r = curl(&["-p", "-x", &right, &stack.whoami_url()]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(h.contains(" 429"), "{h}");
    assert!(
        h.contains("retry-after:") && h.contains("error=http_request_denied"),
        "{h}"
    );
}
