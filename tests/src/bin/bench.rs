//! Whole-path benchmark for HTTP CONNECT proxies (proxynet, and any peer such
//! as a Squid chain, measured the same way in the same run).
//!
//! `bench target` runs the far end: an echo service (setup latency, idle
//! tunnels) and a bulk service (throughput). `bench run` drives one proxy and
//! prints one JSON line of results; `bench protocols` measures HTTP/2 CONNECT
//! and SOCKS5 UDP ([`proxynet_tests::protocol_bench`]). `scripts/bench` starts everything, pins the
//! proxies to one core and this tool to the other, and writes the report.
//!
//! Every loop is bounded by a count and a time limit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use clap::{Parser, Subcommand};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
#[command(about = "proxynet whole-path benchmark")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the echo and bulk targets; prints a PROXYNET_READY line.
    Target,
    /// Benchmark one proxy; prints one JSON line.
    Run(Box<RunArgs>),
    /// Write a local CA (`ca.pem`) and a certificate for 127.0.0.1
    /// (`cert.pem`, `key.pem`) into `--dir`, for the HTTPS proxy listener.
    Certs {
        #[arg(long)]
        dir: std::path::PathBuf,
    },
    /// HTTP/2 CONNECT beside HTTP/1.1 CONNECT over TLS, and UDP through a
    /// SOCKS5 association beside direct UDP; prints one JSON line.
    Protocols(Box<ProtocolArgs>),
}

#[derive(Parser, Clone)]
struct ProtocolArgs {
    #[arg(long)]
    tls_proxy: SocketAddr,
    #[arg(long)]
    ca: std::path::PathBuf,
    #[arg(long)]
    socks: SocketAddr,
    #[arg(long)]
    user: String,
    #[arg(long)]
    password: String,
    #[arg(long)]
    echo: SocketAddr,
    #[arg(long)]
    udp_echo: SocketAddr,
    #[arg(long, default_value_t = 1000)]
    count: usize,
}

#[derive(Parser, Clone)]
struct RunArgs {
    /// Label for the report.
    #[arg(long)]
    label: String,
    /// Proxy address; omit for a direct (no proxy) baseline.
    #[arg(long)]
    proxy: Option<SocketAddr>,
    #[arg(long, default_value = "")]
    user: String,
    #[arg(long, default_value = "")]
    password: String,
    #[arg(long)]
    echo: SocketAddr,
    #[arg(long)]
    bulk: SocketAddr,
    /// Sequential tunnels for the setup-latency percentiles.
    #[arg(long, default_value_t = 2000)]
    setup_count: usize,
    /// Concurrency and duration of the tunnels/s run.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    #[arg(long, default_value_t = 5)]
    rate_seconds: u64,
    /// Bytes per bulk transfer and direction (split over the streams).
    #[arg(long, default_value_t = 1 << 30)]
    bulk_bytes: u64,
    /// Idle tunnels for the memory measurement (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    idle_tunnels: usize,
    /// Processes whose memory counts (the proxy's), comma-separated pids.
    #[arg(long, value_delimiter = ',')]
    pids: Vec<u32>,
    /// Tunnels whose client never reads while the target streams, before a
    /// fresh 1 MB download is timed through the same proxy (0: skip).
    #[arg(long, default_value_t = 0)]
    isolation_tunnels: usize,
    /// Bulk cases to run (to profile one): up1, down1, up8, down8.
    #[arg(long, value_delimiter = ',', default_value = "up1,down1,up8,down8")]
    bulk_cases: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    label: String,
    setup_p50_ms: f64,
    setup_p99_ms: f64,
    tunnels_per_s: f64,
    up_1_mbps: f64,
    down_1_mbps: f64,
    up_8_mbps: f64,
    down_8_mbps: f64,
    idle_tunnels: usize,
    rss_kb_per_tunnel: f64,
    pss_kb_per_tunnel: f64,
    /// With `isolation_tunnels` stalled tunnels open: a fresh 1 MB download's time...
    isolation_fresh_1mb_ms: f64,
    /// ...and what the stalled tunnels made the proxy processes hold (RSS, MB).
    isolation_rss_mb: f64,
    errors: u64,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match args.command {
        Command::Target => runtime.block_on(serve_targets()),
        Command::Run(run) => {
            let report = runtime.block_on(run_all(*run));
            println!("{}", serde_json::to_string(&report).unwrap());
        }
        Command::Certs { dir } => {
            let ca = proxynet_tests::certs::LocalCa::create(&dir);
            ca.issue(
                "proxynet bench",
                &dir.join("cert.pem"),
                &dir.join("key.pem"),
            );
        }
        Command::Protocols(p) => {
            let targets = proxynet_tests::protocol_bench::ProtocolTargets {
                tls_proxy: p.tls_proxy,
                ca: p.ca,
                socks: p.socks,
                user: p.user,
                password: p.password,
                echo: p.echo,
                udp_echo: p.udp_echo,
                count: p.count,
            };
            let report = runtime.block_on(proxynet_tests::protocol_bench::measure(&targets));
            println!("{}", serde_json::to_string(&report).unwrap());
        }
    }
}

