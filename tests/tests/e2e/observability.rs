//! Metrics every binary exports (checked by promtool and scraped by
//! a real Prometheus running every dashboard query), the built-in dashboard
//! in headless Chromium, the JSON access log, and compose.yaml's flags.

use proxynet_common::telemetry::LogFormat;
use proxynet_tests::client::{curl, socks5};
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::{bin, eventually};
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs, ADMIN_TOKEN, PASSWORD, USERNAME};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

async fn metrics_text(stack: &Stack, addr: SocketAddr) -> String {
    scrape(&stack.http, addr).await
}

async fn promtool_accepts(text: &str) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (scripts/test installs prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .await
        .unwrap();
    let out = child.wait_with_output().await.unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Exit 1 is a parse error; lint remarks (exit 3) are style, reported below.
    assert_ne!(
        out.status.code(),
        Some(1),
        "promtool could not parse:\n{report}"
    );
    assert!(!report.contains("error while"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_binary_exports_metrics_that_parse_and_move_with_traffic() {
    let stack = Stack::start().await;
    let agent = stack.agents[0].addrs.admin;
    let before = metrics_text(&stack, stack.proxy_addrs.admin).await;
    let opened = |t: &str| sample(t, "proxynet_tunnels_opened_total", &["ingress=\"connect\""]);
    for _ in 0..5 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200);
    }
    // A refused target moves the error-token counter.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let r = curl(&["-p", "-x", &stack.proxy_url(), &format!("http://{closed}/")]).await;
    assert!(r.headers.contains(" 502"), "{}", r.headers);
    let after = metrics_text(&stack, stack.proxy_addrs.admin).await;
    assert_eq!(opened(&after) - opened(&before), 5.0, "{after}");
    let refused = |t: &str| {
        sample(
            t,
            "proxynet_tunnels_failed_total",
            &["error=\"connection_refused\""],
        )
    };
    assert_eq!(refused(&after) - refused(&before), 1.0);
    assert!(sample(&after, "proxynet_tunnel_setup_seconds_count", &[]) >= 5.0);
    assert!(
        !after.contains(PASSWORD) && !after.contains(USERNAME),
        "identities in labels"
    );

    let control = eventually("the fleet view", Duration::from_secs(20), || async {
        let t = metrics_text(&stack, stack.api_admin).await;
        (sample(&t, "proxynet_fleet_exits", &["state=\"live\""]) == 2.0).then_some(t)
    })
    .await;
    let agent_text = metrics_text(&stack, agent).await;
    for text in [&after, &control, &agent_text] {
        promtool_accepts(text).await;
        assert!(!text.contains(ADMIN_TOKEN));
    }
    // The tunnels went to either exit: count over both agents.
    let mut connected = 0.0;
    for a in &stack.agents {
        let text = metrics_text(&stack, a.addrs.admin).await;
        connected += sample(
            &text,
            "proxynet_agent_tunnels_total",
            &["outcome=\"connected\""],
        );
    }
    assert!(connected >= 5.0, "{connected}");
    let exit = stack.agents[0].addrs.exit_id.to_string();
    assert_eq!(
        sample(
            &control,
            "proxynet_exit_state",
            &[&format!("exit=\"{exit}\""), "state=\"live\""]
        ),
        1.0
    );
}

/// Every PromQL expression in dashboards/*.json, with `$exit` bound.
fn dashboard_queries(exit: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo("dashboards")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let doc: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            for panel in doc["panels"].as_array().unwrap() {
                for target in panel["targets"].as_array().unwrap() {
                    let expr = target["expr"].as_str().unwrap().replace("$exit", exit);
                    out.push((format!("{} / {}", path.display(), panel["title"]), expr));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_stack_and_every_dashboard_query_has_data() {
    let stack = Stack::start().await;
    let dir = tempfile::tempdir().unwrap();
    let targets = format!(
        "scrape_configs:\n  - job_name: proxynet\n    scrape_interval: 1s\n    static_configs:\n      - targets: [\"{}\", \"{}\", \"{}\", \"{}\"]\n",
        stack.api_admin, stack.proxy_addrs.admin, stack.agents[0].addrs.admin, stack.agents[1].addrs.admin
    );
    std::fs::write(dir.path().join("prometheus.yml"), targets).unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut prometheus = tokio::process::Command::new("prometheus")
        .args([
            &format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ),
            &format!("--storage.tsdb.path={}", dir.path().join("data").display()),
            &format!("--web.listen-address=127.0.0.1:{port}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus is installed (scripts/test installs it)");
    // Traffic while it scrapes: tunnels, a refusal, usage into the ledger.
    for _ in 0..6 {
        assert_eq!(
            curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()])
                .await
                .status,
            200
        );
        let _ = curl(&["-p", "-x", &stack.proxy_url(), "http://127.0.0.1:9/"]).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let exit = stack.agents[0].addrs.exit_id.to_string();
    let api = format!("http://127.0.0.1:{port}/api/v1/query");
    for (panel, expr) in dashboard_queries(&exit) {
        eventually(
            &format!("{panel}: {expr}"),
            Duration::from_secs(40),
            || async {
                let r: Value = stack
                    .http
                    .get(&api)
                    .query(&[("query", expr.as_str())])
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                (r["status"] == "success"
                    && r["data"]["result"]
                        .as_array()
                        .is_some_and(|a| !a.is_empty()))
                .then_some(())
            },
        )
        .await;
    }
    let _ = prometheus.kill().await;
}

/// Runs tests/browser/dashboard.mjs; its JSON line.
async fn browser(mode: &str, envs: &[(&str, String)]) -> Value {
    let out = tokio::process::Command::new("node")
        .arg(repo("tests/browser/dashboard.mjs"))
        .env("MODE", mode)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .expect("node runs (scripts/test installs the browser test's packages)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|_| panic!("{mode}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

fn artefact(name: &str) -> PathBuf {
    let dir = repo("target/test-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_fleet_and_an_ejection_in_chromium() {
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new()
            .probe_interval_ms(300)
            .probe_timeout_ms(200)
            .unhealthy_threshold(2)
            .into(),
        ..Default::default()
    })
    .await;
    let dashboard = format!("{}/dashboard", stack.api_url);
    let exits: Vec<String> = stack
        .agents
        .iter()
        .map(|a| a.addrs.exit_id.to_string())
        .collect();
    let seen = browser(
        "live",
        &[
            ("DASHBOARD", dashboard.clone()),
            ("KEY", ADMIN_TOKEN.into()),
            ("EXITS", exits.join(",")),
            (
                "SCREENSHOT",
                artefact("dashboard-live.png").display().to_string(),
            ),
        ],
    )
    .await;
    assert_eq!(seen["ok"], true, "{seen}");

    stack.agents[1].proc.signal(libc::SIGSTOP);
    let seen = browser(
        "ejected",
        &[
            ("DASHBOARD", dashboard.clone()),
            ("KEY", ADMIN_TOKEN.into()),
            ("EXIT", exits[1].clone()),
            ("WAIT_MS", "15000".into()),
            (
                "SCREENSHOT",
                artefact("dashboard-ejected.png").display().to_string(),
            ),
        ],
    )
    .await;
    stack.agents[1].proc.signal(libc::SIGCONT);
    assert_eq!(seen["ok"], true, "{seen}");

    // An account key: its own usage only, operator pages refused.
    let account = stack.create_account("viewer").await;
    stack.create_user(account, "viewer1", PASSWORD).await;
    let url = format!(
        "http://viewer1:{}@{}",
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.proxy
    );
    assert_eq!(
        curl(&["-p", "-x", &url, &stack.whoami_url()]).await.status,
        200
    );
    assert_eq!(
        curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()])
            .await
            .status,
        200
    );
    let key: Value = stack
        .http
        .post(stack.api(&format!("/v1/accounts/{account}/api-keys")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    eventually(
        "the viewer's usage in the ledger",
        Duration::from_secs(20),
        || async {
            let rows = stack.usage_by_user(account).await;
            (!rows.is_empty()).then_some(())
        },
    )
    .await;
    let seen = browser(
        "account",
        &[
            ("DASHBOARD", dashboard),
            ("KEY", key["key"].as_str().unwrap().to_owned()),
            ("EXIT", exits[0].clone()),
            ("ACCOUNT", account.to_string()),
            (
                "SCREENSHOT",
                artefact("dashboard-account.png").display().to_string(),
            ),
        ],
    )
    .await;
    assert_eq!(seen["ok"], true, "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tunnel_has_one_json_access_log_line_and_no_secret_is_logged() {
    let logs = tempfile::tempdir().unwrap();
    let stack = Stack::start_with(StackOptions {
        log_dir: Some(logs.path().to_owned()),
        superproxy_args: SuperproxyArgs::new().log_format(LogFormat::Json).into(),
        ..Default::default()
    })
    .await;
    for proxy in [stack.proxy_url(), stack.socks_url()] {
        let r = curl(&["-p", "-x", &proxy, &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
    }
    let r = curl(&["-x", &stack.proxy_url(), &stack.whoami_url()]).await;
    assert_eq!(r.status, 200);
    let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, "wrong password").await;
    assert!(s.is_err());
    let _ = s.as_mut();
    let log = logs.path().join("superproxy.log");
    let (lines, refused): (Vec<Value>, Vec<Value>) = eventually(
        "three access-log lines and a refusal",
        Duration::from_secs(10),
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            let (lines, refused): (Vec<Value>, Vec<Value>) = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["target"] == "proxynet::access")
                .partition(|v| v["message"] == "tunnel");
            (lines.len() == 3 && !refused.is_empty()).then_some((lines, refused))
        },
    )
    .await;
    let mut ingresses: Vec<&str> = lines
        .iter()
        .map(|l| l["ingress"].as_str().unwrap())
        .collect();
    ingresses.sort_unstable();
    assert_eq!(ingresses, ["connect", "forward", "socks5"]);
    for line in &lines {
        for field in [
            "tunnel",
            "account",
            "user",
            "exit",
            "egress_ip",
            "target_addr",
            "ingress",
            "outcome",
            "bytes_up",
            "bytes_down",
            "setup_ms",
            "duration_ms",
        ] {
            assert!(!line[field].is_null(), "{field} missing in {line}");
        }
        assert_eq!(line["user"], USERNAME);
        assert!(line["bytes_down"].as_u64().unwrap() > 0, "{line}");
    }
    // The refused SOCKS login has its line too, as a refused HTTP one does.
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["message"], "tunnel refused");
    assert_eq!(refused[0]["ingress"], "socks5");
    assert_eq!(refused[0]["status"], 407);
    assert_eq!(refused[0]["outcome"], "http_request_denied");
    // Nowhere in any log: the password, the admin token.
    drop(stack);
    for entry in std::fs::read_dir(logs.path()).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(!text.contains(PASSWORD) && !text.contains(&PASSWORD.replace(' ', "%20")));
        assert!(!text.contains(ADMIN_TOKEN));
    }
}

/// compose.yaml cannot run here (no Docker engine): check that every flag and
/// environment variable it gives a proxynet binary is one that binary knows,
/// and that every service has a healthcheck.
#[test]
fn compose_services_only_use_flags_the_binaries_know() {
    let compose = std::fs::read_to_string(repo("compose.yaml")).unwrap();
    let help = |name: &str| {
        let out = std::process::Command::new(bin(name))
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let helps: std::collections::HashMap<&str, String> =
        ["superproxy", "control-api", "exit-agent"]
            .into_iter()
            .map(|n| (n, help(n)))
            .collect();
    let binary_of = |service: &str| match service {
        "superproxy" => Some("superproxy"),
        "control-api" => Some("control-api"),
        s if s.starts_with("agent") => Some("exit-agent"),
        _ => None,
    };
    let mut service = String::new();
    let mut healthchecks = std::collections::HashSet::new();
    let mut services = Vec::new();
    let mut in_services = false;
    for line in compose.lines() {
        if line == "services:" {
            in_services = true;
            continue;
        }
        if in_services
            && line.len() > 2
            && line.starts_with("  ")
            && !line.starts_with("   ")
            && line.trim_end().ends_with(':')
            || (in_services
                && line.starts_with("  ")
                && !line.starts_with("   ")
                && line.contains(": &"))
        {
            service = line.trim().split(':').next().unwrap().to_owned();
            services.push(service.clone());
            continue;
        }
        if line.contains("healthcheck:") {
            healthchecks.insert(service.clone());
        }
        let Some(binary) = binary_of(&service) else {
            continue;
        };
        let help = &helps[binary];
        for token in line.split(|c: char| {
            c.is_whitespace() || c == '"' || c == '=' || c == ',' || c == '[' || c == ']'
        }) {
            if let Some(flag) = token
                .strip_prefix("--")
                .filter(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            {
                assert!(
                    help.contains(&format!("--{flag}")),
                    "{service}: {binary} has no --{flag}"
                );
            }
        }
        if let Some(var) = line
            .trim()
            .split(':')
            .next()
            .filter(|v| v.starts_with("PROXYNET_"))
        {
            assert!(
                help.contains(&format!("[env: {var}=")) || help.contains(&format!("[env: {var}]")),
                "{service}: {binary} reads no {var}"
            );
        }
    }
    assert!(
        compose.contains("--socks-listen=0.0.0.0:1080"),
        "the published SOCKS port has a listener"
    );
    for s in &services {
        if s != "bootstrap" {
            assert!(healthchecks.contains(s), "{s} has no healthcheck");
        }
    }
    for s in [
        "prometheus",
        "grafana",
        "superproxy",
        "control-api",
        "agent1",
        "agent2",
    ] {
        assert!(services.iter().any(|x| x == s), "{s} missing: {services:?}");
    }
}
