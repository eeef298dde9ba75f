//! fleet-sim: the control plane at fleet scale, measured.
//!
//! Starts a control-api and `--superproxies` superproxies (real binaries) on
//! the Postgres and Redis it is given, enrols `--exits` exit records (rows
//! inserted as enrollment would, then projected by the control-api), and
//! heartbeats every one of them at the production interval through the real
//! heartbeat endpoint. Two real exit-agents link to every superproxy so
//! drains and disables can be timed to the moment each superproxy stops
//! selecting the exit. Each superproxy reaches Redis through a counting
//! relay, so its Redis commands and bytes are its own.
//!
//! Bounded: warm-up, one measurement window, then a fixed number of drain
//! and disable trials, each with a timeout. Prints one JSON object.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use proxynet_common::egress::Cidr;
use proxynet_tests::stack::SuperproxyArgs;
use rand::RngCore;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use uuid::Uuid;

#[derive(Parser, Clone)]
struct Args {
    /// Directory of the release binaries.
    #[arg(long)]
    bin_dir: PathBuf,
    /// A Postgres URL with the right to create databases.
    #[arg(long)]
    postgres_url: String,
    #[arg(long)]
    redis_url: String,
    #[arg(long, default_value_t = 100_000)]
    exits: usize,
    #[arg(long, default_value_t = 10)]
    superproxies: usize,
    /// The production heartbeat interval (the control-api's default).
    #[arg(long, default_value_t = 5_000)]
    heartbeat_interval_ms: u64,
    /// Connections the simulated exits' heartbeats share.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    #[arg(long, default_value_t = 20)]
    warmup_secs: u64,
    #[arg(long, default_value_t = 30)]
    measure_secs: u64,
    /// Drain and disable trials each.
    #[arg(long, default_value_t = 5)]
    trials: usize,
}

const ADMIN: &str = "fleet-sim-admin-token-0123456789abcdef";

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = runtime.block_on(run(args));
    println!("{}", serde_json::to_string(&report).unwrap());
}

// ------------------------------------------------------------ processes

struct Proc {
    child: Child,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Starts `bin` and waits for its ready line.
async fn spawn(
    args: &Args,
    bin: &str,
    argv: &[String],
    env: &[(&str, String)],
) -> (Proc, serde_json::Value) {
    let mut cmd = Command::new(args.bin_dir.join(bin));
    cmd.args(argv)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(v) = proxynet_common::ready::parse::<serde_json::Value>(&line) {
                return v;
            }
        }
        panic!("{bin} exited before it was ready")
    })
    .await
    .unwrap_or_else(|_| panic!("{bin} not ready in time"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (Proc { child }, ready)
}

/// CPU seconds (user + system) a process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name: utime is the 14th field.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
    // SAFETY-free: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz.max(1.0)
}

// ------------------------------------------------------------ redis relay

/// Forwards connections to Redis, counting bytes each way and the commands
/// (top-level RESP arrays) the client sent.
#[derive(Default)]
struct RelayCounts {
    bytes_to_redis: AtomicU64,
    bytes_from_redis: AtomicU64,
    commands: AtomicU64,
}

async fn relay(upstream: SocketAddr) -> (SocketAddr, Arc<RelayCounts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(RelayCounts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let up = c.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut parser = RespCounter::default();
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    up.bytes_to_redis.fetch_add(n as u64, Ordering::Relaxed);
                    up.commands
                        .fetch_add(parser.feed(&buf[..n]), Ordering::Relaxed);
                }
                let _ = sw.shutdown().await;
            });
            let down = c.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    down.bytes_from_redis.fetch_add(n as u64, Ordering::Relaxed);
                }
                let _ = cw.shutdown().await;
            });
        }
    });
    (addr, counts)
}

/// Counts complete top-level commands in a RESP request stream: `*N` then N
/// bulk strings (`$len`, bytes, CRLF). Clients send nothing else.
#[derive(Default)]
struct RespCounter {
    line: Vec<u8>,
    /// Bulk strings left in the current command.
    args_left: u64,
    /// Payload bytes (plus CRLF) left in the current bulk string.
    skip: u64,
}

