//! The abuse desk answers by the address the victim saw. An exit host of its
//! own (network namespaces) sits behind NAT: its agent binds a "private"
//! address, and everything leaving towards the stack is masqueraded to the
//! uplink's "public" one, which the superproxy's egress reflector reports.
//! A tunnel through it is found by the public address and by the bound one;
//! a re-dial's new public address is observed when the agent comes back and
//! the old one stays in the history, each answering for its own time; an
//! exit that declares an address the reflector does not see, without
//! declaring NAT, is flagged and, under the strict policy, not routable.
//! The reflector signs only for the exit that proves it is one, and no exit
//! reaches it through another exit.

use chrono::{SecondsFormat, Utc};
use proxynet_tests::client::{curl, raw_request};
use proxynet_tests::netns::ExitHost;
use proxynet_tests::process::eventually;
use proxynet_tests::reflector;
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, ADMIN_TOKEN, PASSWORD, USERNAME};
use proxynet_tests::whoami::Seen;
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use uuid::Uuid;

/// A stack on `host` whose superproxy runs the egress reflector on the root
/// side of the uplink, where the agent in EXIT reaches it.
async fn stack_behind_nat(host: &ExitHost, api_env: Vec<(String, String)>) -> Stack {
    host.masquerade_uplink();
    let reflector = SocketAddr::from((host.root_addr, 0));
    Stack::start_with(host.stack_options(StackOptions {
        egress_ips: Vec::new(),
        superproxy_args: SuperproxyArgs::new().reflector_listen(reflector).into(),
        api_env,
        ..Default::default()
    }))
    .await
}

/// A stack behind NAT with one agent binding EXIT's "private" address,
/// eligible: the stack and the exit's id.
async fn exit_behind_nat(host: &ExitHost) -> (Stack, Uuid) {
    let mut stack = stack_behind_nat(host, Vec::new()).await;
    let private = IpAddr::V4(host.exit_wan_v4);
    let i = stack
        .add_agent_in(host, &[private], &[], &["--behind-nat"])
        .await;
    let exit = stack.agents[i].addrs.exit_id;
    stack.wait_eligible(1).await;
    (stack, exit)
}

