//! Issue 8: the gateway tried as an attacker and as an operator would —
//! connection limits that count tunnels, login abuse, revocation that cuts,
//! pipelined tunnel bytes, services by name, drains, lost-nothing usage,
//! sessions that keep their IP, API rejections, hardened unit files.

use proxynet_tests::client::{connect_tunnel, curl, raw_request, socks5, status_of};
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::{bin, eventually};
use proxynet_tests::stack::{
    spawn_superproxy, Stack, StackOptions, ADMIN_TOKEN, PASSWORD, USERNAME,
};
use proxynet_tests::stores::OwnRedis;
use proxynet_tests::targets::{echo_round_trip, echo_server, pump};
use proxynet_tests::whoami::Seen;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// argon2 verifications the superproxy has started (its metrics).
async fn verifications_started(stack: &Stack) -> f64 {
    let text = scrape(&stack.http, stack.proxy_addrs.admin).await;
    sample(&text, "proxynet_auth_verifications_total", &[])
}

/// Reads until the peer closes the connection; true if it did within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

async fn open_echo_tunnel(proxy: SocketAddr, user: &str, echo: SocketAddr) -> TcpStream {
    let (mut s, head) = connect_tunnel(proxy, user, PASSWORD, echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_round_trip(&mut s, b"ping")
        .await
        .expect("tunnel works");
    s
}

/// 1. A CONNECT tunnel holds its connection permit for its whole life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connect_tunnels_count_against_max_connections() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: vec!["--max-connections".into(), "2".into()],
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let first = open_echo_tunnel(stack.proxy_addrs.proxy, USERNAME, echo).await;
    let _second = open_echo_tunnel(stack.proxy_addrs.proxy, USERNAME, echo).await;
    let third = raw_request(
        stack.proxy_addrs.proxy,
        b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(third.status, 503, "{third:?}");
    assert!(third.header("retry-after").is_some(), "{third:?}");
    assert!(
        third
            .header("proxy-status")
            .unwrap_or_default()
            .contains("connection_limit_reached"),
        "{third:?}"
    );
    // Closing a tunnel frees its permit.
    drop(first);
    eventually("a permit to free", Duration::from_secs(10), || async {
        let (s, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
        head.starts_with("HTTP/1.1 200").then_some(s)
    })
    .await;
}

/// 2. Logins that hang up mid-check still count; the limit holds for
/// simultaneous attempts as for sequential ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_reset_mid_hash_still_count() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: vec!["--auth-failures-per-minute".into(), "3".into()],
        ..Default::default()
    })
    .await;
    // Each login is reset once its argon2 verification has started (the
    // superproxy counts starts), before it answers: the three the limit
    // allows are spent although no client ever saw an answer.
    for i in 0..3 {
        let mut s = TcpStream::connect(stack.proxy_addrs.proxy).await.unwrap();
        let request = format!(
            "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
            basic(USERNAME, &format!("wrong-{i}"))
        );
        s.write_all(request.as_bytes()).await.unwrap();
        eventually(
            "the verification to start",
            Duration::from_secs(10),
            || async { (verifications_started(&stack).await > i as f64).then_some(()) },
        )
        .await;
        s.set_zero_linger().unwrap();
        drop(s); // reset before the argon2 verification answers
    }
    let r = raw_request(
        stack.proxy_addrs.proxy,
        format!(
            "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
            basic(USERNAME, "one-more-wrong")
        )
        .as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_wrong_passwords_are_limited_like_sequential_ones() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: vec!["--auth-failures-per-minute".into(), "3".into()],
        ..Default::default()
    })
    .await;
    let proxy = stack.proxy_addrs.proxy;
    let attempts: Vec<_> = (0..50)
        .map(|i| {
            tokio::spawn(async move {
                let request = format!(
                    "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {}\r\n\r\n",
                    basic(USERNAME, &format!("guess-{i}"))
                );
                raw_request(proxy, request.as_bytes(), Duration::from_secs(30)).await
            })
        })
        .collect();
    let mut too_many = 0;
    for a in attempts {
        let r = a.await.unwrap();
        if r.status == 429 {
            assert!(r.header("retry-after").is_some(), "{r:?}");
            too_many += 1;
        } else {
            assert_eq!(r.status, 407, "{r:?}");
        }
    }
    assert!(too_many >= 45, "only {too_many} of 50 refused with 429");
}

/// 2. Revocation cuts open tunnels on every superproxy and every ingress.
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