// ---------------------------------------------------------------- targets

async fn serve_targets() {
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bulk = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let udp_echo = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    proxynet_common::ready::announce(&serde_json::json!({
        "echo": echo.local_addr().unwrap(),
        "bulk": bulk.local_addr().unwrap(),
        "udp_echo": udp_echo.local_addr().unwrap(),
    }))
    .unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = udp_echo.recv_from(&mut buf).await {
            let _ = udp_echo.send_to(&buf[..n], from).await;
        }
    });
    let echo_task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = echo.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut buf = [0u8; 512];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let bulk_task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = bulk.accept().await else {
                continue;
            };
            tokio::spawn(bulk_session(s));
        }
    });
    tokio::select! {
        _ = echo_task => {}
        _ = bulk_task => {}
        () = proxynet_common::shutdown::signal() => {}
    }
}

/// `D` + u64: send that many bytes, then close. `U` + u64: read that many, answer one byte.
async fn bulk_session(mut s: TcpStream) {
    // The target shares the host's kernel with the proxies: stalled streams
    // queueing megabytes each would measure the host's TCP memory pressure.
    proxynet_common::sockets::bound_unsent(&s);
    let mut head = [0u8; 9];
    if s.read_exact(&mut head).await.is_err() {
        return;
    }
    let size = u64::from_be_bytes(head[1..].try_into().unwrap());
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = size;
    match head[0] {
        b'D' => {
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                left -= n as u64;
            }
            let _ = s.shutdown().await;
        }
        b'U' => {
            while left > 0 {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => left = left.saturating_sub(n as u64),
                }
            }
            let _ = s.write_all(b"k").await;
        }
        _ => {}
    }
}

// ---------------------------------------------------------------- client

/// Opens a tunnel to `target` (CONNECT with Basic auth), or connects directly.
async fn open(args: &RunArgs, target: SocketAddr) -> std::io::Result<TcpStream> {
    let Some(proxy) = args.proxy else {
        let s = TcpStream::connect(target).await?;
        s.set_nodelay(true)?;
        return Ok(s);
    };
    let mut s = TcpStream::connect(proxy).await?;
    s.set_nodelay(true)?;
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", args.user, args.password));
    let request = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await?;
    proxynet_tests::protocol_bench::read_connect_answer(&mut s).await?;
    Ok(s)
}

/// Connect, handshake with auth, 1-byte echo, close.
async fn one_tunnel(args: &RunArgs) -> std::io::Result<Duration> {
    let start = Instant::now();
    let mut s = open(args, args.echo).await?;
    s.write_all(b"x").await?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await?;
    drop(s);
    Ok(start.elapsed())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx].as_secs_f64() * 1000.0
}

async fn bulk(args: &RunArgs, streams: usize, up: bool) -> f64 {
    let per_stream = args.bulk_bytes / streams as u64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let args = args.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = open(&args, args.bulk).await?;
            let mut head = vec![if up { b'U' } else { b'D' }];
            head.extend_from_slice(&per_stream.to_be_bytes());
            s.write_all(&head).await?;
            let mut buf = vec![0u8; 256 * 1024];
            if up {
                let mut left = per_stream;
                while left > 0 {
                    let n = left.min(buf.len() as u64) as usize;
                    s.write_all(&buf[..n]).await?;
                    left -= n as u64;
                }
                s.read_exact(&mut buf[..1]).await?;
            } else {
                let mut got = 0u64;
                while got < per_stream {
                    let n = s.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    got += n as u64;
                }
            }
            Ok::<_, std::io::Error>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("bulk transfer");
    }
    (per_stream * streams as u64) as f64 / start.elapsed().as_secs_f64() / 1e6
}

/// Opens `n` tunnels to a target that streams without end and never reads
/// them; once the proxy holds all it will for them, times a fresh 1 MB
/// download through the same proxy. (fresh download ms, RSS growth MB).
async fn isolation(args: &RunArgs, n: usize) -> (f64, f64) {
    let (rss0, _) = memory_kb(&args.pids);
    let mut stalled = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(mut s) = open(args, args.bulk).await else {
            continue;
        };
        let mut head = vec![b'D'];
        head.extend_from_slice(&(u64::MAX / 2).to_be_bytes());
        if s.write_all(&head).await.is_ok() {
            stalled.push(s); // never read
        }
    }
    // Settled when the proxies' memory stops growing (bounded: 20 s).
    let mut last = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (rss, _) = memory_kb(&args.pids);
        if rss.abs_diff(last) < 256 {
            break;
        }
        last = rss;
    }
    let (rss1, _) = memory_kb(&args.pids);
    let started = Instant::now();
    let fresh = async {
        let mut s = open(args, args.bulk).await?;
        let mut head = vec![b'D'];
        head.extend_from_slice(&1_000_000u64.to_be_bytes());
        s.write_all(&head).await?;
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        while got < 1_000_000 {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<_, std::io::Error>(got)
    };
    let took = match tokio::time::timeout(Duration::from_secs(30), fresh).await {
        Ok(Ok(1_000_000)) => started.elapsed().as_secs_f64() * 1000.0,
        _ => f64::INFINITY,
    };
    drop(stalled);
    (took, rss1.saturating_sub(rss0) as f64 / 1024.0)
}

