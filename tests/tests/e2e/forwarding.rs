//! Absolute-form forwarding as an origin sees it: `Expect: 100-continue`
//! is the origin's to answer (a refused upload is not uploaded), and an
//! origin's large response head reaches the client.

use proxynet_tests::stack::{Stack, StackOptions};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An origin that answers `/refuse` with 401 before reading any body,
/// `/accept` with `100 Continue` then 200 once the body is in, and
/// `/cookies` with 150 `Set-Cookie` fields. Counts body bytes it received.
async fn origin() -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let length: u64 = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if head.starts_with("post /refuse") {
                    let _ = s
                        .write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 7\r\nConnection: close\r\n\r\ndenied\n")
                        .await;
                    // Count whatever arrives anyway, for a while.
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(std::time::Duration::from_secs(2), s.read(&mut buf))
                            .await
                    {
                        if n == 0 {
                            break;
                        }
                        counter.fetch_add(n as u64, Ordering::Relaxed);
                    }
                } else if head.starts_with("post /accept") {
                    s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
                    let mut left = length;
                    let mut buf = vec![0u8; 64 * 1024];
                    while left > 0 {
                        let n = s.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        counter.fetch_add(n as u64, Ordering::Relaxed);
                        left -= n as u64;
                    }
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                        .await;
                } else if head.starts_with("get /toomany") {
                    let fields: String = (0..300).map(|i| format!("X-F{i}: v\r\n")).collect();
                    let _ = s
                        .write_all(
                            format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 0\r\n\r\n")
                                .as_bytes(),
                        )
                        .await;
                } else {
                    let cookies: String = (0..150)
                        .map(|i| format!("Set-Cookie: c{i}=v{i}; Path=/\r\n"))
                        .collect();
                    let _ = s
                        .write_all(
                            format!("HTTP/1.1 200 OK\r\n{cookies}Content-Length: 3\r\n\r\nok\n")
                                .as_bytes(),
                        )
                        .await;
                }
            });
        }
    });
    (addr, received)
}

