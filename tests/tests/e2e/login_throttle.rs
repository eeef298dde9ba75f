//! Login throttling: failed logins are charged to the source address however
//! they arrive — in parallel, or reset mid-hash.

use proxynet_tests::client::raw_request;
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, USERNAME};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// Argon2 verifications the superproxy has started (its metrics).
async fn verifications_started(stack: &Stack) -> f64 {
    let text = scrape(&stack.http, stack.proxy_addrs.admin).await;
    sample(&text, "proxynet_auth_verifications_total", &[])
}

/// Logins that hang up mid-check still count; the limit holds for
/// simultaneous attempts as for sequential ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_reset_mid_hash_still_count() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new().auth_failures_per_minute(3).into(),
        ..Default::default()
    })
    .await;
    // Each login is reset once its argon2 verification has started (the
    // superproxy counts starts), before it answers: the three the limit
    // allows are spent although no client ever saw an answer.
    for i in 0..3 {
        let mut s = TcpStream::connect(stack.proxy_addrs.proxy).await.unwrap();
        let request = format!(
            "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
            basic(USERNAME, &format!("wrong-{i}"))
        );
        s.write_all(request.as_bytes()).await.unwrap();
        eventually(
            "the verification to start",
            Duration::from_secs(10),
            || async { (verifications_started(&stack).await > i as f64).then_some(()) },
        )
        .await;
        s.set_zero_linger().unwrap();
        drop(s); // reset before the argon2 verification answers
    }
    let r = raw_request(
        stack.proxy_addrs.proxy,
        format!(
            "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
            basic(USERNAME, "one-more-wrong")
        )
        .as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_wrong_passwords_are_limited_like_sequential_ones() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new().auth_failures_per_minute(3).into(),
        ..Default::default()
    })
    .await;
    let proxy = stack.proxy_addrs.proxy;
    let attempts: Vec<_> = (0..50)
        .map(|i| {
            tokio::spawn(async move {
                let request = format!(
                    "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
                    basic(USERNAME, &format!("guess-{i}"))
                );
                raw_request(proxy, request.as_bytes(), Duration::from_secs(30)).await
            })
        })
        .collect();
    let mut too_many = 0;
    for a in attempts {
        let r = a.await.unwrap();
        if r.status == 429 {
            assert!(r.header("retry-after").is_some(), "{r:?}");
            too_many += 1;
        } else {
            assert_eq!(r.status, 407, "{r:?}");
        }
    }
    assert!(too_many >= 45, "only {too_many} of 50 refused with 429");
}
