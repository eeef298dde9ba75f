//! The control plane at scale and in numbers: the pool follows the exit
//! change stream (O(changes)) and falls back to one full read when the
//! stream lost its place; two control-apis serve one stack, and one dying
//! changes nothing a customer sees.

use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, ADMIN_TOKEN};
use std::net::SocketAddr;
use std::time::Duration;

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

/// `proxynet_pool_reads_total{kind}` on a superproxy.
async fn pool_reads(stack: &Stack, admin: SocketAddr, kind: &str) -> u64 {
    let text = scrape(&stack.http, admin).await;
    sample(
        &text,
        "proxynet_pool_reads_total",
        &[&format!("kind=\"{kind}\"")],
    ) as u64
}

async fn eligible(stack: &Stack) -> Vec<String> {
    stack.pool().await["eligible"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["exit_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_reach_the_pool_as_deltas_and_a_lost_place_means_one_full_read() {
    let stack = Stack::start().await;
    let admin = stack.proxy_addrs.admin;
    let exit = stack.agents[0].addrs.exit_id;
    let full_at_start = pool_reads(&stack, admin, "full").await;
    assert!(full_at_start >= 1, "the pool starts with a full read");

    admin_post(&stack, &format!("/v1/exits/{exit}/drain")).await;
    eventually(
        "the drain to reach the pool",
        Duration::from_secs(5),
        || async { (!eligible(&stack).await.contains(&exit.to_string())).then_some(()) },
    )
    .await;
    admin_post(&stack, &format!("/v1/exits/{exit}/undrain")).await;
    eventually(
        "the undrain to reach the pool",
        Duration::from_secs(5),
        || async {
            eligible(&stack)
                .await
                .contains(&exit.to_string())
                .then_some(())
        },
    )
    .await;
    assert!(pool_reads(&stack, admin, "delta").await > 0);
    assert_eq!(
        pool_reads(&stack, admin, "full").await,
        full_at_start,
        "changes were read as deltas, not by re-reading the pool"
    );

    // The stream loses our place (trimmed away, or Redis restarted empty):
    // the next read notices, reads the pool in full once, and goes on.
    let mut redis = stack.stores.redis().await;
    let stream = stack.stores.keys().exit_changes();
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    admin_post(&stack, &format!("/v1/exits/{exit}/drain")).await;
    eventually(
        "the drain to reach the pool after the stream was lost",
        Duration::from_secs(5),
        || async { (!eligible(&stack).await.contains(&exit.to_string())).then_some(()) },
    )
    .await;
    assert_eq!(pool_reads(&stack, admin, "full").await, full_at_start + 1);
}

/// An upgrade from the key layout before user buckets: the old user keys and
/// the old single projection marker are removed once the new layout is
/// projected, so a superproxy of the old release cannot keep authenticating
/// from records nobody updates any more. Other stacks' keys are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_the_previous_user_layout_are_removed_after_the_first_resync() {
    let mut stack = Stack::start().await;
    let account = stack.create_account("legacy").await;
    stack.create_user(account, "current", "pw-current-1").await;
    let prefix = stack.stores.redis_prefix.clone();
    let mut redis = stack.stores.redis().await;
    let legacy_user = format!("{prefix}user:{{oldtimer}}");
    let legacy_marker = format!("{prefix}projection:complete");
    let other_stack = format!("other-{prefix}user:{{oldtimer}}");
    for key in [&legacy_user, &legacy_marker, &other_stack] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(r#"{"version":1}"#)
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    // The first resync of a (re)started control-api removes them.
    stack.restart_api_after_kill().await;
    let exists = |key: String| {
        let mut redis = redis.clone();
        async move {
            redis::cmd("EXISTS")
                .arg(key)
                .query_async::<bool>(&mut redis)
                .await
                .unwrap()
        }
    };
    eventually(
        "the old user key and marker to go",
        Duration::from_secs(20),
        || {
            let (user, marker) = (legacy_user.clone(), legacy_marker.clone());
            let exists = &exists;
            async move { (!exists(user).await && !exists(marker).await).then_some(()) }
        },
    )
    .await;
    assert!(exists(other_stack).await, "another stack's key was removed");
    assert!(
        exists(stack.stores.keys().user("current")).await,
        "the current layout's key is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_apis_serve_one_stack_and_one_dying_changes_nothing() {
    use proxynet_tests::client::connect_tunnel;
    use proxynet_tests::stack::{StackOptions, PASSWORD, USERNAME};
    use proxynet_tests::targets::{echo_server, pump};
    let mut stack = Stack::start_with(StackOptions {
        control_apis: 2,
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("redundant").await;
    let user = stack.create_user(account, "redundant", PASSWORD).await;
    let tunnel = |user: &'static str| {
        let proxy = stack.proxy_addrs.proxy;
        async move {
            let (s, head) = connect_tunnel(proxy, user, PASSWORD, echo).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            s
        }
    };
    for _ in 0..5 {
        pump(tunnel("redundant").await, 10_000).await;
    }

    // One instance dies: customers notice nothing.
    stack.api.kill().await;
    let since = std::time::Instant::now();
    let mut exits = std::collections::HashSet::new();
    while since.elapsed() < Duration::from_secs(5) {
        let (s, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        exits.insert(
            head.lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("proxynet-exit")
                        .then(|| value.trim().to_owned())
                })
                .unwrap_or_default(),
        );
        pump(s, 10_000).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(exits.len(), 2, "both exits stayed live: {exits:?}");
    assert_eq!(stack.eligible_count().await, 2);
    // The API keeps answering through the same address.
    let later = stack.create_account("after-the-loss").await;
    stack.create_user(later, "afterloss", PASSWORD).await;
    eventually("the new user to tunnel", Duration::from_secs(5), || async {
        let (_, head) = connect_tunnel(stack.proxy_addrs.proxy, "afterloss", PASSWORD, echo).await;
        head.starts_with("HTTP/1.1 200").then_some(())
    })
    .await;
    // Usage lands exactly once, whichever instance took it (batches the
    // dead one held are taken over after 30 s).
    for _ in 0..5 {
        pump(tunnel("redundant").await, 10_000).await;
    }
    eventually(
        "every byte in the ledger, once",
        Duration::from_secs(60),
        || async {
            let rows = stack.usage_by_user(account).await;
            let row = rows.iter().find(|r| r["user_id"] == user.to_string())?;
            let up = row["bytes_up"].as_u64()?;
            assert!(up <= 100_000, "counted twice: {up}");
            (up == 100_000).then_some(())
        },
    )
    .await;
}
