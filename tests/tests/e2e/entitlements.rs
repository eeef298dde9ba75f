//! What an operator sets bounds what an account's own keys may set: limits
//! on a user are ceilings, an account's entitlements bound the account as a
//! whole, and a plan decides which source types the account may route
//! through — and what its bytes cost, fixed when they move.

use proxynet_tests::client::connect_tunnel;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{created_id, Stack, ADMIN_TOKEN};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;
use uuid::Uuid;

const PASS: &str = "ceiling-password-1";

async fn call(stack: &Stack, key: &str, method: Method, path: &str, body: Value) -> (u16, Value) {
    let r = stack
        .http
        .request(method, stack.api(path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_key_cannot_lift_the_limits_an_operator_set() {
    let stack = Stack::start().await;
    let account = stack.create_account("ceilinged").await;
    let (status, user) = call(
        &stack,
        ADMIN_TOKEN,
        Method::POST,
        &format!("/v1/accounts/{account}/users"),
        json!({"username": "ceilinged", "password": PASS, "limits": {
            "max_concurrent_tunnels": 1, "bandwidth_bytes": 300_000, "period": "daily",
            "allowed_source_types": ["dc"], "allowed_channels": ["owned"]}}),
    )
    .await;
    assert_eq!(status, 201, "{user}");
    let user_id = user["id"].as_str().unwrap().to_owned();
    let key = stack.account_key(account).await.0;

    // Removing every limit: the ceilings stay (the customer may only lower).
    let (status, patched) = call(
        &stack,
        &key,
        Method::PATCH,
        &format!("/v1/users/{user_id}"),
        json!({"limits": {}}),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["max_concurrent_tunnels"], 1, "{patched}");
    assert_eq!(patched["bandwidth_bytes"], 300_000, "{patched}");
    assert_eq!(patched["allowed_source_types"], json!(["dc"]), "{patched}");
    assert_eq!(patched["allowed_channels"], json!(["owned"]), "{patched}");

    // Raising or widening one: 403 naming the field.
    for (limits, field) in [
        (
            json!({"max_concurrent_tunnels": 5}),
            "limits.max_concurrent_tunnels",
        ),
        (
            json!({"bandwidth_bytes": 10_000_000}),
            "limits.bandwidth_bytes",
        ),
        (
            json!({"allowed_source_types": ["dc", "res"]}),
            "limits.allowed_source_types",
        ),
        (
            json!({"allowed_channels": ["owned", "sdk"]}),
            "limits.allowed_channels",
        ),
    ] {
        let (status, problem) = call(
            &stack,
            &key,
            Method::PATCH,
            &format!("/v1/users/{user_id}"),
            json!({ "limits": limits }),
        )
        .await;
        assert_eq!(status, 403, "{field}: {problem}");
        assert_eq!(problem["status"], 403);
        assert!(
            problem["detail"].as_str().unwrap().starts_with(field),
            "{field}: {problem}"
        );
    }
    // Lowering is the customer's right.
    let (status, lowered) = call(
        &stack,
        &key,
        Method::PATCH,
        &format!("/v1/users/{user_id}"),
        json!({"limits": {"bandwidth_bytes": 200_000}}),
    )
    .await;
    assert_eq!(status, 200, "{lowered}");
    assert_eq!(lowered["bandwidth_bytes"], 200_000);
    assert_eq!(lowered["max_concurrent_tunnels"], 1, "the rest kept");
    let (_, restored) = call(
        &stack,
        &key,
        Method::PATCH,
        &format!("/v1/users/{user_id}"),
        json!({"limits": {}}),
    )
    .await;
    assert_eq!(
        restored["bandwidth_bytes"], 300_000,
        "back up to the ceiling"
    );

    // Nor can it shed them by deleting and re-creating the user, or undo an
    // operator's disable.
    let (status, problem) = call(
        &stack,
        &key,
        Method::DELETE,
        &format!("/v1/users/{user_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 403, "{problem}");
    let (status, _) = call(
        &stack,
        ADMIN_TOKEN,
        Method::PATCH,
        &format!("/v1/users/{user_id}"),
        json!({"enabled": false}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, problem) = call(
        &stack,
        &key,
        Method::PATCH,
        &format!("/v1/users/{user_id}"),
        json!({"enabled": true}),
    )
    .await;
    assert_eq!(status, 403, "{problem}");
    let (status, _) = call(
        &stack,
        ADMIN_TOKEN,
        Method::PATCH,
        &format!("/v1/users/{user_id}"),
        json!({"enabled": true}),
    )
    .await;
    assert_eq!(status, 200);

    // Enforced: the second concurrent tunnel is refused. The superproxy
    // re-read the disabled record on the first PATCH's change event; the
    // second's arrives a moment after the PATCH answers.
    let proxy = stack.proxy_addrs.proxy;
    let _first = eventually(
        "the re-enabled user to be served",
        Duration::from_secs(5),
        || async {
            let (stream, head) = connect_tunnel(proxy, "ceilinged", PASS, stack.whoami).await;
            head.starts_with("HTTP/1.1 200").then_some(stream)
        },
    )
    .await;
    let (_, refused) = connect_tunnel(proxy, "ceilinged", PASS, stack.whoami).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    // The quota endpoint reports the operator's figure.
    let (status, quota) = call(
        &stack,
        &key,
        Method::GET,
        &format!("/v1/users/{user_id}/quota"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(quota["bandwidth_bytes"], 300_000, "{quota}");
    assert_eq!(quota["period"], "daily");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accounts_entitlements_bound_its_users_together_and_alone() {
    let stack = Stack::start().await;
    let account = stack.create_account("entitled").await;
    stack
        .set_entitlements(account, json!({"limits": {"max_concurrent_tunnels": 1}}))
        .await;
    let key = stack.account_key(account).await.0;
    // A user above the account's total is refused when the account asks.
    let (status, problem) = call(
        &stack,
        &key,
        Method::POST,
        &format!("/v1/accounts/{account}/users"),
        json!({"username": "greedy", "password": PASS, "limits": {"max_concurrent_tunnels": 10}}),
    )
    .await;
    assert_eq!(status, 403, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("limits.max_concurrent_tunnels: the account's entitlement is 1"),
        "{problem}"
    );
    for name in ["first", "second"] {
        let (status, user) = call(
            &stack,
            &key,
            Method::POST,
            &format!("/v1/accounts/{account}/users"),
            json!({"username": format!("ent_{name}"), "password": PASS}),
        )
        .await;
        assert_eq!(status, 201, "{user}");
    }
    // The account's total holds across its users: one tunnel for both.
    let proxy = stack.proxy_addrs.proxy;
    let (_held, head) = connect_tunnel(proxy, "ent_first", PASS, stack.whoami).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_, refused) = connect_tunnel(proxy, "ent_second", PASS, stack.whoami).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(
        refused.contains("the account's concurrent tunnel limit (1)"),
        "{refused}"
    );
    drop(_held);
    eventually(
        "the held lease to be released",
        Duration::from_secs(5),
        || async {
            let (_, head) = connect_tunnel(proxy, "ent_second", PASS, stack.whoami).await;
            head.starts_with("HTTP/1.1 200").then_some(())
        },
    )
    .await;
    // The account's restriction holds for users that set none: the demo
    // exits are in DE, the account may use FR only.
    stack
        .set_entitlements(account, json!({"limits": {"allowed_countries": ["FR"]}}))
        .await;
    // The superproxy already holds ent_second's record: the change event that
    // drops it arrives a moment after the PUT answers.
    eventually("no FR exit: 503", Duration::from_secs(5), || async {
        let (_, head) = connect_tunnel(proxy, "ent_second", PASS, stack.whoami).await;
        head.starts_with("HTTP/1.1 503").then_some(())
    })
    .await;
    let (_, head) = connect_tunnel(proxy, "ent_second-country-de", PASS, stack.whoami).await;
    assert!(
        head.starts_with("HTTP/1.1 403"),
        "a country outside the entitlement: {head}"
    );
}

async fn plan(stack: &Stack, name: &str, prices: Value) -> Uuid {
    let r = stack
        .http
        .post(stack.api("/v1/plans"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": name, "prices": prices}))
        .send()
        .await
        .unwrap();
    created_id(r, "create plan").await
}

async fn set_plan(stack: &Stack, account: Uuid, plan: Uuid) {
    let r = stack
        .http
        .put(stack.api(&format!("/v1/accounts/{account}/plan")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "plan_id": plan }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

/// This month's invoice as JSON.
async fn invoice(stack: &Stack, account: Uuid) -> Value {
    stack
        .admin_get_json(&format!("/v1/accounts/{account}/invoices"))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_decides_what_an_account_routes_through_and_prices_it_for_good() {
    let stack = Stack::start().await;
    let res_only = plan(&stack, "residential only", json!({"res": 800})).await;
    let dc_plan = plan(&stack, "datacenter", json!({"dc": 150})).await;

    // A plan that prices only `res` cannot tunnel through the demo's dc exits.
    let residential = stack.create_account("res-buyer").await;
    set_plan(&stack, residential, res_only).await;
    stack.create_user(residential, "resbuyer", PASS).await;
    let proxy = stack.proxy_addrs.proxy;
    let (_, head) = connect_tunnel(proxy, "resbuyer", PASS, stack.whoami).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(
        head.contains("error=http_request_denied") && head.contains("prices: res"),
        "{head}"
    );
    let (_, head) = connect_tunnel(proxy, "resbuyer-type-dc", PASS, stack.whoami).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("does not price type=dc"), "{head}");

    // A dc plan routes, and its invoice does not move when the source is re-typed.
    let buyer = stack.create_account("dc-buyer").await;
    set_plan(&stack, buyer, dc_plan).await;
    let user = stack.create_user(buyer, "dcbuyer", PASS).await;
    let out = proxynet_tests::client::curl(&[
        "-sS",
        "-p",
        "-x",
        &format!("http://dcbuyer:{PASS}@{proxy}"),
        &stack.whoami_url(),
    ])
    .await;
    assert_eq!(out.status, 200, "{} {}", out.headers, out.body);
    eventually(
        "the dc buyer's bytes in the ledger",
        Duration::from_secs(20),
        || async {
            let rows = stack.usage_by_user(buyer).await;
            rows.iter()
                .find(|r| r["user_id"] == user.to_string())
                .filter(|r| r["bytes_down"].as_u64().unwrap_or(0) > 0)
                .map(|_| ())
        },
    )
    .await;
    let before = invoice(&stack, buyer).await;
    let lines = before["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 1, "{before}");
    assert_eq!(lines[0]["source_type"], "dc");
    assert_eq!(lines[0]["cents_per_gb"], 150);

    let source = stack.complete_dc_source().await;
    let mut replaced = stack.admin_get_json(&format!("/v1/sources/{source}")).await;
    let obj = replaced.as_object_mut().unwrap();
    obj.retain(|k, _| {
        [
            "name",
            "channel",
            "supplier",
            "agreement_ref",
            "notice_description",
            "opt_out",
            "liable_party",
            "abuse_contact",
            "countries",
            "consent_required",
        ]
        .contains(&k.as_str())
    });
    obj.insert("source_type".into(), json!("isp"));
    let r = stack
        .http
        .put(stack.api(&format!("/v1/sources/{source}")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&replaced)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    // And a plan change does not re-price the past either.
    set_plan(&stack, buyer, res_only).await;
    let after = invoice(&stack, buyer).await;
    assert_eq!(
        before["lines"], after["lines"],
        "re-priced: {before} vs {after}"
    );
    assert_eq!(before["total_cents"], after["total_cents"]);
}
