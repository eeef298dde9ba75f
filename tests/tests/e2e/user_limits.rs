//! Per-user limits enforced by all superproxies together: concurrent tunnels
//! (leases that a dead superproxy cannot leak) and new tunnels per second.

use proxynet_tests::client::{self, curl, socks5};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{spawn_superproxy, Stack, StackOptions, SuperproxyArgs};
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

const PASS: &str = "limited-password-1";

async fn limited_user(stack: &Stack, name: &str, limits: serde_json::Value) -> String {
    let account = stack.create_account(name).await;
    let r = stack
        .admin()
        .create_user_with(
            account,
            &json!({ "username": name, "password": PASS, "limits": limits }),
        )
        .await;
    proxynet_tests::stack::created_id(r, "create limited user")
        .await
        .to_string()
}

async fn hold_tunnel(proxy: SocketAddr, user: &str, target: SocketAddr) -> (TcpStream, String) {
    client::connect_tunnel(proxy, user, PASS, target).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_limit_refuses_the_next_tunnel_and_frees_on_close() {
    let stack = Stack::start().await;
    limited_user(&stack, "twoatatime", json!({ "max_concurrent_tunnels": 2 })).await;
    let proxy = stack.proxy_addrs.proxy;
    let (first, h1) = hold_tunnel(proxy, "twoatatime", stack.whoami).await;
    let (_second, h2) = hold_tunnel(proxy, "twoatatime", stack.whoami).await;
    assert!(
        h1.starts_with("HTTP/1.1 200") && h2.starts_with("HTTP/1.1 200"),
        "{h1}{h2}"
    );

    let (_, refused) = hold_tunnel(proxy, "twoatatime", stack.whoami).await;
    let lower = refused.to_ascii_lowercase();
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(
        lower.contains("retry-after:") && lower.contains("concurrent tunnel limit (2)"),
        "{refused}"
    );

    let mut s = socks5::login(stack.proxy_addrs.socks, "twoatatime", PASS)
        .await
        .unwrap();
    assert_eq!(
        socks5::request(&mut s, 1, "127.0.0.1", stack.whoami.port()).await,
        2
    );

    drop(first);
    eventually("a slot to free up", Duration::from_secs(5), || async {
        let (_, head) = hold_tunnel(proxy, "twoatatime", stack.whoami).await;
        head.starts_with("HTTP/1.1 200").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_superproxy_frees_its_leases() {
    let mut stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new().lease_ttl_ms(1500).into(),
        ..Default::default()
    })
    .await;
    limited_user(&stack, "onlyone", json!({ "max_concurrent_tunnels": 1 })).await;
    let (_other, other) = spawn_superproxy(
        &stack.stores,
        SuperproxyArgs::new().lease_ttl_ms(1500).as_slice(),
    )
    .await;
    stack.wait_eligible_at(other.admin, 2).await;

    let (_held, head) = hold_tunnel(stack.proxy_addrs.proxy, "onlyone", stack.whoami).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_, refused) = hold_tunnel(other.proxy, "onlyone", stack.whoami).await;
    assert!(
        refused.starts_with("HTTP/1.1 429"),
        "the lease is shared: {refused}"
    );

    stack.proxy.kill().await;
    eventually(
        "the dead superproxy's lease to expire",
        Duration::from_secs(10),
        || async {
            let (_, head) = hold_tunnel(other.proxy, "onlyone", stack.whoami).await;
            head.starts_with("HTTP/1.1 200").then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_tunnel_rate_is_limited_and_limits_can_change() {
    let stack = Stack::start().await;
    let id = limited_user(
        &stack,
        "slowpoke",
        json!({ "max_new_tunnels_per_second": 3 }),
    )
    .await;
    let url = format!("http://slowpoke:{PASS}@{}", stack.proxy_addrs.proxy);
    let mut limited = 0;
    for _ in 0..10 {
        let r = curl(&["-p", "-x", &url, &stack.whoami_url()]).await;
        if r.headers.contains(" 429") {
            assert!(
                r.headers.to_ascii_lowercase().contains("rate limit (3/s)"),
                "{}",
                r.headers
            );
            limited += 1;
        }
    }
    assert!(limited > 0, "ten tunnels in a burst must exceed 3/s");

    // Lifting the limit takes effect without a restart.
    let r = stack
        .admin()
        .patch_user(&id, &json!({ "limits": {} }))
        .await;
    assert_eq!(r.status(), 200);
    eventually(
        "the lifted limit to apply",
        Duration::from_secs(5),
        || async {
            for _ in 0..8 {
                if curl(&["-p", "-x", &url, &stack.whoami_url()]).await.status != 200 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_targeting_bounds_what_a_user_may_ask_for() {
    let stack = Stack::start().await;
    limited_user(
        &stack,
        "resonly",
        json!({ "allowed_source_types": ["res"] }),
    )
    .await;
    limited_user(&stack, "germany", json!({ "allowed_countries": ["DE"] })).await;
    let via = |user: &str| format!("http://{user}:{PASS}@{}", stack.proxy_addrs.proxy);

    // Only dc exits exist: a res-only user finds none, and may not ask for dc.
    let none = curl(&["-p", "-x", &via("resonly"), &stack.whoami_url()]).await;
    let h = none.headers.to_ascii_lowercase();
    assert!(h.contains(" 503") && h.contains("allowed-types=res"), "{h}");
    let denied = curl(&["-p", "-x", &via("resonly-type-dc"), &stack.whoami_url()]).await;
    let h = denied.headers.to_ascii_lowercase();
    assert!(
        h.contains(" 403") && h.contains("may not use type=dc"),
        "{h}"
    );

    // The demo exits are in DE: allowed; asking for another country is refused.
    assert_eq!(
        curl(&["-p", "-x", &via("germany"), &stack.whoami_url()])
            .await
            .status,
        200
    );
    let fr = curl(&["-p", "-x", &via("germany-country-fr"), &stack.whoami_url()]).await;
    assert!(
        fr.headers.contains(" 403") && fr.headers.contains("country=FR"),
        "{}",
        fr.headers
    );
}