/// 2. The projection is monotonic: a stale write cannot resurrect a user.
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
        .http
        .patch(stack.api(&format!("/v1/users/{user}")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"enabled": false}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    // What a resync that read Postgres before the disable would write now.
    let written: i64 = redis::Script::new(proxynet_protocol::store::PUT_USER_SCRIPT)
        .key(&key)
        .key(keys.users_in_bucket(proxynet_protocol::store::user_bucket("lazarus")))
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

/// 2. No `RUST_LOG` can make the SOCKS library log a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_library_debug_logging_never_shows_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("superproxy.log");
    let stack = Stack::start_with(StackOptions {
        superproxy_env: vec![(
            "RUST_LOG".into(),
            "trace,fast_socks5=trace,fast_socks5::server=trace".into(),
        )],
        superproxy_log: Some(log.clone()),
        ..Default::default()
    })
    .await;
    let account = stack.create_account("logcheck").await;
    let secret = "never-in-a-log-4b1d";
    stack.create_user(account, "logcheck", secret).await;
    let proxy = format!("socks5h://logcheck:{secret}@{}", stack.proxy_addrs.socks);
    let r = curl(&["-x", &proxy, &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let r = curl(&[
        "-x",
        &format!(
            "socks5h://logcheck:wrong-{secret}@{}",
            stack.proxy_addrs.socks
        ),
        &stack.whoami_url(),
    ])
    .await;
    assert_ne!(r.status, 200);
    drop(stack);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("TRACE") || text.contains("DEBUG"),
        "trace logging was on"
    );
    assert!(!text.contains(secret), "the password reached the log");
}

/// 3. Tunnel bytes pipelined in the CONNECT request's own write arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_bytes_in_the_connect_write_reach_the_target() {
    let stack = Stack::start().await;
    let echo = echo_server().await;
    let mut s = TcpStream::connect(stack.proxy_addrs.proxy).await.unwrap();
    let payload: [u8; 16] = [
        0x16, 0x03, 0x01, 0x00, 0x0a, b'\n', b'\r', 0x00, 0xff, b'G', b'E', b'T', b' ', b'\n',
        b'\n', 0x01,
    ];
    let mut write = format!(
        "CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic(USERNAME, PASSWORD)
    )
    .into_bytes();
    write.extend_from_slice(&payload);
    s.write_all(&write).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert_eq!(status_of(&String::from_utf8_lossy(&head)), 200);
    let mut back = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
        .await
        .expect("the target answered")
        .unwrap();
    assert_eq!(back, payload);
}

/// 4. The stack's own services are refused when named, not only as literals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stacks_own_services_are_prohibited_by_name() {
    let stack = Stack::start().await;
    let api_port = stack.api_url.rsplit(':').next().unwrap().to_owned();
    for port in [
        stack.proxy_addrs.admin.port().to_string(),
        stack.proxy_addrs.link.port().to_string(),
        stack.proxy_addrs.proxy.port().to_string(),
        api_port,
    ] {
        eventually(
            "the agent to learn the stack's addresses",
            Duration::from_secs(10),
            || async {
                let r = curl(&[
                    "-x",
                    &stack.proxy_url(),
                    &format!("http://localhost:{port}/"),
                ])
                .await;
                (r.status == 403 && r.headers.contains("destination_ip_prohibited")).then_some(())
            },
        )
        .await;
    }
}

