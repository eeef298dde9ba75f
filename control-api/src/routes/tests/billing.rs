//! Plans' dedicated-address prices, and the invoice's dedicated lines
//! computed from allocation rows written straight into the database (the
//! arithmetic itself is unit-tested in `routes/billing.rs`).

use super::*;
use chrono::{DateTime, Utc};

fn at(rfc3339: &str) -> DateTime<Utc> {
    rfc3339.parse().unwrap()
}

/// One allocation interval of `account` on `exit`.
async fn allocation(
    db: &sqlx::PgPool,
    account: Uuid,
    exit: Uuid,
    address: &str,
    held: (&str, Option<&str>),
    cents_per_month: i64,
) {
    let (allocated_at, released_at) = held;
    sqlx::query(
        "INSERT INTO dedicated_ips (id, account_id, exit_id, address, is_prefix, allocated_at,
                                    released_at, release_reason, cents_per_month, allocated_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $7 IS NULL THEN NULL ELSE 'released' END,
                 $8, 'operator')",
    )
    .bind(Uuid::new_v4())
    .bind(account)
    .bind(exit)
    .bind(address)
    .bind(address.contains('/'))
    .bind(at(allocated_at))
    .bind(released_at.map(at))
    .bind(cents_per_month)
    .execute(db)
    .await
    .unwrap();
}

#[tokio::test]
async fn plans_carry_dedicated_prices_and_refuse_negative_ones() {
    let app = app().await;
    let (status, _, plan) = call(
        &app,
        Method::POST,
        "/v1/plans",
        Some(ADMIN),
        Some(
            &json!({"name": "gold", "prices": {"dc": 100},
                    "dedicated_ip_price_cents": 3100, "dedicated_prefix_price_cents": 9300})
            .to_string(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{plan}");
    assert_eq!(plan["dedicated_ip_price_cents"], 3100);
    assert_eq!(plan["dedicated_prefix_price_cents"], 9300);
    assert_eq!(plan["dedicated_replacements_per_month"], 2, "the default");

    for field in [
        "dedicated_ip_price_cents",
        "dedicated_prefix_price_cents",
        "dedicated_replacements_per_month",
    ] {
        let (status, _, problem) = call(
            &app,
            Method::POST,
            "/v1/plans",
            Some(ADMIN),
            Some(&json!({"name": "negative", "prices": {}, field: -1}).to_string()),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{problem}"
        );
    }

    let (status, _, listed) = call(&app, Method::GET, "/v1/plans", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::OK);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "the refused plans were not created");
    assert_eq!(listed[0]["dedicated_ip_price_cents"], 3100);
    assert_eq!(listed[0]["dedicated_prefix_price_cents"], 9300);
    assert_eq!(listed[0]["dedicated_replacements_per_month"], 2);
}

#[tokio::test]
async fn an_invoice_bills_each_dedicated_interval_by_its_started_days_in_the_month() {
    let (app, state) = app_and_state().await;
    let (buyer, _) = account(&app, "buyer").await;
    let (other, _) = account(&app, "other").await;
    let exit = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO exits (id, name, source_type, owner, country, egress_ips, credential_sha256)
         VALUES ($1, 'exit-1', 'dc', 'owner', 'DE', ARRAY['192.0.2.7', '192.0.2.8'], md5('x'))",
    )
    .bind(exit)
    .execute(&state.db)
    .await
    .unwrap();
    // March 2025 has 31 days. Held from February to the 10th at noon:
    // 9.5 days of March, billed 10 of 31 at 3100 = 1000.
    allocation(
        &state.db,
        buyer,
        exit,
        "192.0.2.7",
        ("2025-02-20T00:00:00Z", Some("2025-03-10T12:00:00Z")),
        3100,
    )
    .await;
    // Allocated in March's last hour, still held: one started day at 9300
    // = ceil(300.0) = 300.
    allocation(
        &state.db,
        buyer,
        exit,
        "2001:db8:0:1::/64",
        ("2025-03-31T23:00:00Z", None),
        9300,
    )
    .await;
    // January only, and another account's March: not on this invoice.
    allocation(
        &state.db,
        buyer,
        exit,
        "192.0.2.8",
        ("2025-01-01T00:00:00Z", Some("2025-02-01T00:00:00Z")),
        3100,
    )
    .await;
    allocation(
        &state.db,
        other,
        exit,
        "192.0.2.8",
        ("2025-03-02T00:00:00Z", None),
        3100,
    )
    .await;

    let uri = format!("/v1/accounts/{buyer}/invoices?month=2025-03");
    let (status, _, invoice) = call(&app, Method::GET, &uri, Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::OK, "{invoice}");
    assert_eq!(invoice["lines"], json!([]), "no bytes moved");
    let dedicated = invoice["dedicated"].as_array().unwrap();
    assert_eq!(dedicated.len(), 2, "{invoice}");
    let time = |v: &Value| at(v.as_str().unwrap());
    assert_eq!(dedicated[0]["ip"], "192.0.2.7");
    assert_eq!(dedicated[0]["prefix"], false);
    assert_eq!(dedicated[0]["exit_id"], exit.to_string());
    assert_eq!(time(&dedicated[0]["from"]), at("2025-03-01T00:00:00Z"));
    assert_eq!(time(&dedicated[0]["to"]), at("2025-03-10T12:00:00Z"));
    assert_eq!(dedicated[0]["address_days"], 10);
    assert_eq!(dedicated[0]["cents_per_month"], 3100);
    assert_eq!(dedicated[0]["amount_cents"], 1000);
    assert_eq!(dedicated[1]["ip"], "2001:db8:0:1::/64");
    assert_eq!(dedicated[1]["prefix"], true);
    assert_eq!(time(&dedicated[1]["from"]), at("2025-03-31T23:00:00Z"));
    assert_eq!(time(&dedicated[1]["to"]), at("2025-04-01T00:00:00Z"));
    assert_eq!(dedicated[1]["address_days"], 1);
    assert_eq!(dedicated[1]["amount_cents"], 300);
    assert_eq!(invoice["address_days"], 11);
    assert_eq!(invoice["total_cents"], 1300);

    // The CSV keeps its header; a row per interval after the byte lines.
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("{uri}&format=csv"))
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let csv = String::from_utf8(bytes.to_vec()).unwrap();
    assert_eq!(
        csv.lines().collect::<Vec<_>>(),
        [
            "month,source_type,bytes_up,bytes_down,cents_per_gb,amount_cents",
            "2025-03,dedicated:192.0.2.7,,,3100,1000",
            "2025-03,dedicated:2001:db8:0:1::/64,,,9300,300",
            "2025-03,total,,,,1300",
        ]
    );
}
