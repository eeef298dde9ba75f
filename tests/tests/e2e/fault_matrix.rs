//! The fault matrix: each part of the stack — control-api, Redis, Postgres,
//! one superproxy, one agent — frozen (SIGSTOP, longer than every TTL the
//! tests use) and killed (kill -9, then started again). Each test says what
//! keeps working, what is refused, and how many bytes the ledger loses; the
//! table in docs/health.md is checked against these tests' names.

use proxynet_tests::client::connect_tunnel;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{spawn_superproxy, Stack, StackOptions, SuperproxyArgs, PASSWORD};
use proxynet_tests::stores::OwnRedis;
use proxynet_tests::targets::{echo_server, pump};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Longer than every TTL of the test stack (heartbeat 1.5 s, leases, pool
/// refresh, probes): what a frozen process looks like once its state ran out.
const FROZEN: Duration = Duration::from_secs(6);

/// Probes fast enough that an exit's fault is noticed within a second.
fn fast_probes() -> Vec<String> {
    SuperproxyArgs::new()
        .probe_interval_ms(200)
        .probe_timeout_ms(300)
        .unhealthy_threshold(2)
        .healthy_threshold(2)
        .into()
}

/// A user of its own for a test, whose ledger rows the test checks.
async fn metered_user(stack: &Stack, name: &str) -> (Uuid, Uuid) {
    let account = stack.create_account(name).await;
    let user = stack.create_user(account, name, PASSWORD).await;
    (account, user)
}

/// One CONNECT tunnel through `proxy` for `user`, `n` bytes echoed; the exit
/// that served it.
async fn tunnel(proxy: SocketAddr, user: &str, echo: SocketAddr, n: usize) -> String {
    let (s, head) = connect_tunnel(proxy, user, PASSWORD, echo).await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{user} via {proxy}: {head}"
    );
    pump(s, n).await;
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("proxynet-exit")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default()
}

/// Tunnels for `user` through `proxy` every `every` for `during`; every one
/// must open. Returns the bytes each way and the exits used.
async fn keep_tunnelling(
    proxy: SocketAddr,
    user: &str,
    echo: SocketAddr,
    during: Duration,
    every: Duration,
) -> (u64, std::collections::HashSet<String>) {
    let since = Instant::now();
    let mut moved = 0;
    let mut exits = std::collections::HashSet::new();
    while since.elapsed() < during {
        exits.insert(tunnel(proxy, user, echo, 10_000).await);
        moved += 10_000;
        tokio::time::sleep(every).await;
    }
    (moved, exits)
}

async fn readyz(stack: &Stack, admin: SocketAddr) -> (u16, String) {
    readyz_at(stack, admin, "/readyz").await
}

