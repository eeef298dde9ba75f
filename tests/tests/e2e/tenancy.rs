//! Account isolation: an account's API key reaches its own account and
//! nothing else — every route is tried against another account's resources.

use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN};
use reqwest::Method;
use serde_json::json;

async fn call(
    stack: &Stack,
    key: &str,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> u16 {
    let mut request = stack.http.request(method, stack.api(path)).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_key_cannot_read_or_change_another_account() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec![],
        ..Default::default()
    })
    .await;
    let a = stack.create_account("tenant-a").await;
    let b = stack.create_account("tenant-b").await;
    let (key_a, _) = stack.account_key(a).await;
    let (key_b, key_b_id) = stack.account_key(b).await;
    let user_b = stack.create_user(b, "bob_b", "bob-b-password").await;
    let exit = uuid::Uuid::new_v4();

    // Own account: allowed.
    assert_eq!(
        call(
            &stack,
            &key_a,
            Method::GET,
            &format!("/v1/accounts/{a}"),
            None
        )
        .await,
        200
    );
    assert_eq!(
        call(
            &stack,
            &key_a,
            Method::POST,
            &format!("/v1/accounts/{a}/users"),
            Some(json!({"username": "alice_a", "password": "alice-a-password"}))
        )
        .await,
        201
    );
    assert_eq!(
        call(
            &stack,
            &key_a,
            Method::GET,
            &format!("/v1/accounts/{a}/usage"),
            None
        )
        .await,
        200
    );

    // The other account's resources: answered as absent.
    let cross: Vec<(Method, String, Option<serde_json::Value>)> = vec![
        (Method::GET, format!("/v1/accounts/{b}"), None),
        (Method::GET, format!("/v1/accounts/{b}/users"), None),
        (
            Method::POST,
            format!("/v1/accounts/{b}/users"),
            Some(json!({"username": "intruder", "password": "intruder-pass"})),
        ),
        (Method::GET, format!("/v1/users/{user_b}"), None),
        (
            Method::PATCH,
            format!("/v1/users/{user_b}"),
            Some(json!({"enabled": false})),
        ),
        (Method::DELETE, format!("/v1/users/{user_b}"), None),
        (Method::GET, format!("/v1/users/{user_b}/sessions"), None),
        (
            Method::GET,
            format!("/v1/users/{user_b}/sessions/abc"),
            None,
        ),
        (
            Method::DELETE,
            format!("/v1/users/{user_b}/sessions/abc"),
            None,
        ),
        (Method::GET, format!("/v1/accounts/{b}/usage"), None),
        (Method::GET, format!("/v1/accounts/{b}/invoices"), None),
        (Method::GET, format!("/v1/users/{user_b}/quota"), None),
        (
            Method::POST,
            format!("/v1/accounts/{b}/api-keys"),
            Some(json!({})),
        ),
        (Method::GET, format!("/v1/accounts/{b}/api-keys"), None),
        (Method::DELETE, format!("/v1/api-keys/{key_b_id}"), None),
        // An exit that never carried this account's traffic.
        (Method::GET, format!("/v1/exits/{exit}/provenance"), None),
    ];
    for (method, path, body) in cross {
        let status = call(&stack, &key_a, method.clone(), &path, body).await;
        assert_eq!(status, 404, "{method} {path} with account A's key");
    }

    // Operator-only routes: forbidden to account keys.
    let operator_only: Vec<(Method, String, Option<serde_json::Value>)> = vec![
        (
            Method::POST,
            "/v1/accounts".into(),
            Some(json!({"name": "x"})),
        ),
        (Method::POST, "/v1/api-keys".into(), Some(json!({}))),
        (
            Method::POST,
            "/v1/plans".into(),
            Some(json!({"name": "p", "prices": {}})),
        ),
        (
            Method::PUT,
            format!("/v1/accounts/{a}/plan"),
            Some(json!({"plan_id": exit})),
        ),
        (
            Method::POST,
            "/v1/enrollment-tokens".into(),
            Some(json!({"name": "x", "source_id": uuid::Uuid::new_v4(), "country": "DE"})),
        ),
        (Method::GET, "/v1/exits".into(), None),
        (Method::GET, format!("/v1/exits/{exit}"), None),
        (Method::POST, format!("/v1/exits/{exit}/drain"), None),
        (Method::POST, format!("/v1/exits/{exit}/undrain"), None),
        (Method::POST, format!("/v1/exits/{exit}/disable"), None),
        (Method::POST, format!("/v1/exits/{exit}/enable"), None),
        (Method::GET, "/v1/sources".into(), None),
        (
            Method::POST,
            "/v1/sources".into(),
            Some(json!({"name": "x", "source_type": "dc", "channel": "owned"})),
        ),
        (Method::GET, format!("/v1/sources/{exit}"), None),
        (
            Method::POST,
            "/v1/consent-notices".into(),
            Some(json!({"version": "v1", "body": "x"})),
        ),
        (Method::GET, format!("/v1/exits/{exit}/consent"), None),
        (
            Method::POST,
            format!("/v1/exits/{exit}/consent/revoke"),
            Some(json!({"reason": "x"})),
        ),
        (
            Method::GET,
            "/v1/abuse/lookup?egress_ip=127.0.0.2&at=2026-11-30T00:00:00Z".into(),
            None,
        ),
        (Method::GET, "/v1/audit".into(), None),
        (Method::GET, "/v1/accounts".into(), None),
        (Method::GET, "/v1/plans".into(), None),
        (
            Method::PUT,
            format!("/v1/accounts/{a}/entitlements"),
            Some(json!({})),
        ),
        (Method::DELETE, format!("/v1/accounts/{a}"), None),
        (
            Method::POST,
            format!("/v1/exits/{exit}/reinstate"),
            Some(
                json!({"method": "signed_contract", "notice_version": "v1", "evidence_ref": "x", "opt_out": "x"}),
            ),
        ),
    ];
    for (method, path, body) in operator_only {
        let status = call(&stack, &key_a, method.clone(), &path, body).await;
        assert_eq!(status, 403, "{method} {path} with an account key");
    }

    // No key or an unknown key: 401.
    assert_eq!(
        call(
            &stack,
            "pnkey_unknown",
            Method::GET,
            &format!("/v1/accounts/{a}"),
            None
        )
        .await,
        401
    );
    assert_eq!(
        stack
            .http
            .get(stack.api(&format!("/v1/accounts/{a}")))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );

    // Nothing of B's changed; B's own key still works on B.
    let user: serde_json::Value = stack
        .http
        .get(stack.api(&format!("/v1/users/{user_b}")))
        .bearer_auth(&key_b)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(user["enabled"], true);

    // A revoked key stops working.
    assert_eq!(
        call(
            &stack,
            &key_b,
            Method::DELETE,
            &format!("/v1/api-keys/{key_b_id}"),
            None
        )
        .await,
        204
    );
    assert_eq!(
        call(
            &stack,
            &key_b,
            Method::GET,
            &format!("/v1/accounts/{b}"),
            None
        )
        .await,
        401
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_page_by_key_with_link_headers() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec![],
        ..Default::default()
    })
    .await;
    let account = stack.create_account("paged").await;
    for i in 0..5 {
        stack
            .create_user(account, &format!("user{i}"), "paged-password")
            .await;
    }
    let mut next = Some(format!("/v1/accounts/{account}/users?limit=2"));
    let mut seen = Vec::new();
    let mut pages = 0;
    while let Some(path) = next.take() {
        let r = stack
            .http
            .get(stack.api(&path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        next = r
            .headers()
            .get("link")
            .and_then(|v| v.to_str().ok())
            .and_then(|l| l.strip_prefix('<'))
            .and_then(|l| l.split_once('>'))
            .map(|(url, _)| url.to_owned());
        let users: Vec<serde_json::Value> = r.json().await.unwrap();
        assert!(users.len() <= 2);
        seen.extend(
            users
                .iter()
                .map(|u| u["username"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        assert!(pages <= 5, "pagination does not end");
    }
    assert_eq!(seen, ["user0", "user1", "user2", "user3", "user4"]);
    assert_eq!(pages, 3);
    assert_eq!(
        call(
            &stack,
            ADMIN_TOKEN,
            Method::GET,
            &format!("/v1/accounts/{account}/users?limit=0"),
            None
        )
        .await,
        400
    );
}
