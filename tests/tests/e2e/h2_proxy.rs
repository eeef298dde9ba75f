//! HTTP/2 to the proxy: Node's http2 client and headless Chromium on the
//! HTTPS listener (ALPN `h2`), each stream a tunnel through the one
//! pipeline, and the bounds a hostile HTTP/2 client meets.

use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::stack::{Stack, StackOptions};
use proxynet_tests::targets::echo_server;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio::net::TcpListener;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

async fn whoami() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxynet_tests::whoami::serve(listener));
    addr
}

/// The `client=` of every access-log line naming `target`.
fn clients_for(log: &str, target: SocketAddr) -> Vec<String> {
    let needle = format!("target_addr={target}");
    log.lines()
        .filter(|l| l.contains("h2_forward") && l.contains(&needle))
        .filter_map(|l| l.split("client=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_and_chromium_speak_http2_to_the_https_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("superproxy.log");
    let stack = Stack::start_with(StackOptions {
        proxy_tls: true,
        superproxy_log: Some(log.clone()),
        ..Default::default()
    })
    .await;
    let files = stack.tls.as_ref().unwrap();
    let account = stack.create_account("h2-limited").await;
    let r = stack
        .admin()
        .create_user_with(
            account,
            &json!({"username": "twostreams", "password": "two-streams-pass",
                      "limits": {"max_concurrent_tunnels": 2}}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let echo = echo_server().await;
    let origins = [whoami().await, whoami().await, whoami().await];
    let targets = std::iter::once(stack.whoami)
        .chain(origins)
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",");
    // Node's cases use the stack's whoami; Chromium the three others.
    let out = tokio::process::Command::new("node")
        .arg(repo("tests/browser/h2_proxy.mjs"))
        .env("PROXY_HTTPS", stack.tls_proxy_url())
        .env("PROXY_CA", &files.ca.ca_pem)
        .env("PROXY_CERT", &files.cert)
        .env("TARGETS", &targets)
        .env("ECHO", echo.to_string())
        .env("LIMITED", "twostreams:two-streams-pass")
        .kill_on_drop(true)
        // Its progress lines show in the test's output.
        .stderr(std::process::Stdio::inherit())
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(240), out)
        .await
        .expect("the Node client finishes")
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(r.get("error").is_none(), "{r:#}");
    assert_eq!(r["alpn"], "h2", "{r:#}");
    assert_eq!(r["max_concurrent_streams"], 100, "{r:#}");
    let exits = ["127.0.0.2", "127.0.0.3"];
    let left_from_an_exit =
        |v: &Value| v["status"] == 200 && exits.contains(&v["peer"].as_str().unwrap_or_default());
    for case in r["concurrent"].as_array().unwrap() {
        assert!(left_from_an_exit(case), "concurrent CONNECT streams: {r:#}");
    }
    assert_eq!(r["wrong_password"]["status"], 407, "{r:#}");
    assert!(
        r["wrong_password"]["proxy_status"]
            .as_str()
            .is_some_and(|s| s.contains("error=")),
        "{r:#}"
    );
    assert!(left_from_an_exit(&r["after_refusal"]), "{r:#}");
    assert!(
        left_from_an_exit(&r["forward"]),
        "absolute URI over h2: {r:#}"
    );
    assert_eq!(r["limited"], json!([200, 200, 429]), "{r:#}");
    assert_eq!(r["oversized_headers"]["status"], 431, "{r:#}");
    assert!(left_from_an_exit(&r["after_oversized"]), "{r:#}");
    assert_eq!(r["stalled_stream_blocked"], true, "{r:#}");
    assert!(
        left_from_an_exit(&r["beside_stalled"]),
        "a stalled stream must not stall its neighbours: {r:#}"
    );
    // Metrics by ingress: every h2 stream is a tunnel of its own kind, and
    // refusals are counted by error, as on HTTP/1.1.
    let http = reqwest::Client::new();
    let metrics = scrape(&http, stack.proxy_addrs.admin).await;
    let opened = |ingress: &str| {
        sample(
            &metrics,
            "proxynet_tunnels_opened_total",
            &[&format!("ingress=\"{ingress}\"")],
        )
    };
    // Two concurrent, after the refusal, after the oversized head, beside
    // the stalled one, the stalled one, two of the limited user's.
    assert!(opened("h2_connect") >= 8.0, "{metrics}");
    // The absolute-URI request and Chromium's three pages.
    assert!(opened("h2_forward") >= 4.0, "{metrics}");
    // (431 is the h2 codec's own answer to a header list over its bound,
    // before any stream reaches the pipeline.)
    for refusal in ["status=\"407\"", "status=\"429\""] {
        assert!(
            sample(
                &metrics,
                "proxynet_tunnels_failed_total",
                &["ingress=\"h2_connect\"", refusal]
            ) >= 1.0,
            "{refusal}: {metrics}"
        );
    }
    // A rapid-reset loop loses its connection: the h2 codec's own bound
    // answers GOAWAY ENHANCE_YOUR_CALM (0xb), ours closes it (and counts it
    // in `proxynet_h2_connections_closed_total{reason="rapid_reset"}`).
    // Either close may reach the client as a reset, its GOAWAY unread.
    let reset = &r["rapid_reset"];
    match reset.get("goaway") {
        Some(code) => assert_eq!(code, 11, "GOAWAY ENHANCE_YOUR_CALM: {r:#}"),
        None => assert!(
            reset["closed"] == true,
            "a rapid-reset loop must lose its connection: {r:#}"
        ),
    }
    assert!(
        reset["sent"].as_u64().unwrap() < 5000,
        "closed before the loop ran out: {r:#}"
    );
    let pages = r["chromium"].as_array().unwrap_or_else(|| panic!("{r:#}"));
    assert_eq!(pages.len(), 3, "{r:#}");
    for page in pages {
        assert!(left_from_an_exit(page), "Chromium through h2: {r:#}");
    }

    drop(stack);
    let text = proxynet_tests::process::read_log(&log);
    let mut clients: Vec<String> = origins
        .iter()
        .flat_map(|o| clients_for(&text, *o))
        .collect();
    assert!(
        clients.len() >= 3,
        "every Chromium page is an h2 stream in the access log"
    );
    clients.sort();
    clients.dedup();
    let connect_lines = text
        .lines()
        .filter(|l| l.contains("proxynet::access") && l.contains("h2_connect"))
        .count();
    assert!(
        connect_lines >= 8,
        "every CONNECT stream is a line: {connect_lines}"
    );
    assert_eq!(
        clients.len(),
        1,
        "three origins over one proxy connection: {clients:?}"
    );
}
