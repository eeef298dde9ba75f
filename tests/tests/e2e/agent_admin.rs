//! The exit's own controls belong to whoever holds the exit's host: the
//! agent's state-changing admin routes need its local token and refuse web
//! pages; a tunnel through one exit cannot reach another exit's admin
//! listener; a withdrawn exit comes back only with a fresh consent and its
//! owner's own opt-in.

use proxynet_tests::client::raw_request;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, ADMIN_TOKEN, PASSWORD, USERNAME};
use serde_json::json;
use std::time::Duration;

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
