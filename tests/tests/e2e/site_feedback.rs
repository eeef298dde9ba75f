//! Customers' reports on sites (`POST /v1/feedback`) and the sites API
//! (docs/health.md, "Customer feedback and the sites API"): one account's
//! `blocked` report cools the exit for that account only; reports from
//! three accounts cool it for the fleet; a flood from one key is refused
//! past its rate and cools nothing for anybody else; an operator lifts a
//! cooldown from the API and from the dashboard's Sites page.

use proxynet_tests::client::curl;
use proxynet_tests::process::{bin, eventually};
use proxynet_tests::stack::{Stack, ADMIN_TOKEN, PASSWORD, USERNAME};
use serde_json::{json, Value};
use std::time::Duration;
use uuid::Uuid;

/// `POST /v1/feedback` with `key`: (status, answer).
async fn report(stack: &Stack, key: &str, body: Value) -> (u16, Value) {
    let r = stack
        .http
        .post(stack.api("/v1/feedback"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A new account and one API key of it.
async fn customer(stack: &Stack, name: &str) -> (Uuid, String) {
    let account = stack.create_account(name).await;
    let (key, _) = stack.account_key(account).await;
    (account, key)
}

/// `GET /v1/sites?site=SITE` as `key`: its items.
async fn sites_as(stack: &Stack, key: &str, site: &str) -> Vec<Value> {
    let answer = stack
        .get_json_as(key, &format!("/v1/sites?site={site}"))
        .await;
    answer["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .clone()
}

/// `proxynetctl args` against the stack with `token`: (exit code, stdout).
async fn ctl(stack: &Stack, token: &str, args: &[&str]) -> (i32, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin("proxynetctl"))
            .args(args)
            .env_clear()
            .env("PROXYNET_API", &stack.api_url)
            .env("PROXYNET_ADMIN_TOKEN", token)
            .output(),
    )
    .await
    .expect("proxynetctl finished")
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

/// The exits cooled for `site` fleet-wide, as the operator sees them.
async fn fleet_cooled(stack: &Stack, site: &str) -> Vec<String> {
    sites_as(stack, ADMIN_TOKEN, site)
        .await
        .iter()
        .filter(|item| item["site"] == site)
        .flat_map(|item| item["cooled_exits"].as_array().cloned().unwrap_or_default())
        .map(|c| c["exit_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_accounts_report_cools_for_it_alone_three_accounts_cool_the_fleet_and_operators_lift_it(
) {
    // Every name is the whoami target, so the reporters' tunnels to the
    // site go somewhere real.
    let dns = proxynet_tests::dns::TestDns::start(vec!["127.0.0.1".parse().unwrap()]).await;
    let stack = Stack::start_with(proxynet_tests::stack::StackOptions {
        agent_args: vec!["--dns-server".into(), dns.addr.to_string()],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(2).await;
    let exit = stack.agents[0].addrs.exit_id;
    let site = "blocked-shop.test";
    let (a, key_a) = customer(&stack, "reporter-a").await;
    let (b, key_b) = customer(&stack, "reporter-b").await;
    let (c, key_c) = customer(&stack, "reporter-c").await;
    let (_, key_d) = customer(&stack, "bystander").await;
    // A report corroborates only from an account that used the pair: each
    // reporter sends a request to the site through the exit, and the
    // ledger has it before anyone reports.
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    for (account, user) in [(a, "repa"), (b, "repb"), (c, "repc")] {
        stack.create_user(account, user, PASSWORD).await;
        let proxy = proxynet_tests::client::proxy_as(
            &format!("{user}-exit-{}", exit.simple()),
            stack.proxy_addrs.proxy,
        );
        let url = format!("http://www.{site}:{}/", stack.whoami.port());
        let r = curl(&["-x", &proxy, &url]).await;
        assert_eq!(r.status, 200, "{}{}", r.headers, r.body);
        eventually(
            "the reporter's request to reach the ledger",
            Duration::from_secs(20),
            || async {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT count(*) FROM usage_ledger WHERE account_id = $1 AND exit_id = $2 AND domain = $3",
                )
                .bind(account)
                .bind(exit)
                .bind(site)
                .fetch_one(&db)
                .await
                .unwrap();
                (n > 0).then_some(())
            },
        )
        .await;
    }
    let blocked = json!({"exit_id": exit, "site": "https://www.blocked-shop.test/cart", "verdict": "blocked"});

    // One account: cooled for it at once, for nobody else.
    let (status, answer) = report(&stack, &key_a, blocked.clone()).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["site"], site, "normalised to its registrable domain");
    assert_eq!(answer["exit_id"], exit.to_string());
    assert!(
        answer["account_cooldown"]["remaining_ms"].as_u64().unwrap() > 0,
        "{answer}"
    );
    assert_eq!(answer["corroborating_accounts"], 1);
    assert!(answer.get("fleet_cooldown").is_none(), "{answer}");
    // However often it says so.
    for _ in 0..5 {
        let (status, answer) = report(&stack, &key_a, blocked.clone()).await;
        assert_eq!(status, 201, "{answer}");
        assert_eq!(answer["corroborating_accounts"], 1);
        assert!(answer.get("fleet_cooldown").is_none(), "{answer}");
    }
    assert!(
        fleet_cooled(&stack, site).await.is_empty(),
        "no fleet cooldown"
    );
    let seen_by_operator = sites_as(&stack, ADMIN_TOKEN, site).await;
    assert_eq!(seen_by_operator.len(), 1, "{seen_by_operator:?}");
    let own = &seen_by_operator[0]["account_cooled_exits"];
    assert_eq!(own.as_array().unwrap().len(), 1, "{own}");
    assert_eq!(own[0]["account_id"], a.to_string());
    assert_eq!(own[0]["exit_id"], exit.to_string());
    // The account sees its own cooldown; another account sees nothing of it.
    let seen_by_a = sites_as(&stack, &key_a, site).await;
    assert_eq!(seen_by_a.len(), 1, "{seen_by_a:?}");
    assert_eq!(
        seen_by_a[0]["account_cooled_exits"][0]["exit_id"],
        exit.to_string()
    );
    assert!(sites_as(&stack, &key_d, site).await.is_empty());
    // An account's `ok` lifts its own cooldown.
    let ok = json!({"exit_id": exit, "site": site, "verdict": "ok"});
    let (status, answer) = report(&stack, &key_a, ok).await;
    assert_eq!(status, 201, "{answer}");
    let seen_by_a = sites_as(&stack, &key_a, site).await;
    assert!(
        seen_by_a
            .iter()
            .all(|s| s["account_cooled_exits"].as_array().unwrap().is_empty()),
        "{seen_by_a:?}"
    );
    let (status, _) = report(&stack, &key_a, blocked.clone()).await;
    assert_eq!(status, 201);

    // An account that never used the pair cannot corroborate: its report
    // cools the exit for itself, and counts for nothing else.
    let (_, key_idle) = customer(&stack, "never-used-it").await;
    let (status, answer) = report(&stack, &key_idle, blocked.clone()).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["corroborating_accounts"], 1, "{answer}");

    // A second account: still not the fleet.
    let (status, answer) = report(&stack, &key_b, blocked.clone()).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["corroborating_accounts"], 2);
    assert!(answer.get("fleet_cooldown").is_none(), "{answer}");
    assert!(fleet_cooled(&stack, site).await.is_empty());

    // A third: the fleet.
    let (status, answer) = report(&stack, &key_c, blocked.clone()).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["corroborating_accounts"], 3);
    assert_eq!(answer["fleet_cooldown"]["new"], true, "{answer}");
    assert_eq!(answer["fleet_cooldown"]["level"], 0);
    let remaining = answer["fleet_cooldown"]["remaining_ms"].as_u64().unwrap();
    assert!((1..=12 * 60 * 1000).contains(&remaining), "{answer}");
    assert_eq!(fleet_cooled(&stack, site).await, [exit.to_string()]);
    let worst = sites_as(&stack, ADMIN_TOKEN, site).await;
    assert_eq!(worst[0]["cooled"], 1, "{worst:?}");
    // A reporter sees the fleet's cooldown of a site it reported; a
    // bystander (no traffic to it, no report) does not.
    assert_eq!(sites_as(&stack, &key_b, site).await[0]["cooled"], 1);
    assert!(sites_as(&stack, &key_d, site).await.is_empty());
    // The same from the command line: the table, and a report.
    let (code, table) = ctl(&stack, ADMIN_TOKEN, &["sites", "list"]).await;
    assert_eq!(code, 0, "{table}");
    assert!(table.starts_with("SITE"), "{table}");
    assert!(
        table.contains(site) && table.contains(&exit.to_string()),
        "{table}"
    );
    let exit_arg = exit.to_string();
    let (code, out) = ctl(
        &stack,
        &key_d,
        &[
            "-o",
            "json",
            "feedback",
            "--exit",
            &exit_arg,
            "--site",
            "cli-report.test",
            "--verdict",
            "slow",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["site"], "cli-report.test");
    assert_eq!(answer["verdict"], "slow");
    assert!(
        answer.get("account_cooldown").is_none(),
        "slow cools nothing"
    );
    let audited = stack.admin_get_json("/v1/audit?action=site.cool").await;
    assert_eq!(audited.as_array().unwrap().len(), 1, "{audited}");
    assert_eq!(audited[0]["subject"], exit.to_string());

    // The operator lifts it: gone, audited; lifting again is a 404.
    let lift = stack.api(&format!("/v1/sites/{site}/cooldowns/{exit}"));
    let r = stack
        .http
        .delete(&lift)
        .bearer_auth(&key_a)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "operators only");
    let r = stack
        .http
        .delete(&lift)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(fleet_cooled(&stack, site).await.is_empty());
    let r = stack
        .http
        .delete(&lift)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let audited = stack.admin_get_json("/v1/audit?action=site.lift").await;
    assert_eq!(audited.as_array().unwrap().len(), 1, "{audited}");

    // An operator's report cools the fleet at once; the dashboard shows it
    // with a Lift button, which lifts it.
    let other = stack.agents[1].addrs.exit_id;
    let (status, answer) = report(
        &stack,
        ADMIN_TOKEN,
        json!({"exit_id": other, "site": "198.51.100.7", "verdict": "blocked"}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(
        answer["site"], "198.51.100.0/24",
        "an address counts as its /24"
    );
    assert_eq!(answer["fleet_cooldown"]["new"], true, "{answer}");
    let cookie = stack.dashboard_session(ADMIN_TOKEN).await;
    let page = stack.dashboard_page(&cookie, "/dashboard/sites").await;
    assert!(page.contains("198.51.100.0/24"), "{page}");
    assert!(
        page.contains("href=\"/dashboard/sites\""),
        "linked from the nav"
    );
    let action = format!("/dashboard/sites/198.51.100.0%2F24/cooldowns/{other}/lift");
    assert!(page.contains(&action), "a Lift form: {page}");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_redirect
        .post(stack.api(&action))
        .header("cookie", &cookie)
        .form(&[("csrf", "pncsrf_forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "the session's CSRF token is required");
    let r = no_redirect
        .post(stack.api(&action))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(fleet_cooled(&stack, "198.51.100.0/24").await.is_empty());

    // Every exit cooled for a site: the dashboard says the panic rule routes
    // it through them anyway, and a request to it still goes.
    for agent in &stack.agents {
        let body =
            json!({"exit_id": agent.addrs.exit_id, "site": "wall.test", "verdict": "blocked"});
        let (status, answer) = report(&stack, ADMIN_TOKEN, body).await;
        assert_eq!(status, 201, "{answer}");
    }
    let page = stack.dashboard_page(&cookie, "/dashboard/sites").await;
    assert!(
        page.contains(
            "every live exit cooled: the panic rule routes this site through them anyway"
        ),
        "{page}"
    );
    let proxy = proxynet_tests::client::proxy_as("repa", stack.proxy_addrs.proxy);
    let url = format!("http://www.wall.test:{}/", stack.whoami.port());
    let r = curl(&["-x", &proxy, &url]).await;
    assert_eq!(r.status, 200, "{}{}", r.headers, r.body);

    // A session names its pinned exit.
    let acme: Uuid = stack
        .admin_get_json(&format!("/v1/users/{}", stack.user_id))
        .await["account_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (acme_key, _) = stack.account_key(acme).await;
    let session_proxy = format!(
        "http://{USERNAME}-session-fb1:{}@{}",
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.proxy
    );
    let r = curl(&["-x", &session_proxy, &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let pinned = eventually("the session's pin", Duration::from_secs(10), || async {
        let s = stack
            .admin_get_json(&format!("/v1/users/{}/sessions/fb1", stack.user_id))
            .await;
        s["exit_id"].as_str().map(str::to_owned)
    })
    .await;
    let (status, answer) = report(
        &stack,
        &acme_key,
        json!({"session": "fb1", "site": "pinned.test", "verdict": "blocked"}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["exit_id"], pinned);
    let (status, _) = report(
        &stack,
        &acme_key,
        json!({"session": "nosuch", "site": "pinned.test", "verdict": "blocked"}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = report(
        &stack,
        &acme_key,
        json!({"exit_id": exit, "session": "fb1", "site": "pinned.test", "verdict": "blocked"}),
    )
    .await;
    assert_eq!(status, 400, "one way to name the exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_reports_from_one_key_is_rate_limited_and_cools_nothing_for_others() {
    let stack = Stack::start().await;
    let exit = stack.agents[0].addrs.exit_id;
    let site = "flooded.test";
    let (flooder, key) = customer(&stack, "flooder").await;
    let (_, other_key) = customer(&stack, "other").await;
    let body = json!({"exit_id": exit, "site": site, "verdict": "blocked"});
    // 10,000 reports as fast as one client sends them (bounded in time).
    let (mut accepted, mut limited, mut sent) = (0u32, 0u32, 0u32);
    let started = std::time::Instant::now();
    for _ in 0..10_000 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the flood took too long ({sent} sent)"
        );
        let r = stack
            .http
            .post(stack.api("/v1/feedback"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        sent += 1;
        match r.status().as_u16() {
            201 => accepted += 1,
            429 => {
                assert!(r.headers().contains_key("retry-after"));
                limited += 1;
            }
            other => panic!("{other}: {}", r.text().await.unwrap_or_default()),
        }
    }
    // 30 at once, then one every six seconds.
    let allowed = 30 + (started.elapsed().as_secs() / 6) as u32 + 1;
    assert!(
        (30..=allowed).contains(&accepted),
        "{accepted} accepted of {sent}"
    );
    assert_eq!(sent, 10_000);
    assert_eq!(limited, sent - accepted);

    // Nothing for anybody else: no fleet cooldown, only the flooder's own.
    assert!(fleet_cooled(&stack, site).await.is_empty());
    let seen = sites_as(&stack, ADMIN_TOKEN, site).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["cooled"], 0);
    let own = seen[0]["account_cooled_exits"].as_array().unwrap();
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(own[0]["account_id"], flooder.to_string());
    assert!(sites_as(&stack, &other_key, site).await.is_empty());

    // Every accepted report was stored, all from one account.
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    let (rows, accounts): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT account_id) FROM site_reports WHERE exit_id = $1 AND site = $2",
    )
    .bind(exit)
    .bind(site)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!((rows, accounts), (i64::from(accepted), 1));
}
