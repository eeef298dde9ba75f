//! Upstream exits: partner gateways we did not write (Squid with basic auth,
//! microsocks) behind exit agents. Tunnels by CONNECT, absolute-form and
//! SOCKS5 reach a local target through them; the partner sees the templated
//! username, never the customer's; sessions keep one partner session;
//! targeting reaches only an upstream that declares it; a partner refusing
//! our credential is the upstream exit's fault, a target refusing is not;
//! the egress policy refuses before the partner is asked; and the
//! reconciliation view sums to the ledger.

use proxynet_tests::client::{assert_gateway_error, basic_credential, curl, proxy_as, raw_request};
use proxynet_tests::partners::{password_file, SocksPartner, SquidPartner};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{redis_service_addr, Stack, StackOptions, ADMIN_TOKEN, PASSWORD};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;
use uuid::Uuid;

const PARTNER_SECRET: &str = "partner-secret-7Qx";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn partner_source(stack: &Stack) -> Uuid {
    stack
        .create_source(json!({
            "name": "resold residential",
            "source_type": "dc",
            "channel": "reseller",
            "supplier": "Example Partner GmbH (backconnect gateway)",
            "agreement_ref": "reseller agreement 2026-17",
            "notice_description": "the partner's peers agreed to the partner's terms; the partner attests it",
            "opt_out": "https://partner.example/opt-out",
            "liable_party": "Example Partner GmbH",
            "abuse_contact": "abuse@partner.example",
            "countries": ["FR", "IT", "NL", "PL"],
            "cost_cents_per_gb": 250,
        }))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partner_gateways_carry_tunnels_under_templated_usernames() {
    let squid = SquidPartner::start(PARTNER_SECRET).await;
    let socks = SocksPartner::start("partner", PARTNER_SECRET).await;
    let mut stack = Stack::start_with(StackOptions {
        egress_ips: vec![ip("127.0.0.2")],
        ..Default::default()
    })
    .await;
    let files = tempfile::tempdir().unwrap();
    let secret = password_file(files.path(), "partner.pw", PARTNER_SECRET);
    let wrong = password_file(files.path(), "wrong.pw", "not-the-password");
    let source = partner_source(&stack).await;
    let api = stack.api_url.clone();
    let upstream_args =
        |url: String, template: &str, countries: &str, password: &std::path::Path| {
            let mut args = vec![
                "--upstream".to_owned(),
                url,
                "--upstream-template".to_owned(),
                template.to_owned(),
                "--upstream-password-file".to_owned(),
                password.display().to_string(),
            ];
            if !countries.is_empty() {
                args.extend(["--upstream-countries".to_owned(), countries.to_owned()]);
            }
            args
        };
    let token = stack.enrollment_token_for("squid-fr", source, "FR").await;
    let http_exit = stack
        .add_agent_with_args(
            &api,
            &[ip("127.0.0.5")],
            token,
            &upstream_args(
                format!("http://partner@127.0.0.1:{}", squid.port),
                "{user}-country-{country}-session-{session}",
                "FR,IT",
                &secret,
            ),
        )
        .await;
    let token = stack.enrollment_token_for("socks-nl", source, "NL").await;
    stack
        .add_agent_with_args(
            &api,
            &[ip("127.0.0.6")],
            token,
            &upstream_args(
                format!("socks5h://partner@127.0.0.1:{}", socks.port),
                "{user}",
                "",
                &secret,
            ),
        )
        .await;
    let token = stack
        .enrollment_token_for("squid-pl-wrong", source, "PL")
        .await;
    let refused_exit = stack
        .add_agent_with_args(
            &api,
            &[ip("127.0.0.7")],
            token,
            &upstream_args(
                format!("http://partner@127.0.0.1:{}", squid.port),
                "{user}",
                "",
                &wrong,
            ),
        )
        .await;
    stack.wait_eligible(4).await;
    let http_exit_id = stack.agents[http_exit].addrs.exit_id;
    let refused_exit_id = stack.agents[refused_exit].addrs.exit_id;

    let account = stack.create_account("reseller-customer").await;
    stack.create_user(account, "uma", PASSWORD).await;
    let proxy = proxy_as("uma-country-fr", stack.proxy_addrs.proxy);
    let target = stack.whoami_url();

    // CONNECT, absolute-form and SOCKS5 through the HTTP partner.
    let r = curl(&["-p", "-x", &proxy, &target]).await;
    assert_eq!(r.status, 200, "CONNECT: {} {}", r.body, r.headers);
    let r = curl(&["-x", &proxy, &target]).await;
    assert_eq!(r.status, 200, "absolute-form: {} {}", r.body, r.headers);
    let socks_url = format!(
        "socks5h://uma-country-fr:{}@{}",
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.socks
    );
    let r = curl(&["-x", &socks_url, &target]).await;
    assert_eq!(r.status, 200, "SOCKS5: {} {}", r.body, r.headers);
    // The partner saw the templated username, never the customer's name or password.
    let seen = squid.usernames_at_least(3).await;
    assert!(
        seen.iter()
            .all(|u| u.starts_with("partner-country-fr-session-")),
        "{seen:?}\n{}",
        squid.access_log()
    );
    let everything = format!("{}{}", squid.access_log(), squid.helper_log());
    assert!(
        !everything.contains("uma") && !everything.contains(PASSWORD),
        "{everything}"
    );

    // A sticky session keeps one partner session; rotating tunnels get fresh ones.
    let before = squid.usernames().len();
    let sticky = proxy_as("uma-country-fr-session-s1", stack.proxy_addrs.proxy);
    for _ in 0..4 {
        let r = curl(&["-p", "-x", &sticky, &target]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
    }
    let sticky_names: HashSet<String> = squid.usernames_at_least(before + 4).await[before..]
        .iter()
        .cloned()
        .collect();
    assert_eq!(sticky_names.len(), 1, "{sticky_names:?}");
    let before = squid.usernames().len();
    for _ in 0..4 {
        let r = curl(&["-p", "-x", &proxy, &target]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
    }
    let rotating: HashSet<String> = squid.usernames_at_least(before + 4).await[before..]
        .iter()
        .cloned()
        .collect();
    assert_eq!(rotating.len(), 4, "{rotating:?}");

    // Targeting: IT is declared by the HTTP upstream (and asked of the
    // partner), NL only by the SOCKS one, ES by none.
    let before = squid.usernames().len();
    let r = curl(&[
        "-p",
        "-x",
        &proxy_as("uma-country-it", stack.proxy_addrs.proxy),
        &target,
    ])
    .await;
    assert_eq!(r.status, 200, "{}", r.headers);
    assert!(squid.usernames_at_least(before + 1).await[before..]
        .iter()
        .all(|u| u.starts_with("partner-country-it-")));
    // The SOCKS5 partner (microsocks) by every ingress too.
    let nl = proxy_as("uma-country-nl", stack.proxy_addrs.proxy);
    for args in [vec!["-p", "-x", &nl], vec!["-x", &nl]] {
        let r = curl(&[args.as_slice(), &[target.as_str()]].concat()).await;
        assert_eq!(r.status, 200, "through microsocks {args:?}: {}", r.headers);
    }
    let socks_nl = format!(
        "socks5h://uma-country-nl:{}@{}",
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.socks
    );
    let r = curl(&["-x", &socks_nl, &target]).await;
    assert_eq!(r.status, 200, "SOCKS5 through microsocks: {}", r.headers);
    let r = curl(&[
        "-p",
        "-x",
        &proxy_as("uma-country-es", stack.proxy_addrs.proxy),
        &target,
    ])
    .await;
    assert_ne!(r.status, 200);

    // The egress policy refuses a protected loopback service before the
    // partner is asked: the partner logs nothing for it.
    let before = squid.access_log();
    let redis = redis_service_addr().expect("scripts/test exports the Redis port");
    let request = format!(
        "CONNECT {redis} HTTP/1.1\r\nHost: {redis}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic_credential("uma-country-fr", PASSWORD)
    );
    let r = raw_request(
        stack.proxy_addrs.proxy,
        request.as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_gateway_error(&r, 403, "destination_ip_prohibited");
    let port = redis.rsplit_once(':').unwrap().1;
    assert!(!squid.access_log()[before.len()..].contains(&format!(":{port}")));

    // A target refusing connections is not the upstream exit's fault …
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    for _ in 0..6 {
        let r = curl(&[
            "-p",
            "-x",
            &proxy,
            &format!("http://127.0.0.1:{closed_port}/"),
        ])
        .await;
        assert_ne!(r.status, 200);
    }
    // … the partner refusing our credential (407) is: that exit leaves
    // rotation while the others keep serving.
    for _ in 0..6 {
        let r = curl(&[
            "-p",
            "-x",
            &proxy_as("uma-country-pl", stack.proxy_addrs.proxy),
            &target,
        ])
        .await;
        assert_ne!(r.status, 200);
    }
    eventually(
        "the refused upstream exit to be unavailable",
        Duration::from_secs(20),
        || async {
            let pool = stack.pool().await;
            let health = |id: Uuid| {
                pool["eligible"]
                    .as_array()?
                    .iter()
                    .find(|e| e["exit_id"] == id.to_string())
                    .map(|e| e["health"]["available"].as_bool() == Some(true))
            };
            (health(refused_exit_id) != Some(true) && health(http_exit_id) == Some(true))
                .then_some(())
        },
    )
    .await;
    let r = curl(&[
        "-p",
        "-x",
        &proxy_as("alice-country-de", stack.proxy_addrs.proxy),
        &target,
    ])
    .await;
    assert_eq!(r.status, 200, "our own exit keeps serving: {}", r.headers);

    // The exit's view names the gateway, never its credential.
    let view = stack
        .admin_get_json(&format!("/v1/exits/{http_exit_id}"))
        .await;
    assert_eq!(view["upstream"]["scheme"], "http", "{view}");
    assert_eq!(view["upstream"]["port"], squid.port, "{view}");
    assert!(!view.to_string().contains(PARTNER_SECRET), "{view}");

    // Reconciliation: per day, summing exactly to the ledger's bytes.
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    let reconciled = eventually("the reconciliation to match the ledger", Duration::from_secs(20), || {
        let stack = &stack;
        let db = db.clone();
        async move {
            let (up, down): (Option<i64>, Option<i64>) = sqlx::query_as(
                "SELECT SUM(bytes_up)::bigint, SUM(bytes_down)::bigint FROM usage_ledger WHERE exit_id = $1",
            )
            .bind(http_exit_id)
            .fetch_one(&db)
            .await
            .ok()?;
            let view: Value = stack
                .http
                .get(stack.api(&format!("/v1/exits/{http_exit_id}/reconciliation")))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let (up, down) = (up?, down?);
            (up > 0 && view["bytes_up"] == up && view["bytes_down"] == down).then_some(view)
        }
    })
    .await;
    assert_eq!(reconciled["cost_cents_per_gb"], 250, "{reconciled}");
    let csv = stack
        .http
        .get(stack.api(&format!("/v1/exits/{http_exit_id}/reconciliation")))
        .bearer_auth(ADMIN_TOKEN)
        .header("accept", "text/csv")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let total = csv.lines().last().unwrap();
    assert_eq!(
        total,
        format!(
            "total,{},{},{},{},{}",
            reconciled["bytes_up"],
            reconciled["bytes_down"],
            reconciled["bytes_up"].as_i64().unwrap() + reconciled["bytes_down"].as_i64().unwrap(),
            reconciled["cost_cents"],
            reconciled["billed_cents"]
        ),
        "{csv}"
    );
}
