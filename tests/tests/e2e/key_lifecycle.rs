//! API keys have lineage: a key records the key that minted it, an account
//! lists and revokes its own keys, revoking a key revokes what it minted, and
//! dashboard sessions end with the key they logged in with. Accounts and
//! plans can be listed; a deleted account's users are cut at once. A key
//! past its request rate is answered 429 with Retry-After.

use proxynet_tests::client::connect_tunnel;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN, PASSWORD, USERNAME};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use uuid::Uuid;

async fn mint(stack: &Stack, with: &str, account: Uuid, name: &str) -> (String, Uuid, Value) {
    let r = stack
        .http
        .post(stack.api(&format!("/v1/accounts/{account}/api-keys")))
        .bearer_auth(with)
        .json(&json!({ "name": name }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    (
        body["key"].as_str().unwrap().to_owned(),
        body["id"].as_str().unwrap().parse().unwrap(),
        body,
    )
}

async fn status_with(stack: &Stack, key: &str, path: &str) -> u16 {
    stack
        .http
        .get(stack.api(path))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn dashboard_status(stack: &Stack, cookie: &str, path: &str) -> u16 {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    client
        .get(stack.api(path))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_key_revokes_what_it_minted_and_its_dashboard_sessions() {
    let stack = Stack::start().await;
    let account = stack.create_account("lineage").await;
    let (k1, k1_id, _) = mint(&stack, ADMIN_TOKEN, account, "k1").await;
    let (k2, k2_id, k2_body) = mint(&stack, &k1, account, "k2").await;
    assert_eq!(k2_body["minted_by"], k1_id.to_string());
    let (k3, _, _) = mint(&stack, &k2, account, "k3").await;

    // The account lists its keys, with lineage and last use, no secrets.
    let list = stack
        .http
        .get(stack.api(&format!("/v1/accounts/{account}/api-keys")))
        .bearer_auth(&k2)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    let text = list.text().await.unwrap();
    for secret in [&k1, &k2, &k3] {
        assert!(!text.contains(secret.as_str()), "a secret in the listing");
    }
    let keys: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(keys.len(), 3, "{text}");
    let k2_row = keys.iter().find(|k| k["id"] == k2_id.to_string()).unwrap();
    assert_eq!(k2_row["minted_by"], k1_id.to_string());
    assert!(k2_row["last_used_at"].is_string(), "k2 was used: {k2_row}");

    let session = stack.dashboard_session(&k3).await;
    assert_eq!(
        dashboard_status(&stack, &session, "/dashboard/usage").await,
        200
    );

    // The account revokes its first key: the ones it minted go with it.
    let r = stack
        .http
        .delete(stack.api(&format!("/v1/api-keys/{k1_id}")))
        .bearer_auth(&k3)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    eventually(
        "the minted keys to answer 401",
        Duration::from_secs(5),
        || async {
            let path = format!("/v1/accounts/{account}");
            (status_with(&stack, &k2, &path).await == 401
                && status_with(&stack, &k3, &path).await == 401)
                .then_some(())
        },
    )
    .await;
    eventually(
        "the dashboard session of a revoked key to end",
        Duration::from_secs(5),
        || async {
            (dashboard_status(&stack, &session, "/dashboard/usage").await == 303).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_accounts_and_plans_and_a_deleted_accounts_tunnels_are_cut() {
    let stack = Stack::start().await;
    let accounts = stack.admin_get_json("/v1/accounts?limit=100").await;
    let demo = accounts
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "acme")
        .cloned()
        .unwrap_or_else(|| panic!("the stack's account is listed: {accounts}"));
    let demo_id: Uuid = demo["id"].as_str().unwrap().parse().unwrap();
    let r = stack
        .http
        .post(stack.api("/v1/plans"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "listed", "prices": {"dc": 100, "res": 700}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let plans = stack.admin_get_json("/v1/plans").await;
    let listed = plans
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "listed")
        .unwrap();
    assert_eq!(listed["prices"], json!({"dc": 100, "res": 700}));

    let (key, _, _) = mint(&stack, ADMIN_TOKEN, demo_id, "doomed").await;
    assert_eq!(
        status_with(&stack, &key, "/v1/accounts").await,
        403,
        "operators only"
    );
    let (mut open, head) =
        connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, stack.whoami).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let r = stack
        .http
        .delete(stack.api(&format!("/v1/accounts/{demo_id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // Cut at once, refused from now on; its keys are dead; its ledger stays.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the open tunnel survived the account's deletion"
    );
    let (_, refused) =
        connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, stack.whoami).await;
    assert!(refused.starts_with("HTTP/1.1 407"), "{refused}");
    assert_eq!(
        status_with(&stack, &key, &format!("/v1/accounts/{demo_id}")).await,
        401
    );
    assert_eq!(
        status_with(&stack, ADMIN_TOKEN, &format!("/v1/accounts/{demo_id}")).await,
        404
    );
    assert_eq!(
        status_with(
            &stack,
            ADMIN_TOKEN,
            &format!("/v1/accounts/{demo_id}/invoices")
        )
        .await,
        200,
        "the ledger is kept"
    );
}

/// An API key past its rate (here one request a second, five at once) is
/// answered `429` with `Retry-After`; another key of the same account and
/// the admin token are not held back, and the key is answered again after
/// the wait it was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_past_its_rate_is_answered_429_with_retry_after() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec![],
        api_env: vec![
            ("PROXYNET_API_KEY_RATE".into(), "1".into()),
            ("PROXYNET_API_KEY_BURST".into(), "5".into()),
        ],
        ..Default::default()
    })
    .await;
    let account = stack.create_account("hasty").await;
    let (key, _, _) = mint(&stack, ADMIN_TOKEN, account, "hasty").await;
    let (neighbour, _, _) = mint(&stack, ADMIN_TOKEN, account, "neighbour").await;
    let path = format!("/v1/accounts/{account}");

    let started = std::time::Instant::now();
    let mut answered = Vec::new();
    let mut refusal = None;
    for _ in 0..30 {
        let r = stack
            .http
            .get(stack.api(&path))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        if status == 429 && refusal.is_none() {
            let retry_after: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let problem: Value = r.json().await.unwrap();
            refusal = Some((retry_after, problem));
        }
        answered.push(status);
    }
    let elapsed = started.elapsed();
    assert!(
        answered[..5].iter().all(|s| *s == 200),
        "the burst is answered: {answered:?}"
    );
    assert!(
        answered.iter().all(|s| *s == 200 || *s == 429),
        "{answered:?}"
    );
    let ok = answered.iter().filter(|s| **s == 200).count() as u64;
    assert!(
        ok <= 5 + elapsed.as_secs() + 1,
        "{ok} answered in {elapsed:?}: {answered:?}"
    );
    let (retry_after, problem) = refusal.expect("a 429");
    assert!((1..=2).contains(&retry_after), "Retry-After: {retry_after}");
    assert_eq!(problem["status"], 429, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("requests a second"),
        "{problem}"
    );

    // Per key: the account's other key and the admin token are answered.
    assert_eq!(status_with(&stack, &neighbour, &path).await, 200);
    assert_eq!(status_with(&stack, ADMIN_TOKEN, &path).await, 200);
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(status_with(&stack, &key, &path).await, 200);
}
