//! Exit selection from the client's side: sticky sessions, targeting,
//! operator drain and disable.

use proxynet_tests::client::{curl, egress_via, proxy_as};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{spawn_superproxy, Stack, ADMIN_TOKEN, PASSWORD, USERNAME};
use proxynet_tests::whoami::Seen;
use std::collections::HashSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

async fn admin_post(stack: &Stack, path: &str) {
    let r = stack
        .http
        .post(stack.api(path))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_and_rotation_spreads() {
    let stack = Stack::start().await;
    let sticky = proxy_as(
        &format!("{USERNAME}-session-abc123"),
        stack.proxy_addrs.proxy,
    );
    let first = curl(&["-p", "-x", &sticky, &stack.whoami_url()]).await;
    assert!(
        first
            .headers
            .to_ascii_lowercase()
            .contains("proxynet-session-expires:"),
        "{}",
        first.headers
    );
    let pinned = serde_json::from_str::<Seen>(&first.body)
        .unwrap()
        .peer
        .ip()
        .to_string();
    for _ in 0..19 {
        assert_eq!(egress_via(&sticky, &stack.whoami_url()).await, pinned);
    }
    let mut session_ips = HashSet::new();
    for i in 0..12 {
        let other = proxy_as(&format!("{USERNAME}-session-s{i}"), stack.proxy_addrs.proxy);
        session_ips.insert(egress_via(&other, &stack.whoami_url()).await);
    }
    assert_eq!(
        session_ips.len(),
        2,
        "different sessions pin to different exits: {session_ips:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_or_invalid_targeting_is_refused_precisely() {
    let stack = Stack::start().await;
    let res = curl(&[
        "-p",
        "-x",
        &proxy_as(&format!("{USERNAME}-type-res"), stack.proxy_addrs.proxy),
        &stack.whoami_url(),
    ])
    .await;
    let h = res.headers.to_ascii_lowercase();
    assert!(h.contains(" 503"), "{h}");
    assert!(
        h.contains("error=destination_unavailable") && h.contains("type=res"),
        "{h}"
    );
    assert!(h.contains("retry-after:"), "{h}");

    let de = proxy_as(
        &format!("{USERNAME}-country-de-type-dc"),
        stack.proxy_addrs.proxy,
    );
    assert!(
        ["127.0.0.2", "127.0.0.3"].contains(&egress_via(&de, &stack.whoami_url()).await.as_str())
    );

    for bad in [
        "country-xx",
        "colour-red",
        "session-a-session-b",
        "sesstime-5",
    ] {
        let r = curl(&[
            "-p",
            "-x",
            &proxy_as(&format!("{USERNAME}-{bad}"), stack.proxy_addrs.proxy),
            &stack.whoami_url(),
        ])
        .await;
        let h = r.headers.to_ascii_lowercase();
        assert!(
            h.contains(" 400") && h.contains("proxy username:"),
            "{bad}: {h}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_superproxies_share_session_pins() {
    let stack = Stack::start().await;
    let (_second, second_addrs) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second_addrs.admin, 2).await;
    for i in 0..6 {
        let user = format!("{USERNAME}-session-shared{i}");
        let a = egress_via(
            &proxy_as(&user, stack.proxy_addrs.proxy),
            &stack.whoami_url(),
        )
        .await;
        let b = egress_via(&proxy_as(&user, second_addrs.proxy), &stack.whoami_url()).await;
        assert_eq!(a, b, "session {i} landed on different exits");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_exits_take_no_new_tunnels_but_finish_open_ones() {
    let stack = Stack::start().await;
    let exit = stack.agents[0].addrs.exit_id;
    let pinned_user = format!("{USERNAME}-exit-{}", exit.simple());

    // Open a tunnel through that exit and keep it.
    let mut open = TcpStream::connect(stack.proxy_addrs.proxy).await.unwrap();
    let auth = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{pinned_user}:{PASSWORD}"))
    };
    open.write_all(
        format!(
            "CONNECT {0} HTTP/1.1\r\nHost: {0}\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
            stack.whoami
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = vec![0u8; 1024];
    let n = open.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));

    admin_post(&stack, &format!("/v1/exits/{exit}/drain")).await;
    eventually(
        "the drained exit to leave rotation",
        Duration::from_secs(1),
        || async {
            let r = curl(&[
                "-p",
                "-x",
                &proxy_as(&pinned_user, stack.proxy_addrs.proxy),
                &stack.whoami_url(),
            ])
            .await;
            r.headers.contains(" 503").then_some(())
        },
    )
    .await;
    for _ in 0..6 {
        assert_eq!(
            egress_via(&stack.proxy_url(), &stack.whoami_url()).await,
            stack.agents[1].egress_ip.to_string()
        );
    }

    // The tunnel opened before the drain still carries traffic.
    open.write_all(
        format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            stack.whoami
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    open.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200")
            && answer.contains(&stack.agents[0].egress_ip.to_string()),
        "{answer}"
    );

    admin_post(&stack, &format!("/v1/exits/{exit}/undrain")).await;
    stack.wait_eligible(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_sessions_repin_and_hard_sessions_fail_when_their_exit_goes() {
    let stack = Stack::start().await;
    let soft = proxy_as(
        &format!("{USERNAME}-session-soft1"),
        stack.proxy_addrs.proxy,
    );
    let hard = proxy_as(
        &format!("{USERNAME}-session-hard1-sessmode-hard"),
        stack.proxy_addrs.proxy,
    );
    let soft_ip = egress_via(&soft, &stack.whoami_url()).await;
    let hard_ip = egress_via(&hard, &stack.whoami_url()).await;
    let ip_exit = |ip: &str| {
        stack
            .agents
            .iter()
            .find(|a| a.egress_ip.to_string() == ip)
            .unwrap()
            .addrs
            .exit_id
    };
    let (soft_exit, hard_exit): (Uuid, Uuid) = (ip_exit(&soft_ip), ip_exit(&hard_ip));

    admin_post(&stack, &format!("/v1/exits/{hard_exit}/disable")).await;
    eventually(
        "the hard session to fail",
        Duration::from_secs(5),
        || async {
            let r = curl(&["-p", "-x", &hard, &stack.whoami_url()]).await;
            let h = r.headers.to_ascii_lowercase();
            (h.contains(" 502") && h.contains("sessmode=hard")).then_some(())
        },
    )
    .await;
    admin_post(&stack, &format!("/v1/exits/{hard_exit}/enable")).await;
    stack.wait_eligible(2).await;

    admin_post(&stack, &format!("/v1/exits/{soft_exit}/disable")).await;
    stack.wait_eligible(1).await;
    let moved = egress_via(&soft, &stack.whoami_url()).await;
    assert_ne!(moved, soft_ip, "soft session re-pinned to the other exit");
    for _ in 0..5 {
        assert_eq!(
            egress_via(&soft, &stack.whoami_url()).await,
            moved,
            "and stays there"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_inspect_and_end_sessions() {
    let stack = Stack::start().await;
    let sticky = proxy_as(
        &format!("{USERNAME}-session-ops1-sesstime-5"),
        stack.proxy_addrs.proxy,
    );
    let r = curl(&["-p", "-x", &sticky, &stack.whoami_url()]).await;
    assert_eq!(r.status, 200);
    let exit_header = r
        .headers
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("proxynet-exit:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap();

    let base = stack.api(&format!("/v1/users/{}/sessions", stack.user_id));
    let listed: serde_json::Value = stack
        .http
        .get(&base)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sessions = listed.as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{listed}");
    assert_eq!(sessions[0]["session"], "ops1");
    assert_eq!(sessions[0]["exit_id"], exit_header);
    let ttl = sessions[0]["expires_in_ms"].as_i64().unwrap();
    assert!(
        ttl > 4 * 60_000 && ttl <= 5 * 60_000,
        "sesstime-5 → {ttl} ms"
    );

    let one = stack
        .http
        .get(format!("{base}/ops1"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    let ended = stack
        .http
        .delete(format!("{base}/ops1"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 204);
    let gone = stack
        .http
        .get(format!("{base}/ops1"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
    let bad = stack
        .http
        .get(format!("{base}/not-valid!"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    // The next tunnel of that session pins afresh.
    assert_eq!(
        curl(&["-p", "-x", &sticky, &stack.whoami_url()])
            .await
            .status,
        200
    );
    let again = stack
        .http
        .get(format!("{base}/ops1"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}