/// 6. SIGTERM: readiness red while still serving, then listeners closed,
/// open tunnels finish, every byte in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superproxy_sigterm_drains_in_order_and_bills_every_byte() {
    let mut stack = Stack::start_with(StackOptions {
        superproxy_env: vec![
            ("PROXYNET_DRAIN_DELAY_MS".into(), "3000".into()),
            ("PROXYNET_DRAIN_TIMEOUT_MS".into(), "20000".into()),
        ],
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("drain").await;
    let user = stack.create_user(account, "drainer", PASSWORD).await;
    let mut tunnel = open_echo_tunnel(stack.proxy_addrs.proxy, "drainer", echo).await;
    stack.proxy.signal(libc::SIGTERM);
    let readyz = format!("http://{}/readyz", stack.proxy_addrs.admin);
    eventually("readiness to go red", Duration::from_secs(2), || async {
        let r = stack.http.get(&readyz).send().await.ok()?;
        (r.status() == 503 && r.text().await.ok()?.contains("draining")).then_some(())
    })
    .await;
    // Still serving during the delay: the open tunnel and a new one.
    echo_round_trip(&mut tunnel, b"during the delay")
        .await
        .unwrap();
    let mut late = open_echo_tunnel(stack.proxy_addrs.proxy, "drainer", echo).await;
    // Then the listeners close: new connections are refused, not queued.
    eventually("the listener to close", Duration::from_secs(10), || async {
        TcpStream::connect(stack.proxy_addrs.proxy)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    echo_round_trip(&mut tunnel, b"after the listeners closed")
        .await
        .unwrap();
    echo_round_trip(&mut late, b"still here").await.unwrap();
    drop(late);
    drop(tunnel);
    let status = stack.proxy.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}");
    let bytes = (4 + 16 + 26 + 4 + 10) as u64;
    stack.wait_for_usage(account, user, bytes, bytes).await;
}

/// 5. An agent's SIGTERM: out of the pool first, open tunnels finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sigterm_lets_open_tunnels_finish() {
    let mut stack = Stack::start().await;
    let echo = echo_server().await;
    // Find a tunnel through agent 0.
    let exit0 = stack.agents[0].addrs.exit_id.to_string();
    let mut tunnel = loop {
        let (mut s, head) = connect_tunnel(stack.proxy_addrs.proxy, USERNAME, PASSWORD, echo).await;
        if head.to_ascii_lowercase().contains(&exit0) {
            echo_round_trip(&mut s, b"x").await.unwrap();
            break s;
        }
    };
    stack.agents[0].proc.signal(libc::SIGTERM);
    stack.wait_eligible(1).await;
    for _ in 0..5 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            seen.peer.ip(),
            stack.agents[1].egress_ip,
            "new tunnels avoid the draining exit"
        );
    }
    echo_round_trip(&mut tunnel, b"still flowing while draining")
        .await
        .unwrap();
    drop(tunnel);
    let status = stack.agents[0]
        .proc
        .wait_exit(Duration::from_secs(30))
        .await;
    assert!(status.success(), "{status:?}");
}

/// 7. Usage outlives a Redis outage longer than memory holds: spilled to
/// disk, replayed, counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_spills_to_disk_during_a_redis_outage_and_is_replayed_once() {
    let spill = tempfile::tempdir().unwrap();
    let mut redis = OwnRedis::start().await;
    let stack = Stack::start_with(StackOptions {
        redis_url: Some(redis.url()),
        superproxy_args: vec![
            "--usage-spill-dir".into(),
            spill.path().display().to_string(),
            "--usage-memory-batches".into(),
            "1".into(),
            "--usage-flush-ms".into(),
            "200".into(),
        ],
        ..Default::default()
    })
    .await;
    let echo = echo_server().await;
    let account = stack.create_account("spill").await;
    let user = stack.create_user(account, "spiller", PASSWORD).await;
    pump(
        open_echo_tunnel(stack.proxy_addrs.proxy, "spiller", echo).await,
        1_000,
    )
    .await;

    redis.stop();
    for _ in 0..5 {
        pump(
            open_echo_tunnel(stack.proxy_addrs.proxy, "spiller", echo).await,
            100_000,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    eventually("batches to be spilled", Duration::from_secs(10), || async {
        let files = std::fs::read_dir(spill.path()).ok()?.count();
        (files > 0).then_some(())
    })
    .await;
    redis.restart().await;
    let total = (4 + 1_000 + 5 * (4 + 100_000)) as u64;
    stack.wait_for_usage(account, user, total, total).await;
    eventually(
        "the spill file to be replayed and removed",
        Duration::from_secs(10),
        || async { (std::fs::read_dir(spill.path()).ok()?.count() == 0).then_some(()) },
    )
    .await;
}

/// 7. A batch re-sent after a lost reply advances a quota counter once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_counters_advance_once_per_batch() {
    let stores = proxynet_tests::stores::TestStores::create().await;
    let mut redis = stores.redis().await;
    let counter = format!("{}quota:{{u1}}:m202611", stores.redis_prefix);
    let applied = format!("{counter}:applied");
    let script = redis::Script::new(superproxy::usage::ADD_ONCE_SCRIPT);
    let mut totals = Vec::new();
    for seq in [1u64, 1, 2] {
        let total: u64 = script
            .key(&counter)
            .key(&applied)
            .arg(1_000)
            .arg(4_102_444_800i64)
            .arg("sp-1")
            .arg(seq)
            .invoke_async(&mut redis)
            .await
            .unwrap();
        totals.push(total);
    }
    let (first, resent, next) = (totals[0], totals[1], totals[2]);
    assert_eq!((first, resent, next), (1_000, 1_000, 2_000));
}