/// curl uploading `file` with `Expect: 100-continue` through `proxy_args`;
/// (final status, bytes curl uploaded, response headers as curl saw them).
async fn upload(proxy_args: &[&str], url: &str, file: &std::path::Path) -> (u16, u64, String) {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "30",
            "-o",
            "/dev/null",
            "-D",
            "/dev/stderr",
        ])
        .args(["-w", "%{http_code} %{size_upload}"])
        .args(["-H", "Expect: 100-continue", "--expect100-timeout", "10"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .args(proxy_args)
        .arg(url)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut parts = stdout.split_whitespace();
    let status = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let sent = parts
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or(u64::MAX);
    (
        status,
        sent,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_refusing_an_upload_gets_no_upload_on_either_listener() {
    let stack = Stack::start_with(StackOptions {
        proxy_tls: true,
        ..Default::default()
    })
    .await;
    let (origin, received) = origin().await;
    let file = stack.dir.path().join("upload.bin");
    std::fs::write(&file, vec![9u8; 5 * 1024 * 1024]).unwrap();
    let ca = stack.tls.as_ref().unwrap().ca.ca_pem.display().to_string();
    let plain = stack.proxy_url();
    let tls = stack.tls_proxy_url();
    for proxy_args in [
        vec!["-x", plain.as_str()],
        vec!["--proxy", tls.as_str(), "--proxy-cacert", ca.as_str()],
    ] {
        received.store(0, Ordering::Relaxed);
        let (status, sent, headers) =
            upload(&proxy_args, &format!("http://{origin}/refuse"), &file).await;
        assert_eq!(status, 401, "{proxy_args:?}: {headers}");
        assert!(sent < 1024 * 1024, "{proxy_args:?}: uploaded {sent} bytes");
        assert!(
            !headers.contains("100 Continue"),
            "{proxy_args:?}: a 100 the origin never sent: {headers}"
        );
        assert!(received.load(Ordering::Relaxed) < 1024 * 1024);

        // An origin that asks for the body gets all of it.
        received.store(0, Ordering::Relaxed);
        let (status, sent, headers) =
            upload(&proxy_args, &format!("http://{origin}/accept"), &file).await;
        assert_eq!(status, 200, "{proxy_args:?}: {headers}");
        assert_eq!(sent, 5 * 1024 * 1024);
        assert!(
            headers.contains("100 Continue"),
            "the origin's 100 relayed: {headers}"
        );
        assert_eq!(received.load(Ordering::Relaxed), 5 * 1024 * 1024);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_answer_with_150_cookies_reaches_the_client_and_300_fields_are_named() {
    let stack = Stack::start().await;
    let (origin, _) = origin().await;
    let r = proxynet_tests::client::curl(&[
        "-x",
        &stack.proxy_url(),
        &format!("http://{origin}/cookies"),
    ])
    .await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let cookies = r
        .headers
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .count();
    assert_eq!(cookies, 150);
    // Past the limit: a 502 that says which one.
    let r = proxynet_tests::client::curl(&[
        "-x",
        &stack.proxy_url(),
        &format!("http://{origin}/toomany"),
    ])
    .await;
    assert_eq!(r.status, 502, "{}", r.headers);
    assert!(r.body.contains("more than 256 header fields"), "{}", r.body);
}

/// `GET http://…` and `GET ws://…` (as aiohttp's `ws_connect(proxy=…)`
/// sends it) through the plain port: the upgrade is forwarded, the origin's
/// `101` and its `Sec-WebSocket-Accept` reach the client, and a frame is
/// echoed; an origin's refusal is relayed as it was sent; `wss://` is a 400
/// that names CONNECT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_through_absolute_form_and_refusals_are_relayed() {
    use base64::Engine;
    let stack = Stack::start().await;
    let origin = proxynet_tests::targets::websocket_echo().await;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        proxynet_tests::stack::USERNAME,
        proxynet_tests::stack::PASSWORD
    ));
    let upgrade_as = |scheme: &str, path: &str| {
        format!(
            "GET {scheme}://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nProxy-Authorization: Basic {auth}\r\n\
             Upgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
    };
    let upgrade = |path: &str| upgrade_as("http", path);
    for scheme in ["http", "ws"] {
        let mut s = tokio::net::TcpStream::connect(stack.proxy_addrs.proxy)
            .await
            .unwrap();
        s.write_all(upgrade_as(scheme, "/ws").as_bytes())
            .await
            .unwrap();
        let head = proxynet_tests::client::read_head(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        let lower = head.to_ascii_lowercase();
        // RFC 6455 §1.3's own example key and answer.
        assert!(
            lower.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
            "{head}"
        );
        assert!(lower.contains("upgrade: websocket"), "{head}");
        // A masked text frame "hello", as a client must send it.
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81, 0x80 | 5];
        frame.extend_from_slice(&mask);
        frame.extend(b"hello".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        s.write_all(&frame).await.unwrap();
        let mut echoed = [0u8; 7];
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            s.read_exact(&mut echoed),
        )
        .await
        .expect("the echo arrives")
        .unwrap();
        assert_eq!(&echoed, b"\x81\x05hello");
        drop(s);
    }

    let wss = proxynet_tests::client::raw_request(
        stack.proxy_addrs.proxy,
        upgrade_as("wss", "/ws").as_bytes(),
        std::time::Duration::from_secs(10),
    )
    .await;
    assert_eq!(wss.status, 400, "{}", wss.head);
    assert!(wss.body.contains("use CONNECT for wss"), "{}", wss.body);

    let refused = proxynet_tests::client::raw_request(
        stack.proxy_addrs.proxy,
        upgrade("/other").as_bytes(),
        std::time::Duration::from_secs(10),
    )
    .await;
    assert_eq!(refused.status, 403, "{}", refused.head);
    assert_eq!(refused.body, "no websocket here");
}
