//! A Postgres outage of a minute never drops an exit from routing.

use proxynet_tests::client::curl;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions};
use std::time::{Duration, Instant};

/// A Postgres outage never empties the pool. With the demo's
/// heartbeat timing (1 s interval, 4 s TTL) and the database blackholed for
/// 60 s, both exits stay eligible at every sample and every tunnel works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_of_60_seconds_never_drops_an_exit() {
    let stack = Stack::start_with(StackOptions {
        heartbeat_interval_ms: 1_000,
        heartbeat_ttl_ms: 4_000,
        postgres_fault: true,
        ..Default::default()
    })
    .await;
    // Warm the credential cache while the database is reachable.
    let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);

    let link = stack.postgres_link.as_ref().unwrap();
    link.blackhole();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut tunnels = 0;
    while started.elapsed() < Duration::from_secs(60) {
        samples.push(stack.eligible_count().await);
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(
            r.status,
            200,
            "tunnel {tunnels} at {:?} into the outage: {}",
            started.elapsed(),
            r.headers
        );
        tunnels += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    link.restore();
    assert!(
        samples.iter().all(|n| *n == 2),
        "eligible exits during the outage: {samples:?}"
    );
    assert!(tunnels > 50, "only {tunnels} tunnels tried");
    // And the heartbeats reach Postgres once it is back.
    eventually("heartbeats persisted", Duration::from_secs(20), || async {
        let exits = stack.admin_get_json("/v1/exits").await;
        let fresh = exits
            .as_array()?
            .iter()
            .filter(|e| {
                e["last_heartbeat_at"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|t| (chrono::Utc::now() - t.to_utc()).num_seconds() < 10)
            })
            .count();
        (fresh == 2).then_some(())
    })
    .await;
}
