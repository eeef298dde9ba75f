//! Exit provenance and consent — recorded, enforced in routing on
//! every ingress, answerable to customers and abuse desks.

use proxynet_tests::client::{connect_tunnel, curl, raw_request, socks5};
use proxynet_tests::process::{bin, eventually};
use proxynet_tests::stack::{
    spawn_superproxy, Stack, StackOptions, ADMIN_TOKEN, PASSWORD, USERNAME,
};
use proxynet_tests::targets::{echo_round_trip, echo_server};
use proxynet_tests::webhook_receiver::{verified, Receiver};
use proxynet_tests::whoami::Seen;
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use uuid::Uuid;

fn no_agents() -> StackOptions {
    StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn basic(user: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{PASSWORD}"))
}

/// A complete residential source whose addresses come through a partner SDK.
async fn sdk_source(stack: &Stack, name: &str) -> Uuid {
    stack
        .create_source(json!({
            "name": name,
            "source_type": "res",
            "channel": "sdk",
            "supplier": "Partner Apps Ltd",
            "agreement_ref": "SDK agreement PA-7",
            "notice_description": "in-app opt-in screen of the partner's app",
            "opt_out": "app settings > network sharing",
            "liable_party": "Partner Apps Ltd",
            "abuse_contact": "abuse@partner.example",
            "countries": ["DE"],
        }))
        .await
}

async fn post(stack: &Stack, path: &str, body: Value) -> (u16, Value) {
    let r = stack
        .http
        .post(stack.api(path))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Stores a notice and grants consent to `exit`, expiring at `expires_at`.
async fn grant(stack: &Stack, exit: Uuid, expires_at: Option<chrono::DateTime<chrono::Utc>>) {
    let (status, notice) = post(
        stack,
        "/v1/consent-notices",
        json!({"version": format!("n-{exit}"), "body": "You share your connection with Example Proxy; opt out any time in settings."}),
    )
    .await;
    assert!(status == 201 || status == 409, "{status} {notice}");
    let mut body = json!({
        "method": "in_app_opt_in",
        "notice_version": format!("n-{exit}"),
        "evidence_ref": format!("s3://evidence/{exit}"),
        "opt_out": "app settings > network sharing",
    });
    if let Some(e) = expires_at {
        body["expires_at"] = json!(e);
    }
    let (status, record) = post(stack, &format!("/v1/exits/{exit}/consent"), body).await;
    assert_eq!(status, 201, "{record}");
}

async fn pool(stack: &Stack, admin: SocketAddr) -> Value {
    stack
        .http
        .get(format!("http://{admin}/v1/pool"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until the superproxy at `admin` sees `exit` linked, eligible or not.
async fn wait_linked(stack: &Stack, admin: SocketAddr, exit: Uuid) {
    eventually("the exit to link", Duration::from_secs(20), || async {
        let p = pool(stack, admin).await;
        let id = exit.to_string();
        let listed = |key: &str| {
            p[key]
                .as_array()
                .is_some_and(|a| a.iter().any(|e| e["exit_id"] == id.as_str()))
        };
        (listed("eligible") || listed("blocked")).then_some(())
    })
    .await;
}

async fn tunnel_status(stack: &Stack, proxy: SocketAddr) -> (u16, String) {
    let r = raw_request(
        proxy,
        format!(
            "CONNECT {} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
            stack.whoami,
            basic(USERNAME)
        )
        .as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    (
        r.status,
        r.header("proxy-status").unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_with_incomplete_provenance_never_serves_a_tunnel() {
    let mut stack = Stack::start_with(no_agents()).await;
    let incomplete = json!({
        "name": "half-told",
        "source_type": "dc",
        "channel": "leased",
        "supplier": "Some Hoster",
        "agreement_ref": "lease 42",
        "notice_description": "leased servers",
        "opt_out": "not applicable",
        "liable_party": "",
        "abuse_contact": "",
        "countries": ["DE"],
    });
    let source = stack.create_source(incomplete.clone()).await;
    let token = stack.enrollment_token_for("half", source, "DE").await;
    let i = stack.add_agent_with_token(&[ip("127.0.0.2")], token).await;
    let exit = stack.agents[i].addrs.exit_id;
    wait_linked(&stack, stack.proxy_addrs.admin, exit).await;

    let (status, proxy_status) = tunnel_status(&stack, stack.proxy_addrs.proxy).await;
    assert_eq!(status, 503, "{proxy_status}");
    assert!(
        proxy_status.contains("incomplete_provenance"),
        "{proxy_status}"
    );
    let r = curl(&["-x", &stack.proxy_url(), &stack.whoami_url()]).await;
    assert_eq!(r.status, 503, "absolute-form: {}", r.headers);
    let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
        .await
        .unwrap();
    assert_eq!(
        socks5::request(&mut s, 1, "127.0.0.1", stack.whoami.port()).await,
        0x03
    );

    // Answer the missing questions: the same exit carries traffic.
    let mut complete = incomplete;
    complete["liable_party"] = json!("Some Hoster GmbH");
    complete["abuse_contact"] = json!("abuse@hoster.example");
    let r = stack
        .http
        .put(stack.api(&format!("/v1/sources/{source}")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&complete)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    eventually(
        "the completed exit to carry traffic",
        Duration::from_secs(5),
        || async {
            let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
            (r.status == 200).then_some(())
        },
    )
    .await;
}

/// Expiry binds at its instant with no control-plane event (each superproxy
/// judges it), and the operator hears of it afterwards: `exit.withdrawn`,
/// cause `consent_expired`, within the control-api's 5 s sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_expiry_takes_effect_at_the_instant_and_is_announced_to_the_operator() {
    let mut stack = Stack::start_with(no_agents()).await;
    let operator = Receiver::start().await;
    let r = stack
        .http
        .post(stack.api("/v1/webhooks"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"url": operator.url(), "events": ["exit.withdrawn"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let secret = r.json::<Value>().await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let source = sdk_source(&stack, "expiring").await;
    let token = stack.enrollment_token_for("res-1", source, "DE").await;
    let i = stack.add_agent_with_token(&[ip("127.0.0.2")], token).await;
    let exit = stack.agents[i].addrs.exit_id;
    let expires = chrono::Utc::now() + chrono::Duration::seconds(8);
    grant(&stack, exit, Some(expires)).await;
    stack.wait_eligible(1).await;
    let echo = echo_server().await;
    let (mut open, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // Acted on within a second of the instant (a rebuild is scheduled for it).
    let deadline = expires + chrono::Duration::seconds(1);
    let (mut served_before, mut failed_after) = (0, 0);
    while chrono::Utc::now() < deadline + chrono::Duration::seconds(3) {
        let now = chrono::Utc::now();
        let (status, proxy_status) = tunnel_status(&stack, stack.proxy_addrs.proxy).await;
        if status == 200 {
            assert!(now < deadline, "a tunnel was served after T + 1 s");
            if now < expires {
                served_before += 1;
            }
        } else {
            assert_eq!(status, 503);
            assert!(now >= expires, "refused before T: {proxy_status}");
            assert!(proxy_status.contains("consent_expired"), "{proxy_status}");
            if now >= deadline {
                failed_after += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        served_before > 5 && failed_after > 5,
        "{served_before} {failed_after}"
    );
    // The tunnel that was open at the instant was cut.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(1), open.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the open tunnel survived expiry"
    );

    let heard = eventually(
        "exit.withdrawn (consent_expired) at the operator's receiver",
        Duration::from_secs(20),
        || async { operator.accepted("exit.withdrawn").into_iter().next() },
    )
    .await;
    let body = verified(&secret, &heard);
    assert_eq!(body["data"]["exit_id"], exit.to_string(), "{body}");
    assert_eq!(body["data"]["cause"], "consent_expired");
    let reason = body["data"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("consent version 1 expired at "),
        "{reason}"
    );
    assert_eq!(
        operator.accepted("exit.withdrawn").len(),
        1,
        "announced once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_consent_stops_two_superproxies_and_cuts_open_tunnels() {
    let mut stack = Stack::start_with(no_agents()).await;
    let (_second_proc, second) = spawn_superproxy(&stack.stores, &[]).await;
    let source = sdk_source(&stack, "revocable").await;
    let token = stack.enrollment_token_for("res-2", source, "DE").await;
    let i = stack.add_agent_with_token(&[ip("127.0.0.2")], token).await;
    let exit = stack.agents[i].addrs.exit_id;
    grant(&stack, exit, None).await;
    stack.wait_eligible(1).await;
    stack.wait_eligible_at(second.admin, 1).await;
    let echo = echo_server().await;
    let mut open = Vec::new();
    for proxy in [stack.proxy_addrs.proxy, second.proxy] {
        let (mut s, head) = connect_tunnel(proxy, USERNAME, PASSWORD, echo).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        echo_round_trip(&mut s, b"hi").await.unwrap();
        open.push(s);
    }
    let revoked_at = Instant::now();
    let (status, _) = post(
        &stack,
        &format!("/v1/exits/{exit}/consent/revoke"),
        json!({"reason": "the person asked us by email"}),
    )
    .await;
    assert_eq!(status, 200);
    for proxy in [stack.proxy_addrs.proxy, second.proxy] {
        eventually(
            "new tunnels to be refused",
            Duration::from_secs(5),
            || async {
                let (status, proxy_status) = tunnel_status(&stack, proxy).await;
                (status == 503 && proxy_status.contains("consent_revoked")).then_some(())
            },
        )
        .await;
    }
    for mut s in open {
        let mut buf = [0u8; 16];
        let left = Duration::from_secs(5).saturating_sub(revoked_at.elapsed());
        let closed = tokio::time::timeout(left, s.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "an open tunnel survived revocation"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_opts_out_with_the_control_api_down_and_it_is_acknowledged_later() {
    let mut stack = Stack::start_with(no_agents()).await;
    let source = sdk_source(&stack, "withdrawable").await;
    let token = stack.enrollment_token_for("res-3", source, "DE").await;
    let i = stack.add_agent_with_token(&[ip("127.0.0.2")], token).await;
    let exit = stack.agents[i].addrs.exit_id;
    let agent_admin = stack.agents[i].addrs.admin;
    grant(&stack, exit, None).await;
    stack.wait_eligible(1).await;
    let echo = echo_server().await;
    let (mut open, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    stack.api.kill().await;
    let state = stack.dir.path().join("agent-127.0.0.2.json");
    let out = tokio::process::Command::new(bin("exit-agent"))
        .args([
            "--control-api",
            &stack.api_url,
            "--state-file",
            &state.display().to_string(),
            "--admin-listen",
            &agent_admin.to_string(),
            "opt-out",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // At once: the open tunnel ends and nothing new leaves through the exit.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(2), open.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the open tunnel survived the opt-out"
    );
    let (status, _) = tunnel_status(&stack, stack.proxy_addrs.proxy).await;
    assert_eq!(status, 503, "a withdrawn exit carried a tunnel");
    let status: Value = reqwest::get(format!("http://{agent_admin}/opt-out"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["withdrawn"], true);
    assert!(status["acknowledged_at"].is_null(), "{status}");

    stack.start_api_again().await;
    eventually(
        "the withdrawal to be acknowledged",
        Duration::from_secs(30),
        || async {
            let status: Value = reqwest::get(format!("http://{agent_admin}/opt-out"))
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            status["acknowledged_at"].is_number().then_some(())
        },
    )
    .await;
    let history = stack
        .admin_get_json(&format!("/v1/exits/{exit}/consent"))
        .await;
    let last = history.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["state"], "revoked", "{history}");
    assert_eq!(last["recorded_by"], "agent");
    let view = stack
        .admin_get_json(&format!("/v1/exits/{exit}/provenance"))
        .await;
    assert_eq!(view["blocked"], "withdrawn", "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_history_cannot_be_rewritten_in_sql() {
    let mut stack = Stack::start_with(no_agents()).await;
    let source = sdk_source(&stack, "history").await;
    let token = stack.enrollment_token_for("res-4", source, "DE").await;
    let i = stack.add_agent_with_token(&[ip("127.0.0.2")], token).await;
    let exit = stack.agents[i].addrs.exit_id;
    grant(&stack, exit, None).await;
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    for statement in [
        "UPDATE consent_records SET evidence_ref = 'forged' WHERE exit_id = $1",
        "DELETE FROM consent_records WHERE exit_id = $1",
        "UPDATE consent_notices SET body = 'forged' WHERE version IN (SELECT notice_version FROM consent_records WHERE exit_id = $1)",
    ] {
        let result = sqlx::query(statement).bind(exit).execute(&db).await;
        let err = result.expect_err(statement).to_string();
        assert!(err.contains("append-only"), "{statement}: {err}");
    }
    let truncate = sqlx::query("TRUNCATE consent_records CASCADE")
        .execute(&db)
        .await;
    assert!(truncate.is_err(), "TRUNCATE went through");
    let (count,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM consent_records WHERE exit_id = $1")
            .bind(exit)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(count, 1);
    // The audit log has the grant too, readable over the API.
    let audit = stack
        .admin_get_json(&format!("/v1/audit?action=consent.grant&subject={exit}"))
        .await;
    assert_eq!(audit.as_array().unwrap().len(), 1, "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_see_the_provenance_of_exits_that_carried_their_traffic_only() {
    let stack = Stack::start().await;
    let exit = stack.agents[0].addrs.exit_id;
    let account = stack.create_account("customer").await;
    stack.create_user(account, "buyer", PASSWORD).await;
    let other = stack.create_account("stranger").await;
    let key = |account: Uuid| {
        let stack = &stack;
        async move {
            let (status, body) = post(
                stack,
                &format!("/v1/accounts/{account}/api-keys"),
                json!({}),
            )
            .await;
            assert_eq!(status, 201);
            body["key"].as_str().unwrap().to_owned()
        }
    };
    let (customer_key, stranger_key) = (key(account).await, key(other).await);
    let via_exit = format!(
        "http://buyer-exit-{}:{}@{}",
        exit.simple(),
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.proxy
    );
    let r = curl(&["-p", "-x", &via_exit, &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let url = stack.api(&format!("/v1/exits/{exit}/provenance"));
    let view: Value = eventually(
        "the ledger to show the traffic",
        Duration::from_secs(20),
        || async {
            let r = stack
                .http
                .get(&url)
                .bearer_auth(&customer_key)
                .send()
                .await
                .ok()?;
            (r.status() == 200).then_some(r.json().await.ok()?)
        },
    )
    .await;
    assert_eq!(view["source_type"], "dc");
    assert_eq!(view["channel"], "owned");
    assert_eq!(view["routable"], true);
    assert!(
        view.get("source").is_none(),
        "operator-only data shown: {view}"
    );
    assert!(
        !view.to_string().contains("agreement") && !view.to_string().contains("evidence"),
        "{view}"
    );
    let r = stack
        .http
        .get(&url)
        .bearer_auth(&stranger_key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let full = stack
        .admin_get_json(&format!("/v1/exits/{exit}/provenance"))
        .await;
    assert_eq!(full["source"]["agreement_ref"], "internal: test racks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_restricted_to_owned_datacenters_never_leaves_through_an_sdk_exit() {
    let mut stack = Stack::start_with(no_agents()).await;
    stack.add_agent(ip("127.0.0.2")).await; // owned dc
    let source = sdk_source(&stack, "sdk-exits").await;
    let token = stack.enrollment_token_for("sdk-1", source, "DE").await;
    let i = stack.add_agent_with_token(&[ip("127.0.0.3")], token).await;
    grant(&stack, stack.agents[i].addrs.exit_id, None).await;
    stack.wait_eligible(2).await;
    let account = stack.create_account("careful").await;
    let (status, _) = post(
        &stack,
        &format!("/v1/accounts/{account}/users"),
        json!({"username": "careful", "password": PASSWORD, "limits": {"allowed_channels": ["owned", "leased"]}}),
    )
    .await;
    assert_eq!(status, 201);
    let proxy = |user: &str| {
        format!(
            "http://{user}:{}@{}",
            PASSWORD.replace(' ', "%20"),
            stack.proxy_addrs.proxy
        )
    };
    for _ in 0..20 {
        let r = curl(&["-p", "-x", &proxy("careful"), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_eq!(seen.peer.ip(), ip("127.0.0.2"), "left through the SDK exit");
    }
    let r = curl(&[
        "-p",
        "-x",
        &proxy("careful-channel-sdk"),
        &stack.whoami_url(),
    ])
    .await;
    assert!(r.headers.contains(" 403"), "{}", r.headers);
    // Anyone else may ask for the SDK channel explicitly.
    let r = curl(&[
        "-p",
        "-x",
        &proxy(&format!("{USERNAME}-channel-sdk")),
        &stack.whoami_url(),
    ])
    .await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let seen: Seen = serde_json::from_str(&r.body).unwrap();
    assert_eq!(seen.peer.ip(), ip("127.0.0.3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_abuse_lookup_finds_the_account_and_expired_records_are_gone() {
    let stack = Stack::start_with(StackOptions {
        api_env: vec![("PROXYNET_ABUSE_PRUNE_INTERVAL_SECS".into(), "1".into())],
        ..Default::default()
    })
    .await;
    let (a, b) = (&stack.agents[0], &stack.agents[1]);
    let first = stack.create_account("first").await;
    stack.create_user(first, "first1", PASSWORD).await;
    let second = stack.create_account("second").await;
    stack.create_user(second, "second1", PASSWORD).await;
    let via = |user: &str, exit: Uuid| {
        format!(
            "http://{user}-exit-{}:{}@{}",
            exit.simple(),
            PASSWORD.replace(' ', "%20"),
            stack.proxy_addrs.proxy
        )
    };
    for _ in 0..3 {
        assert_eq!(
            curl(&[
                "-p",
                "-x",
                &via("first1", a.addrs.exit_id),
                &stack.whoami_url()
            ])
            .await
            .status,
            200
        );
        assert_eq!(
            curl(&[
                "-p",
                "-x",
                &via("second1", b.addrs.exit_id),
                &stack.whoami_url()
            ])
            .await
            .status,
            200
        );
    }
    let at = chrono::Utc::now();
    let target = format!("127.0.0.1:{}", stack.whoami.port());
    for (agent, account, user) in [(a, first, "first1"), (b, second, "second1")] {
        let path = format!(
            "/v1/abuse/lookup?egress_ip={}&at={}&target={target}",
            agent.egress_ip,
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        let rows = eventually(
            "the target log to have the tunnels",
            Duration::from_secs(20),
            || async {
                let rows = stack.admin_get_json(&path).await;
                (rows
                    .as_array()?
                    .iter()
                    .map(|r| r["tunnels"].as_i64().unwrap_or(0))
                    .sum::<i64>()
                    == 3)
                    .then_some(rows)
            },
        )
        .await;
        for row in rows.as_array().unwrap() {
            assert_eq!(row["account_id"], account.to_string(), "{rows}");
            assert_eq!(row["username"], user);
            assert_eq!(row["exit_id"], agent.addrs.exit_id.to_string());
        }
    }
    // Older than the retention (30 days): deleted by the next pruning round.
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO target_log (minute, egress_ip, exit_id, account_id, user_id, target_host, target_port, tunnels)
         VALUES (now() - interval '31 days', '127.0.0.2', $1, $2, $2, 'old.example', 443, 1)",
    )
    .bind(a.addrs.exit_id)
    .bind(first)
    .execute(&db)
    .await
    .unwrap();
    eventually(
        "expired records to be deleted",
        Duration::from_secs(10),
        || async {
            let (n,): (i64,) =
                sqlx::query_as("SELECT count(*) FROM target_log WHERE target_host = 'old.example'")
                    .fetch_one(&db)
                    .await
                    .ok()?;
            (n == 0).then_some(())
        },
    )
    .await;
    let _ = TcpStream::connect(stack.proxy_addrs.proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_cuts_a_tunnel_through_an_exit_whose_heartbeats_lapsed() {
    let mut stack = Stack::start_with(no_agents()).await;
    // The agent reaches the control-api through a link the test can break;
    // its superproxy link is its own.
    let api: SocketAddr = stack.api_url.trim_start_matches("http://").parse().unwrap();
    let control_link = proxynet_tests::faults::FaultyLink::start(api).await;
    let source = sdk_source(&stack, "lapsing").await;
    let token = stack.enrollment_token_for("res-lapse", source, "DE").await;
    let i = stack
        .add_agent_via(
            &format!("http://{}", control_link.addr),
            &[ip("127.0.0.2")],
            token,
        )
        .await;
    let exit = stack.agents[i].addrs.exit_id;
    grant(&stack, exit, None).await;
    stack.wait_eligible(1).await;
    let echo = echo_server().await;
    let (mut open, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // Its heartbeats stop reaching the control plane (which is fine
    // otherwise): its liveness lapses, its link and tunnel stay up.
    control_link.blackhole();
    eventually(
        "the exit's liveness to lapse",
        Duration::from_secs(10),
        || async { (stack.eligible_count().await == 0).then_some(()) },
    )
    .await;
    echo_round_trip(&mut open, b"still").await.unwrap();

    let revoked_at = Instant::now();
    let (status, _) = post(
        &stack,
        &format!("/v1/exits/{exit}/consent/revoke"),
        json!({"reason": "withdrawn by email"}),
    )
    .await;
    assert_eq!(status, 200);
    let mut buf = [0u8; 16];
    let left = Duration::from_secs(5).saturating_sub(revoked_at.elapsed());
    let closed = tokio::time::timeout(left, open.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the tunnel through a lapsed, linked exit survived revocation"
    );
}