impl RespCounter {
    fn feed(&mut self, mut data: &[u8]) -> u64 {
        let mut done = 0;
        while !data.is_empty() {
            if self.skip > 0 {
                let n = (self.skip as usize).min(data.len());
                self.skip -= n as u64;
                data = &data[n..];
                if self.skip == 0 && self.args_left == 0 {
                    done += 1;
                }
                continue;
            }
            let Some(end) = data.iter().position(|b| *b == b'\n') else {
                self.line.extend_from_slice(data);
                break;
            };
            self.line.extend_from_slice(&data[..=end]);
            data = &data[end + 1..];
            let line = std::mem::take(&mut self.line);
            let text = String::from_utf8_lossy(&line);
            let value = text.trim_end();
            if let Some(n) = value.strip_prefix('*') {
                self.args_left = n.parse().unwrap_or(0);
                if self.args_left == 0 {
                    done += 1;
                }
            } else if let Some(n) = value.strip_prefix('$') {
                self.args_left = self.args_left.saturating_sub(1);
                self.skip = n.parse::<u64>().unwrap_or(0) + 2;
            }
        }
        done
    }
}

// ------------------------------------------------------------ heartbeats

struct SimExit {
    id: Uuid,
    credential: String,
}

#[derive(Default)]
struct BeatCounts {
    ok: AtomicU64,
    failed: AtomicU64,
    latencies_us: Mutex<Vec<u32>>,
}

