//! proxynet exit agent.
//!
//! Runs on an exit host: enrolls once ([`control`], [`state`]), heartbeats and
//! learns which superproxies exist, keeps a link to each ([`link`]), and serves
//! their tunnel streams from its egress IPs under the egress policy
//! ([`tunnel`]). It tells the control plane which public address each egress
//! leaves from, as a reflector sees it ([`public_egress`]). It never sees a
//! customer's username, password or address.
//!
//! [`ExitAgent::bind`] enrolls if needed and binds the admin listener (port 0 is
//! fine); [`ExitAgent::serve`] runs until its shutdown future resolves, then
//! drains: announce → wait → stop accepting → finish in-flight → close.

mod admin;
mod admin_token;
mod config;
mod control;
mod dns;
mod egress;
mod link;
mod optout;
mod policy;
mod public_egress;
mod state;
mod tunnel;
mod udp;
pub(crate) mod upstream;

use proxynet_common::tasks::{Stop, Tasks};
use proxynet_store::SuperproxyRecord;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use config::{Command, Config};
use control::{ControlClient, ControlError};
/// The host owner's opt-out and opt-in, run from the command line.
pub use optout::{run_cli as opt_out, run_opt_in_cli as opt_in};
use state::{AgentState, StateError};
use tunnel::TunnelContext;

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Addresses {
    pub admin: SocketAddr,
    pub exit_id: Uuid,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("not enrolled: no state file at {0} and no --enroll-token given")]
    NotEnrolled(String),
    #[error("the control-api URL {0} is not https: its credential would cross the network in clear text (pass --allow-insecure-control-api for a local test stack)")]
    InsecureControlApi(String),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("cannot read or create the admin token file {path}: {source}")]
    AdminToken {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("--upstream: {0}")]
    Upstream(String),
}

/// The partner gateway of an upstream exit (`--upstream`), with its
/// password read from `--upstream-password-file`.
fn upstream_of(config: &Config) -> Result<Option<upstream::Upstream>, StartError> {
    let Some(url) = &config.upstream.upstream else {
        return Ok(None);
    };
    let password = match &config.upstream.upstream_password_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| {
                    StartError::Upstream(format!(
                        "cannot read --upstream-password-file {}: {e}",
                        path.display()
                    ))
                })?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
        ),
        None => None,
    };
    upstream::Upstream::parse(url, &config.upstream.upstream_template, password)
        .map(Some)
        .map_err(StartError::Upstream)
}

pub struct ExitAgent {
    ctx: Arc<TunnelContext>,
    admin: TcpListener,
    addresses: Addresses,
    control: ControlClient,
}

