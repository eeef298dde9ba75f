//! Health from the outside: a stopped (blackholed) exit is found by probes and
//! readmitted when it recovers; a killed exit costs clients nothing after the
//! detection window.

use proxynet_tests::client::curl;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::whoami::Seen;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Probes every 200 ms, 300 ms timeout, down after 2 failures, up after 2
/// successes: worst-case detection 200 × 2 + 300 = 700 ms (docs/health.md).
const PROBE_INTERVAL_MS: u64 = 200;
const PROBE_TIMEOUT_MS: u64 = 300;
const UNHEALTHY: u64 = 2;
const HEALTHY: u64 = 2;

fn detection_window() -> Duration {
    Duration::from_millis(PROBE_INTERVAL_MS * UNHEALTHY + PROBE_TIMEOUT_MS)
}

fn fast_probes() -> StackOptions {
    StackOptions {
        superproxy_args: [
            "--probe-interval-ms",
            &PROBE_INTERVAL_MS.to_string(),
            "--probe-timeout-ms",
            &PROBE_TIMEOUT_MS.to_string(),
            "--unhealthy-threshold",
            &UNHEALTHY.to_string(),
            "--healthy-threshold",
            &HEALTHY.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Default::default()
    }
}

async fn available(stack: &Stack, exit: uuid::Uuid) -> Option<bool> {
    let pool = stack.pool().await;
    pool["eligible"]
        .as_array()?
        .iter()
        .find(|e| e["exit_id"] == exit.to_string())
        .and_then(|e| e["health"]["available"].as_bool())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_exit_is_ejected_by_probes_and_readmitted_when_it_resumes() {
    let stack = Stack::start_with(fast_probes()).await;
    let stopped = &stack.agents[0];
    stopped.proc.signal(libc::SIGSTOP);
    let started = Instant::now();
    eventually(
        "probes to mark the stopped exit down",
        Duration::from_secs(10),
        || async { (available(&stack, stopped.addrs.exit_id).await == Some(false)).then_some(()) },
    )
    .await;
    let detected = started.elapsed();
    // Generous slack for a loaded CI machine; the formula is the model.
    assert!(
        detected < detection_window() + Duration::from_secs(3),
        "took {detected:?}"
    );

    for _ in 0..8 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_eq!(seen.peer.ip(), stack.agents[1].egress_ip);
    }

    stopped.proc.signal(libc::SIGCONT);
    eventually(
        "the resumed exit to be readmitted",
        Duration::from_secs(10),
        || async { (available(&stack, stopped.addrs.exit_id).await == Some(true)).then_some(()) },
    )
    .await;
    let mut ips = HashSet::new();
    for _ in 0..16 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200);
        ips.insert(serde_json::from_str::<Seen>(&r.body).unwrap().peer.ip());
    }
    assert_eq!(ips.len(), 2, "both exits serve again");
}

/// One tunnel as a scraper would open it: CONNECT, a GET inside, the answer.
async fn one_tunnel(
    proxy: std::net::SocketAddr,
    target: std::net::SocketAddr,
) -> Result<(), String> {
    let (mut s, head) =
        proxynet_tests::client::connect_tunnel(proxy, USERNAME, PASSWORD, target).await;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or("").to_owned());
    }
    s.write_all(
        format!("GET / HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    if answer.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err("tunnel broke".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_exit_under_load_costs_nothing_after_the_detection_window() {
    let mut stack = Stack::start_with(fast_probes()).await;
    let proxy = stack.proxy_addrs.proxy;
    let target = stack.whoami;
    // 50 new rotating tunnels per second for 4 s, bounded.
    let load = tokio::spawn(async move {
        let mut results = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let mut pending = Vec::new();
        for _ in 0..200 {
            tick.tick().await;
            let opened = Instant::now();
            pending.push(tokio::spawn(async move {
                (opened, one_tunnel(proxy, target).await)
            }));
        }
        for p in pending {
            results.push(p.await.unwrap());
        }
        results
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let killed_at = Instant::now();
    stack.agents[0].proc.kill().await;
    let results = load.await.unwrap();
    let window_end = killed_at + detection_window();
    let late_failures: Vec<&String> = results
        .iter()
        .filter(|(opened, r)| *opened > window_end && r.is_err())
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert!(
        late_failures.is_empty(),
        "errors after the detection window: {late_failures:?}"
    );
    let after = results
        .iter()
        .filter(|(opened, _)| *opened > window_end)
        .count();
    assert!(
        after > 100,
        "the load kept going after the kill ({after} tunnels)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_target_does_not_steer_rotation_away_from_an_exit() {
    let stack = Stack::start().await;
    // A target whose accept queue is full: the exits' SYNs are dropped and
    // retried, so connecting to it takes seconds (or fails).
    // It is on a /24 of its own (127.0.1.0/24), so it is another site than
    // the whoami target's: its timeouts may cool an exit for itself (site
    // health, docs/health.md), never for the other site, nor globally.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.1.1:0".parse().unwrap()).unwrap();
    let slow = socket.local_addr().unwrap();
    let _listener = socket.listen(1).unwrap();
    let mut _fill = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(slow),
        )
        .await
        {
            _fill.push(s);
        }
    }
    let proxy = stack.proxy_addrs.proxy;
    let slow_tunnels: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(12),
                    proxynet_tests::client::connect_tunnel(proxy, USERNAME, PASSWORD, slow),
                )
                .await;
            })
        })
        .collect();
    for t in slow_tunnels {
        t.await.unwrap();
    }
    // Rotation still uses both exits.
    let mut by_exit = std::collections::HashMap::new();
    for _ in 0..30 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        *by_exit.entry(seen.peer.ip()).or_insert(0) += 1;
    }
    assert_eq!(by_exit.len(), 2, "{by_exit:?}");
    assert!(by_exit.values().all(|n| *n >= 8), "{by_exit:?}");
}
