//! The routes driven in-process (`tower::ServiceExt::oneshot`, no sockets)
//! against a database and a Redis key prefix of their own on the test
//! servers `scripts/test` starts: what the HTTP layer answers, and that a
//! refused request changed nothing.
//!
//! Here: the helpers and the HTTP layer's own answers (problems, tenancy,
//! authentication, the OpenAPI document). By area: [`egress`] (reflections,
//! egress history, the abuse desk), [`webhooks`], [`usage`],
//! [`retry_rules`], [`billing`] (plans' dedicated prices, dedicated lines
//! on invoices).

mod billing;
mod egress;
mod retry_rules;
mod usage;
mod webhooks;

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
