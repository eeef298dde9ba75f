//! The routes driven in-process (`tower::ServiceExt::oneshot`, no sockets)
//! against a database and a Redis key prefix of their own on the test
//! servers `scripts/test` starts: what the HTTP layer answers, and that a
//! refused request changed nothing.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use sqlx::Connection;
use tower::ServiceExt;
use uuid::Uuid;

use crate::config::Config;
use crate::ControlApi;

const ADMIN: &str = "unit-test-admin-token-0123456789abcdef";

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run the tests with scripts/test"))
}

/// The control-api's router on a fresh database and key prefix.
async fn app() -> Router {
    app_and_state().await.0
}

/// [`app`], and the state behind it (its stores).
async fn app_and_state() -> (Router, crate::AppState) {
    let server = env("PROXYNET_TEST_DATABASE_URL");
    let name = format!("u_{}", Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&server).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    // The server URL names a database last: swap it for ours.
    let (base, _) = server.rsplit_once('/').unwrap();
    let database_url = format!("{base}/{name}");
    let redis_url = env("PROXYNET_TEST_REDIS_URL");
    let mut args = vec![
        "control-api".to_owned(),
        "--listen=127.0.0.1:0".into(),
        "--admin-listen=127.0.0.1:0".into(),
        format!("--database-url={database_url}"),
        format!("--redis-url={redis_url}"),
        format!("--redis-prefix={name}:"),
        format!("--admin-token={ADMIN}"),
    ];
    if std::env::var("PROXYNET_TEST_REDIS_CLUSTER").is_ok_and(|v| v == "true") {
        args.push("--redis-cluster".into());
    }
    let config = <Config as clap::Parser>::try_parse_from(args).unwrap();
    let api = ControlApi::bind(config).await.unwrap();
    (crate::routes::router(api.state.clone()), api.state.clone())
}

/// One request; the status, the content type and the JSON body (or Null).
async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, String, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(body.map(|b| Body::from(b.to_owned())).unwrap_or_default())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, content_type, json)
}