/// `GET /v1/exits/{id}` once its agent has reported an observation.
async fn observed_exit(stack: &Stack, exit: Uuid) -> Value {
    eventually(
        "the exit's egress to be observed",
        Duration::from_secs(20),
        || async {
            let view = stack.admin_get_json(&format!("/v1/exits/{exit}")).await;
            (view["egress"]["observed"].as_array()?.len() == 1).then_some(view)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_behind_nat_is_found_by_the_public_address_and_the_bound_one() {
    let host = ExitHost::create();
    let (stack, exit) = exit_behind_nat(&host).await;
    let private = IpAddr::V4(host.exit_wan_v4);
    let public = IpAddr::V4(host.uplink_addr);

    let view = observed_exit(&stack, exit).await;
    assert_eq!(view["behind_nat"], true, "{view}");
    assert_eq!(view["egress_ips"], serde_json::json!([private]), "declared");
    let observed = &view["egress"]["observed"][0];
    assert_eq!(observed["egress"], private.to_string(), "{view}");
    assert_eq!(observed["bound"], private.to_string());
    assert_eq!(observed["observed"], public.to_string());
    assert_eq!(observed["status"], "behind_nat");
    assert_eq!(view["egress"]["verification"], "behind_nat");
    assert_eq!(view["egress"]["routable"], true);
    assert_eq!(view["egress"]["history"].as_array().unwrap().len(), 1);

    // A tunnel: the target (not behind the NAT) sees the bound address.
    let whoami = host.start_whoami();
    let r = curl(&["-p", "-x", &stack.proxy_url(), &whoami.url(false)]).await;
    assert_eq!(r.status, 200, "{}{}", r.headers, r.body);
    assert_eq!(
        serde_json::from_str::<Seen>(&r.body).unwrap().peer.ip(),
        private
    );
    let at = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let target = whoami.v4.to_string();

    // The victim names the public address and the time.
    let lookup =
        |egress: IpAddr| format!("/v1/abuse/lookup?egress_ip={egress}&at={at}&target={target}");
    let rows = eventually(
        "the target log to have the tunnel",
        Duration::from_secs(20),
        || async {
            let rows = stack.admin_get_json(&lookup(public)).await;
            (!rows.as_array()?.is_empty()).then_some(rows)
        },
    )
    .await;
    let row = &rows[0];
    assert_eq!(row["account_name"], "acme", "{rows}");
    assert_eq!(row["username"], USERNAME);
    assert_eq!(row["user_id"], stack.user_id.to_string());
    assert_eq!(row["exit_id"], exit.to_string());
    assert_eq!(row["egress_ip"], private.to_string());
    assert_eq!(row["observed_ip"], public.to_string());
    assert_eq!(row["matched"], "observed");
    assert_eq!(row["source_name"], "proxynet-tests-dc");
    assert_eq!(row["target_port"], whoami.v4.port());

    // The customer whose traffic the exit carried sees the public address
    // in its provenance view, with its own key.
    let account: Uuid = row["account_id"].as_str().unwrap().parse().unwrap();
    let (key, _) = stack.account_key(account).await;
    let customer = stack
        .get_json_as(&key, &format!("/v1/exits/{exit}/provenance"))
        .await;
    assert_eq!(
        customer["egress"]["observed"],
        serde_json::json!([public.to_string()]),
        "{customer}"
    );
    assert_eq!(customer["egress"]["verification"], "behind_nat");

    // The complaint as a victim writes it: the address and the time only.
    let bare = stack
        .admin_get_json(&format!("/v1/abuse/lookup?egress_ip={public}&at={at}"))
        .await;
    assert_eq!(bare.as_array().unwrap().len(), 1, "{bare}");
    assert_eq!(bare[0]["username"], USERNAME);
    assert_eq!(bare[0]["target_host"], whoami.v4.ip().to_string());

    // By the bound address too; and nothing an hour later.
    let rows = stack.admin_get_json(&lookup(private)).await;
    assert_eq!(rows[0]["matched"], "bound", "{rows}");
    assert_eq!(rows[0]["username"], USERNAME);
    let later =
        (Utc::now() + chrono::Duration::hours(1)).to_rfc3339_opts(SecondsFormat::Secs, true);
    let none = stack
        .admin_get_json(&format!("/v1/abuse/lookup?egress_ip={public}&at={later}"))
        .await;
    assert_eq!(none, serde_json::json!([]));

    // The operator's export of the range, both formats, filtered the same way.
    let (from, to) = (
        (Utc::now() - chrono::Duration::hours(1)).to_rfc3339_opts(SecondsFormat::Secs, true),
        (Utc::now() + chrono::Duration::minutes(5)).to_rfc3339_opts(SecondsFormat::Secs, true),
    );
    let export = |format: &str| {
        stack
            .http
            .get(stack.api(&format!(
                "/v1/abuse/export?from={from}&to={to}&format={format}&egress_ip={public}"
            )))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    let json: Value = export("json").await.unwrap().json().await.unwrap();
    assert_eq!(json[0]["observed_ip"], public.to_string(), "{json}");
    let csv = export("csv").await.unwrap().text().await.unwrap();
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("minute,egress_ip,observed_ip,matched,"));
    let line = lines.next().unwrap();
    assert!(
        line.contains(&format!(",{private},{public},observed,{exit},")),
        "{line}"
    );
    assert!(line.contains(",alice,"), "{line}");
    let too_long = stack
        .http
        .get(stack.api("/v1/abuse/export?from=2026-01-01T00:00:00Z&to=2026-03-01T00:00:00Z"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(too_long.status(), 400);

    // Every use of the desk is in the audit log.
    for action in ["abuse.lookup", "abuse.export"] {
        let audit = stack
            .admin_get_json(&format!("/v1/audit?action={action}"))
            .await;
        assert!(!audit.as_array().unwrap().is_empty(), "{action}: {audit}");
    }
    // Named by the address asked about, with what it answered.
    let audit = stack
        .admin_get_json(&format!("/v1/audit?action=abuse.lookup&subject={public}"))
        .await;
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["detail"]["rows"] == 1 && a["detail"]["at"] == at.as_str()),
        "{audit}"
    );

    // A past customer does not keep seeing the exit's current address: its
    // one tunnel, moved ten minutes before the address was first seen, no
    // longer overlaps the observation, so its view names no address.
    let past = stack.create_account("past-customer").await;
    stack
        .create_user(past, "pastuser", proxynet_tests::stack::PASSWORD)
        .await;
    let past_proxy = proxynet_tests::client::proxy_as("pastuser", stack.proxy_addrs.proxy);
    let r = curl(&["-p", "-x", &past_proxy, &whoami.url(false)]).await;
    assert_eq!(r.status, 200, "{}{}", r.headers, r.body);
    let (past_key, _) = stack.account_key(past).await;
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    eventually(
        "the past customer's usage to reach the ledger",
        Duration::from_secs(20),
        || async {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM usage_ledger WHERE account_id = $1 AND exit_id = $2",
            )
            .bind(past)
            .bind(exit)
            .fetch_one(&db)
            .await
            .unwrap();
            (n > 0).then_some(())
        },
    )
    .await;
    let view = stack
        .get_json_as(&past_key, &format!("/v1/exits/{exit}/provenance"))
        .await;
    assert_eq!(
        view["egress"]["observed"],
        serde_json::json!([public.to_string()]),
        "while its tunnel is recent it sees the address: {view}"
    );
    sqlx::query(
        "UPDATE usage_ledger SET minute = minute - interval '10 minutes' WHERE account_id = $1",
    )
    .bind(past)
    .execute(&db)
    .await
    .unwrap();
    let view = stack
        .get_json_as(&past_key, &format!("/v1/exits/{exit}/provenance"))
        .await;
    assert_eq!(view["exit_id"], exit.to_string(), "still its exit: {view}");
    assert_eq!(view["egress"]["observed"], serde_json::json!([]), "{view}");
}

/// A residential re-dial: the public address behind the NAT changes and the
/// connections through the old one die. The agent's link comes back over
/// the new address and the agent looks again (on the reconnect, at most
/// every 30 s; its periodic look is 10 minutes away); the new address is
/// history, not an error, and each address answers for the time it carried
/// the exit's traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redialled_exit_keeps_its_old_public_address_in_the_history() {
    let host = ExitHost::create();
    let (stack, exit) = exit_behind_nat(&host).await;
    let private = IpAddr::V4(host.exit_wan_v4);
    let first = IpAddr::V4(host.uplink_addr);
    let view = observed_exit(&stack, exit).await;
    assert_eq!(view["egress"]["observed"][0]["observed"], first.to_string());
    let whoami = host.start_whoami();
    let (proxy, target) = (stack.proxy_url(), whoami.url(false));
    let r = curl(&["-p", "-x", &proxy, &target]).await;
    assert_eq!(r.status, 200, "{}{}", r.headers, r.body);
    let before = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);

    let second = IpAddr::V4(host.redial(1));
    let view = eventually(
        "the re-dialled address to be observed after the link reconnects (the re-dial cuts the old connections with ss -K)",
        Duration::from_secs(60),
        || async {
            let view = stack.admin_get_json(&format!("/v1/exits/{exit}")).await;
            (view["egress"]["observed"][0]["observed"] == second.to_string()).then_some(view)
        },
    )
    .await;
    let history = view["egress"]["history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{view}");
    assert_eq!(history[0]["observed"], second.to_string(), "newest first");
    assert_eq!(history[1]["observed"], first.to_string());
    assert_eq!(history[0]["bound"], private.to_string());
    assert_eq!(view["egress"]["verification"], "behind_nat", "{view}");
    assert_eq!(view["egress"]["routable"], true);

    stack.wait_eligible(1).await;
    let r = curl(&["-p", "-x", &proxy, &target]).await;
    assert_eq!(r.status, 200, "{}{}", r.headers, r.body);
    let after = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let lookup = |egress: IpAddr, at: &str| format!("/v1/abuse/lookup?egress_ip={egress}&at={at}");
    for (public, at) in [(second, &after), (first, &before)] {
        let rows = eventually(
            "the target log to answer for the address",
            Duration::from_secs(20),
            || async {
                let rows = stack.admin_get_json(&lookup(public, at)).await;
                (!rows.as_array()?.is_empty()).then_some(rows)
            },
        )
        .await;
        assert_eq!(rows[0]["username"], USERNAME, "{public}: {rows}");
        assert_eq!(rows[0]["observed_ip"], public.to_string(), "{rows}");
        assert_eq!(rows[0]["matched"], "observed");
    }
    // The new address did not carry anything an hour before it was seen.
    let earlier =
        (Utc::now() - chrono::Duration::hours(1)).to_rfc3339_opts(SecondsFormat::Secs, true);
    let none = stack.admin_get_json(&lookup(second, &earlier)).await;
    assert_eq!(none, serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_ip_the_reflector_does_not_see_is_flagged_and_strictly_not_routable() {
    let host = ExitHost::create();
    let mut stack = stack_behind_nat(
        &host,
        vec![("PROXYNET_STRICT_EGRESS_VERIFICATION".into(), "true".into())],
    )
    .await;
    // Declares the address it binds, but says nothing of the NAT that the
    // world sees its traffic through.
    let declared = IpAddr::V4(host.exit_wan_v4);
    let i = stack.add_agent_in(&host, &[declared], &[], &[]).await;
    let exit = stack.agents[i].addrs.exit_id;

    let view = observed_exit(&stack, exit).await;
    assert_eq!(view["egress_ips"], serde_json::json!([declared]), "{view}");
    assert_eq!(view["behind_nat"], false);
    let observed = &view["egress"]["observed"][0];
    assert_eq!(observed["bound"], declared.to_string(), "{view}");
    assert_eq!(observed["observed"], host.uplink_addr.to_string());
    assert_eq!(observed["status"], "mismatch");
    assert_eq!(view["egress"]["verification"], "mismatch");
    assert_eq!(view["egress"]["routable"], false);

    // Blocked in every superproxy, with the reason the client is told.
    eventually(
        "the superproxy to block the exit",
        Duration::from_secs(10),
        || async {
            let pool = stack.pool().await;
            let blocked = pool["blocked"].as_array()?;
            (pool["eligible"].as_array()?.is_empty()
                && blocked.iter().any(|b| b["reason"] == "egress_unverified"))
            .then_some(())
        },
    )
    .await;
    let whoami = host.start_whoami();
    let r = curl(&["-p", "-x", &stack.proxy_url(), &whoami.url(false)]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(h.contains(" 503"), "{h}");
    assert!(
        h.contains("no exit with valid provenance is available (egress_unverified)"),
        "{h}"
    );

    // The verdict change is audited; the customer and dashboard views say it.
    let audit = stack
        .admin_get_json(&format!(
            "/v1/audit?action=exit.egress_verification&subject={exit}"
        ))
        .await;
    assert_eq!(audit[0]["detail"]["to"], "mismatch", "{audit}");
    let provenance = stack
        .admin_get_json(&format!("/v1/exits/{exit}/provenance"))
        .await;
    assert_eq!(provenance["blocked"], "egress_unverified", "{provenance}");
    assert_eq!(
        provenance["egress"]["observed"],
        serde_json::json!([host.uplink_addr.to_string()])
    );
    let cookie = stack.dashboard_session(ADMIN_TOKEN).await;
    let exits = eventually(
        "the dashboard to sample the exit's egress",
        Duration::from_secs(10),
        || async {
            let data: Value = stack
                .http
                .get(stack.api("/dashboard/data.json"))
                .header("cookie", &cookie)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let row = data["exits"]
                .as_array()?
                .iter()
                .find(|e| e["id"] == exit.to_string())?
                .clone();
            (row["egress_verification"] == "mismatch").then_some(row)
        },
    )
    .await;
    assert_eq!(
        exits["observed_egress"],
        serde_json::json!([host.uplink_addr.to_string()])
    );
    assert_eq!(exits["egress_ips"], serde_json::json!([declared]));
    let page = stack
        .dashboard_page(&cookie, &format!("/dashboard/exits/{exit}"))
        .await;
    assert!(
        page.contains(&format!(
            "<dd id=\"observed-egress\">{}</dd>",
            host.uplink_addr
        )),
        "{page}"
    );
    // Declared, bound and seen side by side, with the verdict.
    assert!(
        page.contains(&format!(
            "<tr><td>{declared}</td><td class=\"bound\">{declared}</td><td class=\"observed\">{}</td><td>mismatch</td>",
            host.uplink_addr
        )),
        "{page}"
    );
}

/// A reflection says which address an exit's own line sends from, so only
/// the exit may ask for one: without its proof (over a fresh challenge,
/// from the address the challenge was issued to) the reflector refuses,
/// and a tunnel through another exit never reaches the reflector at all
/// (it would sign that exit's address for the asker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflection_needs_the_exits_proof_and_never_arrives_through_another_exit() {
    let stack = Stack::start().await;
    let at = stack
        .proxy_addrs
        .reflector
        .expect("the test stack runs the reflector on loopback");
    let from: IpAddr = "127.0.0.9".parse().unwrap();
    let (exit, credential) = stack.enroll_by_hand("asker", &[from]).await;

    // No proof, whatever else the request says: refused.
    for path in [
        "/whoami".to_owned(),
        format!("/whoami?exit={exit}"),
        format!("/whoami?exit={exit}&challenge=1.00.00"),
    ] {
        let (status, body) = reflector::get(from, at, &path).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    // A proof made without the exit's credential, a proof for another exit,
    // a made-up challenge, a challenge issued to another address: refused.
    let challenge = reflector::challenge(from, at).await;
    let forged = reflector::exit_proof("not the credential", exit, &challenge);
    let (status, body) = reflector::ask(from, at, exit, &challenge, &forged).await;
    assert_eq!(status, 403, "forged proof: {body}");
    let neighbour = stack.agents[0].addrs.exit_id;
    let mine = reflector::exit_proof(&credential, exit, &challenge);
    let (status, body) = reflector::ask(from, at, neighbour, &challenge, &mine).await;
    assert_eq!(status, 403, "another exit's reflection: {body}");
    let made_up = format!("{}.00ff.00ff", Utc::now().timestamp());
    let proof = reflector::exit_proof(&credential, exit, &made_up);
    let (status, body) = reflector::ask(from, at, exit, &made_up, &proof).await;
    assert_eq!(status, 403, "made-up challenge: {body}");
    let elsewhere: IpAddr = "127.0.0.10".parse().unwrap();
    let (status, body) = reflector::ask(elsewhere, at, exit, &challenge, &mine).await;
    assert_eq!(status, 403, "a challenge of another address: {body}");

    // With the proof, from the address it was issued to: the address seen,
    // signed for this exit, which the control-api takes as the exit's.
    let (status, body) = reflector::ask(from, at, exit, &challenge, &mine).await;
    assert_eq!(status, 200, "{body}");
    let reflection: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reflection["address"], from.to_string(), "{reflection}");
    assert_eq!(reflection["exit"], exit.to_string());
    let report = serde_json::json!({"observed": [
        {"egress": from.to_string(), "bound": from.to_string(), "reflection": reflection}
    ]});
    let answer: Value = stack
        .http
        .post(stack.api(&format!("/v1/agent/exits/{exit}/egress")))
        .bearer_auth(&credential)
        .json(&report)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["accepted"], 1, "{answer}");
    assert_eq!(answer["verification"], "verified");

    // Through an exit: the superproxy refuses the literal address, and the
    // exit refuses the name (the reflector is in every exit's deny list).
    let basic = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"))
    };
    let connect =
        format!("CONNECT {at} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {basic}\r\n\r\n");
    let r = raw_request(
        stack.proxy_addrs.proxy,
        connect.as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.head.contains("destination_ip_prohibited"), "{r:?}");
    for agent in &stack.agents {
        let user = format!("{USERNAME}-exit-{}", agent.addrs.exit_id.simple());
        let proxy = proxynet_tests::client::proxy_as(&user, stack.proxy_addrs.proxy);
        eventually(
            "the exit to refuse the reflector by name",
            Duration::from_secs(10),
            || async {
                let r = curl(&[
                    "-x",
                    &proxy,
                    &format!("http://localhost:{}/whoami/challenge", at.port()),
                ])
                .await;
                (r.status == 403 && r.headers.contains("destination_ip_prohibited")).then_some(())
            },
        )
        .await;
    }
}
