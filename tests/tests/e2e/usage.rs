//! Usage accounting: every byte through CONNECT and SOCKS5 reaches the ledger
//! exactly once, across a control-api crash.

use proxynet_tests::client::{self, socks5};
use proxynet_tests::stack::{Stack, ADMIN_TOKEN, PASSWORD};
use proxynet_tests::targets::{echo_server, pump};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const TEN_MB: usize = 10_000_000;

async fn connect_tunnel(proxy: SocketAddr, user: &str, target: SocketAddr) -> TcpStream {
    let (s, head) = client::connect_tunnel(proxy, user, PASSWORD, target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_bytes_through_connect_and_socks_reach_the_ledger() {
    let stack = Stack::start().await;
    let echo = echo_server().await;
    let account = stack.create_account("metered").await;
    let socks_user = stack.create_user(account, "sockuser", PASSWORD).await;
    let connect_user = stack.create_user(account, "connuser", PASSWORD).await;

    pump(
        connect_tunnel(stack.proxy_addrs.proxy, "connuser", echo).await,
        TEN_MB,
    )
    .await;
    let mut s = socks5::login(stack.proxy_addrs.socks, "sockuser", PASSWORD)
        .await
        .unwrap();
    assert_eq!(
        socks5::request(&mut s, 1, "127.0.0.1", echo.port()).await,
        0
    );
    let mut rest = [0u8; 6]; // the rest of the IPv4 reply
    s.read_exact(&mut rest).await.unwrap();
    pump(s, TEN_MB).await;

    stack
        .wait_for_usage(account, connect_user, TEN_MB as u64, TEN_MB as u64)
        .await;
    stack
        .wait_for_usage(account, socks_user, TEN_MB as u64, TEN_MB as u64)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_api_crash_neither_loses_nor_duplicates_usage() {
    let mut stack = Stack::start().await;
    let echo = echo_server().await;
    let account = stack.create_account("crash").await;
    let user = stack.create_user(account, "crashuser", PASSWORD).await;
    let proxy = stack.proxy_addrs.proxy;

    // Traffic while the control-api is killed and restarted: batches wait in
    // the stream (or are redelivered) and land exactly once.
    let traffic = tokio::spawn(async move {
        for _ in 0..20 {
            pump(connect_tunnel(proxy, "crashuser", echo).await, 500_000).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.restart_api_after_kill().await;
    traffic.await.unwrap();
    stack
        .wait_for_usage(account, user, 10_000_000, 10_000_000)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoices_price_ledger_bytes_by_source_type_and_export_csv() {
    let stack = Stack::start().await;
    let echo = echo_server().await;
    let account = stack.create_account("billed").await;
    let user = stack.create_user(account, "billeduser", PASSWORD).await;
    let plan: serde_json::Value = stack
        .http
        .post(stack.api("/v1/plans"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({ "name": "standard", "prices": { "dc": 250, "res": 800 } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = stack
        .http
        .put(stack.api(&format!("/v1/accounts/{account}/plan")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({ "plan_id": plan["id"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    pump(
        connect_tunnel(stack.proxy_addrs.proxy, "billeduser", echo).await,
        TEN_MB,
    )
    .await;
    stack
        .wait_for_usage(account, user, TEN_MB as u64, TEN_MB as u64)
        .await;

    let invoice: serde_json::Value = stack
        .admin_get_json(&format!("/v1/accounts/{account}/invoices"))
        .await;
    let lines = invoice["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 1, "{invoice}");
    assert_eq!(lines[0]["source_type"], "dc");
    assert_eq!(lines[0]["bytes_up"], TEN_MB as u64);
    // 0.02 GB × 250 cents = 5 cents.
    assert_eq!(lines[0]["amount_cents"], 5);
    assert_eq!(invoice["total_cents"], 5);

    let csv = stack
        .http
        .get(stack.api(&format!("/v1/accounts/{account}/invoices?format=csv")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows[0],
        "month,source_type,bytes_up,bytes_down,cents_per_gb,amount_cents"
    );
    assert!(rows[1].ends_with(",dc,10000000,10000000,250,5"), "{csv}");
    assert!(rows[2].ends_with(",total,,,,5"), "{csv}");

    let quota: serde_json::Value = stack
        .admin_get_json(&format!("/v1/users/{user}/quota"))
        .await;
    assert_eq!(quota["bandwidth_bytes"], serde_json::Value::Null);
    assert_eq!(quota["exhausted"], false);
}

/// Makes the test's own database unreachable (new connections refused, open
/// ones terminated) without touching the shared server, and back.
async fn set_database_reachable(stack: &Stack, reachable: bool) {
    use sqlx::Connection;
    let server = std::env::var("PROXYNET_TEST_DATABASE_URL").unwrap();
    let db = stack
        .stores
        .database_url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let mut admin = sqlx::PgConnection::connect(&server).await.unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE {db} ALLOW_CONNECTIONS {reachable}"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    if !reachable {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
            .bind(&db)
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_of_30_seconds_loses_no_usage() {
    let stack = Stack::start().await;
    let echo = echo_server().await;
    let account = stack.create_account("pg-outage").await;
    let user = stack.create_user(account, "pgoutage", PASSWORD).await;
    // Warm the superproxy's credential cache while the database is up.
    pump(
        connect_tunnel(stack.proxy_addrs.proxy, "pgoutage", echo).await,
        1_000,
    )
    .await;

    set_database_reachable(&stack, false).await;
    let started = std::time::Instant::now();
    // Traffic keeps flowing (the data plane never needs Postgres); usage waits in the stream.
    for _ in 0..10 {
        pump(
            connect_tunnel(stack.proxy_addrs.proxy, "pgoutage", echo).await,
            1_000_000,
        )
        .await;
    }
    let rest = Duration::from_secs(30).saturating_sub(started.elapsed());
    tokio::time::sleep(rest).await; // the outage itself, not a wait for a condition
    set_database_reachable(&stack, true).await;

    stack
        .wait_for_usage(account, user, 10_001_000, 10_001_000)
        .await;
}

/// Bytes a superproxy's spill files hold for `user` (up, down).
fn spilled_bytes(dir: &std::path::Path, user: uuid::Uuid) -> (u64, u64) {
    let mut total = (0, 0);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            let Ok(batch) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            for row in batch["batch"]["rows"].as_array().into_iter().flatten() {
                if row["user_id"] == user.to_string() {
                    total.0 += row["bytes_up"].as_u64().unwrap_or(0);
                    total.1 += row["bytes_down"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superproxy_killed_during_a_redis_outage_loses_no_usage() {
    let spill = tempfile::tempdir().unwrap();
    let mut redis = proxynet_tests::stores::OwnRedis::start().await;
    let args: Vec<String> = proxynet_tests::stack::SuperproxyArgs::new()
        .usage_spill_dir(spill.path())
        .usage_flush_ms(200)
        .into();
    let mut stack = Stack::start_with(proxynet_tests::stack::StackOptions {
        redis_url: Some(redis.url()),
        superproxy_args: args.clone(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("durable").await;
    let user = stack.create_user(account, "durable", PASSWORD).await;
    pump(
        connect_tunnel(stack.proxy_addrs.proxy, "durable", echo).await,
        1_000,
    )
    .await;
    stack.wait_for_usage(account, user, 1_000, 1_000).await;

    // 30 s into a Redis outage, tunnels still run (known user, known pool)
    // and every batch Redis refused is on disk, not in memory.
    redis.stop();
    let down = std::time::Instant::now();
    let mut during = 0u64;
    while down.elapsed() < Duration::from_secs(30) {
        pump(
            connect_tunnel(stack.proxy_addrs.proxy, "durable", echo).await,
            100_000,
        )
        .await;
        during += 100_000;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    proxynet_tests::process::eventually(
        "every byte of the outage to be in the spill file",
        Duration::from_secs(10),
        || async { (spilled_bytes(spill.path(), user) == (during, during)).then_some(()) },
    )
    .await;
    stack.proxy.kill().await;

    // Restarted on the same directory, with Redis back: replayed, once.
    redis.restart().await;
    let (_again, _) = proxynet_tests::stack::spawn_superproxy(&stack.stores, &args).await;
    let total = 1_000 + during;
    stack.wait_for_usage(account, user, total, total).await;
    proxynet_tests::process::eventually(
        "the spill file to be replayed and removed",
        Duration::from_secs(10),
        || async { (std::fs::read_dir(spill.path()).ok()?.count() == 0).then_some(()) },
    )
    .await;
}