/// One connection's share of the fleet: each of its exits beats once per
/// interval, at an offset spread evenly over the interval. Requests are
/// pipelined; the answer order is the request order.
async fn beat_loop(
    api: SocketAddr,
    exits: Arc<Vec<SimExit>>,
    mine: Vec<usize>,
    interval: Duration,
    counts: Arc<BeatCounts>,
    stop: Arc<AtomicBool>,
) {
    let Ok(stream) = TcpStream::connect(api).await else {
        counts.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let (sent_tx, mut sent_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let reader_counts = counts.clone();
    let reader = tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(64 * 1024, read);
        let mut line = String::new();
        let mut sample = 0u32;
        while let Some(sent) = sent_rx.recv().await {
            line.clear();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let ok = line.starts_with("HTTP/1.1 200");
            let mut length = 0usize;
            loop {
                line.clear();
                if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line
                    .to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_owned())
                {
                    length = v.parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).await.is_err() {
                return;
            }
            if ok {
                reader_counts.ok.fetch_add(1, Ordering::Relaxed);
            } else {
                reader_counts.failed.fetch_add(1, Ordering::Relaxed);
            }
            sample = sample.wrapping_add(1);
            if sample.is_multiple_of(16) {
                let us = sent.elapsed().as_micros().min(u32::MAX as u128) as u32;
                if let Ok(mut l) = reader_counts.latencies_us.lock() {
                    l.push(us);
                }
            }
        }
    });
    let n = mine.len().max(1);
    let start = Instant::now();
    let mut next = 0usize;
    let mut round = 0u64;
    let tick = Duration::from_millis(10);
    let mut batch = Vec::with_capacity(64 * 1024);
    while !stop.load(Ordering::Relaxed) {
        // Everything due by now: exit k of this share beats at
        // round * interval + k * interval / n.
        let elapsed = start.elapsed();
        batch.clear();
        let mut sends = 0;
        loop {
            let due = interval * round as u32 + interval * next as u32 / n as u32;
            if due > elapsed {
                break;
            }
            let exit = &exits[mine[next]];
            batch.extend_from_slice(
                format!(
                    "POST /v1/agent/exits/{}/heartbeat HTTP/1.1\r\nHost: sim\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
                    exit.id, exit.credential
                )
                .as_bytes(),
            );
            sends += 1;
            next += 1;
            if next == mine.len() {
                next = 0;
                round += 1;
            }
        }
        if sends > 0 {
            let now = Instant::now();
            for _ in 0..sends {
                let _ = sent_tx.send(now);
            }
            if write.write_all(&batch).await.is_err() {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        tokio::time::sleep(tick).await;
    }
    drop(sent_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
}

// ------------------------------------------------------------ the run

#[derive(serde::Serialize, Default)]
struct Report {
    exits: usize,
    superproxies: usize,
    heartbeat_interval_ms: u64,
    measure_secs: f64,
    heartbeats_per_s: f64,
    heartbeats_target_per_s: f64,
    heartbeat_failures: u64,
    heartbeat_p50_ms: f64,
    heartbeat_p99_ms: f64,
    redis_commands_per_s_per_superproxy: f64,
    redis_bytes_per_s_per_superproxy: f64,
    redis_commands_per_s_total: f64,
    redis_cpu_percent: f64,
    postgres_transactions_per_s: f64,
    postgres_rows_written_per_s: f64,
    superproxy_cpu_percent_mean: f64,
    superproxy_cpu_percent_max: f64,
    control_api_cpu_percent: f64,
    pool_full_reads_in_window: f64,
    pool_delta_reads_per_s: f64,
    drain_visible_everywhere_ms_p50: f64,
    drain_visible_everywhere_ms_max: f64,
    disable_visible_everywhere_ms_p50: f64,
    disable_visible_everywhere_ms_max: f64,
    projection_secs: f64,
}

async fn run(args: Args) -> Report {
    let tag = Uuid::new_v4().simple().to_string()[..10].to_owned();
    let database = format!("fleetsim_{tag}");
    let admin_db = sqlx::PgPool::connect(&args.postgres_url).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&admin_db)
        .await
        .unwrap();
    let db_url = match args.postgres_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{database}"),
        None => panic!("postgres url without a database"),
    };
    let prefix = format!("sim{tag}:");
    let redis_addr: SocketAddr = args
        .redis_url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .expect("redis url as redis://host:port/");
    let api_env = vec![
        ("PROXYNET_DATABASE_URL", db_url.clone()),
        ("PROXYNET_REDIS_URL", args.redis_url.clone()),
        ("PROXYNET_REDIS_PREFIX", prefix.clone()),
        ("PROXYNET_ADMIN_TOKEN", ADMIN.to_owned()),
        ("PROXYNET_API_LISTEN", "127.0.0.1:0".to_owned()),
        ("PROXYNET_API_ADMIN_LISTEN", "127.0.0.1:0".to_owned()),
        (
            "PROXYNET_HEARTBEAT_INTERVAL_MS",
            args.heartbeat_interval_ms.to_string(),
        ),
        (
            "PROXYNET_HEARTBEAT_TTL_MS",
            (args.heartbeat_interval_ms * 3).to_string(),
        ),
    ];
    // First start: migrations. Then the fleet is enrolled and the
    // control-api restarted, so its start-up projection carries it.
    let (api, _) = spawn(&args, "control-api", &[], &api_env).await;
    drop(api);
    let db = sqlx::PgPool::connect(&db_url).await.unwrap();
    let exits = enrol(&db, args.exits).await;
    let projection_started = Instant::now();
    let (api, ready) = spawn(&args, "control-api", &[], &api_env).await;
    let api_addr: SocketAddr = ready["api"].as_str().unwrap().parse().unwrap();
    let http = reqwest::Client::new();
    let api_url = format!("http://{api_addr}");
    {
        let client = redis::Client::open(args.redis_url.as_str()).unwrap();
        let mut redis = client.get_multiplexed_async_connection().await.unwrap();
        let last = format!("{prefix}{{exits}}:exit:{}", exits.last().unwrap().id);
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let present: bool = redis::cmd("EXISTS")
                .arg(&last)
                .query_async(&mut redis)
                .await
                .unwrap_or(false);
            if present || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let projection_secs = projection_started.elapsed().as_secs_f64();

    // Superproxies, each with its own counting relay to Redis.
    let mut superproxies = Vec::new();
    for _ in 0..args.superproxies {
        let (relay_addr, counts) = relay(redis_addr).await;
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let (proc, ready) = spawn(
            &args,
            "superproxy",
            SuperproxyArgs::new()
                .listen(any_port)
                .socks_listen(any_port)
                .admin_listen(any_port)
                .link_listen(any_port)
                .egress_allow(Cidr::v4(127, 0, 0, 0, 8))
                .as_slice(),
            &[
                ("PROXYNET_REDIS_URL", format!("redis://{relay_addr}/")),
                ("PROXYNET_REDIS_PREFIX", prefix.clone()),
            ],
        )
        .await;
        let admin: SocketAddr = ready["admin"].as_str().unwrap().parse().unwrap();
        superproxies.push((proc, admin, counts));
    }

    // Two real agents, so drains and disables can be watched in selection.
    let source = create_source(&http, &api_url).await;
    let state_dir = tempfile::tempdir().unwrap();
    let mut agents = Vec::new();
    for (i, ip) in ["127.0.0.2", "127.0.0.3"].iter().enumerate() {
        let token = enrollment_token(&http, &api_url, source, &format!("real-{i}")).await;
        let (proc, ready) = spawn(
            &args,
            "exit-agent",
            &[
                "--control-api".into(),
                api_url.clone(),
                "--state-file".into(),
                state_dir
                    .path()
                    .join(format!("agent-{i}.json"))
                    .display()
                    .to_string(),
                "--egress-ip".into(),
                (*ip).to_owned(),
                "--admin-listen".into(),
                "127.0.0.1:0".into(),
                "--egress-allow".into(),
                "127.0.0.0/8".into(),
                "--allow-insecure-control-api".into(),
                "--enroll-token".into(),
                token,
            ],
            &[],
        )
        .await;
        let exit: Uuid = ready["exit_id"].as_str().unwrap().parse().unwrap();
        agents.push((proc, exit));
    }

    // The fleet's heartbeats.
    let exits = Arc::new(exits);
    let counts = Arc::new(BeatCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let interval = Duration::from_millis(args.heartbeat_interval_ms);
    let mut beaters = Vec::new();
    for c in 0..args.connections {
        let mine: Vec<usize> = (c..exits.len()).step_by(args.connections).collect();
        beaters.push(tokio::spawn(beat_loop(
            api_addr,
            exits.clone(),
            mine,
            interval,
            counts.clone(),
            stop.clone(),
        )));
    }

    // Both real exits eligible on every superproxy before anything is timed.
    for (_, admin, _) in &superproxies {
        wait_eligible(
            &http,
            *admin,
            &[agents[0].1, agents[1].1],
            true,
            Duration::from_secs(120),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(args.warmup_secs)).await;

    // The measurement window: every figure is a difference between what
    // these counters read at its start and at its end.
    struct Snapshot {
        /// Per superproxy: CPU seconds, Redis commands, Redis bytes both ways.
        superproxies: Vec<(f64, u64, u64)>,
        api_cpu: f64,
        /// Redis: commands processed, CPU seconds.
        redis: (f64, f64),
        /// Postgres: transactions, rows inserted, updated, deleted.
        postgres: (i64, i64, i64, i64),
        /// Heartbeats answered, failed.
        beats: (u64, u64),
        /// The first superproxy's full and delta pool reads.
        pool_reads: (f64, f64),
    }
    let redis_client = redis::Client::open(args.redis_url.as_str()).unwrap();
    let snapshot = || async {
        let per_superproxy = superproxies
            .iter()
            .map(|(p, _, c)| {
                (
                    cpu_seconds(p.pid()),
                    c.commands.load(Ordering::Relaxed),
                    c.bytes_to_redis.load(Ordering::Relaxed)
                        + c.bytes_from_redis.load(Ordering::Relaxed),
                )
            })
            .collect();
        let api_cpu = cpu_seconds(api.pid());
        let mut redis = redis_client
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("all")
            .query_async(&mut redis)
            .await
            .unwrap();
        let field = |name: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let redis = (
            field("total_commands_processed"),
            field("used_cpu_user") + field("used_cpu_sys"),
        );
        let postgres = sqlx::query_as(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database WHERE datname = $1",
        )
        .bind(&database)
        .fetch_one(&admin_db)
        .await
        .unwrap();
        let beats = (
            counts.ok.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
        );
        let text = proxynet_tests::metrics::scrape(&http, superproxies[0].1).await;
        let reads = |kind: &str| -> f64 {
            proxynet_tests::metrics::sample(
                &text,
                "proxynet_pool_reads_total",
                &[&format!("kind=\"{kind}\"")],
            )
        };
        Snapshot {
            superproxies: per_superproxy,
            api_cpu,
            redis,
            postgres,
            beats,
            pool_reads: (reads("full"), reads("delta")),
        }
    };
    counts.latencies_us.lock().unwrap().clear();
    let t0 = Instant::now();
    let start = snapshot().await;
    tokio::time::sleep(Duration::from_secs(args.measure_secs)).await;
    let secs = t0.elapsed().as_secs_f64();
    let end = snapshot().await;

    let per_sp: Vec<(f64, f64, f64)> = start
        .superproxies
        .iter()
        .zip(&end.superproxies)
        .map(|(a, b)| {
            (
                (b.0 - a.0) / secs * 100.0,
                (b.1 - a.1) as f64 / secs,
                (b.2 - a.2) as f64 / secs,
            )
        })
        .collect();
    let n = per_sp.len() as f64;
    let mut latencies = counts.latencies_us.lock().unwrap().clone();
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return f64::NAN;
        }
        latencies[((latencies.len() - 1) as f64 * p) as usize] as f64 / 1000.0
    };
    let mut report = Report {
        exits: args.exits,
        superproxies: args.superproxies,
        heartbeat_interval_ms: args.heartbeat_interval_ms,
        measure_secs: secs,
        heartbeats_per_s: (end.beats.0 - start.beats.0) as f64 / secs,
        heartbeats_target_per_s: args.exits as f64 / interval.as_secs_f64(),
        heartbeat_failures: end.beats.1 - start.beats.1,
        heartbeat_p50_ms: pct(0.5),
        heartbeat_p99_ms: pct(0.99),
        redis_commands_per_s_per_superproxy: per_sp.iter().map(|s| s.1).sum::<f64>() / n,
        redis_bytes_per_s_per_superproxy: per_sp.iter().map(|s| s.2).sum::<f64>() / n,
        redis_commands_per_s_total: (end.redis.0 - start.redis.0) / secs,
        redis_cpu_percent: (end.redis.1 - start.redis.1) / secs * 100.0,
        postgres_transactions_per_s: (end.postgres.0 - start.postgres.0) as f64 / secs,
        postgres_rows_written_per_s: ((end.postgres.1 - start.postgres.1)
            + (end.postgres.2 - start.postgres.2)
            + (end.postgres.3 - start.postgres.3)) as f64
            / secs,
        superproxy_cpu_percent_mean: per_sp.iter().map(|s| s.0).sum::<f64>() / n,
        superproxy_cpu_percent_max: per_sp.iter().map(|s| s.0).fold(0.0, f64::max),
        control_api_cpu_percent: (end.api_cpu - start.api_cpu) / secs * 100.0,
        pool_full_reads_in_window: end.pool_reads.0 - start.pool_reads.0,
        pool_delta_reads_per_s: (end.pool_reads.1 - start.pool_reads.1) / secs,
        projection_secs,
        ..Default::default()
    };

    // Drain and disable, each timed until no superproxy selects the exit.
    let admins: Vec<SocketAddr> = superproxies.iter().map(|s| s.1).collect();
    let mut drains = Vec::new();
    let mut disables = Vec::new();
    for _ in 0..args.trials {
        for (exit, on, off, times) in [
            (agents[0].1, "drain", "undrain", &mut drains),
            (agents[1].1, "disable", "enable", &mut disables),
        ] {
            let started = Instant::now();
            admin_post(&http, &api_url, &format!("/v1/exits/{exit}/{on}")).await;
            wait_everywhere(&http, &admins, exit, false).await;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            admin_post(&http, &api_url, &format!("/v1/exits/{exit}/{off}")).await;
            wait_everywhere(&http, &admins, exit, true).await;
        }
    }
    let stats = |v: &mut Vec<f64>| -> (f64, f64) {
        v.sort_by(|a, b| a.total_cmp(b));
        (v[v.len() / 2], *v.last().unwrap())
    };
    (
        report.drain_visible_everywhere_ms_p50,
        report.drain_visible_everywhere_ms_max,
    ) = stats(&mut drains);
    (
        report.disable_visible_everywhere_ms_p50,
        report.disable_visible_everywhere_ms_max,
    ) = stats(&mut disables);

    stop.store(true, Ordering::Relaxed);
    for b in beaters {
        let _ = tokio::time::timeout(Duration::from_secs(10), b).await;
    }
    drop(agents);
    drop(superproxies);
    drop(api);
    db.close().await;
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .execute(&admin_db)
        .await;
    report
}

/// Inserts `n` exit rows as enrollment would write them (one egress IP each,
/// a random credential of which only the SHA-256 is stored).
async fn enrol(db: &sqlx::PgPool, n: usize) -> Vec<SimExit> {
    let source: Uuid = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO sources (id, name, source_type, channel, supplier, agreement_ref, notice_description,
                              opt_out, liable_party, abuse_contact, countries, consent_required)
         VALUES ($1, 'fleet-sim', 'dc', 'owned', 'fleet-sim', 'internal', 'simulated hosts we own',
                 'not applicable', 'fleet-sim operator', 'abuse@example.test', ARRAY['DE'], false)",
    )
    .bind(source)
    .execute(db)
    .await
    .unwrap();
    let mut rng = rand::thread_rng();
    let exits: Vec<SimExit> = (0..n)
        .map(|_| {
            let mut secret = [0u8; 32];
            rng.fill_bytes(&mut secret);
            SimExit {
                id: Uuid::new_v4(),
                credential: hex::encode(secret),
            }
        })
        .collect();
    for (c, chunk) in exits.chunks(10_000).enumerate() {
        let ids: Vec<Uuid> = chunk.iter().map(|e| e.id).collect();
        let names: Vec<String> = (0..chunk.len())
            .map(|i| format!("sim-{}", c * 10_000 + i))
            .collect();
        let ips: Vec<String> = (0..chunk.len())
            .map(|i| {
                let k = c * 10_000 + i;
                format!("198.18.{}.{}", k / 256, k % 256)
            })
            .collect();
        let shas: Vec<String> = chunk
            .iter()
            .map(|e| hex::encode(Sha256::digest(e.credential.as_bytes())))
            .collect();
        sqlx::query(
            "INSERT INTO exits (id, name, source_type, owner, country, egress_ips, credential_sha256, source_id)
             SELECT t.id, t.name, 'dc', 'fleet-sim', 'DE', ARRAY[t.ip], t.sha, $5
               FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS t(id, name, ip, sha)",
        )
        .bind(&ids)
        .bind(&names)
        .bind(&ips)
        .bind(&shas)
        .bind(source)
        .execute(db)
        .await
        .unwrap();
    }
    exits
}

async fn create_source(http: &reqwest::Client, api: &str) -> Uuid {
    let r = http
        .post(format!("{api}/v1/sources"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({
            "name": "fleet-sim-real", "source_type": "dc", "channel": "owned",
            "supplier": "fleet-sim", "agreement_ref": "internal",
            "notice_description": "hosts we own", "opt_out": "not applicable",
            "liable_party": "fleet-sim operator", "abuse_contact": "abuse@example.test",
            "countries": ["DE"],
        }))
        .send()
        .await
        .unwrap();
    proxynet_tests::stack::created_id(r, "create source").await
}

async fn enrollment_token(http: &reqwest::Client, api: &str, source: Uuid, name: &str) -> String {
    let r = http
        .post(format!("{api}/v1/enrollment-tokens"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"name": name, "source_id": source, "country": "DE"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json::<serde_json::Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn admin_post(http: &reqwest::Client, api: &str, path: &str) {
    let r = http
        .post(format!("{api}{path}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
}

#[derive(Deserialize)]
struct PoolView {
    eligible: Vec<PoolExit>,
}

#[derive(Deserialize)]
struct PoolExit {
    exit_id: Uuid,
}

async fn eligible_at(http: &reqwest::Client, admin: SocketAddr) -> Vec<Uuid> {
    match http.get(format!("http://{admin}/v1/pool")).send().await {
        Ok(r) => r
            .json::<PoolView>()
            .await
            .map(|v| v.eligible.into_iter().map(|e| e.exit_id).collect())
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

async fn wait_eligible(
    http: &reqwest::Client,
    admin: SocketAddr,
    exits: &[Uuid],
    present: bool,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = eligible_at(http, admin).await;
        if exits.iter().all(|e| now.contains(e) == present) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "superproxy {admin} never saw the change"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until every superproxy has (or lacks) `exit` in selection.
async fn wait_everywhere(http: &reqwest::Client, admins: &[SocketAddr], exit: Uuid, present: bool) {
    let one = [exit];
    let waits = admins
        .iter()
        .map(|admin| wait_eligible(http, *admin, &one, present, Duration::from_secs(30)));
    futures_util::future::join_all(waits).await;
}
