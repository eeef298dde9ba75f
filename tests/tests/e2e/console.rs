//! The dashboard as an operator console, driven in headless Chromium
//! (tests/browser/console.mjs): sizes with units, charts with time labels,
//! an exit's source and consent, Drain after confirmation (the REST API
//! agrees) and Undrain, an account key confined to its own account with no
//! action buttons, and a 1,000-exit fleet paged. Screenshots land in
//! `target/test-artefacts/console-*.png`.

use proxynet_tests::client::curl;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN, PASSWORD};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use uuid::Uuid;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn artefact(name: &str) -> String {
    let dir = repo("target/test-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name).display().to_string()
}

/// Runs tests/browser/console.mjs in `mode`; its JSON line.
async fn console(mode: &str, envs: &[(&str, String)]) -> Value {
    let out = tokio::process::Command::new("node")
        .arg(repo("tests/browser/console.mjs"))
        .env("MODE", mode)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .expect("node runs (scripts/test installs the browser test's packages)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|_| panic!("{mode}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

/// A stack whose fleet sampler runs every second.
async fn fast_stack() -> Stack {
    Stack::start_with(StackOptions {
        api_env: vec![("PROXYNET_OBSERVE_INTERVAL_SECS".into(), "1".into())],
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_reads_at_a_glance_and_drains_an_exit_after_confirmation() {
    let stack = fast_stack().await;
    let acme: Uuid = stack
        .admin_get_json(&format!("/v1/users/{}", stack.user_id))
        .await["account_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    stack.account_key(acme).await;
    for _ in 0..4 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200);
    }
    eventually("usage in the ledger", Duration::from_secs(20), || async {
        (!stack.usage_by_user(acme).await.is_empty()).then_some(())
    })
    .await;
    let exit = stack.agents[0].addrs.exit_id.to_string();
    let dashboard = format!("{}/dashboard", stack.api_url);
    let seen = console(
        "operator",
        &[
            ("DASHBOARD", dashboard.clone()),
            ("API", stack.api_url.clone()),
            ("KEY", ADMIN_TOKEN.into()),
            ("EXIT", exit.clone()),
            ("SOURCE", "proxynet-tests-dc".into()),
            ("ACCOUNT", acme.to_string()),
            ("SHOT_FLEET", artefact("console-fleet.png")),
            ("SHOT_EXIT", artefact("console-exit.png")),
            ("SHOT_ACCOUNT", artefact("console-account.png")),
            ("SHOT_PHONE", artefact("console-fleet-phone.png")),
        ],
    )
    .await;
    assert_eq!(seen["ok"], true, "{seen:#}");

    // Both actions were audited with the operator as actor.
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    let audited: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, actor FROM audit_log WHERE subject = $1 AND action IN ('exit.drain', 'exit.undrain') ORDER BY id",
    )
    .bind(&exit)
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(
        audited,
        [
            ("exit.drain".to_owned(), "operator".to_owned()),
            ("exit.undrain".to_owned(), "operator".to_owned())
        ]
    );

    // An action without the session's CSRF token is refused, even from the
    // right origin with a valid session cookie.
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_redirect
        .post(stack.api("/dashboard/login"))
        .form(&[("key", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    for csrf in ["", "pncsrf_forged"] {
        let r = no_redirect
            .post(stack.api(&format!("/dashboard/exits/{exit}/drain")))
            .header("cookie", &cookie)
            .form(&[("csrf", csrf), ("confirm", "yes")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "csrf {csrf:?}");
    }
    let view = stack.admin_get_json(&format!("/v1/exits/{exit}")).await;
    assert_eq!(view["admin_draining"], false, "{view}");

    // An account key: its own account's pages, no action buttons.
    let viewer = stack.create_account("viewer").await;
    stack.create_user(viewer, "viewer1", PASSWORD).await;
    let (key, _) = stack.account_key(viewer).await;
    let seen = console(
        "account",
        &[
            ("DASHBOARD", dashboard),
            ("KEY", key),
            ("EXIT", exit),
            ("ACCOUNT", viewer.to_string()),
            ("OTHER", acme.to_string()),
            ("SHOT_ACCOUNT", artefact("console-account-key.png")),
        ],
    )
    .await;
    assert_eq!(seen["ok"], true, "{seen:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_exit_fleet_renders_its_first_page_and_page_controls() {
    let stack = fast_stack().await;
    // Enrolled records without agents: the sampler lists them (down).
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO exits (id, name, source_type, owner, country, egress_ips, credential_sha256)
         SELECT gen_random_uuid(), 'bulk-' || lpad(i::text, 4, '0'),
                (ARRAY['dc', 'isp', 'res', 'mobile'])[1 + i % 4], 'bulk-owner',
                (ARRAY['DE', 'US', 'FR', 'NL'])[1 + i % 4],
                ARRAY['10.9.' || (i / 250)::text || '.' || (1 + i % 250)::text], md5(i::text)
           FROM generate_series(0, 999) AS i",
    )
    .execute(&db)
    .await
    .unwrap();
    let seen = console(
        "big",
        &[
            ("DASHBOARD", format!("{}/dashboard", stack.api_url)),
            ("KEY", ADMIN_TOKEN.into()),
            ("TOTAL", "1002".into()),
            ("SHOT_BIG", artefact("console-fleet-1000.png")),
        ],
    )
    .await;
    assert_eq!(seen["ok"], true, "{seen:#}");
}
