//! Bandwidth quotas: a user over quota is cut inside the stream, refused on
//! the next tunnel with the quota named, and parallel tunnels overshoot by a
//! bounded amount (docs/usage.md).

use proxynet_tests::stack::{Stack, ADMIN_TOKEN};
use serde_json::json;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PASS: &str = "quota-password-1";
const QUOTA: u64 = 1_000_000;

/// Sends `size` bytes to every connection, then closes it.
async fn download_server(size: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let chunk = vec![7u8; 64 * 1024];
                let mut left = size;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    addr
}

async fn quota_user(stack: &Stack, name: &str) -> String {
    let account = stack.create_account(name).await;
    let r = stack
        .admin()
        .create_user_with(account, &json!({ "username": name, "password": PASS, "limits": { "bandwidth_bytes": QUOTA, "period": "daily" } }))
        .await;
    proxynet_tests::stack::created_id(r, "create quota user")
        .await
        .to_string()
}

/// CONNECT and read until the tunnel ends; returns (response head, bytes received).
async fn download(proxy: SocketAddr, user: &str, target: SocketAddr) -> (String, u64) {
    let (mut s, head) = proxynet_tests::client::connect_tunnel(proxy, user, PASS, target).await;
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    if head.starts_with("HTTP/1.1 200") {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    (head, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_over_quota_is_cut_and_the_next_tunnel_refused() {
    let stack = Stack::start().await;
    let user = quota_user(&stack, "metered1").await;
    let target = download_server(50_000_000).await;
    let (head, received) = download(stack.proxy_addrs.proxy, "metered1", target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(received < 50_000_000, "the stream was not cut");
    assert!(
        received <= QUOTA + 256 * 1024,
        "cut late: {received} bytes for a {QUOTA}-byte quota"
    );

    let (refused, _) = download(stack.proxy_addrs.proxy, "metered1", target).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("bandwidth quota exhausted"),
        "{refused}"
    );

    let state = proxynet_tests::process::eventually(
        "the quota state to show exhaustion",
        std::time::Duration::from_secs(10),
        || async {
            let q: serde_json::Value = stack
                .http
                .get(stack.api(&format!("/v1/users/{user}/quota")))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (q["exhausted"] == true).then_some(q)
        },
    )
    .await;
    assert_eq!(state["warning"], true);
    assert_eq!(state["period"], "daily");
    assert_eq!(state["remaining_bytes"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_tunnels_overshoot_a_quota_by_a_bounded_amount() {
    let stack = Stack::start().await;
    let _ = quota_user(&stack, "metered100").await;
    let target = download_server(5_000_000).await;
    let proxy = stack.proxy_addrs.proxy;
    let tasks: Vec<_> = (0..100)
        .map(|_| tokio::spawn(async move { download(proxy, "metered100", target).await.1 }))
        .collect();
    let mut total = 0u64;
    for t in tasks {
        total += t.await.unwrap();
    }
    // Each tunnel may finish the chunk it is moving when the shared budget runs
    // out: at most 128 KiB each (docs/usage.md), against 500 MB unlimited.
    let bound = QUOTA + 100 * 128 * 1024;
    assert!(total <= bound, "{total} bytes moved, bound {bound}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_parallel_tunnels_stay_within_a_quota_and_a_read() {
    let stack = Stack::start().await;
    let account = stack.create_account("tight").await;
    let r = stack
        .admin()
        .create_user_with(account, &json!({ "username": "tight", "password": PASS, "limits": { "bandwidth_bytes": 300_000, "period": "daily" } }))
        .await;
    proxynet_tests::stack::created_id(r, "create quota user").await;
    let target = download_server(5_000_000).await;
    let proxy = stack.proxy_addrs.proxy;
    let tasks: Vec<_> = (0..40)
        .map(|_| tokio::spawn(async move { download(proxy, "tight", target).await.1 }))
        .collect();
    let mut total = 0u64;
    for t in tasks {
        total += t.await.unwrap();
    }
    // Budget reserved before every read: one superproxy overshoots by at
    // most one read, however many tunnels run (docs/usage.md).
    assert!(
        total <= 300_000 + 256 * 1024,
        "{total} bytes for a 300,000-byte quota"
    );
    assert!(total >= 300_000 / 2, "the quota was usable: {total}");
}
