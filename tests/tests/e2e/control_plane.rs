//! Issue 12: the pool follows the exit change stream (O(changes)), and falls
//! back to one full read when the stream lost its place.

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
