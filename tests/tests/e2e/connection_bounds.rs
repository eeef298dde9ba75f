//! Bounds one client cannot push past: connections that never log in (per
//! source address, and in time) — while a burst from one address that does
//! log in is served whole —, tunnels of a user without limits of its own,
//! live sticky sessions per user; and the IPv4-translated IPv6 spelling of a
//! denied address.

use proxynet_tests::client::{connect_tunnel, raw_request, read_head};
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, PASSWORD, USERNAME};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// `proxynet_unauthenticated_connections{state}` on the stack's superproxy.
async fn unauthenticated(stack: &Stack, state: &str) -> f64 {
    let text = scrape(&stack.http, stack.proxy_addrs.admin).await;
    sample(
        &text,
        "proxynet_unauthenticated_connections",
        &[&format!("state=\"{state}\"")],
    )
}

/// A CONNECT to `target` as the stack's user, Basic credentials.
fn connect_request(target: std::net::SocketAddr) -> String {
    format!(
        "CONNECT {target} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic(USERNAME)
    )
}

/// Lifts this process's open-file limit to `want` (within its hard limit);
/// the processes the stack starts afterwards inherit it. A test holding
/// hundreds of tunnels holds both ends of them here (its client sockets and
/// the whoami target's), past the common default of 1,024.
#[allow(unsafe_code)]
fn raise_open_file_limit(want: libc::rlim_t) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read or write the struct passed.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0, "getrlimit: {}", std::io::Error::last_os_error());
    if limit.rlim_cur >= want {
        return;
    }
    assert!(
        limit.rlim_max >= want,
        "this test needs {want} open files; the hard limit is {}",
        limit.rlim_max
    );
    limit.rlim_cur = want;
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(set, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_from_one_address_hold_at_most_their_share() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new()
            .unauthenticated_timeout_ms(6000)
            .max_unauthenticated_waiting_per_source(200)
            .into(),
        ..Default::default()
    })
    .await;
    let proxy = stack.proxy_addrs.proxy;
    // Connected one after another, so accepted in this order.
    let mut silent = Vec::with_capacity(300);
    for _ in 0..300 {
        silent.push(TcpStream::connect(proxy).await.unwrap());
    }
    // 64 hold a pre-auth slot, the next 200 wait for one (accepted, not
    // read), and only the 36 beyond the waiting bound are closed at once.
    eventually(
        "the connections over the waiting bound to be closed",
        Duration::from_secs(5),
        || async {
            let open = silent.iter().filter(|s| !closed_now(s)).count();
            let counted =
                unauthenticated(&stack, "held").await + unauthenticated(&stack, "waiting").await;
            (open <= 264 && counted >= 264.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        unauthenticated(&stack, "held").await,
        64.0,
        "the bound is held"
    );
    assert_eq!(unauthenticated(&stack, "waiting").await, 200.0);
    assert!(
        silent[..264].iter().all(|s| !closed_now(s)),
        "the waiting ones are not closed"
    );
    assert!(silent[264..].iter().all(closed_now));
    // A waiting connection is not read: its login goes unanswered while the
    // silent ones hold every slot of the address.
    silent[263]
        .write_all(connect_request(stack.whoami).as_bytes())
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_secs(1), silent[263].read(&mut byte))
            .await
            .is_err(),
        "a connection waiting for a slot was read"
    );
    // Let go of it: a waiter seated just before its deadline is read, and
    // this one would then log in and stay.
    drop(silent.remove(263));
    // Another address is served at once, beside them.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.9:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(proxy).await.unwrap();
    other
        .write_all(connect_request(stack.whoami).as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut other).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The silent ones are let go at the pre-auth deadline, counted from
    // accept, the waiting ones too; the tunnel stays.
    eventually(
        "the silent connections to be cut at their deadline",
        Duration::from_secs(10),
        || async { silent.iter().all(closed_now).then_some(()) },
    )
    .await;
    assert!(
        !closed(&mut other).await,
        "the authenticated tunnel was cut"
    );
}

/// A customer's host behind one NAT address opens 500 connections in the
/// same moment, and each logs in: past the 64 pre-auth slots they wait
/// (unread) for a slot instead of being closed, the address gets the larger
/// allowance at its first login, and every one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_connections_at_once_from_one_address_all_log_in() {
    raise_open_file_limit(4_096);
    let stack = Stack::start().await;
    let proxy = stack.proxy_addrs.proxy;
    // Every socket connected first, then every login written at once.
    let mut sockets = Vec::with_capacity(500);
    for _ in 0..500 {
        sockets.push(TcpStream::connect(proxy).await.unwrap());
    }
    let request = connect_request(stack.whoami);
    let served = futures_util::future::join_all(sockets.into_iter().map(|mut s| {
        let request = request.clone();
        async move {
            if s.write_all(request.as_bytes()).await.is_err() {
                return (String::from("(closed before the login was written)"), s);
            }
            let head = tokio::time::timeout(Duration::from_secs(30), read_head(&mut s))
                .await
                .unwrap_or_default();
            // The stream is kept: its tunnel stays open until the end.
            (head, s)
        }
    }))
    .await;
    let refused: Vec<&str> = served
        .iter()
        .map(|(head, _)| head.as_str())
        .filter(|head| !head.starts_with("HTTP/1.1 200"))
        .collect();
    assert!(
        refused.is_empty(),
        "{} of 500 not served, e.g. {:?}",
        refused.len(),
        refused.first()
    );
    let text = scrape(&stack.http, stack.proxy_addrs.admin).await;
    for limit in [
        "unauthenticated_per_source",
        "unauthenticated_total",
        "unauthenticated_timeout",
    ] {
        let refusals = sample(
            &text,
            "proxynet_limit_refusals_total",
            &[&format!("limit=\"{limit}\"")],
        );
        assert_eq!(refusals, 0.0, "{limit}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_limits_meets_the_default_cap_and_sessions_are_capped() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new()
            .default_user_max_tunnels(2)
            .max_sessions_per_user(3)
            .into(),
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