/// (RSS, PSS) in kB summed over `pids`, from /proc/PID/smaps_rollup.
fn memory_kb(pids: &[u32]) -> (u64, u64) {
    let mut rss = 0;
    let mut pss = 0;
    for pid in pids {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            match (
                parts.next(),
                parts.next().and_then(|v| v.parse::<u64>().ok()),
            ) {
                (Some("Rss:"), Some(v)) => rss += v,
                (Some("Pss:"), Some(v)) => pss += v,
                _ => {}
            }
        }
    }
    (rss, pss)
}

async fn run_all(args: RunArgs) -> Report {
    let errors = Arc::new(AtomicU64::new(0));

    // Warm-up: credentials verified and cached, connections pooled.
    for _ in 0..50 {
        let _ = one_tunnel(&args).await;
    }

    // Memory first: later phases leave freed memory in the allocator that
    // new tunnels would reuse, hiding their cost.
    let (mut rss_per, mut pss_per) = (f64::NAN, f64::NAN);
    let mut opened = 0;
    if args.idle_tunnels > 0 && !args.pids.is_empty() {
        let (rss0, pss0) = memory_kb(&args.pids);
        let mut idle = Vec::with_capacity(args.idle_tunnels);
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut failed_batches = 0;
        while idle.len() < args.idle_tunnels && Instant::now() < deadline && failed_batches < 10 {
            // Open in small concurrent batches; each tunnel proves itself with an echo.
            let batch = (args.idle_tunnels - idle.len()).min(32);
            let mut pending = Vec::with_capacity(batch);
            for _ in 0..batch {
                let args = args.clone();
                pending.push(tokio::spawn(async move {
                    let mut s = open(&args, args.echo).await?;
                    s.write_all(b"x").await?;
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).await?;
                    Ok::<_, std::io::Error>(s)
                }));
            }
            let before = idle.len();
            for p in pending {
                match p.await.unwrap() {
                    Ok(s) => idle.push(s),
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // A proxy that refuses whole batches is at a limit: stop, report what was held.
            if idle.len() == before {
                failed_batches += 1;
            }
        }
        opened = idle.len();
        // Let both ends settle (allocator, lazy frees) before sampling.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (rss1, pss1) = memory_kb(&args.pids);
        if opened > 0 {
            rss_per = (rss1.saturating_sub(rss0)) as f64 / opened as f64;
            pss_per = (pss1.saturating_sub(pss0)) as f64 / opened as f64;
        }
        drop(idle);
    }

    let (isolation_fresh_1mb_ms, isolation_rss_mb) = if args.isolation_tunnels > 0 {
        isolation(&args, args.isolation_tunnels).await
    } else {
        (f64::NAN, f64::NAN)
    };

    let mut samples = Vec::with_capacity(args.setup_count);
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..args.setup_count {
        match one_tunnel(&args).await {
            Ok(d) => samples.push(d),
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if Instant::now() > deadline {
            break;
        }
    }
    samples.sort();

    let done = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + Duration::from_secs(args.rate_seconds);
    let rate_start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (args, done, errors) = (args.clone(), done.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                match one_tunnel(&args).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
    let tunnels_per_s = done.load(Ordering::Relaxed) as f64 / rate_start.elapsed().as_secs_f64();

    let case = |name: &str| args.bulk_cases.iter().any(|c| c == name);
    let bulk_case = async |name: &str, streams: usize, up: bool| {
        if case(name) {
            bulk(&args, streams, up).await
        } else {
            f64::NAN
        }
    };
    let up_1_mbps = bulk_case("up1", 1, true).await;
    let down_1_mbps = bulk_case("down1", 1, false).await;
    let up_8_mbps = bulk_case("up8", 8, true).await;
    let down_8_mbps = bulk_case("down8", 8, false).await;

    Report {
        label: args.label,
        setup_p50_ms: percentile(&samples, 0.50),
        setup_p99_ms: percentile(&samples, 0.99),
        tunnels_per_s,
        up_1_mbps,
        down_1_mbps,
        up_8_mbps,
        down_8_mbps,
        idle_tunnels: opened,
        rss_kb_per_tunnel: rss_per,
        pss_kb_per_tunnel: pss_per,
        isolation_fresh_1mb_ms,
        isolation_rss_mb,
        errors: errors.load(Ordering::Relaxed),
    }
}
