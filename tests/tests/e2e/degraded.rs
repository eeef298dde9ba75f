//! Store outages: with Redis gone, superproxies keep serving the users and
//! exits they know; when it returns (empty), everything reconverges without a
//! restart. And what the control plane's silence holds: the exits that were
//! live when it fell silent, not one that had lapsed before.

use proxynet_tests::client::curl;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{spawn_superproxy, Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::stores::OwnRedis;
use proxynet_tests::whoami::Seen;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const OUTAGE: Duration = Duration::from_secs(30);

async fn ok_via(proxy: SocketAddr, user: &str, target: &str) -> Result<String, String> {
    let url = format!("http://{user}:{}@{proxy}", PASSWORD.replace(' ', "%20"));
    let r = curl(&["-p", "-x", &url, target]).await;
    if r.status != 200 {
        return Err(r.headers);
    }
    Ok(serde_json::from_str::<Seen>(&r.body)
        .map_err(|e| e.to_string())?
        .peer
        .ip()
        .to_string())
}

async fn readyz(stack: &Stack, admin: SocketAddr) -> u16 {
    stack
        .http
        .get(format!("http://{admin}/readyz"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_keeps_known_users_routing_and_recovers_without_restarts() {
    let mut redis = OwnRedis::start().await;
    let stack = Stack::start_with(StackOptions {
        redis_url: Some(redis.url()),
        ..Default::default()
    })
    .await;
    let (_second, second) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second.admin, 2).await;
    let sticky = format!("{USERNAME}-session-outage1");
    let proxies = [stack.proxy_addrs.proxy, second.proxy];
    let mut pinned = None;
    for proxy in proxies {
        ok_via(proxy, USERNAME, &stack.whoami_url()).await.unwrap();
        let ip = ok_via(proxy, &sticky, &stack.whoami_url()).await.unwrap();
        assert_eq!(*pinned.get_or_insert(ip.clone()), ip);
    }

    redis.stop();
    let down_since = Instant::now();
    while down_since.elapsed() < OUTAGE {
        for proxy in proxies {
            ok_via(proxy, USERNAME, &stack.whoami_url())
                .await
                .expect("known user keeps working during the outage");
            let ip = ok_via(proxy, &sticky, &stack.whoami_url())
                .await
                .expect("known session keeps working");
            assert_eq!(Some(&ip), pinned.as_ref(), "the session stays on its exit");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        readyz(&stack, stack.proxy_addrs.admin).await,
        503,
        "readiness reports degraded"
    );

    redis.restart().await; // empty: no persistence
                           // Redis is back but empty until the control-api re-projects (≤ 1 s): an
                           // absent user then proves nothing, so known users keep working on their
                           // last known record instead of being refused (and charged as failed
                           // logins) and the pool is not emptied by a read of the empty store.
    let back_since = Instant::now();
    while back_since.elapsed() < Duration::from_secs(3) {
        for proxy in proxies {
            ok_via(proxy, USERNAME, &stack.whoami_url())
                .await
                .expect("a known user keeps working while Redis is re-projected");
        }
    }
    for admin in [stack.proxy_addrs.admin, second.admin] {
        eventually("readiness to recover", Duration::from_secs(20), || async {
            (readyz(&stack, admin).await == 200).then_some(())
        })
        .await;
    }
    // A user created after the outage works everywhere: projection reconverged.
    let account = stack.create_account("after-outage").await;
    stack
        .create_user(account, "carol", "carol-password-1")
        .await;
    for proxy in proxies {
        let url = format!("http://carol:carol-password-1@{proxy}");
        eventually("the new user to work", Duration::from_secs(20), || async {
            (curl(&["-p", "-x", &url, &stack.whoami_url()]).await.status == 200).then_some(())
        })
        .await;
        // Users known before the outage come back with the re-projection.
        eventually(
            "the old user to work again",
            Duration::from_secs(10),
            || async { ok_via(proxy, USERNAME, &stack.whoami_url()).await.ok() },
        )
        .await;
    }
}

/// Redis restarts empty and the control-api re-projects it within a second,
/// but the agent's next heartbeat is late (here: never, until the test lets
/// it through). The exit its link and probes vouch for stays eligible
/// instead of the pool emptying until the agents beat again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_restarts_empty_keeps_linked_exits_until_their_agents_beat_again() {
    let mut redis = OwnRedis::start().await;
    let mut stack = Stack::start_with(StackOptions {
        redis_url: Some(redis.url()),
        egress_ips: Vec::new(),
        ..Default::default()
    })
    .await;
    let api: SocketAddr = stack.api_url.trim_start_matches("http://").parse().unwrap();
    let control_link = proxynet_tests::faults::FaultyLink::start(api).await;
    let token = stack.enrollment_token("reset-hold").await;
    stack
        .add_agent_via(
            &format!("http://{}", control_link.addr),
            &["127.0.0.2".parse().unwrap()],
            token,
        )
        .await;
    stack.wait_eligible(1).await;
    ok_via(stack.proxy_addrs.proxy, USERNAME, &stack.whoami_url())
        .await
        .unwrap();

    redis.stop();
    control_link.blackhole(); // no heartbeat lands until restored
    redis.restart().await; // empty: no persistence
                           // Re-projected (not degraded) and read in full: the store lists no live
                           // exit, yet the linked one is still eligible, held by its link.
    let pool = eventually(
        "the superproxy to read the re-projected store",
        Duration::from_secs(20),
        || async {
            let pool = stack.pool().await;
            (pool["degraded"] == false && pool["live"] == 0).then_some(pool)
        },
    )
    .await;
    assert_eq!(pool["eligible"].as_array().map(Vec::len), Some(1), "{pool}");
    assert_eq!(pool["held_by_links"], 1, "{pool}");
    ok_via(stack.proxy_addrs.proxy, USERNAME, &stack.whoami_url())
        .await
        .expect("the held exit carries traffic");

    control_link.restore();
    eventually(
        "the agent's heartbeats to refill the live set",
        Duration::from_secs(20),
        || async {
            let pool = stack.pool().await;
            (pool["live"] == 1 && pool["held_by_links"] == 0).then_some(())
        },
    )
    .await;
}

/// The exit ids a `/v1/pool` answer lists as eligible.
fn eligible_ids(pool: &serde_json::Value) -> Vec<String> {
    pool["eligible"]
        .as_array()
        .map(|exits| {
            exits
                .iter()
                .filter_map(|e| e["exit_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// An exit whose agent stopped beating while the control plane still took
/// heartbeats (its control connection blackholed; its link to the
/// superproxy up and answering probes) was out before the control plane
/// fell silent. The grace holds the exit that was live then, not that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_grace_keeps_out_an_exit_that_lapsed_before_the_silence() {
    let mut stack = Stack::start_with(StackOptions {
        egress_ips: vec!["127.0.0.2".parse().unwrap()],
        ..Default::default()
    })
    .await;
    let held = stack.agents[0].addrs.exit_id.to_string();
    let api: SocketAddr = stack.api_url.trim_start_matches("http://").parse().unwrap();
    let control_link = proxynet_tests::faults::FaultyLink::start(api).await;
    let token = stack.enrollment_token("lapsed-before").await;
    stack
        .add_agent_via(
            &format!("http://{}", control_link.addr),
            &["127.0.0.3".parse().unwrap()],
            token,
        )
        .await;
    stack.wait_eligible(2).await;
    let lapsed = stack.agents[1].addrs.exit_id;

    // Its heartbeats stop landing while the control plane is there: its
    // liveness lapses and it leaves the pool, its link still up.
    control_link.blackhole();
    eventually(
        "the blackholed exit's liveness to lapse",
        Duration::from_secs(20),
        || async {
            let pool = stack.pool().await;
            (pool["live"] == 1 && pool["links"] == 2 && eligible_ids(&pool) == [held.clone()])
                .then_some(())
        },
    )
    .await;

    // The control plane falls silent; the other exit's liveness lapses in
    // turn and its link holds it.
    stack.api.signal(libc::SIGSTOP);
    let pool = eventually(
        "the grace to hold the exit live at the silence",
        Duration::from_secs(20),
        || async {
            let pool = stack.pool().await;
            (!pool["control_plane_silent_s"].is_null()
                && pool["live"] == 0
                && pool["held_by_links"] == 1)
                .then_some(pool)
        },
    )
    .await;
    assert_eq!(eligible_ids(&pool), std::slice::from_ref(&held), "{pool}");
    assert_eq!(pool["links"], 2, "both links are up: {pool}");
    let ip = ok_via(stack.proxy_addrs.proxy, USERNAME, &stack.whoami_url())
        .await
        .expect("the held exit carries traffic");
    assert_eq!(ip, "127.0.0.2");
    let pinned = format!("{USERNAME}-exit-{}", lapsed.simple());
    assert!(
        ok_via(stack.proxy_addrs.proxy, &pinned, &stack.whoami_url())
            .await
            .is_err(),
        "the exit that lapsed before the silence is not routed to"
    );
    // And it stays out while the silence lasts (the view is rebuilt at
    // least every 5 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let pool = stack.pool().await;
    assert_eq!(eligible_ids(&pool), std::slice::from_ref(&held), "{pool}");

    // Both back: heartbeats refill the live set, nothing needs a restart.
    stack.api.signal(libc::SIGCONT);
    control_link.restore();
    stack.wait_eligible(2).await;
}
