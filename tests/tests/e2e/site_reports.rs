//! Customers' reports as the superproxy applies them (docs/health.md,
//! "Customer feedback and the sites API"): account A's `blocked` report to
//! `POST /v1/feedback` steers A's tunnels to the site off the exit within a
//! second, while account B's tunnels to the site, and A's to another site,
//! still use it; `Proxynet-Report: blocked` on a session's CONNECT (the
//! first-CONNECT path and hyper's) moves a soft session to the other exit
//! for that site on that very request, and answers a hard one 502 naming
//! the site. Names are resolved by a test DNS server the agents use (every
//! name is the loopback target), so each name is a site of its own.

use proxynet_tests::client::read_head;
use proxynet_tests::dns::TestDns;
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions};
use proxynet_tests::targets::{echo_round_trip, echo_server};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use uuid::Uuid;

const PASS: &str = "site-reports-password-1";

const REPORT: &str = "Proxynet-Report: blocked\r\n";

async fn stack_with_dns() -> (Stack, TestDns) {
    let dns = TestDns::start(vec!["127.0.0.1".parse().unwrap()]).await;
    let stack = Stack::start_with(StackOptions {
        agent_args: vec!["--dns-server".into(), dns.addr.to_string()],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(2).await;
    (stack, dns)
}

/// What one CONNECT came to: the exit its `200` names, whether an echo
/// came back through it, and the response head.
struct Tunnel {
    exit: Option<Uuid>,
    echoed: bool,
    head: String,
}

/// One CONNECT to `host:port` on `s` as `user` with `extra` header lines;
/// on a `200`, one round trip through the tunnel.
async fn tunnel_on(s: &mut TcpStream, user: &str, host: &str, port: u16, extra: &str) -> Tunnel {
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{PASS}"));
    let target = format!("{host}:{port}");
    s.write_all(
        format!(
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n{extra}\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = read_head(s).await;
    if !head.starts_with("HTTP/1.1 200") {
        return Tunnel {
            exit: None,
            echoed: false,
            head,
        };
    }
    let exit = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            if !name.trim().eq_ignore_ascii_case("proxynet-exit") {
                return None;
            }
            value.trim().parse::<Uuid>().ok()
        })
        .unwrap_or_else(|| panic!("Proxynet-Exit on the 200: {head}"));
    let echoed = tokio::time::timeout(Duration::from_secs(5), echo_round_trip(s, b"hello, site"))
        .await
        .ok()
        .flatten()
        .is_some();
    Tunnel {
        exit: Some(exit),
        echoed,
        head,
    }
}

/// [`tunnel_on`] a connection of its own (the first-CONNECT path).
async fn tunnel(proxy: SocketAddr, user: &str, host: &str, port: u16, extra: &str) -> Tunnel {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    tunnel_on(&mut s, user, host, port, extra).await
}

/// The exit a tunnel that must work went through.
async fn exit_of(proxy: SocketAddr, user: &str, host: &str, port: u16, extra: &str) -> Uuid {
    let t = tunnel(proxy, user, host, port, extra).await;
    assert!(t.echoed, "{user} to {host}: {}", t.head);
    t.exit.unwrap()
}

/// Reads the body of a refusal whose head was just read (by its
/// `Content-Length`), so the connection can carry the next request.
async fn skip_body(s: &mut TcpStream, head: &str) {
    let length = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_accounts_report_steers_its_own_tunnels_off_the_exit_within_a_second() {
    let (stack, _dns) = stack_with_dns().await;
    let echo = echo_server().await;
    let port = echo.port();
    let proxy = stack.proxy_addrs.proxy;
    let a = stack.create_account("reports-a").await;
    let b = stack.create_account("reports-b").await;
    stack.create_user(a, "reportera", PASS).await;
    stack.create_user(b, "reporterb", PASS).await;
    let (key_a, _) = stack.account_key(a).await;
    let blocked = stack.agents[0].addrs.exit_id;

    // A reports the exit blocked by the site, as the API takes it today.
    let r = stack
        .http
        .post(stack.api("/v1/feedback"))
        .bearer_auth(&key_a)
        .json(&json!({"exit_id": blocked, "site": "https://www.shop.test/cart", "verdict": "blocked"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let reported_at = Instant::now();

    // Within a second the superproxy has it from the announcement.
    tokio::time::sleep_until(reported_at + Duration::from_secs(1)).await;
    for i in 0..20 {
        let exit = exit_of(proxy, "reportera", "shop.test", port, "").await;
        assert_ne!(
            exit, blocked,
            "A's tunnel {i} to the site took the exit A reported"
        );
    }

    // B's tunnels to the site still use it, and so do A's to another site.
    // (One loop each: interleaved, the other account's tunnel still
    // closing on one exit counts as load there, and fewer tunnels in flight
    // wins — on a loaded machine the two loops then lock into one exit each.)
    let (mut b_through, mut a_elsewhere) = (0, 0);
    for _ in 0..30 {
        if exit_of(proxy, "reporterb", "shop.test", port, "").await == blocked {
            b_through += 1;
        }
    }
    for _ in 0..30 {
        if exit_of(proxy, "reportera", "elsewhere.test", port, "").await == blocked {
            a_elsewhere += 1;
        }
    }
    assert!(
        b_through > 0,
        "B's 30 tunnels to the site avoided the exit A reported"
    );
    assert!(
        a_elsewhere > 0,
        "A's 30 tunnels to another site avoided the exit"
    );

    // The superproxy holds one account cooldown and no fleet cooldown.
    let text = eventually(
        "the account cooldown counted",
        Duration::from_secs(5),
        || async {
            let text = scrape(&stack.http, stack.proxy_addrs.admin).await;
            (sample(&text, "proxynet_site_account_cooldowns_active", &[]) == 1.0).then_some(text)
        },
    )
    .await;
    assert_eq!(sample(&text, "proxynet_site_cooldowns_active", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_header_moves_a_session_off_its_exit_for_that_site() {
    let (stack, _dns) = stack_with_dns().await;
    let echo = echo_server().await;
    let port = echo.port();
    let proxy = stack.proxy_addrs.proxy;
    let account = stack.create_account("reports-header").await;
    let user = stack.create_user(account, "sessionuser", PASS).await;
    let (key, _) = stack.account_key(account).await;
    let soft = "sessionuser-session-abc";

    // The session keeps its exit...
    let first = exit_of(proxy, soft, "shop.test", port, "").await;
    for _ in 0..3 {
        assert_eq!(exit_of(proxy, soft, "shop.test", port, "").await, first);
    }
    // ... until a request of it reports the site blocked: that very
    // request leaves from the other exit, and the session stays there.
    let moved = exit_of(proxy, soft, "shop.test", port, REPORT).await;
    assert_ne!(moved, first, "the reporting request kept the reported exit");
    for _ in 0..5 {
        assert_eq!(exit_of(proxy, soft, "shop.test", port, "").await, moved);
    }
    let pin = stack
        .admin_get_json(&format!("/v1/users/{user}/sessions/abc"))
        .await;
    assert_eq!(pin["exit_id"], moved.to_string(), "{pin}");
    // It is in Redis for every superproxy (and the sites API): the
    // account's own cooldown, not the fleet's.
    let seen: Value = eventually("the report in Redis", Duration::from_secs(5), || async {
        let seen = stack.get_json_as(&key, "/v1/sites?site=shop.test").await;
        let written = seen["items"][0]["account_cooled_exits"]
            .as_array()
            .is_some_and(|own| !own.is_empty());
        written.then_some(seen)
    })
    .await;
    let items = seen["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{seen}");
    assert_eq!(items[0]["cooled"], 0, "{seen}");
    let own = items[0]["account_cooled_exits"].as_array().unwrap();
    assert_eq!(own.len(), 1, "{seen}");
    assert_eq!(own[0]["exit_id"], first.to_string());
    assert_eq!(own[0]["account_id"], account.to_string());
    // The account's other sessions to the site avoid it too.
    for i in 0..6 {
        let fresh = format!("sessionuser-session-fresh{i}");
        assert_ne!(exit_of(proxy, &fresh, "shop.test", port, "").await, first);
    }

    // Hyper's CONNECT path (a request after a refused first CONNECT on the
    // same connection) takes the header as well.
    let on_hyper = "sessionuser-session-hyp";
    let pinned = exit_of(proxy, on_hyper, "hyper.test", port, "").await;
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let refused = tunnel_on(
        &mut s,
        on_hyper,
        "hyper.test",
        port,
        "Proxynet-Options: colour-red\r\n",
    )
    .await;
    assert!(refused.head.starts_with("HTTP/1.1 400"), "{}", refused.head);
    skip_body(&mut s, &refused.head).await;
    let t = tunnel_on(&mut s, on_hyper, "hyper.test", port, REPORT).await;
    assert!(t.echoed, "{}", t.head);
    assert_ne!(t.exit, Some(pinned), "hyper's path kept the reported exit");

    // A hard session is not moved: its reporting request is a 502 naming
    // the site, and so is its next one to that site.
    let hard = "sessionuser-session-hard1-sessmode-hard";
    let held = exit_of(proxy, hard, "hard.test", port, "").await;
    for extra in [REPORT, ""] {
        let t = tunnel(proxy, hard, "hard.test", port, extra).await;
        assert!(t.head.starts_with("HTTP/1.1 502"), "{}", t.head);
        assert!(
            t.head.contains("refused by the site hard.test"),
            "{}",
            t.head
        );
    }
    // Its tunnels to other sites keep the pin.
    assert_eq!(exit_of(proxy, hard, "other.test", port, "").await, held);

    // Without a session there is no exit to name: ignored, the tunnel
    // served as ever. Every header is counted by what became of it.
    exit_of(proxy, "sessionuser", "nosession.test", port, REPORT).await;
    let text = scrape(&stack.http, stack.proxy_addrs.admin).await;
    let reports = |result: &str| {
        sample(
            &text,
            "proxynet_site_reports_total",
            &["source=\"header\"", &format!("result=\"{result}\"")],
        )
    };
    assert_eq!(reports("cooled"), 3.0, "{text}");
    assert_eq!(reports("no_session"), 1.0);
    assert_eq!(sample(&text, "proxynet_site_cooldowns_active", &[]), 0.0);
}
