//! Allow-listed networks cannot be squatted: prefixes are bounded, special
//! ranges need the operator, a conflict names nobody, and a network removed
//! from a user cuts the tunnels it let in.

use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, ADMIN_TOKEN};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

async fn create(stack: &Stack, key: &str, account: Uuid, name: &str, cidrs: Value) -> (u16, Value) {
    let r = stack
        .http
        .post(stack.api(&format!("/v1/accounts/{account}/users")))
        .bearer_auth(key)
        .json(&json!({"username": name, "password": "allowlisted-pw-1", "allowed_source_cidrs": cidrs}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_and_special_networks_are_refused_and_conflicts_name_nobody() {
    let stack = Stack::start().await;
    let squatter = stack.create_account("squatter").await;
    let key = stack.account_key(squatter).await.0;
    for (cidr, why) in [
        ("128.0.0.0/1", "wider than"),
        ("::/0", "wider than"),
        ("93.184.0.0/16", "wider than"),
        ("10.1.2.0/24", "special-purpose"),
        ("127.0.0.1/32", "special-purpose"),
        ("fe80::/64", "special-purpose"),
    ] {
        for caller in [key.as_str(), ADMIN_TOKEN] {
            let (status, problem) = create(&stack, caller, squatter, "squat", json!([cidr])).await;
            assert_eq!(status, 403, "{cidr}: {problem}");
            assert!(
                problem["detail"].as_str().unwrap().contains(why),
                "{cidr}: {problem}"
            );
        }
    }
    // A site's own /24 is fine; another account's overlapping claim is
    // refused without naming the network's holder or its network.
    let (status, user) = create(&stack, &key, squatter, "office", json!(["93.184.216.0/24"])).await;
    assert_eq!(status, 201, "{user}");
    let rival = stack.create_account("rival").await;
    let rival_key = stack.account_key(rival).await.0;
    let (status, problem) = create(
        &stack,
        &rival_key,
        rival,
        "rival",
        json!(["93.184.216.128/25"]),
    )
    .await;
    assert_eq!(status, 409, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        !detail.contains("93.184.216.0")
            && !detail.contains("squatter")
            && !detail.contains("office"),
        "the conflict reveals its holder: {detail}"
    );
    // The operator can widen an account's bounds.
    stack
        .set_entitlements(rival, json!({"allowlist": {"min_prefix_v4": 16}}))
        .await;
    let (status, user) = create(
        &stack,
        &rival_key,
        rival,
        "campus",
        json!(["198.18.0.0/15"]),
    )
    .await;
    assert_eq!(status, 403, "special still needs its own grant: {user}");
    let (status, user) = create(
        &stack,
        &rival_key,
        rival,
        "campus",
        json!(["100.128.0.0/16"]),
    )
    .await;
    assert_eq!(status, 201, "{user}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_allow_listed_network_cuts_its_open_tunnel() {
    let stack = Stack::start().await;
    let account = stack.create_account("lan").await;
    stack.allow_loopback_allowlists(account).await;
    let (status, user) = create(&stack, ADMIN_TOKEN, account, "lan", json!(["127.0.0.0/8"])).await;
    assert_eq!(status, 201, "{user}");
    let user_id = user["id"].as_str().unwrap().to_owned();
    let proxy = stack.proxy_addrs.proxy;
    let whoami = stack.whoami;
    let mut open = eventually(
        "an allow-listed tunnel without credentials",
        Duration::from_secs(5),
        || async {
            let mut s = TcpStream::connect(proxy).await.ok()?;
            s.write_all(format!("CONNECT {whoami} HTTP/1.1\r\nHost: {whoami}\r\n\r\n").as_bytes())
                .await
                .ok()?;
            let head = proxynet_tests::client::read_head(&mut s).await;
            head.starts_with("HTTP/1.1 200").then_some(s)
        },
    )
    .await;
    let r = stack
        .admin()
        .patch_user(&user_id, &json!({"allowed_source_cidrs": []}))
        .await;
    assert_eq!(r.status(), 200);
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the tunnel outlived its network's removal by 5 s"
    );
}
