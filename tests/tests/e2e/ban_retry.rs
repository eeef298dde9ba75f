//! Retry on ban (docs/health.md, "Retry on ban"): a site that answers one
//! exit's address with a challenge (`403` with `cf-mitigated`) and the
//! other's with its page. With a retry rule on the user, every
//! absolute-form GET ends `200` (a banned answer is given up for another
//! exit's, `Proxynet-Attempts: 2`); the ban cools the exit for that site at
//! once, so later GETs succeed at the first attempt; other sites still go
//! through the banned exit; and the given-up attempts' bytes are in the
//! ledger as not billable and out of the invoice. Names are resolved by a
//! test DNS server the agents use (every name is the loopback target), so
//! each name is a site of its own.

use base64::Engine;
use proxynet_tests::client::{raw_request, RawResponse};
use proxynet_tests::dns::TestDns;
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN, PASSWORD, USERNAME};
use proxynet_tests::targets::banning_http;
use proxynet_tests::whoami::Seen;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// One absolute-form `GET http://host:port/` through `proxy` as `user`, on
/// a connection of its own.
async fn get(proxy: SocketAddr, user: &str, host: &str, port: u16) -> RawResponse {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{PASSWORD}"));
    let request = format!(
        "GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n\
         Proxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    );
    raw_request(proxy, request.as_bytes(), Duration::from_secs(10)).await
}

/// The exit an answer names (`Proxynet-Exit`).
fn exit_of(r: &RawResponse) -> Uuid {
    r.header("proxynet-exit")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Proxynet-Exit on the answer: {}", r.head))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_banned_exit_is_retried_cooled_for_its_site_and_not_billed() {
    let dns = TestDns::start(vec!["127.0.0.1".parse().unwrap()]).await;
    let banned_ip: IpAddr = "127.0.0.2".parse().unwrap();
    let wall = banning_http(HashSet::from([banned_ip])).await;
    let stack = Stack::start_with(StackOptions {
        agent_args: vec!["--dns-server".into(), dns.addr.to_string()],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(2).await;
    let banned = stack
        .agents
        .iter()
        .find(|a| a.egress_ip == banned_ip)
        .expect("an agent egressing from 127.0.0.2")
        .addrs
        .exit_id;
    let proxy = stack.proxy_addrs.proxy;
    let user = stack
        .admin_get_json(&format!("/v1/users/{}", stack.user_id))
        .await;
    let account: Uuid = user["account_id"].as_str().unwrap().parse().unwrap();

    // A plan, so the account's bytes are invoiced.
    let plan: Value = stack
        .http
        .post(stack.api("/v1/plans"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "name": "standard", "prices": { "dc": 250 } }))
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
        .json(&json!({ "plan_id": plan["id"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    // The rules: ban.test's challenge is retried on another exit and cools
    // the exit at once; probe.test's is only named a ban (counted, nothing
    // else), so the rules' arrival at the superproxy can be seen.
    let r = stack
        .admin()
        .patch_user(stack.user_id, &json!({ "retry_rules": [
            {"sites": ["ban.test"], "statuses": [403], "header": "cf-mitigated", "retry": 2, "cool": true},
            {"sites": ["probe.test"], "statuses": [403], "header": "cf-mitigated"}
        ]}))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let pinned = format!("{USERNAME}-exit-{}", banned.simple());
    eventually(
        "the retry rules to reach the superproxy",
        Duration::from_secs(20),
        || async {
            let r = get(proxy, &pinned, "probe.test", wall.port()).await;
            assert_eq!(r.status, 403, "{}", r.head);
            assert!(r.header("proxynet-attempts").is_none(), "{}", r.head);
            let metrics = scrape(&stack.http, stack.proxy_addrs.admin).await;
            let bans = sample(
                &metrics,
                "proxynet_site_outcomes_total",
                &["verdict=\"banned\""],
            );
            (bans > 0.0).then_some(())
        },
    )
    .await;

    let deadline = Instant::now() + Duration::from_secs(120);
    // Every GET ends 200 from the other exit; the banned exit's answer is
    // given up (at most one more attempt), and after its first ban the
    // exit is cooled for the site.
    let mut retried = 0;
    for i in 0..100 {
        assert!(Instant::now() < deadline, "100 GETs took over 2 minutes");
        let r = get(proxy, USERNAME, "ban.test", wall.port()).await;
        assert_eq!(r.status, 200, "GET {i}: {}", r.head);
        assert_eq!(r.body, "ok", "GET {i}");
        assert_ne!(exit_of(&r), banned, "GET {i} answered by the banned exit");
        if let Some(attempts) = r.header("proxynet-attempts") {
            assert_eq!(attempts, "2", "GET {i}: {}", r.head);
            retried += 1;
        }
    }
    assert!(
        retried >= 1,
        "none of 100 GETs was retried: the banned exit was never drawn"
    );

    // The cooldown is on: at least 95 of the next 100 succeed at once.
    let mut at_once = 0;
    for i in 0..100 {
        assert!(Instant::now() < deadline, "200 GETs took over 2 minutes");
        let r = get(proxy, USERNAME, "ban.test", wall.port()).await;
        assert_eq!(r.status, 200, "GET {i} after the cooldown: {}", r.head);
        if r.header("proxynet-attempts").is_none() {
            at_once += 1;
        }
    }
    assert!(at_once >= 95, "{at_once} of 100 GETs succeeded at once");

    // Another site through the banned exit is unaffected: named, and in its
    // share of the draws.
    let fine = stack.whoami.port();
    let r = get(proxy, &pinned, "fine.test", fine).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let seen: Seen = serde_json::from_str(&r.body).unwrap();
    assert_eq!(seen.peer.ip(), banned_ip);
    let mut through_banned = 0;
    for i in 0..20 {
        assert!(Instant::now() < deadline, "GETs to fine.test took too long");
        let r = get(proxy, USERNAME, "fine.test", fine).await;
        assert_eq!(r.status, 200, "GET {i} to fine.test: {}", r.head);
        assert!(r.header("proxynet-attempts").is_none(), "{}", r.head);
        if exit_of(&r) == banned {
            through_banned += 1;
        }
    }
    assert!(
        through_banned > 0,
        "the exit cooled for ban.test carried none of 20 GETs to fine.test"
    );

    let metrics = scrape(&stack.http, stack.proxy_addrs.admin).await;
    assert!(
        sample(
            &metrics,
            "proxynet_ban_retries_total",
            &["outcome=\"retried\""]
        ) >= 1.0
    );

    // The given-up attempts are in the ledger as not billable, through the
    // banned exit, and the invoice leaves them out.
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    eventually(
        "not billable ledger rows for the banned exit",
        Duration::from_secs(20),
        || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM usage_ledger \
                  WHERE account_id = $1 AND exit_id = $2 AND NOT billable",
            )
            .bind(account)
            .bind(banned)
            .fetch_one(&db)
            .await
            .unwrap();
            (n > 0).then_some(())
        },
    )
    .await;
    let (billed, not_billable) = eventually(
        "the invoice to bill every byte but the given-up attempts'",
        Duration::from_secs(20),
        || async {
            let usage = stack
                .admin_get_json(&format!("/v1/accounts/{account}/usage"))
                .await;
            let row = usage.as_array()?.first()?.clone();
            let moved = row["bytes_up"].as_u64()? + row["bytes_down"].as_u64()?;
            let not_billable = row["not_billable_bytes"].as_u64().unwrap_or(0);
            let invoice = stack
                .admin_get_json(&format!("/v1/accounts/{account}/invoices"))
                .await;
            let billed: u64 = invoice["lines"]
                .as_array()?
                .iter()
                .map(|l| {
                    l["bytes_up"].as_u64().unwrap_or(0) + l["bytes_down"].as_u64().unwrap_or(0)
                })
                .sum();
            (not_billable > 0 && billed + not_billable == moved).then_some((billed, not_billable))
        },
    )
    .await;
    assert!(billed > not_billable, "{billed} billed, {not_billable} not");
}
