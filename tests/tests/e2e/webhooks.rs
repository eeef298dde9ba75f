//! Signed webhooks (docs/webhooks.md): an account manages its own webhooks
//! only; a quota running out through real tunnels, a revoked key and a
//! withdrawn exit reach their subscribers signed; a delivery pending when
//! the control-api dies is sent by the next one, once; a receiver that
//! never answers holds up no other webhook; one that keeps failing is
//! disabled until its owner enables it, and one the operator paused until
//! an operator does; a cascade of fifty revocations is one event per
//! webhook; a refused URL tells a customer the rule, not the address its
//! name resolves to.
//!
//! Each receiver is a real HTTP server on 127.0.0.1
//! (`proxynet_tests::webhook_receiver`; the stack runs the control-api with
//! `--webhook-allow-internal`; that loopback is refused without it is shown
//! by `control-api`'s `webhooks::target` tests). The signature is checked
//! with an HMAC written there from SHA-256, not with the server's code.

use proxynet_tests::process::eventually;
use proxynet_tests::stack::{created_id, Stack, StackOptions, ADMIN_TOKEN};
use proxynet_tests::webhook_receiver::{verified, Hit, Receiver};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

/// `method path` with `token` and a JSON `body`: the status and body.
async fn send(
    stack: &Stack,
    method: reqwest::Method,
    token: &str,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let r = stack
        .http
        .request(method, stack.api(path))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// `POST path` with `token` and `{url, events}`: the status and body.
async fn post_webhook(
    stack: &Stack,
    token: &str,
    path: &str,
    url: &str,
    events: &[&str],
) -> (u16, Value) {
    let body = json!({ "url": url, "events": events });
    send(stack, reqwest::Method::POST, token, path, body).await
}

/// A webhook that must be created: (id, secret).
async fn webhook(
    stack: &Stack,
    token: &str,
    path: &str,
    url: &str,
    events: &[&str],
) -> (Uuid, String) {
    let (status, body) = post_webhook(stack, token, path, url, events).await;
    assert_eq!(status, 201, "{body}");
    (
        body["id"].as_str().unwrap().parse().unwrap(),
        body["secret"].as_str().unwrap().to_owned(),
    )
}

async fn get(stack: &Stack, token: &str, path: &str) -> (u16, String) {
    let r = stack
        .http
        .get(stack.api(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn delete(stack: &Stack, token: &str, path: &str) -> u16 {
    stack
        .http
        .delete(stack.api(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The delivery history of a webhook, as the operator reads it.
async fn deliveries(stack: &Stack, path: &str) -> Vec<Value> {
    let (status, text) = get(stack, ADMIN_TOKEN, path).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_created_listed_and_deleted_by_their_own_account_only() {
    let stack = Stack::start().await;
    let receiver = Receiver::start().await;
    let (a, b) = (
        stack.create_account("hooks-a").await,
        stack.create_account("hooks-b").await,
    );
    let ((key_a, _), (key_b, _)) = (stack.account_key(a).await, stack.account_key(b).await);
    let hooks_a = format!("/v1/accounts/{a}/webhooks");
    let hooks_b = format!("/v1/accounts/{b}/webhooks");

    let (status, created) = post_webhook(
        &stack,
        &key_a,
        &hooks_a,
        &receiver.url(),
        &["quota.exhausted", "key.revoked", "quota.exhausted"],
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(
        secret.starts_with("pnwhsec_") && secret.len() > 40,
        "{created}"
    );
    assert_eq!(created["url"], receiver.url());
    assert_eq!(created["events"], json!(["quota.exhausted", "key.revoked"]));
    assert!(created["created_at"].is_string());

    // Listed without the secret, to the account and the operator.
    for token in [key_a.as_str(), ADMIN_TOKEN] {
        let (status, text) = get(&stack, token, &hooks_a).await;
        assert_eq!(status, 200, "{text}");
        assert!(
            !text.contains(&secret) && !text.contains("secret"),
            "{text}"
        );
        let list: Vec<Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(list.len(), 1, "{text}");
        assert_eq!(list[0]["id"], id.as_str());
    }

    // Another account's key finds none of it (404, as if absent).
    assert_eq!(get(&stack, &key_b, &hooks_a).await.0, 404);
    assert_eq!(
        post_webhook(&stack, &key_b, &hooks_a, &receiver.url(), &["key.revoked"])
            .await
            .0,
        404
    );
    assert_eq!(
        get(&stack, &key_b, &format!("{hooks_a}/{id}/deliveries"))
            .await
            .0,
        404
    );
    assert_eq!(
        delete(&stack, &key_b, &format!("{hooks_a}/{id}")).await,
        404
    );
    assert_eq!(
        delete(&stack, &key_b, &format!("{hooks_b}/{id}")).await,
        404
    );
    assert_eq!(get(&stack, &key_b, &hooks_b).await, (200, "[]".into()));

    // exit.withdrawn is the operator's: refused on an account's webhook,
    // taken on an operator webhook; account keys cannot reach those.
    let (status, problem) = post_webhook(
        &stack,
        &key_a,
        &hooks_a,
        &receiver.url(),
        &["exit.withdrawn"],
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("operator"),
        "{problem}"
    );
    let (status, problem) = post_webhook(
        &stack,
        ADMIN_TOKEN,
        &hooks_a,
        &receiver.url(),
        &["exit.withdrawn"],
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    let (op_id, _) = webhook(
        &stack,
        ADMIN_TOKEN,
        "/v1/webhooks",
        &receiver.url(),
        &["exit.withdrawn", "quota.warning"],
    )
    .await;
    assert_eq!(get(&stack, &key_a, "/v1/webhooks").await.0, 403);
    assert_eq!(
        post_webhook(
            &stack,
            &key_a,
            "/v1/webhooks",
            &receiver.url(),
            &["key.revoked"]
        )
        .await
        .0,
        403
    );
    let (_, ops) = get(&stack, ADMIN_TOKEN, "/v1/webhooks").await;
    let ops: Vec<Value> = serde_json::from_str(&ops).unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0]["id"], op_id.to_string());
    assert_eq!(ops[0]["account_id"], Value::Null);

    // What a URL and an event list must be.
    let port = receiver.addr.port();
    let long = format!("http://127.0.0.1:{port}/{}", "a".repeat(2048));
    let api_itself = stack.api("/v1/accounts");
    for (url, events, why) in [
        (
            format!("ftp://127.0.0.1:{port}/"),
            vec!["key.revoked"],
            "http",
        ),
        (
            format!("http://user:pw@127.0.0.1:{port}/"),
            vec!["key.revoked"],
            "credentials",
        ),
        (long, vec!["key.revoked"], "2048"),
        ("not a url".to_owned(), vec!["key.revoked"], "URL"),
        (api_itself, vec!["key.revoked"], "proxy network itself"),
        (
            "http://127.0.0.1:25/".to_owned(),
            vec!["key.revoked"],
            "port 25",
        ),
        (receiver.url(), vec![], "at least one"),
        (receiver.url(), vec!["quota.maybe"], "not one of"),
    ] {
        let (status, problem) = post_webhook(&stack, &key_a, &hooks_a, &url, &events).await;
        assert_eq!(status, 400, "{url} {events:?}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(why), "{url}: {detail}");
    }

    // At most ten per account.
    for _ in 1..10 {
        webhook(&stack, &key_a, &hooks_a, &receiver.url(), &["key.revoked"]).await;
    }
    let (status, problem) =
        post_webhook(&stack, &key_a, &hooks_a, &receiver.url(), &["key.revoked"]).await;
    assert_eq!(status, 409, "{problem}");

    // Deleted by its account: gone from the list, its history with it.
    assert_eq!(
        delete(&stack, &key_a, &format!("{hooks_a}/{id}")).await,
        204
    );
    assert_eq!(
        delete(&stack, &key_a, &format!("{hooks_a}/{id}")).await,
        404
    );
    assert_eq!(
        get(&stack, &key_a, &format!("{hooks_a}/{id}/deliveries"))
            .await
            .0,
        404
    );
    let (_, list) = get(&stack, &key_a, &hooks_a).await;
    let list: Vec<Value> = serde_json::from_str(&list).unwrap();
    assert_eq!(list.len(), 9);
    assert!(list.iter().all(|w| w["id"] != id.as_str()));
    assert_eq!(
        delete(&stack, &key_a, &format!("/v1/webhooks/{op_id}")).await,
        403
    );
    assert_eq!(
        delete(&stack, ADMIN_TOKEN, &format!("/v1/webhooks/{op_id}")).await,
        204
    );
    assert!(receiver.hits().is_empty(), "nothing was emitted");
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_running_out_through_tunnels_is_announced_signed_within_twenty_seconds() {
    const QUOTA: u64 = 200_000;
    const PASS: &str = "hooked-password-1";
    let stack = Stack::start().await;
    let (customer, operator) = (Receiver::start().await, Receiver::start().await);
    let account = stack.create_account("hooked").await;
    let r = stack
        .admin()
        .create_user_with(
            account,
            &json!({"username": "hooked", "password": PASS,
                      "limits": {"bandwidth_bytes": QUOTA, "period": "daily", "warn_percent": 50}}),
        )
        .await;
    let user = created_id(r, "create the metered user").await;
    let (key, _) = stack.account_key(account).await;
    let hooks = format!("/v1/accounts/{account}/webhooks");
    let (hook, secret) = webhook(
        &stack,
        &key,
        &hooks,
        &customer.url(),
        &["quota.warning", "quota.exhausted"],
    )
    .await;
    let (_, operator_secret) = webhook(
        &stack,
        ADMIN_TOKEN,
        "/v1/webhooks",
        &operator.url(),
        &["quota.exhausted"],
    )
    .await;

    // The quota runs out through a real tunnel: the stream is cut.
    let target = download_server(5_000_000).await;
    let (mut tunnel, head) =
        proxynet_tests::client::connect_tunnel(stack.proxy_addrs.proxy, "hooked", PASS, target)
            .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut received = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = tunnel.read(&mut buf).await {
        received += n as u64;
    }
    let ran_out = Instant::now();
    assert!(received < 5_000_000, "the stream was not cut");

    let exhausted = eventually(
        "quota.exhausted at the account's receiver",
        Duration::from_secs(20),
        || async { customer.accepted("quota.exhausted").into_iter().next() },
    )
    .await;
    assert!(ran_out.elapsed() <= Duration::from_secs(20));
    let body = verified(&secret, &exhausted);
    let data = &body["data"];
    assert_eq!(data["scope"], "user");
    assert_eq!(data["account_id"], account.to_string());
    assert_eq!(data["user_id"], user.to_string());
    assert_eq!(data["username"], "hooked");
    assert_eq!(data["period"], "daily");
    assert_eq!(data["limit_bytes"], QUOTA);
    assert!(data["used_bytes"].as_u64().unwrap() >= QUOTA, "{data}");
    let start =
        chrono::DateTime::parse_from_rfc3339(data["period_start"].as_str().unwrap()).unwrap();
    let end = chrono::DateTime::parse_from_rfc3339(data["period_end"].as_str().unwrap()).unwrap();
    assert_eq!(end - start, chrono::Duration::days(1));
    assert!(start.timestamp() <= chrono::Utc::now().timestamp());

    // The warning went first, or with it; the operator's webhook got the
    // same event (same body id) under its own delivery id and signature.
    let warning = eventually(
        "quota.warning at the account's receiver",
        Duration::from_secs(5),
        || async { customer.accepted("quota.warning").into_iter().next() },
    )
    .await;
    let warned = verified(&secret, &warning);
    assert_eq!(warned["data"]["warn_percent"], 50);
    let seen_by_operator = eventually(
        "quota.exhausted at the operator's receiver",
        Duration::from_secs(20),
        || async { operator.accepted("quota.exhausted").into_iter().next() },
    )
    .await;
    let op_body = verified(&operator_secret, &seen_by_operator);
    assert_eq!(op_body["id"], body["id"]);
    assert_ne!(seen_by_operator.delivery, exhausted.delivery);
    assert!(
        operator.accepted("quota.warning").is_empty(),
        "the operator subscribed to exhaustion only"
    );

    // The history says what the receiver saw; each event once per period.
    let history = deliveries(&stack, &format!("{hooks}/{hook}/deliveries")).await;
    assert_eq!(history.len(), 2, "{history:?}");
    for d in &history {
        assert_eq!(d["status"], "delivered", "{d}");
        assert_eq!(d["attempts"], 1, "{d}");
        assert_eq!(d["last_status_code"], 200, "{d}");
        assert!(
            d["delivered_at"].is_string() && d["next_attempt_at"].is_null(),
            "{d}"
        );
    }
    let delivery_ids: Vec<&str> = history.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert!(delivery_ids.contains(&exhausted.delivery.as_str()));
    assert_eq!(customer.hits().len(), 2, "{:?}", customer.hits());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_keys_and_withdrawn_exits_reach_their_subscribers() {
    let stack = Stack::start().await;
    let (customer, operator) = (Receiver::start().await, Receiver::start().await);
    let account = stack.create_account("revoker").await;
    let (key, _) = stack.account_key(account).await;
    let hooks = format!("/v1/accounts/{account}/webhooks");
    let (_, secret) = webhook(&stack, &key, &hooks, &customer.url(), &["key.revoked"]).await;
    let (_, operator_secret) = webhook(
        &stack,
        ADMIN_TOKEN,
        "/v1/webhooks",
        &operator.url(),
        &["key.revoked", "exit.withdrawn"],
    )
    .await;

    // A key and the key it minted, revoked by one call.
    let mint = |with: String, name: &'static str| {
        let stack = &stack;
        async move {
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
                body["id"].as_str().unwrap().to_owned(),
            )
        }
    };
    let (parent, parent_id) = mint(ADMIN_TOKEN.to_owned(), "parent").await;
    let (_, child_id) = mint(parent, "child").await;
    assert_eq!(
        delete(&stack, &key, &format!("/v1/api-keys/{parent_id}")).await,
        204
    );

    // One event for the key and the key it minted.
    for (receiver, secret) in [(&customer, &secret), (&operator, &operator_secret)] {
        let hit = eventually(
            "the key.revoked delivery",
            Duration::from_secs(10),
            || async { receiver.accepted("key.revoked").into_iter().next() },
        )
        .await;
        let body = verified(secret, &hit);
        let parent = &body["data"];
        assert_eq!(parent["key_id"], parent_id.as_str());
        assert_eq!(parent["name"], "parent");
        assert_eq!(parent["account_id"], account.to_string());
        assert_eq!(parent["cascade_from"], Value::Null);
        assert_eq!(parent["cause"], "revoked");
        assert_eq!(parent["revoked_by"], format!("account:{account}"));
        assert_eq!(parent["revoked_key_ids"], json!([parent_id, child_id]));
    }

    // The exit's owner withdraws it: the operator hears, the account cannot.
    let token_file = stack
        .dir
        .path()
        .join(format!("agent-{}.admin-token", stack.agents[0].egress_ip));
    let token = std::fs::read_to_string(token_file).unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://{}/opt-out", stack.agents[0].addrs.admin))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let withdrawn = eventually(
        "exit.withdrawn at the operator's receiver",
        Duration::from_secs(10),
        || async { operator.accepted("exit.withdrawn").into_iter().next() },
    )
    .await;
    let body = verified(&operator_secret, &withdrawn);
    assert_eq!(
        body["data"]["exit_id"],
        stack.agents[0].addrs.exit_id.to_string()
    );
    assert_eq!(body["data"]["cause"], "opt_out");
    assert!(body["data"]["withdrawn_at"].is_string(), "{body}");
    assert!(customer.hits().iter().all(|h| h.event == "key.revoked"));
    assert_eq!(operator.accepted("exit.withdrawn").len(), 1);
    assert_eq!(customer.accepted("key.revoked").len(), 1, "one event");
    assert_eq!(operator.accepted("key.revoked").len(), 1, "one event");
}

/// Mints a key for `account` with `with`: (key, id).
async fn mint_key(stack: &Stack, with: &str, account: Uuid, name: &str) -> (String, String) {
    let r = stack
        .http
        .post(stack.api(&format!("/v1/accounts/{account}/api-keys")))
        .bearer_auth(with)
        .json(&json!({ "name": name }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "mint {name}");
    let body: Value = r.json().await.unwrap();
    (
        body["key"].as_str().unwrap().to_owned(),
        body["id"].as_str().unwrap().to_owned(),
    )
}

/// Revoking the top of a lineage of fifty keys queues one `key.revoked`
/// per webhook, listing all fifty, not fifty events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_of_fifty_revocations_is_one_event_per_webhook() {
    let stack = Stack::start().await;
    let (customer, operator) = (Receiver::start().await, Receiver::start().await);
    let account = stack.create_account("long-lineage").await;
    let (key, _) = stack.account_key(account).await;
    let hooks = format!("/v1/accounts/{account}/webhooks");
    let (hook, secret) = webhook(&stack, &key, &hooks, &customer.url(), &["key.revoked"]).await;
    let (operator_hook, operator_secret) = webhook(
        &stack,
        ADMIN_TOKEN,
        "/v1/webhooks",
        &operator.url(),
        &["key.revoked"],
    )
    .await;
    // Each key mints the next: a lineage fifty deep.
    let (mut holder, root) = mint_key(&stack, ADMIN_TOKEN, account, "k0").await;
    let mut lineage = vec![root.clone()];
    for i in 1..50 {
        let (next, id) = mint_key(&stack, &holder, account, &format!("k{i}")).await;
        lineage.push(id);
        holder = next;
    }
    assert_eq!(
        delete(&stack, &key, &format!("/v1/api-keys/{root}")).await,
        204
    );

    for (receiver, secret) in [(&customer, &secret), (&operator, &operator_secret)] {
        let hit = eventually(
            "the key.revoked delivery",
            Duration::from_secs(10),
            || async { receiver.accepted("key.revoked").into_iter().next() },
        )
        .await;
        let body = verified(secret, &hit);
        let data = &body["data"];
        assert_eq!(data["key_id"], root.as_str(), "{data}");
        assert_eq!(data["cause"], "revoked");
        let listed: Vec<&str> = data["revoked_key_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_str().unwrap())
            .collect();
        let expected: Vec<&str> = lineage.iter().map(String::as_str).collect();
        assert_eq!(listed, expected, "every key, top of the lineage first");
    }
    // All were queued by the revocation's commit: one row per webhook.
    for history in [
        format!("{hooks}/{hook}/deliveries"),
        format!("/v1/webhooks/{operator_hook}/deliveries"),
    ] {
        let rows = deliveries(&stack, &history).await;
        assert_eq!(rows.len(), 1, "{history}: {rows:?}");
    }
    assert_eq!(customer.hits().len(), 1);
    assert_eq!(operator.hits().len(), 1);
}

/// A webhook URL refused for what its name resolves to tells a customer
/// the rule, never the address (that goes to the operator's log); the
/// operator is told the address too. (The stack allows internal targets,
/// so the refusals here are the ones that flag never lifts: the SMTP ports
/// and the control plane's own API.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_webhook_url_tells_a_customer_the_rule_but_not_the_address() {
    let stack = Stack::start().await;
    let account = stack.create_account("curious").await;
    let (key, _) = stack.account_key(account).await;
    let hooks = format!("/v1/accounts/{account}/webhooks");
    let api_port = reqwest::Url::parse(&stack.api_url).unwrap().port().unwrap();
    for (url, rule) in [
        ("http://localhost:25/hook".to_owned(), "port 25"),
        (
            format!("http://localhost:{api_port}/hook"),
            "proxy network itself",
        ),
    ] {
        let (status, problem) = post_webhook(&stack, &key, &hooks, &url, &["key.revoked"]).await;
        assert_eq!(status, 400, "{url}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(rule) && detail.contains("localhost"),
            "{url}: {detail}"
        );
        assert!(
            !detail.contains("127.0.0.1") && !detail.contains("::1"),
            "a customer is not told what the name resolves to: {detail}"
        );
        let (status, problem) =
            post_webhook(&stack, ADMIN_TOKEN, &hooks, &url, &["key.revoked"]).await;
        assert_eq!(status, 400, "{url}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("127.0.0.1") || detail.contains("::1"),
            "the operator is: {detail}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_pending_across_a_control_api_restart_is_delivered_once() {
    let mut stack = Stack::start().await;
    let receiver = Receiver::start().await;
    let account = stack.create_account("durable").await;
    let hooks = format!("/v1/accounts/{account}/webhooks");
    let (hook, secret) = webhook(
        &stack,
        ADMIN_TOKEN,
        &hooks,
        &receiver.url(),
        &["key.revoked"],
    )
    .await;
    let history = format!("{hooks}/{hook}/deliveries");
    let (_, doomed) = stack.account_key(account).await;

    // The first attempt is refused; its retry is due in about 5 s.
    receiver.fail_next.store(1, Ordering::SeqCst);
    assert_eq!(
        delete(&stack, ADMIN_TOKEN, &format!("/v1/api-keys/{doomed}")).await,
        204
    );
    let first = eventually(
        "the failed first attempt to be recorded",
        Duration::from_secs(10),
        || async {
            let rows = deliveries(&stack, &history).await;
            let row = rows.into_iter().next()?;
            (row["attempts"] == 1 && row["last_status_code"] == 500).then_some(row)
        },
    )
    .await;
    assert_eq!(first["status"], "pending");
    assert_eq!(first["last_response"], "not yet");
    assert!(first["next_attempt_at"].is_string());
    let delivery = first["id"].as_str().unwrap().to_owned();

    // The control-api dies before the retry; the one started after it sends it.
    let died = Instant::now();
    stack.restart_api_after_kill().await;
    let accepted = eventually(
        "the pending delivery to be sent after the restart",
        Duration::from_secs(30),
        || async { receiver.accepted("key.revoked").into_iter().next() },
    )
    .await;
    assert_eq!(accepted.delivery, delivery);
    assert!(
        accepted.at > died,
        "the retry came from the restarted control-api"
    );
    let body = verified(&secret, &accepted);
    assert_eq!(body["data"]["key_id"], doomed.to_string());
    let hits = receiver.hits();
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert_eq!(hits[0].delivery, hits[1].delivery);
    assert_eq!(
        hits[0].body, hits[1].body,
        "every attempt sends the same bytes"
    );
    let row = eventually(
        "the delivery to be recorded",
        Duration::from_secs(10),
        || async {
            let rows = deliveries(&stack, &history).await;
            rows.into_iter().find(|r| r["status"] == "delivered")
        },
    )
    .await;
    assert_eq!(row["attempts"], 2);
    assert_eq!(row["last_status_code"], 200);

    // Delivered is final: after one more restart, a fresh event is sent and
    // the delivered one is not sent again.
    stack.restart_api_after_kill().await;
    let (_, barrier) = stack.account_key(account).await;
    assert_eq!(
        delete(&stack, ADMIN_TOKEN, &format!("/v1/api-keys/{barrier}")).await,
        204
    );
    eventually(
        "the fresh event after the second restart",
        Duration::from_secs(10),
        || async {
            receiver
                .accepted("key.revoked")
                .into_iter()
                .find(|h| h.json()["data"]["key_id"] == barrier.to_string())
        },
    )
    .await;
    let of_first: Vec<Hit> = receiver
        .hits()
        .into_iter()
        .filter(|h| h.delivery == delivery)
        .collect();
    assert_eq!(of_first.len(), 2, "{of_first:?}");
    assert_eq!(of_first.iter().filter(|h| h.answered == 200).count(), 1);
}

/// A receiver that takes connections, reads what is sent and never answers:
/// how many it took, and how many our side has closed since.
struct Hanging {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl Hanging {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hanging = Self {
            addr: listener.local_addr().unwrap(),
            accepted: Arc::default(),
            closed: Arc::default(),
        };
        let (accepted, closed) = (hanging.accepted.clone(), hanging.closed.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let closed = closed.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                    closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        hanging
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_holds_up_no_other_webhook() {
    let stack = Stack::start().await;
    let (good, hanging) = (Receiver::start().await, Hanging::start().await);
    webhook(
        &stack,
        ADMIN_TOKEN,
        "/v1/webhooks",
        &format!("http://{}/hook", hanging.addr),
        &["key.revoked"],
    )
    .await;
    let (_, secret) = webhook(
        &stack,
        ADMIN_TOKEN,
        "/v1/webhooks",
        &good.url(),
        &["key.revoked"],
    )
    .await;
    // Five events, each waiting for both webhooks: more than one claim's
    // two rows per webhook.
    let account = stack.create_account("five-keys").await;
    for _ in 0..5 {
        let (_, id) = stack.account_key(account).await;
        assert_eq!(
            delete(&stack, ADMIN_TOKEN, &format!("/v1/api-keys/{id}")).await,
            204
        );
    }
    let hits = eventually(
        "all five at the receiver that answers",
        Duration::from_secs(30),
        || async {
            let hits = good.accepted("key.revoked");
            (hits.len() == 5).then_some(hits)
        },
    )
    .await;
    for hit in &hits {
        assert_eq!(verified(&secret, hit)["data"]["cause"], "revoked");
    }
    // All five came while the silent receiver's first attempts were still
    // waiting for an answer (an attempt is given up after 10 s): nothing
    // waited for them.
    assert!(hanging.accepted.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        hanging.closed.load(Ordering::SeqCst),
        0,
        "the silent receiver's attempts ended before the others were delivered"
    );
}

/// Mints a key for `account` and revokes it (operator): one `key.revoked`
/// for the account's webhooks, queued before this returns.
async fn revoke_a_key(stack: &Stack, account: Uuid) {
    let r = stack
        .http
        .post(stack.api(&format!("/v1/accounts/{account}/api-keys")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "name": "short-lived" }))
        .send()
        .await
        .unwrap();
    let id = created_id(r, "a key").await;
    assert_eq!(
        delete(stack, ADMIN_TOKEN, &format!("/v1/api-keys/{id}")).await,
        204
    );
}

/// `PATCH path {enabled}` with `token`: the status and body.
async fn set_enabled(stack: &Stack, token: &str, path: &str, enabled: bool) -> (u16, Value) {
    let body = json!({ "enabled": enabled });
    send(stack, reqwest::Method::PATCH, token, path, body).await
}

/// A receiver that keeps failing is disabled: here one attempt per delivery
/// and three failed deliveries in a row, of any age, disable a webhook (the
/// defaults: 15 attempts, 10 deliveries, the first 3 days old). A delivery
/// between failures starts the count again; once disabled, its owner sees
/// why, the operator's webhook hears `webhook.disabled`, no event queues for
/// it; its owner enables it and events flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_keeps_failing_is_disabled_until_its_owner_enables_it() {
    let stack = Stack::start_with(StackOptions {
        api_env: vec![
            ("PROXYNET_WEBHOOK_MAX_ATTEMPTS".into(), "1".into()),
            ("PROXYNET_WEBHOOK_DISABLE_AFTER_FAILURES".into(), "3".into()),
            ("PROXYNET_WEBHOOK_DISABLE_AFTER_SECS".into(), "0".into()),
        ],
        ..Default::default()
    })
    .await;
    let (customer, operator) = (Receiver::start().await, Receiver::start().await);
    let account = stack.create_account("flaky-receiver").await;
    let (key, _) = stack.account_key(account).await;
    let hooks = format!("/v1/accounts/{account}/webhooks");
    // The failing webhook hears of its own disabling no more than of
    // anything else; the account's other webhook and the operator's do.
    let (hook, _) = webhook(
        &stack,
        &key,
        &hooks,
        &customer.url(),
        &["key.revoked", "webhook.disabled"],
    )
    .await;
    let watcher = Receiver::start().await;
    let (_, watcher_secret) =
        webhook(&stack, &key, &hooks, &watcher.url(), &["webhook.disabled"]).await;
    let (operator_hook, operator_secret) = webhook(
        &stack,
        ADMIN_TOKEN,
        "/v1/webhooks",
        &operator.url(),
        &["webhook.disabled"],
    )
    .await;
    let history = format!("{hooks}/{hook}/deliveries");
    let listed = || async {
        let (status, text) = get(&stack, &key, &hooks).await;
        assert_eq!(status, 200, "{text}");
        let list: Vec<Value> = serde_json::from_str(&text).unwrap();
        list.into_iter()
            .find(|w| w["id"] == hook.to_string())
            .unwrap()
    };
    let wait_finished = |n: usize| {
        let (stack, history) = (&stack, &history);
        async move {
            eventually(
                "the deliveries to finish",
                Duration::from_secs(20),
                || async {
                    let rows = deliveries(stack, history).await;
                    (rows.len() == n && rows.iter().all(|d| d["status"] != "pending"))
                        .then_some(rows)
                },
            )
            .await
        }
    };

    // Two failures, then a delivery: the run starts again.
    customer.fail_next.store(2, Ordering::SeqCst);
    revoke_a_key(&stack, account).await;
    revoke_a_key(&stack, account).await;
    let rows = wait_finished(2).await;
    assert!(
        rows.iter()
            .all(|d| d["status"] == "failed" && d["attempts"] == 1),
        "{rows:?}"
    );
    assert_eq!(listed().await["failed_deliveries_in_row"], 2);
    revoke_a_key(&stack, account).await;
    wait_finished(3).await;
    let info = listed().await;
    assert_eq!(info["failed_deliveries_in_row"], 0, "{info}");
    assert_eq!(info["enabled"], true);

    // Three failures in a row: disabled.
    customer.fail_next.store(3, Ordering::SeqCst);
    for _ in 0..3 {
        revoke_a_key(&stack, account).await;
    }
    wait_finished(6).await;
    let info = eventually(
        "the webhook to be disabled",
        Duration::from_secs(10),
        || async {
            let info = listed().await;
            (info["enabled"] == false).then_some(info)
        },
    )
    .await;
    assert_eq!(info["failed_deliveries_in_row"], 3, "{info}");
    assert!(info["disabled_at"].is_string(), "{info}");
    let reason = info["disabled_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("3 deliveries in a row failed"),
        "{reason}"
    );
    assert!(reason.contains("500"), "{reason}");
    assert!(
        !reason.contains("receiver-own-token"),
        "never the URL: {reason}"
    );
    for (receiver, secret) in [(&operator, &operator_secret), (&watcher, &watcher_secret)] {
        let heard = eventually(
            "webhook.disabled at the operator's and the account's other receiver",
            Duration::from_secs(10),
            || async { receiver.accepted("webhook.disabled").into_iter().next() },
        )
        .await;
        let body = verified(secret, &heard);
        assert_eq!(body["data"]["webhook_id"], hook.to_string(), "{body}");
        assert_eq!(body["data"]["account_id"], account.to_string());
        assert_eq!(body["data"]["cause"], "failures");
        assert_eq!(body["data"]["failed_deliveries"], 3);
        assert!(!heard.body.contains("receiver-own-token"), "{}", heard.body);
    }
    let own = deliveries(&stack, &history).await;
    assert!(own.iter().all(|d| d["event"] == "key.revoked"), "{own:?}");

    // Disabled: nothing queues for it.
    let hits = customer.hits().len();
    revoke_a_key(&stack, account).await;
    assert_eq!(deliveries(&stack, &history).await.len(), 6);

    // Another account cannot touch it, nor an operator webhook; its owner
    // enables it.
    let (status, _) = set_enabled(
        &stack,
        &key,
        &format!("/v1/webhooks/{operator_hook}"),
        false,
    )
    .await;
    assert_eq!(status, 403, "operator webhooks are the operator's");
    let other = stack.create_account("neighbour").await;
    let (other_key, _) = stack.account_key(other).await;
    let (status, _) = set_enabled(&stack, &other_key, &format!("{hooks}/{hook}"), true).await;
    assert_eq!(status, 404, "another account's webhook looks absent");
    let (status, body) = set_enabled(
        &stack,
        &other_key,
        &format!("/v1/accounts/{other}/webhooks/{hook}"),
        true,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (status, info) = set_enabled(&stack, &key, &format!("{hooks}/{hook}"), true).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["enabled"], true);
    assert_eq!(info["disabled_reason"], Value::Null);
    assert_eq!(info["failed_deliveries_in_row"], 0);
    revoke_a_key(&stack, account).await;
    eventually(
        "an event delivered after enabling",
        Duration::from_secs(10),
        || async { (customer.hits().len() > hits).then_some(()) },
    )
    .await;
    assert_eq!(customer.hits().last().unwrap().answered, 200);

    // Paused by its owner, here with proxynetctl: its reason says so, and
    // events stop again.
    let out = tokio::process::Command::new(proxynet_tests::process::bin("proxynetctl"))
        .args(["--output", "json", "webhooks", "disable"])
        .arg(hook.to_string())
        .args(["--account", &account.to_string()])
        .env_clear()
        .env("PROXYNET_API", &stack.api_url)
        .env("PROXYNET_ADMIN_TOKEN", &key)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["enabled"], false, "{info}");
    assert_eq!(
        info["disabled_reason"],
        format!("disabled by account:{account}")
    );
    let queued = deliveries(&stack, &history).await.len();
    revoke_a_key(&stack, account).await;
    assert_eq!(deliveries(&stack, &history).await.len(), queued);
}

/// A webhook the operator paused stays paused until an operator enables it:
/// the account's own key is refused (403, naming the field).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_key_cannot_resume_a_webhook_the_operator_paused() {
    let stack = Stack::start().await;
    let receiver = Receiver::start().await;
    let account = stack.create_account("paused-by-operator").await;
    let (key, _) = stack.account_key(account).await;
    let hooks = format!("/v1/accounts/{account}/webhooks");
    let (hook, secret) = webhook(&stack, &key, &hooks, &receiver.url(), &["key.revoked"]).await;
    let path = format!("{hooks}/{hook}");

    let (status, info) = set_enabled(&stack, ADMIN_TOKEN, &path, false).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["enabled"], false);
    assert_eq!(info["disabled_by"], "operator");
    assert_eq!(info["disabled_reason"], "disabled by operator");

    let (status, problem) = set_enabled(&stack, &key, &path, true).await;
    assert_eq!(status, 403, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("enabled:") && detail.contains("operator"),
        "{detail}"
    );
    let (_, list) = get(&stack, &key, &hooks).await;
    let list: Vec<Value> = serde_json::from_str(&list).unwrap();
    assert_eq!(list[0]["enabled"], false, "still paused");
    revoke_a_key(&stack, account).await;
    assert!(
        deliveries(&stack, &format!("{path}/deliveries"))
            .await
            .is_empty(),
        "nothing queues for it"
    );

    // The operator lifts it; events flow again.
    let (status, info) = set_enabled(&stack, ADMIN_TOKEN, &path, true).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["enabled"], true);
    assert_eq!(info["disabled_by"], Value::Null);
    revoke_a_key(&stack, account).await;
    let hit = eventually(
        "an event after the operator enabled it",
        Duration::from_secs(10),
        || async { receiver.accepted("key.revoked").into_iter().next() },
    )
    .await;
    verified(&secret, &hit);
}
