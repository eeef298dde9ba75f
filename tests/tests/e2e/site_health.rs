//! Health per target site (docs/health.md §5): a site that resets every
//! connection from one exit's address right after accept gets that exit
//! cooled for it, and only for it, within a few tunnels, on every
//! superproxy of the fleet — for the account whose tunnels failed (a
//! second account's failures make it the fleet's: unit-tested in
//! `superproxy/src/sites.rs`). Names are resolved by a test DNS server the
//! agents use (every name is the loopback target), so each name is a site
//! of its own.

use proxynet_tests::dns::TestDns;
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::stack::{spawn_superproxy, Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::targets::{echo_round_trip, echo_server, resetting};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use uuid::Uuid;

/// One CONNECT to `host:port` through `proxy` as the stack's user, then
/// one round trip through the tunnel: the exit that carried it (its `200`
/// says which) and whether the echo came back. A reset that reaches the
/// exit while it is still connecting is a `502` (the target refused): no
/// exit is named then, and nothing echoed.
async fn tunnel(proxy: SocketAddr, host: &str, port: u16) -> (Option<Uuid>, bool) {
    use base64::Engine;
    use tokio::io::AsyncWriteExt;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"));
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let target = format!("{host}:{port}");
    s.write_all(
        format!(
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let head = proxynet_tests::client::read_head(&mut s).await;
    if head.starts_with("HTTP/1.1 502") {
        assert!(head.contains("connection_refused"), "{head}");
        return (None, false);
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let exit = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            if !name.trim().eq_ignore_ascii_case("proxynet-exit") {
                return None;
            }
            value.trim().parse::<Uuid>().ok()
        })
        .unwrap_or_else(|| panic!("Proxynet-Exit on the 200: {head}"));
    let echoed = tokio::time::timeout(
        Duration::from_secs(5),
        echo_round_trip(&mut s, b"hello, site"),
    )
    .await
    .ok()
    .flatten()
    .is_some();
    (Some(exit), echoed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_that_resets_one_exit_gets_it_cooled_for_that_site_only_on_every_superproxy() {
    let dns = TestDns::start(vec!["127.0.0.1".parse().unwrap()]).await;
    let refused_ip: IpAddr = "127.0.0.2".parse().unwrap();
    let picky = resetting(HashSet::from([refused_ip])).await;
    let friendly = echo_server().await;
    let stack = Stack::start_with(StackOptions {
        agent_args: vec!["--dns-server".into(), dns.addr.to_string()],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(2).await;
    // A second superproxy on the same Redis, following the change channel
    // before anything is cooled: it learns of the cooldown by announcement.
    let (_second, second) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second.admin, 2).await;
    let refused = stack
        .agents
        .iter()
        .find(|a| a.egress_ip == refused_ip)
        .expect("an agent egressing from 127.0.0.2")
        .addrs
        .exit_id;
    let proxy = stack.proxy_addrs.proxy;

    // Until the cooldown, tunnels through the refused exit are reset (the
    // target closes them within the handshake), the others echo.
    let mut resets = 0;
    for _ in 0..60 {
        let (exit, echoed) = tunnel(proxy, "refuser.test", picky.port()).await;
        // A 502 names no exit; only the refused one ever fails.
        assert_eq!(
            echoed,
            exit.is_some_and(|e| e != refused),
            "only {refused} is refused"
        );
        if !echoed {
            resets += 1;
            if resets == 3 {
                break;
            }
        }
    }
    assert_eq!(resets, 3, "three resets within 60 tunnels (two exits)");
    let cooled_at = Instant::now();

    // Within a second the other superproxy avoids the exit for the site.
    tokio::time::sleep_until(cooled_at + Duration::from_secs(1)).await;
    for i in 0..20 {
        let (exit, echoed) = tunnel(second.proxy, "refuser.test", picky.port()).await;
        assert!(
            echoed && exit.is_some_and(|e| e != refused),
            "tunnel {i} through the second superproxy went through the cooled exit"
        );
    }

    // The deciding superproxy: at least 95 % of the next 40 succeed at once.
    let mut succeeded = 0;
    for _ in 0..40 {
        let (exit, echoed) = tunnel(proxy, "refuser.test", picky.port()).await;
        if echoed {
            assert_ne!(exit, Some(refused));
            succeeded += 1;
        }
    }
    assert!(succeeded >= 38, "{succeeded} of 40 tunnels succeeded");

    // Another site through the same exit is unaffected: it still carries
    // its share of that site's tunnels, and every one works.
    let mut through_refused = 0;
    for _ in 0..20 {
        let (exit, echoed) = tunnel(proxy, "friendly.test", friendly.port()).await;
        assert!(echoed, "a tunnel to another site failed through {exit:?}");
        if exit == Some(refused) {
            through_refused += 1;
        }
    }
    assert!(
        through_refused > 0,
        "the exit cooled for refuser.test carried none of 20 tunnels to friendly.test"
    );

    // The metrics say what happened, on each side.
    let first = scrape(&stack.http, stack.proxy_addrs.admin).await;
    // One account's failures cool the exit for that account's routing
    // (every superproxy learns it); the fleet's cooldown waits for a second
    // account's to corroborate them (docs/health.md), so one customer
    // cannot steer everybody's traffic.
    assert_eq!(
        sample(&first, "proxynet_site_account_cooldowns_total", &[]),
        1.0
    );
    assert_eq!(sample(&first, "proxynet_site_cooldowns_total", &[]), 0.0);
    // A reset lands as a refused connect when it reaches the exit while it
    // is still connecting, as a tunnel closed within the handshake after.
    let failures: f64 = ["handshake_closed", "refused"]
        .iter()
        .map(|v| {
            sample(
                &first,
                "proxynet_site_outcomes_total",
                &[&format!("verdict=\"{v}\"")],
            )
        })
        .sum();
    assert!(failures >= 3.0, "{failures} failures recorded");
    let other = scrape(&stack.http, second.admin).await;
    assert_eq!(
        sample(&other, "proxynet_site_account_cooldowns_active", &[]),
        1.0,
        "the second superproxy holds the account's cooldown"
    );

    // A site that refuses every exit gets every exit cooled, and its
    // tunnels still go (the panic rule): they open, the site resets them.
    let wall = resetting(stack.agents.iter().map(|a| a.egress_ip).collect()).await;
    for i in 0..12 {
        let (_, echoed) = tunnel(proxy, "wall.test", wall.port()).await;
        assert!(!echoed, "tunnel {i} to a site that refuses everyone echoed");
    }
    proxynet_tests::process::eventually(
        "the site refusing every exit is in panic",
        Duration::from_secs(5),
        || async {
            let text = scrape(&stack.http, stack.proxy_addrs.admin).await;
            (sample(&text, "proxynet_site_panic_total", &[]) >= 1.0).then_some(())
        },
    )
    .await;
}
