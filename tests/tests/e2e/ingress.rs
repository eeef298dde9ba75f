//! Every ingress a real client uses: SOCKS5 (own port and peeked on the HTTP
//! port), absolute-form HTTP with header hygiene, CONNECT — and the typed
//! answers when the target or the policy says no.

use proxynet_tests::client::{curl, raw_exchange, socks5, status_of};
use proxynet_tests::stack::{
    redis_service_addr, Stack, StackOptions, SuperproxyArgs, PASSWORD, USERNAME,
};
use proxynet_tests::whoami::Seen;
use std::collections::HashSet;
use std::time::Duration;
use tokio::net::TcpListener;

fn exit_ips() -> HashSet<String> {
    ["127.0.0.2", "127.0.0.3"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn basic_auth() -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"))
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5h_tunnels_leave_from_an_exit_on_both_ports() {
    let stack = Stack::start().await;
    let target = format!("http://localhost:{}/", stack.whoami.port());
    let mut seen = HashSet::new();
    for proxy in [
        stack.socks_url(),
        stack.socks_url().replace(
            &stack.proxy_addrs.socks.to_string(),
            &stack.proxy_addrs.proxy.to_string(),
        ),
    ] {
        for _ in 0..6 {
            let r = curl(&["-x", &proxy, &target]).await;
            assert_eq!(r.status, 200, "{proxy}: {} {}", r.body, r.headers);
            let who: Seen = serde_json::from_str(&r.body).unwrap();
            seen.insert(who.peer.ip().to_string());
        }
    }
    assert!(seen.is_subset(&exit_ips()) && !seen.is_empty(), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_strips_hop_by_hop_headers_and_adds_nothing() {
    let stack = Stack::start().await;
    let r = curl(&[
        "-x",
        &stack.proxy_url(),
        "-H",
        "Connection: X-Hop",
        "-H",
        "X-Hop: secret-hop",
        "-H",
        "Keep-Alive: timeout=5",
        "-H",
        "Proxy-Connection: keep-alive",
        "-H",
        "X-End-To-End: kept",
        &stack.whoami_url(),
    ])
    .await;
    assert_eq!(r.status, 200, "{} {}", r.body, r.headers);
    assert!(
        r.headers.to_ascii_lowercase().contains("proxynet-exit:"),
        "{}",
        r.headers
    );
    let seen: Seen = serde_json::from_str(&r.body).unwrap();
    assert!(exit_ips().contains(&seen.peer.ip().to_string()));
    for gone in [
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "via",
        "x-forwarded-for",
        "forwarded",
    ] {
        assert!(
            !seen.has_header(gone),
            "{gone} reached the target: {:?}",
            seen.headers
        );
    }
    assert!(seen.has_header("x-end-to-end"));
    assert_eq!(seen.target, "/", "origin-form upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_stream_whole_in_both_framings() {
    let stack = Stack::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("body.bin");
    std::fs::write(&file, vec![b'x'; 100 * 1024]).unwrap();
    let data = format!("@{}", file.display());
    let with_length = curl(&[
        "-x",
        &stack.proxy_url(),
        "--data-binary",
        &data,
        &stack.whoami_url(),
    ])
    .await;
    let chunked = curl(&[
        "-x",
        &stack.proxy_url(),
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        &data,
        &stack.whoami_url(),
    ])
    .await;
    for r in [with_length, chunked] {
        assert_eq!(r.status, 200, "{}", r.headers);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_eq!(seen.body_bytes, 100 * 1024);
        assert_eq!(seen.method, "POST");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_clients_rotate_per_request() {
    let stack = Stack::start().await;
    // One curl process, one client connection, twelve requests.
    let url = stack.whoami_url();
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), 12).collect();
    let proxy = stack.proxy_url();
    let mut args = vec!["-x", proxy.as_str()];
    args.extend(urls);
    let r = curl(&args).await;
    assert_eq!(r.status, 200);
    // curl prints each response body followed by its status line (-w).
    let bodies = r.body.replace("\n200", "");
    let peers: HashSet<String> = serde_json::Deserializer::from_str(&bodies)
        .into_iter::<Seen>()
        .map(|seen| seen.unwrap().peer.ip().to_string())
        .collect();
    assert_eq!(
        peers,
        exit_ips(),
        "rotating mode spreads requests of one connection over exits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_targets_get_502_connection_refused_everywhere() {
    let stack = Stack::start().await;
    let port = closed_port().await;
    let connect = curl(&[
        "-p",
        "-x",
        &stack.proxy_url(),
        &format!("http://127.0.0.1:{port}/"),
    ])
    .await;
    let h = connect.headers.to_ascii_lowercase();
    assert!(h.contains(" 502"), "{h}");
    assert!(
        h.contains("proxy-status: proxynet; error=connection_refused"),
        "{h}"
    );

    let absolute = curl(&[
        "-x",
        &stack.proxy_url(),
        &format!("http://127.0.0.1:{port}/"),
    ])
    .await;
    assert_eq!(absolute.status, 502);
    assert!(absolute
        .headers
        .to_ascii_lowercase()
        .contains("error=connection_refused"));

    let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
        .await
        .unwrap();
    assert_eq!(socks5::request(&mut s, 1, "127.0.0.1", port).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stacks_own_services_are_denied_in_every_spelling_without_a_connection() {
    // A decoy protected service we can watch for connections.
    let decoy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let decoy_port = decoy.local_addr().unwrap().port();
    let accepts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let accepts = accepts.clone();
        tokio::spawn(async move {
            while decoy.accept().await.is_ok() {
                accepts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    }
    let stack = Stack::start_with(StackOptions {
        protected: vec![format!("127.0.0.1:{decoy_port}")],
        ..Default::default()
    })
    .await;

    let redis_port: u16 = redis_service_addr()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    for port in [redis_port, decoy_port] {
        for host in [
            "127.0.0.1",
            "127.1",
            "0x7f.1",
            "2130706433",
            "0177.0.0.1",
            "0x7f000001",
            "[::ffff:127.0.0.1]",
            "localhost",
        ] {
            let url = format!("http://{host}:{port}/");
            let connect = curl(&["-p", "-x", &stack.proxy_url(), &url]).await;
            assert!(
                connect.headers.contains(" 403"),
                "CONNECT {url}: {}",
                connect.headers
            );
            assert!(
                connect.headers.contains("error=destination_ip_prohibited"),
                "{}",
                connect.headers
            );
            let absolute = curl(&["-x", &stack.proxy_url(), &url]).await;
            assert_eq!(
                absolute.status, 403,
                "absolute-form {url}: {}",
                absolute.headers
            );
        }
        for host in ["127.0.0.1", "localhost", "2130706433", "127.1"] {
            let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
                .await
                .unwrap();
            assert_eq!(
                socks5::request(&mut s, 1, host, port).await,
                2,
                "SOCKS {host}:{port}"
            );
        }
    }
    assert_eq!(
        accepts.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a denied target was connected to"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_bind_gets_reply_7_and_bad_credentials_fail_auth() {
    let stack = Stack::start().await;
    let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
        .await
        .unwrap();
    assert_eq!(socks5::request(&mut s, 2, "127.0.0.1", 80).await, 7);
    let refused = socks5::login(stack.proxy_addrs.socks, USERNAME, "wrong-password").await;
    assert!(matches!(refused, Err(status) if status != 0));
    let refused = socks5::login(stack.proxy_addrs.socks, "nobody", PASSWORD).await;
    assert!(matches!(refused, Err(status) if status != 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_a_forward_proxy_must_not_carry() {
    let stack = Stack::start().await;
    let proxy = stack.proxy_addrs.proxy;
    let auth = basic_auth();
    let trace = raw_exchange(
        proxy,
        format!(
            "TRACE http://{}/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
            stack.whoami
        )
        .as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status_of(&trace), 405, "{trace}");
    assert!(
        trace.contains("proxy-status: proxynet; error=http_request_denied"),
        "{trace}"
    );

    let options = raw_exchange(
        proxy,
        format!("OPTIONS http://{}/ HTTP/1.1\r\nHost: x\r\nMax-Forwards: 0\r\nProxy-Authorization: Basic {auth}\r\n\r\n", stack.whoami).as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status_of(&options), 200, "{options}");
    assert!(
        options.to_ascii_lowercase().contains("allow:"),
        "answered by the proxy itself: {options}"
    );
    assert!(
        !options.contains("proxynet-exit"),
        "Max-Forwards: 0 must not be forwarded: {options}"
    );

    let forwarded = curl(&[
        "-x",
        &stack.proxy_url(),
        "-X",
        "OPTIONS",
        "-H",
        "Max-Forwards: 3",
        &stack.whoami_url(),
    ])
    .await;
    let seen: Seen = serde_json::from_str(&forwarded.body).unwrap();
    let max = seen
        .headers
        .iter()
        .find(|(n, _)| n == "max-forwards")
        .map(|(_, v)| v.clone());
    assert_eq!(max.as_deref(), Some("2"));

    let origin = raw_exchange(
        proxy,
        format!("GET / HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n")
            .as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(status_of(&origin), 400, "{origin}");
    assert!(
        origin.contains("proxy-status: proxynet; error=http_request_error"),
        "{origin}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_refused_before_dialling_are_retried_on_another_exit() {
    // 192.0.2.1 (TEST-NET-1) is not an address of this host: that agent's
    // bind fails, it answers `egress_unavailable` without touching the target,
    // and the superproxy retries on the healthy exit.
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec!["127.0.0.2".parse().unwrap(), "192.0.2.1".parse().unwrap()],
        ..Default::default()
    })
    .await;
    for _ in 0..10 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{} {}", r.body, r.headers);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_eq!(seen.peer.ip().to_string(), "127.0.0.2");
    }
}

/// A loopback target that never completes a handshake: its accept queue is
/// full, so further SYNs are dropped and connects time out.
async fn blackhole_target() -> (
    tokio::net::TcpListener,
    Vec<tokio::net::TcpStream>,
    std::net::SocketAddr,
) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    // Fill the accept queue (backlog + 1 on Linux) without accepting.
    for _ in 0..4 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            fillers.push(s);
        }
    }
    (listener, fillers, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_never_answers_gets_504_from_the_exit_within_the_budget() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new().connect_budget_ms(1500).into(),
        ..Default::default()
    })
    .await;
    let (_listener, _fillers, target) = blackhole_target().await;
    let started = std::time::Instant::now();
    let r = curl(&["-p", "-x", &stack.proxy_url(), &format!("http://{target}/")]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(h.contains(" 504"), "{h}");
    assert!(h.contains("error=connection_timeout"), "{h}");
    // The exit gave up first (budget minus its margin), not the client.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );

    let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
        .await
        .unwrap();
    assert_eq!(
        socks5::request(&mut s, 1, "127.0.0.1", target.port()).await,
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_replies_for_no_exit_and_bad_address_types() {
    let stack = Stack::start().await;
    // No exit matches the targeting: network unreachable (3).
    let mut s = socks5::login(
        stack.proxy_addrs.socks,
        &format!("{USERNAME}-type-res"),
        PASSWORD,
    )
    .await
    .unwrap();
    assert_eq!(
        socks5::request(&mut s, 1, "127.0.0.1", stack.whoami.port()).await,
        3
    );
    // An address type RFC 1928 does not define: 8.
    let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(&[5, 1, 0, 9, 1, 2, 3, 4, 0, 80]).await.unwrap();
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply, [5, 8]);
}

/// Reads one response head byte by byte (nothing past it), plus its body when
/// it has a Content-Length.
async fn read_response(s: &mut tokio::net::TcpStream) -> (String, String) {
    use tokio::io::AsyncReadExt;
    let head = proxynet_tests::client::read_head(s).await;
    assert!(head.ends_with("\r\n\r\n"), "closed mid-head: {head:?}");
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await.unwrap();
    (head, String::from_utf8(body).unwrap())
}

/// A CONNECT refused for want of credentials leaves the connection open for
/// the retry with them (what curl's --proxy-anyauth and browsers do) — also
/// when the retry was pipelined behind the refused request — and the retry's
/// tunnel works. A client that asked to close gets the refusal and the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connect_keeps_the_connection_for_the_retry() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stack = Stack::start().await;
    let echo = proxynet_tests::targets::echo_server().await;
    let bare = format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n");
    let authed = format!(
        "CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic_auth()
    );
    for pipelined in [false, true] {
        let mut s = tokio::net::TcpStream::connect(stack.proxy_addrs.proxy)
            .await
            .unwrap();
        if pipelined {
            s.write_all(format!("{bare}{authed}").as_bytes())
                .await
                .unwrap();
        } else {
            s.write_all(bare.as_bytes()).await.unwrap();
        }
        let (head, body) = read_response(&mut s).await;
        assert_eq!(status_of(&head), 407, "{head}");
        assert!(
            head.to_ascii_lowercase().contains("proxy-status: "),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("proxy-authenticate: basic"),
            "{head}"
        );
        assert!(!body.is_empty(), "the refusal explains itself");
        if !pipelined {
            s.write_all(authed.as_bytes()).await.unwrap();
        }
        let (head, _) = read_response(&mut s).await;
        assert_eq!(status_of(&head), 200, "pipelined={pipelined}: {head}");
        s.write_all(b"ping through the retry").await.unwrap();
        let mut echoed = [0u8; 22];
        s.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"ping through the retry");
    }

    let mut s = tokio::net::TcpStream::connect(stack.proxy_addrs.proxy)
        .await
        .unwrap();
    s.write_all(format!("CONNECT {echo} HTTP/1.1\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (head, _) = read_response(&mut s).await;
    assert_eq!(status_of(&head), 407, "{head}");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "not closed: {closed:?} {rest:?}"
    );
}