impl ExitAgent {
    pub async fn bind(config: Config) -> Result<Self, StartError> {
        if !config.control_api.starts_with("https://") && !config.allow_insecure_control_api {
            return Err(StartError::InsecureControlApi(config.control_api.clone()));
        }
        let control = ControlClient::new(&config.control_api)?;
        let upstream = upstream_of(&config)?;
        let identity = match AgentState::load(&config.state_file)? {
            Some(state) => {
                if config.enroll_token.is_some() {
                    tracing::info!("already enrolled; ignoring the enrollment token");
                }
                state
            }
            None => {
                let token = config.enroll_token.as_ref().ok_or_else(|| {
                    StartError::NotEnrolled(config.state_file.display().to_string())
                })?;
                let state = control
                    .enroll(
                        token,
                        &config.egress_ips,
                        &config.egress_prefixes,
                        config.behind_nat,
                        upstream
                            .as_ref()
                            .map(|u| u.declaration(&config.upstream.upstream_countries))
                            .as_ref(),
                    )
                    .await?;
                state.save(&config.state_file)?;
                tracing::info!(exit = %state.exit_id, "enrolled");
                state
            }
        };
        let token_path = config.admin_token_path();
        let admin_token =
            admin_token::load_or_create(&token_path).map_err(|source| StartError::AdminToken {
                path: token_path.display().to_string(),
                source,
            })?;
        let admin = TcpListener::bind(config.admin_listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.admin_listen,
                source,
            })?;
        let admin_addr = admin.local_addr().map_err(|source| StartError::Listen {
            addr: config.admin_listen,
            source,
        })?;
        let mut own = vec![admin_addr];
        own.extend(control_api_addr(&config.control_api));
        let policy =
            policy::LivePolicy::new(policy::deny_own_egress(config.egress.policy(&own), &config));
        let dns = dns::Dns::new(
            config.dns_max_in_flight,
            config.dns_timeout(),
            &config.dns_servers,
        );
        let addresses = Addresses {
            admin: admin_addr,
            exit_id: identity.exit_id,
        };
        let withdrawn = identity.opted_out.is_some();
        if withdrawn {
            tracing::warn!("this exit was withdrawn by its owner: it carries no tunnels");
        }
        let opt_out = std::sync::Mutex::new(identity.opted_out.clone());
        let ctx = Arc::new(TunnelContext {
            identity,
            policy,
            dns,
            active: AtomicUsize::new(0),
            links_up: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            withdrawn: AtomicBool::new(withdrawn),
            beat_info: control::BeatInfo {
                admin_addrs: expand_unspecified(admin_addr),
                internal_targets: !config.egress.egress_allow.is_empty(),
            },
            cut_all: std::sync::Mutex::new(CancellationToken::new()),
            admin_token,
            opt_out,
            metrics: proxynet_common::metrics::install(),
            egress_watch: Default::default(),
            beat_now: Default::default(),
            upstream,
            config,
        });
        Ok(Self {
            ctx,
            admin,
            addresses,
            control,
        })
    }

    pub fn addresses(&self) -> Addresses {
        self.addresses
    }

    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let ctx = self.ctx;
        let mut tasks = Tasks::new();
        {
            let (listener, router) = (self.admin, admin::router(ctx.clone()));
            tasks.spawn("admin endpoint", |stop| async move {
                let _ = axum::serve(listener, router)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await;
            });
        }
        {
            let (control, ctx) = (self.control.clone(), ctx.clone());
            tasks.spawn("heartbeats", |stop| heartbeat_loop(control, ctx, stop));
        }
        {
            let (control, ctx) = (self.control.clone(), ctx.clone());
            tasks.spawn("public egress observation", |stop| {
                public_egress::run(ctx, control, stop)
            });
        }
        {
            let (control, ctx) = (self.control.clone(), ctx.clone());
            tasks.spawn("withdrawal acknowledgement", |stop| {
                optout::acknowledge_until_done(ctx, control, stop)
            });
        }
        shutdown.await;

        // Drain in the order that loses no tunnel: announce, let the news spread,
        // stop accepting, let in-flight tunnels finish, close.
        tracing::info!("draining: announcing to the control plane");
        ctx.draining.store(true, Ordering::Relaxed);
        if let Err(e) = self
            .control
            .heartbeat(&ctx.identity, true, active(&ctx), &ctx.beat_info)
            .await
        {
            tracing::warn!(error = %e, "could not announce draining; superproxies will notice the heartbeat expiry");
        }
        tokio::time::sleep(Duration::from_millis(ctx.config.drain_announce_ms)).await;
        ctx.refusing.store(true, Ordering::Relaxed);
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(ctx.config.drain_timeout_ms);
        while active(&ctx) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::info!(left = active(&ctx), "drained; closing links");
        tasks.stop(Duration::from_secs(5)).await;
    }
}

fn active(ctx: &TunnelContext) -> u64 {
    ctx.active.load(Ordering::Relaxed) as u64
}

/// A listener's addresses as others would dial them: an unspecified bind
/// answers on every interface address of this host.
fn expand_unspecified(addr: SocketAddr) -> Vec<SocketAddr> {
    if !addr.ip().is_unspecified() {
        return vec![addr];
    }
    proxynet_common::egress::host_interface_addresses()
        .into_iter()
        .map(|ip| SocketAddr::new(ip, addr.port()))
        .collect()
}

/// The control-api's own address, when its URL names an IP literal: protected
/// from being used as a tunnel target.
fn control_api_addr(url: &str) -> Option<SocketAddr> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let host = parsed.host_str()?;
    let ip = proxynet_common::egress::parse_ip_literal(host)?;
    Some(SocketAddr::new(ip, parsed.port_or_known_default()?))
}

