//! Options by header (docs/username.md, "Options by header"): the username
//! grammar's options in a `Proxynet-Options` request header select country
//! and session on CONNECT (the first-CONNECT path and hyper's) and on
//! absolute-form requests, replacing the username's; the header never
//! reaches the target; a malformed one is a 400 naming it; an allow-listed
//! client, which has no username, uses it too, bounded as a username's
//! options are.

use base64::Engine;
use proxynet_tests::client::{curl, proxy_as, read_head, CurlResult};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, PASSWORD, USERNAME};
use proxynet_tests::whoami::Seen;
use serde_json::json;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response header's value (last occurrence: with `-p`, the origin's
/// answer comes after the proxy's), lower-cased name.
fn header(headers: &str, name: &str) -> Option<String> {
    headers.lines().rev().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// What whoami saw of a request whose answer curl printed.
fn seen(r: &CurlResult) -> Seen {
    assert_eq!(r.status, 200, "{} {}", r.headers, r.body);
    serde_json::from_str(&r.body).unwrap()
}

/// One CONNECT tunnel (`-p`) to whoami with `options` in the header sent to
/// the proxy only.
async fn via_connect(proxy_url: &str, options: &str, target: &str) -> CurlResult {
    let header = format!("Proxynet-Options: {options}");
    curl(&["-p", "--proxy-header", &header, "-x", proxy_url, target]).await
}

/// One absolute-form request to whoami with `options` in its headers.
async fn via_forward(proxy_url: &str, options: &str, target: &str) -> CurlResult {
    let header = format!("Proxynet-Options: {options}");
    curl(&["-H", &header, "-x", proxy_url, target]).await
}

/// Reads the body of a response whose head was just read (by its
/// `Content-Length`), so the connection can carry the next request.
async fn skip_body(s: &mut TcpStream, head: &str) {
    let length = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            if n.trim().eq_ignore_ascii_case("content-length") {
                v.trim().parse::<usize>().ok()
            } else {
                None
            }
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await.unwrap();
}

/// A CONNECT head as `USERNAME` with `options` in its header.
fn connect_head(target: SocketAddr, options: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"));
    format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\
         Proxynet-Options: {options}\r\n\r\n"
    )
}

/// What whoami saw of one `GET /` sent through an open tunnel.
async fn whoami_through(s: &mut TcpStream) -> Seen {
    s.write_all(b"GET / HTTP/1.1\r\nHost: whoami\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_by_header_select_country_and_session_and_never_reach_the_target() {
    let mut stack = Stack::start().await;
    // A third exit in FR beside the demo's two in DE.
    let source = stack.complete_dc_source().await;
    let token = stack.enrollment_token_for("paris", source, "FR").await;
    stack
        .add_agent_with_token(&["127.0.0.4".parse().unwrap()], token)
        .await;
    stack.wait_eligible(3).await;
    let proxy = stack.proxy_url();
    let url = stack.whoami_url();

    // Country, on CONNECT and absolute-form: always the FR exit.
    for _ in 0..6 {
        let r = via_connect(&proxy, "country-fr", &url).await;
        assert_eq!(seen(&r).peer.ip().to_string(), "127.0.0.4");
        let r = via_forward(&proxy, "country-fr", &url).await;
        let s = seen(&r);
        assert_eq!(s.peer.ip().to_string(), "127.0.0.4");
        assert!(
            !s.has_header("proxynet-options"),
            "the header reached the target: {:?}",
            s.headers
        );
    }
    // The header replaces the username's options: `country-de` in the
    // username, `country-fr` in the header, FR it is.
    let german = proxy_as(&format!("{USERNAME}-country-de"), stack.proxy_addrs.proxy);
    let r = via_forward(&german, "country-fr", &url).await;
    assert_eq!(seen(&r).peer.ip().to_string(), "127.0.0.4");

    // A session: one exit for every request of it, and its pin's expiry.
    for via in ["connect", "forward"] {
        let mut exits = HashSet::new();
        for _ in 0..8 {
            let options = format!("session-hdr{via}-sesstime-5");
            let r = if via == "connect" {
                via_connect(&proxy, &options, &url).await
            } else {
                via_forward(&proxy, &options, &url).await
            };
            assert!(
                header(&r.headers, "proxynet-session-expires").is_some(),
                "{via}: {}",
                r.headers
            );
            exits.insert(seen(&r).peer.ip());
        }
        assert_eq!(exits.len(), 1, "{via}: a session left from {exits:?}");
    }

    // Malformed: a 400 whose details name the header, on the first-CONNECT
    // path, on absolute-form, and with an option the grammar refuses.
    for (r, what) in [
        (via_connect(&proxy, "colour-red", &url).await, "connect"),
        (via_forward(&proxy, "colour-red", &url).await, "forward"),
        (via_forward(&proxy, "sesstime-5", &url).await, "no session"),
    ] {
        let h = r.headers.to_ascii_lowercase();
        assert!(
            h.contains(" 400") && h.contains("proxynet-options:"),
            "{what}: {h}"
        );
    }

    // Hyper's CONNECT path (every request after a refused first CONNECT on
    // one connection): a malformed header is refused, a good one obeyed.
    let mut s = TcpStream::connect(stack.proxy_addrs.proxy).await.unwrap();
    s.write_all(connect_head(stack.whoami, "country-xx").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("proxynet-options:"),
        "{head}"
    );
    skip_body(&mut s, &head).await;
    s.write_all(connect_head(stack.whoami, "country-fr").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        whoami_through(&mut s).await.peer.ip().to_string(),
        "127.0.0.4"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_listed_client_takes_its_options_from_the_header_within_its_bounds() {
    let stack = Stack::start().await;
    let account = stack.create_account("office").await;
    stack
        .set_entitlements(
            account,
            json!({"allowlist": {"min_prefix_v4": 8, "special_ranges": true},
                   "limits": {"allowed_countries": ["DE"]}}),
        )
        .await;
    let r = stack
        .admin()
        .create_user_with(
            account,
            &json!({"username": "office", "password": "allowlisted-pw-1",
                      "allowed_source_cidrs": ["127.0.0.0/8"]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    // No credentials at all: the allow-listed address is the login.
    let anonymous = format!("http://{}", stack.proxy_addrs.proxy);
    let url = stack.whoami_url();
    let pinned = stack.agents[1].addrs.exit_id.simple().to_string();
    eventually(
        "the allow-list to reach the superproxy",
        Duration::from_secs(10),
        || async { (curl(&["-p", "-x", &anonymous, &url]).await.status == 200).then_some(()) },
    )
    .await;
    for _ in 0..6 {
        let options = format!("exit-{pinned}");
        let r = via_connect(&anonymous, &options, &url).await;
        assert_eq!(
            seen(&r).peer.ip(),
            stack.agents[1].egress_ip,
            "{}",
            r.headers
        );
        let r = via_forward(&anonymous, &options, &url).await;
        let s = seen(&r);
        assert_eq!(s.peer.ip(), stack.agents[1].egress_ip);
        assert!(!s.has_header("proxynet-options"), "{:?}", s.headers);
    }
    let r = via_forward(&anonymous, "session-office1", &url).await;
    assert!(
        header(&r.headers, "proxynet-session-expires").is_some(),
        "{}",
        r.headers
    );
    // Bounded as a username's options: a country outside the account's.
    let r = via_connect(&anonymous, "country-fr", &url).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(h.contains(" 403") && h.contains("country=fr"), "{h}");
    // Malformed: named.
    let r = via_forward(&anonymous, "country", &url).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(h.contains(" 400") && h.contains("proxynet-options:"), "{h}");
}
