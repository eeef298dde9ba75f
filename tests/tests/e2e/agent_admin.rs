//! The exit's own controls belong to whoever holds the exit's host: the
//! agent's state-changing admin routes need its local token and refuse web
//! pages; a tunnel through one exit cannot reach another exit's admin
//! listener; a withdrawn exit comes back only with a fresh consent and its
//! owner's own opt-in. And an exit cannot use that protection against
//! anyone else: only an admin address on egress the reflector verified the
//! exit holds reaches the other exits' deny lists.

use proxynet_tests::client::raw_request;
use proxynet_tests::process::eventually;
use proxynet_tests::reflector;
use proxynet_tests::stack::{Stack, ADMIN_TOKEN, PASSWORD, USERNAME};
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use uuid::Uuid;

fn basic(user: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{PASSWORD}"))
}

fn admin_token(stack: &Stack, i: usize) -> String {
    let path = stack
        .dir
        .path()
        .join(format!("agent-{}.admin-token", stack.agents[i].egress_ip));
    std::fs::read_to_string(path).unwrap().trim().to_owned()
}

/// `POST /opt-out` on agent `i` with extra headers; the status.
async fn post_opt_out(stack: &Stack, i: usize, headers: &[(&str, &str)]) -> u16 {
    let mut r =
        reqwest::Client::new().post(format!("http://{}/opt-out", stack.agents[i].addrs.admin));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_hosts_own_tools_can_withdraw_an_exit() {
    let stack = Stack::start().await;
    stack.wait_eligible(2).await;
    let token = admin_token(&stack, 0);
    let bearer = format!("Bearer {token}");
    // A web page's "simple" cross-site POST, a missing or wrong token, a
    // rebinding page's foreign Host: all refused, the exit stays.
    assert_eq!(post_opt_out(&stack, 0, &[]).await, 401);
    assert_eq!(
        post_opt_out(&stack, 0, &[("authorization", "Bearer nope")]).await,
        401
    );
    assert_eq!(
        post_opt_out(
            &stack,
            0,
            &[
                ("origin", "http://evil.example"),
                ("content-type", "text/plain"),
                ("authorization", &bearer)
            ]
        )
        .await,
        403
    );
    assert_eq!(
        post_opt_out(
            &stack,
            0,
            &[("host", "evil.example:9091"), ("authorization", &bearer)]
        )
        .await,
        403
    );
    assert_eq!(stack.eligible_count().await, 2, "the exit stayed eligible");

    // With the token, from the host itself: withdrawn as before.
    assert_eq!(
        post_opt_out(&stack, 0, &[("authorization", &bearer)]).await,
        200
    );
    let exit = stack.agents[0].addrs.exit_id;
    eventually(
        "the withdrawal to reach the pool",
        Duration::from_secs(10),
        || async { (stack.eligible_count().await == 1).then_some(()) },
    )
    .await;

    eventually(
        "the control plane to record the withdrawal",
        Duration::from_secs(10),
        || async {
            let p = stack
                .admin_get_json(&format!("/v1/exits/{exit}/provenance"))
                .await;
            p["withdrawn_at"].is_string().then_some(())
        },
    )
    .await;
    // The operator cannot bring it back without fresh consent ...
    let r = stack
        .http
        .post(stack.api("/v1/consent-notices"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"version": "reinstate-1", "body": "You share this host's connection."}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = stack
        .http
        .post(stack.api(&format!("/v1/exits/{exit}/reinstate")))
        .bearer_auth(ADMIN_TOKEN)
        .json(
            &json!({"method": "signed_contract", "notice_version": "reinstate-1",
                      "evidence_ref": "contract addendum 2", "opt_out": "exit-agent opt-out"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    // ... and the host stays out until its owner opts in again.
    assert_eq!(stack.eligible_count().await, 1);
    let r = reqwest::Client::new()
        .delete(format!("http://{}/opt-out", stack.agents[0].addrs.admin))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    eventually(
        "the reinstated exit to be eligible",
        Duration::from_secs(10),
        || async { (stack.eligible_count().await == 2).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_through_one_exit_cannot_reach_another_exits_admin_listener() {
    let stack = Stack::start().await;
    stack.wait_eligible(2).await;
    let through = stack.agents[0].addrs.exit_id;
    let neighbour = stack.agents[1].addrs.admin;
    let user = format!("{USERNAME}-exit-{}", through.simple());
    eventually(
        "the neighbour's admin address to be denied",
        Duration::from_secs(10),
        || async {
            let connect = format!(
                "CONNECT {neighbour} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic(&user)
            );
            let r = raw_request(
                stack.proxy_addrs.proxy,
                connect.as_bytes(),
                Duration::from_secs(10),
            )
            .await;
            (r.status == 403 && r.head.contains("destination_ip_prohibited")).then_some(())
        },
    )
    .await;
}

/// The `protected` list of a heartbeat reply.
fn protected(reply: &Value) -> Vec<SocketAddr> {
    serde_json::from_value(reply["protected"].clone()).unwrap()
}

/// The reply to a beat of `exit`, once one is let through (beats closer
/// than a quarter interval apart are answered 429).
async fn beat(stack: &Stack, exit: Uuid, credential: &str, body: Value) -> Value {
    eventually(
        "a heartbeat to be taken",
        Duration::from_secs(10),
        || async {
            let (status, reply) = stack.beat_as(exit, credential, body.clone()).await;
            assert!(status == 200 || status == 429, "heartbeat: {status}");
            (status == 200).then_some(reply)
        },
    )
    .await
}

/// An exit that declares an address nobody saw it send from, and reports
/// its admin listener there, must not make every other exit refuse that
/// address to every customer: the claim is ignored (and shown on the exit).
/// An exit the reflector saw at its address protects its admin listener
/// there, and nothing it merely declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_admin_addresses_on_verified_egress_reach_other_exits_deny_lists() {
    let stack = Stack::start().await;
    let at = stack
        .proxy_addrs
        .reflector
        .expect("the test stack runs the reflector on loopback");
    // Reads every exit's deny list whole: its policy reaches loopback and
    // it egresses from loopback, so its reply lists special ranges too.
    let watcher_ip: IpAddr = "127.0.0.11".parse().unwrap();
    let (watcher, watcher_key) = stack.enroll_by_hand("watcher", &[watcher_ip]).await;
    // Declares a public address it was never seen at (someone else's) and
    // claims the address's HTTPS port as its admin listener.
    let someone_elses: IpAddr = "93.184.216.34".parse().unwrap();
    let (hostile, hostile_key) = stack.enroll_by_hand("hostile", &[someone_elses]).await;
    let claimed = SocketAddr::new(someone_elses, 443);
    beat(
        &stack,
        hostile,
        &hostile_key,
        json!({"admin_addrs": [claimed.to_string()]}),
    )
    .await;
    // Replies are reused for half a second: any reply after this one was
    // built after the claim was recorded.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The demo exits, seen by the stack's reflector on its own loopback,
    // keep protecting their admin listeners from each other ...
    let neighbours: Vec<SocketAddr> = stack.agents.iter().map(|a| a.addrs.admin).collect();
    let seen = eventually(
        "the demo exits' admin addresses in another exit's deny list",
        Duration::from_secs(20),
        || async {
            let reply = beat(
                &stack,
                watcher,
                &watcher_key,
                json!({"internal_targets": true}),
            )
            .await;
            let list = protected(&reply);
            neighbours.iter().all(|a| list.contains(a)).then_some(list)
        },
    )
    .await;
    // ... and the claim on an address no one saw the hostile exit at is on
    // no exit's list.
    assert!(!seen.contains(&claimed), "{claimed} in {seen:?}");

    // Seen by the reflector at 127.0.0.9; it declares a public address too,
    // never seen.
    let own: IpAddr = "127.0.0.9".parse().unwrap();
    let declared_only: IpAddr = "93.184.216.35".parse().unwrap();
    let (honest, honest_key) = stack.enroll_by_hand("honest", &[own, declared_only]).await;
    let reflection = reflector::reflect(own, at, honest, &honest_key).await;
    let answer: Value = stack
        .http
        .post(stack.api(&format!("/v1/agent/exits/{honest}/egress")))
        .bearer_auth(&honest_key)
        .json(&json!({"observed": [
            {"egress": own.to_string(), "bound": own.to_string(), "reflection": reflection}
        ]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["accepted"], 1, "{answer}");
    let honest_admin = SocketAddr::new(own, 4444);
    let honest_declared_only = SocketAddr::new(declared_only, 443);
    beat(
        &stack,
        honest,
        &honest_key,
        json!({"admin_addrs": [honest_admin.to_string(), honest_declared_only.to_string()]}),
    )
    .await;

    // The honest exit's own address reaches the watcher ...
    let seen = eventually(
        "the verified admin address in another exit's deny list",
        Duration::from_secs(10),
        || async {
            let reply = beat(
                &stack,
                watcher,
                &watcher_key,
                json!({"internal_targets": true}),
            )
            .await;
            let list = protected(&reply);
            list.contains(&honest_admin).then_some(list)
        },
    )
    .await;
    // ... and neither the hostile claim nor the honest exit's unverified one.
    assert!(!seen.contains(&claimed), "{claimed} in {seen:?}");
    assert!(
        !seen.contains(&honest_declared_only),
        "{honest_declared_only} in {seen:?}"
    );
    // A public exit's list (special ranges left out) says the same: here
    // the hostile exit's own, beating with the same claim.
    let public = protected(
        &beat(
            &stack,
            hostile,
            &hostile_key,
            json!({"admin_addrs": [claimed.to_string()]}),
        )
        .await,
    );
    assert!(!public.contains(&claimed), "{public:?}");
    assert!(!public.contains(&honest_declared_only), "{public:?}");

    // The operator sees what was claimed and what was ignored.
    let view = stack.admin_get_json(&format!("/v1/exits/{hostile}")).await;
    assert_eq!(view["admin_addresses"], json!([]), "{view}");
    assert_eq!(
        view["admin_addresses_unverified"],
        json!([claimed.to_string()])
    );
    let view = stack.admin_get_json(&format!("/v1/exits/{honest}")).await;
    assert_eq!(
        view["admin_addresses"],
        json!([honest_admin.to_string()]),
        "{view}"
    );
    assert_eq!(
        view["admin_addresses_unverified"],
        json!([honest_declared_only.to_string()])
    );
}