/// 8. A session keeps its egress IP on a multi-IP exit; a dual-stack exit
/// picks the target's family.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_their_egress_ip_and_families_match() {
    let mut stack = Stack::start_with(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    })
    .await;
    stack
        .add_agent_with_ips(&["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()])
        .await;
    stack.wait_eligible(1).await;
    let session = format!(
        "http://{USERNAME}-session-keepip1:{}@{}",
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.proxy
    );
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10 {
        let r = curl(&["-p", "-x", &session, &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
        seen.insert(serde_json::from_str::<Seen>(&r.body).unwrap().peer.ip());
    }
    assert_eq!(seen.len(), 1, "one session, one egress IP: {seen:?}");
    // Rotating users still use both.
    let mut rotating = std::collections::HashSet::new();
    for _ in 0..20 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        rotating.insert(serde_json::from_str::<Seen>(&r.body).unwrap().peer.ip());
    }
    assert_eq!(rotating.len(), 2, "{rotating:?}");

    let mut dual = Stack::start_with(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    })
    .await;
    dual.add_agent_with_ips(&["::1".parse().unwrap(), "127.0.0.2".parse().unwrap()])
        .await;
    dual.wait_eligible(1).await;
    for _ in 0..20 {
        let r = curl(&["-p", "-x", &dual.proxy_url(), &dual.whoami_url()]).await;
        assert_eq!(
            r.status, 200,
            "an IPv4 target from a dual-stack exit: {}",
            r.headers
        );
    }
}

/// 9. Requests axum refuses answer problem+json like every other API error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_rejections_are_problem_details() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    })
    .await;
    let cases = [
        stack
            .http
            .post(stack.api("/v1/accounts"))
            .header("content-type", "application/json")
            .body("{not json"),
        stack
            .http
            .post(stack.api("/v1/accounts"))
            .json(&json!({"name": "x", "unknown": 1})),
        stack
            .http
            .post(stack.api("/v1/accounts"))
            .body("{\"name\":\"x\"}"),
        stack.http.get(stack.api("/v1/users/not-a-uuid")),
        stack.http.get(stack.api("/v1/exits?limit=lots")),
    ];
    for request in cases {
        let r = request.bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        let status = r.status().as_u16();
        assert!((400..500).contains(&status), "{status}");
        assert_eq!(
            r.headers()["content-type"].to_str().unwrap(),
            "application/problem+json"
        );
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["status"], status);
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{body}"
        );
    }
}

/// 9. The systemd units are valid and hardened.
#[test]
fn systemd_units_verify_and_are_hardened() {
    let units = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd");
    let dir = tempfile::tempdir().unwrap();
    for name in ["superproxy", "control-api", "exit-agent"] {
        let file = format!("proxynet-{name}.service");
        let text = std::fs::read_to_string(units.join(&file)).unwrap();
        for required in [
            "DynamicUser=yes",
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            "StateDirectoryMode=0700",
        ] {
            assert!(text.contains(required), "{file} lacks {required}");
        }
        // Verify against the binaries this build produced.
        let local = text.replace(
            &format!("/usr/local/bin/{name}"),
            &bin(name).display().to_string(),
        );
        std::fs::write(dir.path().join(&file), local).unwrap();
    }
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(
            ["superproxy", "control-api", "exit-agent"]
                .map(|n| dir.path().join(format!("proxynet-{n}.service"))),
        )
        .output()
        .expect("systemd-analyze is installed (scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// 5. One live link per exit per superproxy: a second hello with the same
/// credential takes over, and the takeover is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_link_with_one_credential_replaces_the_first_and_is_audited() {
    let stack = Stack::start().await;
    let agent = &stack.agents[0];
    let state = stack
        .dir
        .path()
        .join(format!("agent-{}.json", agent.egress_ip));
    let twin_state = stack.dir.path().join("twin.json");
    std::fs::copy(&state, &twin_state).unwrap();
    let args = stack.agent_args(agent.egress_ip, &twin_state);
    let (_twin, _) =
        proxynet_tests::process::spawn_ready::<serde_json::Value>("exit-agent", &args, &[]).await;
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    eventually(
        "the takeover in the audit log",
        Duration::from_secs(15),
        || async {
            let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM audit_log WHERE action = 'exit.link_replaced' AND subject = $1",
        )
        .bind(agent.addrs.exit_id.to_string())
        .fetch_one(&db)
        .await
        .ok()?;
            (n >= 1).then_some(())
        },
    )
    .await;
    let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
}
