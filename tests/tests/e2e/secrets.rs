//! No credential in a log line: the SOCKS library's own debug logging never
//! shows a password.

use proxynet_tests::client::curl;
use proxynet_tests::stack::{Stack, StackOptions};

/// No `RUST_LOG` can make the SOCKS library log a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_library_debug_logging_never_shows_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("superproxy.log");
    let stack = Stack::start_with(StackOptions {
        superproxy_env: vec![(
            "RUST_LOG".into(),
            "trace,fast_socks5=trace,fast_socks5::server=trace".into(),
        )],
        superproxy_log: Some(log.clone()),
        ..Default::default()
    })
    .await;
    let account = stack.create_account("logcheck").await;
    let secret = "never-in-a-log-4b1d";
    stack.create_user(account, "logcheck", secret).await;
    let proxy = format!("socks5h://logcheck:{secret}@{}", stack.proxy_addrs.socks);
    let r = curl(&["-x", &proxy, &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let r = curl(&[
        "-x",
        &format!(
            "socks5h://logcheck:wrong-{secret}@{}",
            stack.proxy_addrs.socks
        ),
        &stack.whoami_url(),
    ])
    .await;
    assert_ne!(r.status, 200);
    drop(stack);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("TRACE") || text.contains("DEBUG"),
        "trace logging was on"
    );
    assert!(!text.contains(secret), "the password reached the log");
}
