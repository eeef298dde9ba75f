//! Revocation cuts what is open: a disabled user's tunnels end on every
//! superproxy, and a stale projection write cannot bring the user back.

use proxynet_tests::client::{closed_within, open_echo_tunnel};
use proxynet_tests::client::{curl, socks5};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{spawn_superproxy, Stack, ADMIN_TOKEN, PASSWORD};
use proxynet_tests::targets::{echo_round_trip, echo_server};
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// Revocation cuts open tunnels on every superproxy and every ingress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_user_cuts_its_open_tunnels_everywhere() {
    let stack = Stack::start().await;
    let (_second_proc, second) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second.admin, 2).await;
    let echo = echo_server().await;
    let account = stack.create_account("revoked").await;
    for (i, revocation) in ["disable", "password", "delete"].into_iter().enumerate() {
        let name = format!("victim{i}");
        let user = stack.create_user(account, &name, PASSWORD).await;
        let mut connect = open_echo_tunnel(stack.proxy_addrs.proxy, &name, echo).await;
        let mut socks = socks5::login(second.socks, &name, PASSWORD).await.unwrap();
        assert_eq!(
            socks5::request(&mut socks, 1, "127.0.0.1", echo.port()).await,
            0
        );
        let mut rest = [0u8; 6];
        socks.read_exact(&mut rest).await.unwrap();
        echo_round_trip(&mut socks, b"ping").await.unwrap();
        // An absolute-form keep-alive connection that served one request.
        let mut keep_alive = TcpStream::connect(second.proxy).await.unwrap();
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
            stack.whoami_url(),
            basic(&name, PASSWORD)
        );
        keep_alive.write_all(request.as_bytes()).await.unwrap();
        let mut first = [0u8; 12];
        keep_alive.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");

        let r = match revocation {
            "disable" => stack
                .http
                .patch(stack.api(&format!("/v1/users/{user}")))
                .json(&json!({"enabled": false})),
            "password" => stack
                .http
                .patch(stack.api(&format!("/v1/users/{user}")))
                .json(&json!({"password": "a-brand-new-password"})),
            _ => stack.http.delete(stack.api(&format!("/v1/users/{user}"))),
        }
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
        assert!(r.status().is_success(), "{revocation}: {}", r.status());
        for (what, stream) in [
            ("CONNECT", &mut connect),
            ("SOCKS5", &mut socks),
            ("keep-alive", &mut keep_alive),
        ] {
            assert!(
                closed_within(stream, Duration::from_secs(5)).await,
                "{revocation}: the {what} connection stayed open"
            );
        }
    }
}

/// The projection is monotonic: a stale write cannot resurrect a user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_projection_write_does_not_resurrect_a_disabled_user() {
    let stack = Stack::start().await;
    let account = stack.create_account("stale").await;
    let user = stack.create_user(account, "lazarus", PASSWORD).await;
    let url = format!("http://lazarus:{PASSWORD}@{}", stack.proxy_addrs.proxy).replace(' ', "%20");
    assert_eq!(
        curl(&["-p", "-x", &url, &stack.whoami_url()]).await.status,
        200
    );
    let mut redis = stack.stores.redis().await;
    let keys = stack.stores.keys();
    let key = keys.user("lazarus");
    let enabled: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();

    let r = stack
        .admin()
        .patch_user(user, &json!({"enabled": false}))
        .await;
    assert!(r.status().is_success());
    // What a resync that read Postgres before the disable would write now.
    let written: i64 = redis::Script::new(proxynet_store::PUT_USER_SCRIPT)
        .key(&key)
        .key(keys.users_in_bucket(proxynet_store::user_bucket("lazarus")))
        .arg(&enabled)
        .arg(
            serde_json::from_str::<serde_json::Value>(&enabled).unwrap()["version"]
                .as_i64()
                .unwrap(),
        )
        .arg("")
        .arg("lazarus")
        .invoke_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(written, 0, "the stale record was written");
    let now: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&now).unwrap()["enabled"],
        false
    );
    eventually(
        "the disabled user to be refused",
        Duration::from_secs(5),
        || async {
            curl(&["-p", "-x", &url, &stack.whoami_url()])
                .await
                .headers
                .contains(" 407")
                .then_some(())
        },
    )
    .await;
}