async fn account(app: &Router, name: &str) -> (Uuid, String) {
    let (status, _, created) = call(
        app,
        Method::POST,
        "/v1/accounts",
        Some(ADMIN),
        Some(&json!({ "name": name }).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    let (status, _, key) = call(
        app,
        Method::POST,
        &format!("/v1/accounts/{id}/api-keys"),
        Some(ADMIN),
        Some(r#"{"name": "k"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{key}");
    (id, key["key"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn malformed_json_is_a_problem_and_writes_nothing() {
    let app = app().await;
    let (status, content_type, problem) = call(
        &app,
        Method::POST,
        "/v1/accounts",
        Some(ADMIN),
        Some(r#"{"name": "#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        content_type.starts_with("application/problem+json"),
        "{content_type}"
    );
    assert_eq!(problem["status"], 400, "{problem}");
    let (_, _, listed) = call(&app, Method::GET, "/v1/accounts", Some(ADMIN), None).await;
    assert_eq!(listed, json!([]), "nothing was created");
}

#[tokio::test]
async fn another_accounts_resources_look_exactly_like_missing_ones() {
    let app = app().await;
    let (_, key_a) = account(&app, "a").await;
    let (b, _) = account(&app, "b").await;
    let theirs = call(
        &app,
        Method::GET,
        &format!("/v1/accounts/{b}"),
        Some(&key_a),
        None,
    )
    .await;
    let nobodys = call(
        &app,
        Method::GET,
        &format!("/v1/accounts/{}", Uuid::new_v4()),
        Some(&key_a),
        None,
    )
    .await;
    assert_eq!(theirs.0, StatusCode::NOT_FOUND);
    // Same status, same body: no oracle for which ids exist.
    assert_eq!(theirs.0, nobodys.0);
    assert_eq!(theirs.2, nobodys.2);
    // Nor can the key create users in the other account.
    let (status, _, _) = call(
        &app,
        Method::POST,
        &format!("/v1/accounts/{b}/users"),
        Some(&key_a),
        Some(&json!({"username": "intruder", "password": "long-enough-1"}).to_string()),
    )
    .await;
    assert!(
        matches!(status, StatusCode::NOT_FOUND | StatusCode::FORBIDDEN),
        "{status}"
    );
    let (_, _, users) = call(
        &app,
        Method::GET,
        &format!("/v1/accounts/{b}/users"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(users, json!([]));
}

#[tokio::test]
async fn no_token_is_a_bearer_challenge_and_an_account_key_mints_no_operator_key() {
    let app = app().await;
    let (status, _, _) = call(&app, Method::GET, "/v1/accounts", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, key) = account(&app, "a").await;
    let (status, content_type, _) = call(
        &app,
        Method::POST,
        "/v1/api-keys",
        Some(&key),
        Some(r#"{"name": "k"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(content_type.starts_with("application/problem+json"));
    let (status, _, _) = call(&app, Method::GET, "/v1/accounts", Some(&key), None).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "listing every account is the operator's"
    );
}

#[tokio::test]
async fn the_document_lists_every_operation_the_table_routes() {
    let app = app().await;
    let (status, _, doc) = call(&app, Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let operations = crate::routes::operations();
    assert!(operations.len() > 50);
    for op in &operations {
        assert!(
            doc["paths"][op.path][op.method]["responses"].is_object(),
            "{} {} missing from the document",
            op.method,
            op.path
        );
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|ops| ops.as_object().unwrap().len())
        .sum();
    assert_eq!(documented, operations.len());
}

#[tokio::test]
async fn every_protected_operation_refuses_a_caller_without_credentials_and_operator_ones_an_account_key(
) {
    let app = app().await;
    let (account_id, key) = account(&app, "a").await;
    let concrete = |path: &str| {
        path.split('/')
            .map(|seg| match seg {
                "{id}" => account_id.to_string(),
                s if s.starts_with('{') => "x".to_owned(),
                s => s.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("/")
    };
    let mut checked = 0;
    for op in crate::routes::operations() {
        if matches!(op.auth(), crate::openapi::Auth::None) {
            continue;
        }
        let method = Method::from_bytes(op.method.to_uppercase().as_bytes()).unwrap();
        let uri = concrete(op.path);
        let body = (method != Method::GET && method != Method::DELETE).then_some("{}");
        let (status, _, problem) = call(&app, method.clone(), &uri, None, body).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {uri} without credentials: {problem}"
        );
        if matches!(op.auth(), crate::openapi::Auth::Operator) {
            let (status, _, problem) = call(&app, method.clone(), &uri, Some(&key), body).await;
            assert!(
                matches!(status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND),
                "{method} {uri} with an account key: {status} {problem}"
            );
        }
        checked += 1;
    }
    assert!(checked > 40, "only {checked} protected operations");
}

/// An exit enrolled from `egress_ip` under a complete datacenter source:
/// (exit id, its credential).
async fn enrolled_exit(app: &Router, egress_ip: &str) -> (Uuid, String) {
    let source = json!({
        "name": "dc", "source_type": "dc", "channel": "owned", "supplier": "s",
        "agreement_ref": "a", "notice_description": "n", "opt_out": "o",
        "liable_party": "l", "abuse_contact": "abuse@example.test", "countries": ["DE"],
    });
    let (status, _, source) = call(
        app,
        Method::POST,
        "/v1/sources",
        Some(ADMIN),
        Some(&source.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{source}");
    let token = json!({"name": "e", "source_id": source["id"], "country": "DE"});
    let (status, _, token) = call(
        app,
        Method::POST,
        "/v1/enrollment-tokens",
        Some(ADMIN),
        Some(&token.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let enroll = json!({"token": token["token"], "egress_ips": [egress_ip]});
    let (status, _, enrolled) = call(
        app,
        Method::POST,
        "/v1/agent/enroll",
        None,
        Some(&enroll.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{enrolled}");
    (
        enrolled["exit_id"].as_str().unwrap().parse().unwrap(),
        enrolled["credential"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn an_egress_report_counts_only_signed_fresh_reflections_and_keeps_history() {
    use proxynet_wire::reflector::Reflection;
    let (app, state) = app_and_state().await;
    let (exit, credential) = enrolled_exit(&app, "198.51.100.7").await;
    let key = proxynet_store::reflector_key(&mut state.redis.clone(), state.projector.keys())
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let report = |reflection: Reflection| {
        json!({"observed": [{"egress": "198.51.100.7", "bound": "198.51.100.7", "reflection": reflection}]})
            .to_string()
    };
    let path = format!("/v1/agent/exits/{exit}/egress");
    let seen =
        |address: &str, at: i64| Reflection::signed(&key, address.parse().unwrap(), at, Some(exit));

    // Not the agent's: refused before anything is read.
    let (status, _, _) = call(
        &app,
        Method::POST,
        &path,
        Some("pnexit_wrong"),
        Some(&report(seen("198.51.100.7", now))),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // An agent inventing what the reflector saw: not recorded.
    let forged = Reflection::signed(
        b"a key of its own",
        "198.51.100.7".parse().unwrap(),
        now,
        Some(exit),
    );
    let (status, _, answer) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(forged)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["accepted"], 0);
    assert!(
        answer["ignored"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("proof"),
        "{answer}"
    );
    assert_eq!(answer["verification"], "unobserved");

    let (_, _, answer) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("198.51.100.7", now - 60))),
    )
    .await;
    assert_eq!(
        (answer["accepted"].as_i64(), answer["verification"].as_str()),
        (Some(1), Some("verified")),
        "{answer}"
    );
    // The world now sees another address: a new row, and a mismatch.
    let (_, _, answer) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("203.0.113.9", now - 30))),
    )
    .await;
    assert_eq!(answer["verification"], "mismatch", "{answer}");
    // The same address again extends the row; an older report is ignored.
    call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("203.0.113.9", now))),
    )
    .await;
    let (_, _, late) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("198.51.100.7", now - 120))),
    )
    .await;
    assert_eq!(late["accepted"], 0, "{late}");

    let (_, _, view) = call(
        &app,
        Method::GET,
        &format!("/v1/exits/{exit}"),
        Some(ADMIN),
        None,
    )
    .await;
    let egress = &view["egress"];
    assert_eq!(egress["verification"], "mismatch", "{view}");
    assert_eq!(
        egress["routable"], true,
        "flagged only: the strict policy is off"
    );
    assert_eq!(egress["observed"][0]["observed"], "203.0.113.9");
    assert_eq!(egress["observed"][0]["status"], "mismatch");
    let history = egress["history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{view}");
    assert_eq!(history[0]["observed"], "203.0.113.9");
    assert_eq!(
        history[0]["first_seen"],
        json!(chrono::DateTime::from_timestamp(now - 30, 0).unwrap())
    );
    assert_eq!(
        history[0]["last_seen"],
        json!(chrono::DateTime::from_timestamp(now, 0).unwrap())
    );
    assert_eq!(history[1]["observed"], "198.51.100.7");

    let (_, _, audit) = call(
        &app,
        Method::GET,
        &format!("/v1/audit?action=exit.egress_verification&subject={exit}"),
        Some(ADMIN),
        None,
    )
    .await;
    let changes: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["detail"]["to"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["mismatch", "verified"], "newest first");
}

#[tokio::test]
async fn a_redial_in_the_same_second_is_the_latest_and_address_changes_are_bounded() {
    use proxynet_wire::reflector::Reflection;
    let (app, state) = app_and_state().await;
    let (exit, credential) = enrolled_exit(&app, "198.51.100.8").await;
    let key = proxynet_store::reflector_key(&mut state.redis.clone(), state.projector.keys())
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let path = format!("/v1/agent/exits/{exit}/egress");
    let report = |address: &str| {
        let reflection = Reflection::signed(&key, address.parse().unwrap(), now, Some(exit));
        json!({"observed": [{"egress": "198.51.100.8", "bound": "198.51.100.8", "reflection": reflection}]})
            .to_string()
    };
    // Reflections carry whole seconds: a re-dial within the second is
    // still the newer row.
    for address in ["203.0.113.1", "203.0.113.2"] {
        let (_, _, answer) = call(
            &app,
            Method::POST,
            &path,
            Some(&credential),
            Some(&report(address)),
        )
        .await;
        assert_eq!(answer["accepted"], 1, "{answer}");
    }
    let (_, _, view) = call(
        &app,
        Method::GET,
        &format!("/v1/exits/{exit}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        view["egress"]["observed"][0]["observed"], "203.0.113.2",
        "{view}"
    );
    assert_eq!(view["egress"]["history"][0]["observed"], "203.0.113.2");
    assert_eq!(view["egress"]["history"][1]["observed"], "203.0.113.1");

    // Two valid reflections replayed in turn: each is a change, and the
    // history stops growing at the hourly bound.
    let mut last = serde_json::Value::Null;
    // (The same address as the latest row only extends it, and is taken.)
    for i in 0..=crate::routes::egress::MAX_CHANGES_PER_EXIT_HOUR {
        let address = if i % 2 == 0 {
            "203.0.113.1"
        } else {
            "203.0.113.2"
        };
        last = call(
            &app,
            Method::POST,
            &path,
            Some(&credential),
            Some(&report(address)),
        )
        .await
        .2;
    }
    assert_eq!(last["accepted"], 0, "{last}");
    assert!(
        last["ignored"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("too many"),
        "{last}"
    );
    let (rows,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM exit_egress_observations WHERE exit_id = $1")
            .bind(exit)
            .fetch_one(&state.db)
            .await
            .unwrap();
    assert_eq!(rows, crate::routes::egress::MAX_CHANGES_PER_EXIT_HOUR);
}

#[tokio::test]
async fn the_desk_takes_networks_of_bounded_width_and_exports_bounded_ranges() {
    let app = app().await;
    let lookup = |q: &str| format!("/v1/abuse/lookup?at=2026-11-30T10:00:00Z&egress_ip={q}");
    for ok in ["198.51.100.7", "2001:db8:1:2::/64", "198.51.0.0/16"] {
        let (status, _, rows) = call(&app, Method::GET, &lookup(ok), Some(ADMIN), None).await;
        assert_eq!((status, rows), (StatusCode::OK, json!([])), "{ok}");
    }
    for bad in ["198.0.0.0/8", "2001:db8::/16", "shop.example"] {
        let (status, _, _) = call(&app, Method::GET, &lookup(bad), Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let export = |q: &str| format!("/v1/abuse/export?{q}");
    let (status, content_type, rows) = call(
        &app,
        Method::GET,
        &export("from=2026-11-01T00:00:00Z&to=2026-11-30T00:00:00Z"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!((status, rows), (StatusCode::OK, json!([])));
    assert_eq!(content_type, "application/json");
    for bad in [
        "from=2026-10-01T00:00:00Z&to=2026-11-30T00:00:00Z",
        "from=2026-11-30T00:00:00Z&to=2026-11-01T00:00:00Z",
        "from=2026-11-01T00:00:00Z&to=2026-11-02T00:00:00Z&format=xml",
    ] {
        let (status, _, _) = call(&app, Method::GET, &export(bad), Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (_, _, audit) = call(
        &app,
        Method::GET,
        "/v1/audit?action=abuse.lookup",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        audit.as_array().unwrap().len(),
        3,
        "every lookup answered is audited"
    );
    // The window for clock skew is bounded: up to an hour either side.
    for (window, want) in [
        ("0", StatusCode::OK),
        ("60", StatusCode::OK),
        ("61", StatusCode::BAD_REQUEST),
        ("-1", StatusCode::BAD_REQUEST),
    ] {
        let q = format!("198.51.100.7&window_minutes={window}");
        let (status, _, body) = call(&app, Method::GET, &lookup(&q), Some(ADMIN), None).await;
        assert_eq!(status, want, "window {window}: {body}");
    }
}

#[tokio::test]
async fn deleting_an_account_tells_the_operators_webhooks_of_each_key_it_revoked() {
    let (app, state) = app_and_state().await;
    let (account, _) = account(&app, "leaving").await;
    let (status, _, _) = call(
        &app,
        Method::POST,
        &format!("/v1/accounts/{account}/api-keys"),
        Some(ADMIN),
        Some(r#"{"name": "second"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // Written as the webhook routes would (their URL check resolves names).
    let operator_hook = Uuid::new_v4();
    let account_hook = Uuid::new_v4();
    for (id, owner) in [(operator_hook, None), (account_hook, Some(account))] {
        sqlx::query(
            "INSERT INTO webhooks (id, account_id, url, events, secret)
             VALUES ($1, $2, 'https://hooks.example.test/', ARRAY['key.revoked'], 'pnwhsec_t')",
        )
        .bind(id)
        .bind(owner)
        .execute(&state.db)
        .await
        .unwrap();
    }
    let (status, _, _) = call(
        &app,
        Method::DELETE,
        &format!("/v1/accounts/{account}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let bodies: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT webhook_id, body FROM webhook_deliveries WHERE event = 'key.revoked'",
    )
    .fetch_all(&state.db)
    .await
    .unwrap();
    assert_eq!(bodies.len(), 2, "one event per key: {bodies:?}");
    for (hook, body) in &bodies {
        assert_eq!(*hook, operator_hook, "a deleted account hears nothing more");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["data"]["account_id"], account.to_string(), "{body}");
        assert_eq!(body["data"]["cause"], "account_deleted");
        assert_eq!(body["data"]["revoked_by"], "operator");
        assert!(body["data"]["cascade_from"].is_null());
    }
}

#[tokio::test]
async fn domain_listings_are_kept_for_two_days_and_late_usage_is_other() {
    use crate::usage_domains::{bounded, prune, LISTED_HOURS, OTHER};
    let (_, state) = app_and_state().await;
    let account = Uuid::new_v4();
    let now = chrono::Utc::now().timestamp();
    let row = |minute: i64, domain: &str| proxynet_store::UsageRow {
        account_id: account,
        user_id: Uuid::new_v4(),
        exit_id: Uuid::new_v4(),
        minute: minute - minute.rem_euclid(60),
        bytes_up: 1,
        bytes_down: 1,
        source_type: None,
        domain: Some(domain.to_owned()),
    };
    let fresh = row(now, "fresh.example");
    let late = row(now - (LISTED_HOURS + 1) * 3600, "late.example");
    let mut tx = state.db.begin().await.unwrap();
    let kept = bounded(&mut tx, &[fresh.clone(), late.clone()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(kept.name(&fresh).as_deref(), Some("fresh.example"));
    assert_eq!(
        kept.name(&late).as_deref(),
        Some(OTHER),
        "its hour's listing may be gone"
    );
    // A listing past the window (and its hour of margin) goes; the current
    // hour's stays.
    sqlx::query(
        "INSERT INTO usage_domains_hourly (account_id, hour, domain)
         VALUES ($1, date_trunc('hour', now()) - make_interval(hours => $2), 'old.example')",
    )
    .bind(account)
    .bind((LISTED_HOURS + 1) as i32)
    .execute(&state.db)
    .await
    .unwrap();
    assert_eq!(prune(&state.db).await.unwrap(), 1);
    let left: Vec<(String,)> =
        sqlx::query_as("SELECT domain FROM usage_domains_hourly WHERE account_id = $1")
            .bind(account)
            .fetch_all(&state.db)
            .await
            .unwrap();
    assert_eq!(left, [("fresh.example".to_owned(),)]);
}

#[tokio::test]
async fn a_claim_takes_each_webhooks_first_row_first_and_caps_an_account() {
    use crate::webhooks::delivery::PER_ACCOUNT;
    let (app, state) = app_and_state().await;
    let (account, _) = account(&app, "ten-hooks").await;
    let mut hooks = Vec::new();
    // Ten webhooks of one account and one of the operator's, three due
    // deliveries each.
    for owner in std::iter::repeat_n(Some(account), 10).chain([None]) {
        let hook = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO webhooks (id, account_id, url, events, secret)
             VALUES ($1, $2, 'https://hooks.example.test/', ARRAY['key.revoked'], 'pnwhsec_t')",
        )
        .bind(hook)
        .bind(owner)
        .execute(&state.db)
        .await
        .unwrap();
        for _ in 0..3 {
            sqlx::query(
                "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event, body)
                 VALUES (gen_random_uuid(), $1, gen_random_uuid(), 'key.revoked', '{}')",
            )
            .bind(hook)
            .execute(&state.db)
            .await
            .unwrap();
        }
        hooks.push(hook);
    }
    let deliverer = crate::webhooks::Deliverer::new(
        state.db.clone(),
        crate::webhooks::target::policy(true, &state.protected),
    );
    let claimed = deliverer.claim(32, &[], &[]).await.unwrap();
    let of_account: Vec<_> = claimed
        .iter()
        .filter(|c| c.account_id == Some(account))
        .collect();
    assert_eq!(of_account.len() as i64, PER_ACCOUNT, "the account's cap");
    let distinct: std::collections::HashSet<Uuid> =
        of_account.iter().map(|c| c.webhook_id).collect();
    assert_eq!(
        distinct.len() as i64,
        PER_ACCOUNT,
        "first rows before second ones"
    );
    let operator = claimed.iter().filter(|c| c.account_id.is_none()).count();
    assert_eq!(
        operator, 2,
        "two per webhook; operator webhooks are not capped"
    );

    // With those in flight: nothing more of the busy webhooks, and of the
    // account only what room it has left.
    let busy: Vec<Uuid> = claimed.iter().map(|c| c.webhook_id).collect();
    let again = deliverer.claim(32, &busy, &[(account, 0)]).await.unwrap();
    assert!(again.is_empty(), "{} more", again.len());
    let room = deliverer.claim(32, &busy, &[(account, 1)]).await.unwrap();
    assert_eq!(room.len(), 1);
    assert!(!busy.contains(&room[0].webhook_id));
}