/// Heartbeats on the interval the control-api asks for and keeps one link
/// supervisor per announced superproxy.
async fn heartbeat_loop(control: ControlClient, ctx: Arc<TunnelContext>, stop: Stop) {
    let mut links: HashMap<Uuid, LinkTask> = HashMap::new();
    let mut interval = Duration::from_secs(5);
    let mut failures: u32 = 0;
    loop {
        let draining = ctx.announces_draining();
        let beat = control.heartbeat(&ctx.identity, draining, active(&ctx), &ctx.beat_info);
        let Some(answer) = stop.run_until_cancelled(beat).await else {
            return;
        };
        match answer {
            Ok(reply) => {
                failures = 0;
                interval = Duration::from_millis(reply.heartbeat_interval_ms.clamp(100, 60_000));
                ctx.policy.learn(reply.protected.iter().copied().chain(
                    reply.superproxies.iter().flat_map(|s| {
                        std::iter::once(s.link_addr).chain(s.service_addrs.iter().copied())
                    }),
                ));
                ctx.egress_watch.learn(&reply);
                reconcile(&mut links, reply.superproxies, &ctx);
            }
            Err(e) => {
                failures += 1;
                // Links stay up: the data plane keeps working through a
                // control-plane outage until our liveness entry expires.
                tracing::warn!(error = %e, failures, "heartbeat failed");
            }
        }
        let wait = if failures == 0 {
            interval
        } else {
            interval.min(Duration::from_millis(500 * u64::from(failures.min(10))))
        };
        // A withdrawal (or its undoing) beats at once: superproxies stop
        // choosing the exit before the control plane hears of the opt-out.
        let next = async {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = ctx.beat_now.notified() => {}
            }
        };
        if stop.run_until_cancelled(next).await.is_none() {
            return;
        }
    }
}

/// One superproxy's link supervisor and the switch that winds it down.
struct LinkTask {
    record: SuperproxyRecord,
    stop: CancellationToken,
    /// Consecutive heartbeat replies that did not list this superproxy, and
    /// since when it has been missing from them.
    missing: u32,
    missing_since: Option<std::time::Instant>,
    _task: JoinHandle<()>,
}

/// A superproxy is let go only after this many replies in a row without it,
/// spanning at least [`WITHDRAWAL_GRACE`]: a Redis that restarted empty lists
/// no superproxy until each re-announces (after its own reconnect backoff),
/// and such replies must not tear every link down. Waiting costs nothing: a
/// superproxy that really left closes its links itself (a drain ends them
/// with its last tunnel, a crash is caught by the link keepalive), and a
/// draining one accepts no new tunnels to send down them.
const MISSING_BEFORE_WINDDOWN: u32 = 2;
const WITHDRAWAL_GRACE: Duration = Duration::from_secs(10);

fn reconcile(
    links: &mut HashMap<Uuid, LinkTask>,
    wanted: Vec<SuperproxyRecord>,
    ctx: &Arc<TunnelContext>,
) {
    let wanted: HashMap<Uuid, SuperproxyRecord> = wanted.into_iter().map(|s| (s.id, s)).collect();
    links.retain(|id, link| {
        let keep = match wanted.get(id) {
            Some(w) => {
                link.missing = 0;
                link.missing_since = None;
                w.link_addr == link.record.link_addr && w.cert_sha256 == link.record.cert_sha256
            }
            None => {
                link.missing += 1;
                let since = *link.missing_since.get_or_insert_with(std::time::Instant::now);
                link.missing < MISSING_BEFORE_WINDDOWN || since.elapsed() < WITHDRAWAL_GRACE
            }
        };
        if !keep {
            // Graceful: no new streams (GOAWAY), open tunnels finish. A
            // draining superproxy withdraws itself while its tunnels still run.
            tracing::info!(superproxy = %id, "superproxy withdrawn or changed; winding its link down");
            link.stop.cancel();
        }
        keep
    });
    for (id, record) in wanted {
        links.entry(id).or_insert_with(|| {
            let stop = CancellationToken::new();
            let task = tokio::spawn(link::supervise(record.clone(), ctx.clone(), stop.clone()));
            LinkTask {
                record,
                stop,
                missing: 0,
                missing_since: None,
                _task: task,
            }
        });
    }
}