async fn readyz_at(stack: &Stack, admin: SocketAddr, path: &str) -> (u16, String) {
    // A fresh connection each time: the admin listener closes a kept-alive
    // one idle for its 5 s header timeout, the same 5 s the loops sleep, and
    // a reused one can be closed under the request.
    let r = stack
        .http
        .get(format!("http://{admin}{path}"))
        .header("connection", "close")
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

// ---- control-api ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_api_frozen() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: fast_probes(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "cpfrozen").await;
    stack.api.signal(libc::SIGSTOP);
    // 45 s frozen: every 5 s a tunnel opens, on both exits (the superproxy's
    // probed links keep them eligible), readiness says what is going on.
    let exits: Vec<String> = stack
        .agents
        .iter()
        .map(|a| a.addrs.exit_id.simple().to_string())
        .collect();
    let since = Instant::now();
    let mut moved = 0u64;
    let mut said_silent = false;
    while since.elapsed() < Duration::from_secs(45) {
        for exit in &exits {
            let pinned = format!("cpfrozen-exit-{exit}");
            tunnel(stack.proxy_addrs.proxy, &pinned, echo, 10_000).await;
            moved += 10_000;
        }
        let (status, body) = readyz(&stack, stack.proxy_addrs.admin).await;
        assert_eq!(status, 200, "{body}");
        said_silent |= body.contains("control plane silent");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert!(
        said_silent,
        "readiness never reported the silent control plane"
    );
    stack.api.signal(libc::SIGCONT);
    // Nothing needs a restart: readiness recovers, the ledger gets every byte.
    eventually("readiness to recover", Duration::from_secs(10), || async {
        let (_, body) = readyz(&stack, stack.proxy_addrs.admin).await;
        body.starts_with("ready").then_some(())
    })
    .await;
    stack.wait_for_usage(account, user, moved, moved).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_api_killed() {
    let mut stack = Stack::start_with(StackOptions {
        superproxy_args: fast_probes(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "cpkilled").await;
    stack.api.kill().await;
    // Longer than the heartbeat TTL: both exits stay in rotation.
    let (moved, exits) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "cpkilled",
        echo,
        FROZEN,
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(exits.len(), 2, "{exits:?}");
    stack.start_api_again().await;
    stack.wait_for_usage(account, user, moved, moved).await;
}

// ---- Redis -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen() {
    let redis = OwnRedis::start().await;
    let stack = Stack::start_with(StackOptions {
        redis_url: Some(redis.url()),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "redisfrozen").await;
    tunnel(stack.proxy_addrs.proxy, "redisfrozen", echo, 10_000).await;
    redis.signal(libc::SIGSTOP);
    // Known users keep routing on the last known pool (each Redis call
    // waits out its reply timeout first).
    let (moved, _) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "redisfrozen",
        echo,
        FROZEN,
        Duration::from_millis(500),
    )
    .await;
    redis.signal(libc::SIGCONT);
    stack
        .wait_for_usage(account, user, moved + 10_000, moved + 10_000)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed() {
    let mut redis = OwnRedis::start().await;
    let stack = Stack::start_with(StackOptions {
        redis_url: Some(redis.url()),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "rediskilled").await;
    tunnel(stack.proxy_addrs.proxy, "rediskilled", echo, 10_000).await;
    stack.wait_for_usage(account, user, 10_000, 10_000).await;
    // Killed with nothing in flight, restarted empty (no persistence).
    redis.stop();
    let (moved, _) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "rediskilled",
        echo,
        FROZEN,
        Duration::from_millis(500),
    )
    .await;
    let (status, _) = readyz(&stack, stack.proxy_addrs.admin).await;
    assert_eq!(status, 503, "degraded while Redis is gone");
    // A balancer in front of a fleet that shares this Redis asks with
    // `degraded=serve`: ready, serving from memory.
    let (status, body) = readyz_at(&stack, stack.proxy_addrs.admin, "/readyz?degraded=serve").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("serving from memory"), "{body}");
    redis.restart().await;
    // The batches kept in memory reach the new Redis and the ledger.
    stack
        .wait_for_usage(account, user, 10_000 + moved, 10_000 + moved)
        .await;
    tunnel(stack.proxy_addrs.proxy, "rediskilled", echo, 1_000).await;
}

// ---- Postgres ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_frozen() {
    let stack = Stack::start_with(StackOptions {
        postgres_fault: true,
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "pgfrozen").await;
    let link = stack.postgres_link.as_ref().unwrap();
    link.blackhole();
    let (moved, exits) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "pgfrozen",
        echo,
        FROZEN,
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(
        exits.len(),
        2,
        "heartbeats never wait for Postgres: {exits:?}"
    );
    link.restore();
    stack.wait_for_usage(account, user, moved, moved).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed() {
    let stack = Stack::start_with(StackOptions {
        postgres_fault: true,
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "pgkilled").await;
    let link = stack.postgres_link.as_ref().unwrap();
    // Every connection reset, the port refusing: a crashed database.
    link.cut();
    let (moved, exits) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "pgkilled",
        echo,
        FROZEN,
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(exits.len(), 2, "{exits:?}");
    // A control-plane write is refused meanwhile, with a 5xx problem.
    let r = stack
        .http
        .post(stack.api("/v1/accounts"))
        .bearer_auth(proxynet_tests::stack::ADMIN_TOKEN)
        .json(&serde_json::json!({"name": "during"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_server_error(), "{}", r.status());
    link.restore();
    stack.wait_for_usage(account, user, moved, moved).await;
}

// ---- one superproxy ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superproxy_frozen() {
    let stack = Stack::start().await;
    let (second_proc, second) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second.admin, 2).await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "spfrozen").await;
    second_proc.signal(libc::SIGSTOP);
    // The other instance serves on; the frozen one's agents keep their links.
    let (moved, _) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "spfrozen",
        echo,
        FROZEN,
        Duration::from_millis(200),
    )
    .await;
    second_proc.signal(libc::SIGCONT);
    eventually(
        "the thawed superproxy to serve",
        Duration::from_secs(10),
        || async {
            let (s, head) = connect_tunnel(second.proxy, "spfrozen", PASSWORD, echo).await;
            drop(s);
            head.starts_with("HTTP/1.1 200").then_some(())
        },
    )
    .await;
    let thawed = tunnel(second.proxy, "spfrozen", echo, 10_000).await;
    assert!(!thawed.is_empty());
    stack
        .wait_for_usage(account, user, moved + 10_000, moved + 10_000)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superproxy_killed() {
    let stack = Stack::start().await;
    let (mut second_proc, second) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second.admin, 2).await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "spkilled").await;
    tunnel(second.proxy, "spkilled", echo, 10_000).await;
    stack.wait_for_usage(account, user, 10_000, 10_000).await;
    // Killed with nothing in flight: nothing of its usage is lost (bytes of
    // the last flush interval would be, had it been moving any).
    second_proc.kill().await;
    let (moved, _) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "spkilled",
        echo,
        FROZEN,
        Duration::from_millis(200),
    )
    .await;
    let (_again, again) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(again.admin, 2).await;
    tunnel(again.proxy, "spkilled", echo, 10_000).await;
    let total = 10_000 + moved + 10_000;
    stack.wait_for_usage(account, user, total, total).await;
}

// ---- one agent --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_frozen() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: fast_probes(),
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "agentfrozen").await;
    let frozen = stack.agents[0].addrs.exit_id.to_string();
    stack.agents[0].proc.signal(libc::SIGSTOP);
    // Within the probes' detection window the frozen exit leaves rotation;
    // from then on every tunnel opens through the other.
    eventually(
        "the frozen exit to leave rotation",
        Duration::from_secs(5),
        || async { (stack.eligible_count().await == 1).then_some(()) },
    )
    .await;
    let (moved, exits) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "agentfrozen",
        echo,
        FROZEN,
        Duration::from_millis(200),
    )
    .await;
    assert!(!exits.contains(&frozen), "{exits:?}");
    stack.agents[0].proc.signal(libc::SIGCONT);
    stack.wait_eligible(2).await;
    stack.wait_for_usage(account, user, moved, moved).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed() {
    let mut stack = Stack::start().await;
    let echo = echo_server().await;
    let (account, user) = metered_user(&stack, "agentkilled").await;
    let killed = stack.agents[0].addrs.exit_id.to_string();
    stack.agents[0].proc.kill().await;
    // Its link drops with it: out of rotation at once, every tunnel served.
    eventually(
        "the killed exit to leave rotation",
        Duration::from_secs(2),
        || async { (stack.eligible_count().await == 1).then_some(()) },
    )
    .await;
    let (moved, exits) = keep_tunnelling(
        stack.proxy_addrs.proxy,
        "agentkilled",
        echo,
        FROZEN,
        Duration::from_millis(200),
    )
    .await;
    assert!(!exits.contains(&killed), "{exits:?}");
    stack.restart_agent(0).await;
    stack.wait_eligible(2).await;
    stack.wait_for_usage(account, user, moved, moved).await;
}
