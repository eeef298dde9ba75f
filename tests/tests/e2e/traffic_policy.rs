//! Traffic policy by target domain: the customer's allowed/denied domains
//! and per-domain limits on users and accounts, the operator's denied
//! domains and aggregate per-domain limits, and usage by domain. Names are
//! resolved by a test DNS server the agents use, answering every name with
//! the loopback address of the whoami target, so refusals can be shown to
//! cost no lookup at the exit.

use proxynet_tests::client::socks5;
use proxynet_tests::dns::TestDns;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN};
use proxynet_tests::targets::echo_round_trip;
use serde_json::{json, Value};
use std::time::Duration;
use uuid::Uuid;

const PASS: &str = "policy-password-1";

async fn stack_with_dns() -> (Stack, TestDns) {
    let dns = TestDns::start(vec!["127.0.0.1".parse().unwrap()]).await;
    let stack = Stack::start_with(StackOptions {
        agent_args: vec!["--dns-server".into(), dns.addr.to_string()],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(2).await;
    (stack, dns)
}

async fn patch(stack: &Stack, path: &str, token: &str, body: Value) -> reqwest::Response {
    stack
        .http
        .patch(stack.api(path))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn set_user_policy(stack: &Stack, user: Uuid, policy: Value) {
    let r = patch(
        stack,
        &format!("/v1/users/{user}"),
        ADMIN_TOKEN,
        json!({ "policy": policy }),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// A CONNECT to `host:port` as `user`; the response head.
async fn connect(stack: &Stack, user: &str, host: &str, port: u16) -> String {
    connect_stream(stack, user, host, port).await.1
}

async fn connect_stream(
    stack: &Stack,
    user: &str,
    host: &str,
    port: u16,
) -> (tokio::net::TcpStream, String) {
    use base64::Engine;
    use tokio::io::AsyncWriteExt;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{PASS}"));
    let mut s = tokio::net::TcpStream::connect(stack.proxy_addrs.proxy)
        .await
        .unwrap();
    let target = format!("{host}:{port}");
    s.write_all(
        format!(
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = proxynet_tests::client::read_head(&mut s).await;
    (s, head)
}

fn assert_denied(head: &str, rule: &str) {
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("proxy-status: proxynet; error=http_request_denied"),
        "{head}"
    );
    assert!(head.contains(rule), "the refusal names {rule:?}: {head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_denied_and_allowed_domains_refuse_before_any_exit_is_used() {
    let (stack, dns) = stack_with_dns().await;
    let account = stack.create_account("policy-acct").await;
    let user = stack.create_user(account, "policyuser", PASS).await;
    let port = stack.whoami.port();

    set_user_policy(&stack, user, json!({"denied_domains": ["LocalHost."]})).await;
    // The superproxy learns of the change from its event, a moment after the
    // PATCH answers; until then a tunnel may still be resolved and served.
    eventually(
        "the denied domain to apply",
        Duration::from_secs(5),
        || async {
            let head = connect(&stack, "policyuser", "probe.localhost", port).await;
            head.starts_with("HTTP/1.1 403").then_some(())
        },
    )
    .await;
    let resolved = dns.a_queries();
    for host in ["localhost", "sub.localhost"] {
        assert_denied(
            &connect(&stack, "policyuser", host, port).await,
            "denied_domains entry \\\"localhost\\\"",
        );
    }
    assert_eq!(
        dns.a_queries(),
        resolved,
        "a refused name is never resolved"
    );
    assert!(connect(&stack, "policyuser", "127.0.0.1", port)
        .await
        .starts_with("HTTP/1.1 200"));
    // SOCKS5: "connection not allowed by ruleset".
    let mut s = socks5::login(stack.proxy_addrs.socks, "policyuser", PASS)
        .await
        .unwrap();
    assert_eq!(socks5::request(&mut s, 1, "sub.localhost", port).await, 2);

    set_user_policy(&stack, user, json!({"allowed_domains": ["example.test"]})).await;
    eventually(
        "the allowed domains to apply",
        Duration::from_secs(5),
        || async {
            let head = connect(&stack, "policyuser", "127.0.0.1", port).await;
            head.starts_with("HTTP/1.1 403").then_some(())
        },
    )
    .await;
    for host in ["localhost", "127.0.0.1", "example.org"] {
        assert_denied(
            &connect(&stack, "policyuser", host, port).await,
            "not in allowed_domains",
        );
    }
    assert!(connect(&stack, "policyuser", "www.example.test", port)
        .await
        .starts_with("HTTP/1.1 200"));

    // The account bounds the user: a user may narrow, never widen.
    let r = patch(
        &stack,
        &format!("/v1/accounts/{account}"),
        ADMIN_TOKEN,
        json!({"policy": {"allowed_domains": ["example.test"], "domain_new_tunnels_per_second": 5}}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["policy"]["allowed_domains"], json!(["example.test"]));
    for wider in [
        json!({"allowed_domains": ["other.test"]}),
        json!({"domain_new_tunnels_per_second": 6}),
    ] {
        let r = patch(
            &stack,
            &format!("/v1/users/{user}"),
            ADMIN_TOKEN,
            json!({ "policy": wider }),
        )
        .await;
        assert_eq!(r.status(), 403, "{}", r.text().await.unwrap());
    }
    // Bad entries and unknown fields are refused with the field named.
    let r = patch(
        &stack,
        &format!("/v1/users/{user}"),
        ADMIN_TOKEN,
        json!({"policy": {"denied_domain": ["a.test"]}}),
    )
    .await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("denied_domain"));
    // An account key reads and sets its own account's policy, not another's.
    let (key, _) = stack.account_key(account).await;
    let other = stack.create_account("policy-other").await;
    let r = patch(
        &stack,
        &format!("/v1/accounts/{other}"),
        &key,
        json!({"policy": {}}),
    )
    .await;
    assert_eq!(r.status(), 404);
    // The operator's account policy binds the account's own key ...
    let r = patch(
        &stack,
        &format!("/v1/accounts/{account}"),
        &key,
        json!({"policy": {}}),
    )
    .await;
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("only an operator"));
    // ... until the operator clears it; then the account sets its own.
    let r = patch(
        &stack,
        &format!("/v1/accounts/{account}"),
        ADMIN_TOKEN,
        json!({"policy": {}}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = patch(
        &stack,
        &format!("/v1/accounts/{account}"),
        &key,
        json!({"policy": {"denied_domains": ["ads.example.test"]}}),
    )
    .await;
    assert_eq!(r.status(), 200);
}

/// A policy the operator wrote on a user binds the account's own key as
/// the account's policy does: the key can neither clear it (`{}`), replace
/// it, nor delete the user to shed it, and the denied domain stays denied;
/// once the operator clears it, the key sets its own again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_user_policy_binds_the_accounts_key() {
    let (stack, _dns) = stack_with_dns().await;
    let account = stack.create_account("bound-acct").await;
    let user = stack.create_user(account, "bounduser", PASS).await;
    let port = stack.whoami.port();
    let (key, _) = stack.account_key(account).await;

    set_user_policy(&stack, user, json!({"denied_domains": ["localhost"]})).await;
    eventually(
        "the operator's denial to apply",
        Duration::from_secs(5),
        || async {
            let head = connect(&stack, "bounduser", "localhost", port).await;
            head.starts_with("HTTP/1.1 403").then_some(())
        },
    )
    .await;
    let shown: Value = stack.admin_get_json(&format!("/v1/users/{user}")).await;
    assert_eq!(shown["policy_by_operator"], json!(true), "{shown}");

    for attempt in [
        json!({"policy": {}}),
        json!({"policy": {"denied_domains": ["other.test"]}}),
    ] {
        let r = patch(&stack, &format!("/v1/users/{user}"), &key, attempt).await;
        assert_eq!(r.status(), 403);
        let text = r.text().await.unwrap();
        assert!(
            text.contains("policy") && text.contains("only an operator"),
            "{text}"
        );
    }
    // Deleting the user (to re-create it without the policy) is refused too.
    let r = stack
        .http
        .delete(stack.api(&format!("/v1/users/{user}")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Other fields stay the account's to change.
    let r = patch(
        &stack,
        &format!("/v1/users/{user}"),
        &key,
        json!({"enabled": true}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Nothing the key tried let traffic through.
    assert_denied(
        &connect(&stack, "bounduser", "localhost", port).await,
        "denied_domains entry \\\"localhost\\\"",
    );

    // The operator releases it with `{}`; then the account writes its own.
    set_user_policy(&stack, user, json!({})).await;
    let r = patch(
        &stack,
        &format!("/v1/users/{user}"),
        &key,
        json!({"policy": {"denied_domains": ["ads.example.test"]}}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["policy_by_operator"], json!(false), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_cuts_the_open_tunnels_it_now_refuses() {
    let (stack, _dns) = stack_with_dns().await;
    let account = stack.create_account("cut-acct").await;
    let user = stack.create_user(account, "cutuser", PASS).await;
    let echo = proxynet_tests::targets::echo_server().await;
    let (mut to_name, head) = connect_stream(&stack, "cutuser", "echo.test", echo.port()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (mut to_ip, head) = connect_stream(&stack, "cutuser", "127.0.0.1", echo.port()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_round_trip(&mut to_name, b"before").await.unwrap();

    set_user_policy(&stack, user, json!({"denied_domains": ["echo.test"]})).await;
    // The change event re-checks the user at once: the tunnel ends (EOF).
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut to_name, &mut buf),
    )
    .await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "cut: {read:?}");
    echo_round_trip(&mut to_ip, b"still open").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_domain_rate_refuses_the_burst_to_one_domain_and_serves_others() {
    let (stack, _dns) = stack_with_dns().await;
    let account = stack.create_account("rate-acct").await;
    let user = stack.create_user(account, "domainrate", PASS).await;
    set_user_policy(&stack, user, json!({"domain_new_tunnels_per_second": 2})).await;
    let port = stack.whoami.port();
    // The limit applies once the superproxy has the changed record: a burst
    // to another domain runs into it then (that domain's tokens only).
    eventually(
        "the per-domain rate to apply",
        Duration::from_secs(5),
        || async {
            let probes = futures_util::future::join_all(
                (0..4).map(|_| connect(&stack, "domainrate", "probe.example.org", port)),
            )
            .await;
            probes
                .iter()
                .any(|h| h.starts_with("HTTP/1.1 429"))
                .then_some(())
        },
    )
    .await;
    let heads = futures_util::future::join_all(
        (0..12).map(|_| connect(&stack, "domainrate", "busy.example.test", port)),
    )
    .await;
    let limited: Vec<&String> = heads
        .iter()
        .filter(|h| h.starts_with("HTTP/1.1 429"))
        .collect();
    assert!(limited.len() >= 6, "{heads:#?}");
    for h in &limited {
        let lower = h.to_ascii_lowercase();
        assert!(lower.contains("retry-after:"), "{h}");
        assert!(h.contains("per-domain (example.test)"), "{h}");
    }
    // Another domain has its own budget.
    assert!(connect(&stack, "domainrate", "other.test", port)
        .await
        .starts_with("HTTP/1.1 200"));
}

async fn put_operator_policy(stack: &Stack, policy: Value) {
    let r = stack
        .http
        .put(stack.api("/v1/policy"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&policy)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_denied_domains_and_aggregate_limits_bind_every_account() {
    let (stack, dns) = stack_with_dns().await;
    let port = stack.whoami.port();
    let mut users = Vec::new();
    for name in ["opone", "optwo"] {
        let account = stack.create_account(name).await;
        stack.create_user(account, name, PASS).await;
        users.push(name);
    }
    // Only the operator reads or writes it.
    let account = stack.create_account("op-probe").await;
    let (key, _) = stack.account_key(account).await;
    let r = stack
        .http
        .put(stack.api("/v1/policy"))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    put_operator_policy(
        &stack,
        json!({"denied_domains": ["blocked.test"], "denied_ports": [6667],
               "domain_limits": [{"domain": "hot.test", "new_tunnels_per_second": 3}]}),
    )
    .await;
    let got = stack.admin_get_json("/v1/policy").await;
    assert_eq!(got["denied_domains"], json!(["blocked.test"]));
    assert!(got["version"].as_i64().unwrap() >= 1);
    // The change reaches the superproxy by its change event.
    eventually(
        "the operator policy to apply",
        Duration::from_secs(5),
        || async {
            connect(&stack, "opone", "blocked.test", port)
                .await
                .starts_with("HTTP/1.1 403")
                .then_some(())
        },
    )
    .await;
    for user in &users {
        for host in ["blocked.test", "www.blocked.test"] {
            assert_denied(
                &connect(&stack, user, host, port).await,
                "the operator's denied_domains entry",
            );
        }
        assert_denied(
            &connect(&stack, user, "irc.test", 6667).await,
            "denied_ports (6667)",
        );
    }
    assert_eq!(dns.a_queries(), 0, "no DNS lookup at the exit for refusals");

    // 20 quick tunnels over two accounts share the network's 3/s.
    let heads = futures_util::future::join_all(
        (0..20).map(|i| connect(&stack, users[i % 2], "api.hot.test", port)),
    )
    .await;
    let limited = heads
        .iter()
        .filter(|h| h.starts_with("HTTP/1.1 429") && h.contains("the network's per-domain"))
        .count();
    assert!(limited >= 10, "{heads:#?}");
    assert!(dns.a_queries() >= 1, "the admitted ones were resolved");

    // Audited.
    let audit = stack.admin_get_json("/v1/audit?action=policy.update").await;
    assert!(!audit.as_array().unwrap().is_empty(), "{audit}");
}

/// The operator's aggregate is one budget shared fairly, not first come
/// first served: an account alone keeps room for the next one, so one
/// tenant's idle tunnels cannot lock every other tenant out of a domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_aggregate_concurrency_is_shared_fairly_between_accounts() {
    let (stack, _dns) = stack_with_dns().await;
    let port = stack.whoami.port();
    for name in ["fairone", "fairtwo"] {
        let account = stack.create_account(name).await;
        stack.create_user(account, name, PASS).await;
    }
    put_operator_policy(
        &stack,
        json!({"denied_domains": ["marker.test"],
               "domain_limits": [{"domain": "fair.test", "max_concurrent_tunnels": 2}]}),
    )
    .await;
    eventually(
        "the operator policy to apply",
        Duration::from_secs(5),
        || async {
            connect(&stack, "fairone", "marker.test", port)
                .await
                .starts_with("HTTP/1.1 403")
                .then_some(())
        },
    )
    .await;

    // The first account's tunnel, held open.
    let (held, head) = connect_stream(&stack, "fairone", "a.fair.test", port).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // A second would leave no room for another account: refused, though
    // the aggregate has a place left.
    let head = connect(&stack, "fairone", "b.fair.test", port).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(
        head.contains("the network's per-domain (fair.test)"),
        "{head}"
    );
    assert!(head.contains("fair share"), "{head}");
    // The other account gets its tunnel while the first holds its share.
    let (other, head) = connect_stream(&stack, "fairtwo", "fair.test", port).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Now the aggregate itself is spent, for both.
    for user in ["fairone", "fairtwo"] {
        let head = connect(&stack, user, "c.fair.test", port).await;
        assert!(head.starts_with("HTTP/1.1 429"), "{head}");
        assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
    }
    // Another domain is not limited by it.
    assert!(connect(&stack, "fairone", "other.test", port)
        .await
        .starts_with("HTTP/1.1 200"));
    drop((held, other));
}

/// A TLS client's first flight, as rustls sends it: its ClientHello naming
/// `name`.
fn client_hello(name: &'static str) -> Vec<u8> {
    use std::sync::Arc;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(name).unwrap();
    let mut client = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    let mut bytes = Vec::new();
    client.write_tls(&mut bytes).unwrap();
    bytes
}

/// A CONNECT to `127.0.0.1:port` (an echo) as `user` that sends `first`
/// after the `200`: whether it came back (the tunnel was let through), or
/// the connection closed without it (refused after the `200`).
async fn echoed_through_address(stack: &Stack, user: &str, port: u16, first: &[u8]) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut s, head) = connect_stream(stack, user, "127.0.0.1", port).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(first).await.unwrap();
    let mut back = vec![0u8; first.len()];
    match tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back)).await {
        Ok(Ok(_)) => {
            assert_eq!(back, first, "the first bytes reach the target first, whole");
            true
        }
        Ok(Err(_)) => false,
        Err(_) => panic!("neither echoed nor closed"),
    }
}

/// A tunnel to an IP literal carries its real destination in the TLS server
/// name: the per-domain rules judge that name (the `200` is already sent, so
/// a refusal closes the tunnel before any byte reaches the target, and the
/// access log says it was refused). Without a ClientHello the tunnel is let
/// through as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_to_an_address_is_judged_by_its_tls_server_name() {
    let dns = TestDns::start(vec!["127.0.0.1".parse().unwrap()]).await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("superproxy.log");
    let stack = Stack::start_with(StackOptions {
        agent_args: vec!["--dns-server".into(), dns.addr.to_string()],
        superproxy_log: Some(log.clone()),
        ..Default::default()
    })
    .await;
    stack.wait_eligible(2).await;
    let port = stack.whoami.port();
    let account = stack.create_account("sni-acct").await;
    let user = stack.create_user(account, "sniuser", PASS).await;
    let echo = proxynet_tests::targets::echo_server().await;
    put_operator_policy(
        &stack,
        json!({"denied_domains": ["marker.test"],
               "domain_limits": [{"domain": "sni.example.test", "new_tunnels_per_second": 1}]}),
    )
    .await;
    eventually(
        "the operator policy to apply",
        Duration::from_secs(5),
        || async {
            connect(&stack, "sniuser", "marker.test", port)
                .await
                .starts_with("HTTP/1.1 403")
                .then_some(())
        },
    )
    .await;

    // Six at once to the address, all naming the limited domain: the
    // network's 1/s lets about one through, the others are closed.
    let hello = client_hello("www.sni.example.test");
    let through = futures_util::future::join_all(
        (0..6).map(|_| echoed_through_address(&stack, "sniuser", echo.port(), &hello)),
    )
    .await;
    let passed = through.iter().filter(|t| **t).count();
    assert!((1..=2).contains(&passed), "{through:?}");
    // Plain bytes are no ClientHello: let through, counted by the address.
    for _ in 0..3 {
        assert!(echoed_through_address(&stack, "sniuser", echo.port(), b"plain bytes first").await);
    }

    // The customer's denied domains apply to the server name too.
    set_user_policy(
        &stack,
        user,
        json!({"denied_domains": ["denied.example.test"]}),
    )
    .await;
    let denied = client_hello("api.denied.example.test");
    let allowed = client_hello("fine.example.test");
    eventually(
        "the user's denial to apply to the server name",
        Duration::from_secs(5),
        || async {
            (!echoed_through_address(&stack, "sniuser", echo.port(), &denied).await).then_some(())
        },
    )
    .await;
    assert!(echoed_through_address(&stack, "sniuser", echo.port(), &allowed).await);

    // Each refusal is a refused tunnel in the access log, naming the rule.
    eventually(
        "the refusals in the access log",
        Duration::from_secs(10),
        || async {
            let text = proxynet_tests::process::read_log(&log);
            let refused = |what: &str| {
                text.lines().any(|l| {
                    l.contains("proxynet::access")
                        && l.contains("tunnel refused")
                        && l.contains(what)
                })
            };
            (refused("per-domain (sni.example.test)") && refused("denied.example.test"))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_groups_by_domain_and_country_from_the_ledger() {
    let (stack, _dns) = stack_with_dns().await;
    let account = stack.create_account("usage-domains").await;
    let user = stack.create_user(account, "domainusage", PASS).await;
    let port = stack.whoami.port();
    let r = proxynet_tests::client::curl(&[
        "-x",
        &format!("http://domainusage:{PASS}@{}", stack.proxy_addrs.proxy),
        &format!("http://localhost:{port}/"),
    ])
    .await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let (s, head) = connect_stream(&stack, "domainusage", "127.0.0.1", port).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(s);
    let _ = user;
    let rows = eventually(
        "usage by domain to list localhost",
        Duration::from_secs(20),
        || async {
            let rows = stack
                .admin_get_json(&format!("/v1/accounts/{account}/usage?group_by=domain"))
                .await;
            let localhost = rows
                .as_array()?
                .iter()
                .find(|r| r["domain"] == "localhost")?
                .clone();
            (localhost["bytes_down"].as_i64()? > 0).then_some(rows)
        },
    )
    .await;
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["domain"].is_string()),
        "{rows}"
    );
    let by_country = stack
        .admin_get_json(&format!(
            "/v1/accounts/{account}/usage?group_by=country,user"
        ))
        .await;
    assert_eq!(by_country[0]["country"], "DE", "{by_country}");
    assert!(by_country[0]["user_id"].is_string(), "{by_country}");
    let by_day = stack
        .admin_get_json(&format!("/v1/accounts/{account}/usage?group_by=day,domain"))
        .await;
    assert!(by_day[0]["day"].is_string(), "{by_day}");
    let r = stack
        .http
        .get(stack.api(&format!(
            "/v1/accounts/{account}/usage?group_by=domain,bogus"
        )))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}
