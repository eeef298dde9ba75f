//! The spine: a client authenticates, a live exit is chosen, bytes leave from
//! that exit's egress IP, credentials go nowhere.

use proxynet_tests::client::{curl, raw_exchange, status_of};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, ADMIN_TOKEN, PASSWORD, USERNAME};
use proxynet_tests::whoami::Seen;
use std::collections::HashSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_rotate_over_both_exits_and_no_credentials_reach_the_target() {
    let stack = Stack::start().await;
    let mut seen_ips = HashSet::new();
    for _ in 0..12 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "body: {} headers: {}", r.body, r.headers);
        assert!(
            r.headers.to_ascii_lowercase().contains("proxynet-exit:"),
            "{}",
            r.headers
        );
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_ne!(
            seen.peer.ip().to_string(),
            "127.0.0.1",
            "a tunnel left from the superproxy host"
        );
        assert!(!seen.has_header("proxy-authorization"));
        seen_ips.insert(seen.peer.ip().to_string());
    }
    let expected: HashSet<String> = ["127.0.0.2", "127.0.0.3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(seen_ips, expected, "both exits carry rotating tunnels");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wrong_or_malformed_credentials_get_407() {
    let stack = Stack::start().await;
    let target = stack.whoami_url();
    let proxy = stack.proxy_addrs.proxy;

    let none = curl(&["-p", "-x", &format!("http://{proxy}"), &target]).await;
    let wrong = curl(&[
        "-p",
        "-x",
        &format!("http://{USERNAME}:wrong-password@{proxy}"),
        &target,
    ])
    .await;
    let unknown = curl(&[
        "-p",
        "-x",
        &format!("http://mallory:{}@{proxy}", PASSWORD.replace(' ', "%20")),
        &target,
    ])
    .await;
    for (what, r) in [("none", &none), ("wrong", &wrong), ("unknown", &unknown)] {
        assert_ne!(r.exit_code, 0, "{what}: curl must fail");
        let h = r.headers.to_ascii_lowercase();
        assert!(h.contains(" 407"), "{what}: {h}");
        assert!(h.contains("proxy-authenticate: basic"), "{what}: {h}");
        assert!(
            h.contains("proxy-status: proxynet; error=http_request_denied"),
            "{what}: {h}"
        );
    }
    // Unknown user and wrong password are indistinguishable.
    let strip = |h: &str| {
        h.lines()
            .filter(|l| !l.to_ascii_lowercase().starts_with("date"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&wrong.headers), strip(&unknown.headers));

    for header in [
        "Proxy-Authorization: Basic !!!notbase64",
        "Proxy-Authorization: Bearer abc",
        "Proxy-Authorization: Basic bm9jb2xvbg==",
    ] {
        let req = format!(
            "CONNECT {} HTTP/1.1\r\nHost: x\r\n{header}\r\n\r\n",
            stack.whoami
        );
        let resp = raw_exchange(proxy, req.as_bytes(), Duration::from_secs(10)).await;
        assert_eq!(status_of(&resp), 407, "{header}: {resp}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_connect_lines_get_400() {
    let stack = Stack::start().await;
    let proxy = stack.proxy_addrs.proxy;
    let auth = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"))
    };
    for line in [
        "CONNECT  HTTP/1.1",
        "CONNECT example.com HTTP/1.1",
        "CONNECT example.com:notaport HTTP/1.1",
        "CONNECT exa mple.com:80 HTTP/1.1",
        "CONNECT example.com:0 HTTP/1.1",
        "GET / HTTP/1.1",
    ] {
        let req = format!("{line}\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n");
        let resp = raw_exchange(proxy, req.as_bytes(), Duration::from_secs(10)).await;
        assert_eq!(status_of(&resp), 400, "{line}: {resp}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_stops_receiving_tunnels_after_heartbeat_expiry() {
    let mut stack = Stack::start().await;
    let dead_ip = stack.agents[0].egress_ip.to_string();
    let dead_exit = stack.agents[0].addrs.exit_id;
    stack.agents[0].proc.kill().await;

    // The control plane sees the heartbeat expire...
    eventually(
        "the dead exit to leave the live set",
        Duration::from_secs(20),
        || async {
            let exits: serde_json::Value = stack
                .http
                .get(stack.api("/v1/exits"))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let dead = exits
                .as_array()?
                .iter()
                .find(|e| e["id"] == dead_exit.to_string())?;
            (dead["live"] == false).then_some(())
        },
    )
    .await;
    stack.wait_eligible(1).await;

    // ...and every new tunnel goes to the survivor.
    for _ in 0..10 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{} {}", r.body, r.headers);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_ne!(seen.peer.ip().to_string(), dead_ip);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_or_disabling_a_user_revokes_access() {
    let stack = Stack::start().await;
    let account = stack.create_account("revocation").await;
    let user_id = stack.create_user(account, "bob", "bob-password-1").await;
    let proxy = format!("http://bob:bob-password-1@{}", stack.proxy_addrs.proxy);
    let ok = curl(&["-p", "-x", &proxy, &stack.whoami_url()]).await;
    assert_eq!(ok.status, 200);

    let r = stack
        .admin()
        .patch_user(user_id, &serde_json::json!({ "enabled": false }))
        .await;
    assert_eq!(r.status(), 200);
    eventually("disable to take effect", Duration::from_secs(5), || async {
        let r = curl(&["-p", "-x", &proxy, &stack.whoami_url()]).await;
        r.headers.contains(" 407").then_some(())
    })
    .await;

    // Password rotation: the old password stops working, the new one works.
    let r = stack
        .admin()
        .patch_user(
            user_id,
            &serde_json::json!({ "enabled": true, "password": "bob-password-2" }),
        )
        .await;
    assert_eq!(r.status(), 200);
    let new_proxy = format!("http://bob:bob-password-2@{}", stack.proxy_addrs.proxy);
    eventually(
        "rotation to take effect",
        Duration::from_secs(5),
        || async {
            let r = curl(&["-p", "-x", &new_proxy, &stack.whoami_url()]).await;
            (r.status == 200).then_some(())
        },
    )
    .await;
    let old = curl(&["-p", "-x", &proxy, &stack.whoami_url()]).await;
    assert!(old.headers.contains(" 407"), "{}", old.headers);

    let r = stack
        .http
        .delete(stack.api(&format!("/v1/users/{user_id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    eventually(
        "deletion to take effect",
        Duration::from_secs(5),
        || async {
            let r = curl(&["-p", "-x", &new_proxy, &stack.whoami_url()]).await;
            r.headers.contains(" 407").then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_or_rotating_takes_effect_on_every_superproxy_within_five_seconds() {
    let stack = Stack::start().await;
    let (_second, second) = proxynet_tests::stack::spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second.admin, 2).await;
    let account = stack.create_account("fleet-revocation").await;
    let user = stack.create_user(account, "carl", "carl-password-1").await;
    let via =
        |proxy: std::net::SocketAddr, password: &str| format!("http://carl:{password}@{proxy}");
    let proxies = [stack.proxy_addrs.proxy, second.proxy];
    for proxy in proxies {
        assert_eq!(
            curl(&[
                "-p",
                "-x",
                &via(proxy, "carl-password-1"),
                &stack.whoami_url()
            ])
            .await
            .status,
            200
        );
    }

    let patch = |body: serde_json::Value| {
        let (http, url) = (stack.http.clone(), stack.api(&format!("/v1/users/{user}")));
        async move {
            http.patch(url)
                .bearer_auth(ADMIN_TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(patch(serde_json::json!({ "enabled": false })).await, 200);
    for proxy in proxies {
        eventually(
            "disable to reach every superproxy",
            Duration::from_secs(5),
            || async {
                let r = curl(&[
                    "-p",
                    "-x",
                    &via(proxy, "carl-password-1"),
                    &stack.whoami_url(),
                ])
                .await;
                r.headers.contains(" 407").then_some(())
            },
        )
        .await;
    }

    assert_eq!(
        patch(serde_json::json!({ "enabled": true, "password": "carl-password-2" })).await,
        200
    );
    for proxy in proxies {
        eventually(
            "the rotated password to work everywhere",
            Duration::from_secs(5),
            || async {
                (curl(&[
                    "-p",
                    "-x",
                    &via(proxy, "carl-password-2"),
                    &stack.whoami_url(),
                ])
                .await
                .status
                    == 200)
                    .then_some(())
            },
        )
        .await;
        let old = curl(&[
            "-p",
            "-x",
            &via(proxy, "carl-password-1"),
            &stack.whoami_url(),
        ])
        .await;
        assert!(
            old.headers.contains(" 407"),
            "old password still works on {proxy}"
        );
    }
}
