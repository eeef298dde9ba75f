//! The tunnel pipeline: the one order of stages every ingress goes through.
//!
//! authenticate → parse the target → admit (limits, quota) → select an exit
//! and open the stream (with safe retry) → meter → [`Tunnel`].
//!
//! CONNECT, absolute-form HTTP and SOCKS5 differ only in how they read the
//! credentials and the target off the wire and how they answer; they all call
//! [`Pipeline::open`] and get back a [`Tunnel`] that owns everything the
//! tunnel holds — the connection's ticket (its permit and drain guard), the
//! user's concurrency lease, the exit's in-flight count, the byte meter and
//! the revocation registration — for exactly as long as the bytes flow.
//! Dropping the tunnel releases them all and writes its access-log line.

use crate::link::stream::ExitStream;
use proxynet_protocol::secret::Secret;
use proxynet_protocol::splice::{splice_until, End, SpliceOutcome, TunnelLimits};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

use crate::accept::ConnectionTicket;
use crate::admission::{Admission, Leases, UserLimits};
use crate::authenticate::Authenticator;
use crate::config::Config;
use crate::error::{ErrorKind, ProxyError};
use crate::health::InFlight;
use crate::limits::AuthFailureLimiter;
use crate::open_tunnels::{OpenTunnels, Registration};
use crate::session::Pin;
use crate::target::Target;
use crate::tunnel::TunnelOpener;
use crate::usage::{Meter, Metered, QuotaOwner, QuotaSpec, UsageRecorder};
use crate::username::{self, ParsedUsername};

/// Which client protocol a tunnel came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    Connect,
    Forward,
    Socks5,
}

impl Ingress {
    pub fn as_str(self) -> &'static str {
        match self {
            Ingress::Connect => "connect",
            Ingress::Forward => "forward",
            Ingress::Socks5 => "socks5",
        }
    }
}

/// Proxy credentials as the client presented them.
pub struct Credentials {
    /// The full proxy username, grammar and all (`alice-session-x1`).
    pub username: String,
    pub password: Secret,
}

/// The destination as the ingress read it, parsed by the pipeline.
pub enum TargetSpec<'a> {
    /// CONNECT's authority-form `host:port` (the port is required).
    Authority(&'a str),
    /// An absolute-form URL's authority (`host[:port]`, port 80 when absent).
    UrlAuthority(&'a str),
    /// Already structured (SOCKS5).
    Parsed(Target),
}

impl TargetSpec<'_> {
    fn parse(self) -> Result<Target, ProxyError> {
        let parsed = match self {
            TargetSpec::Authority(a) => Target::parse_authority(a),
            TargetSpec::UrlAuthority(a) => Target::parse_url_authority(a, 80),
            TargetSpec::Parsed(t) => return Ok(t),
        };
        parsed.map_err(|e| ProxyError::new(ErrorKind::BadRequest, format!("bad target: {e}")))
    }
}

/// Who is asking: the authenticated user and what their username asked for.
pub struct Client {
    pub user_id: Uuid,
    pub account_id: Uuid,
    /// The base username (no grammar, never the password).
    pub username: String,
    pub credential_digest: [u8; 32],
    pub limits: UserLimits,
    pub request: ParsedUsername,
    /// The allow-listed network it logged in by (no credentials).
    pub network: Option<proxynet_protocol::egress::Cidr>,
}

/// The stages, each owned by its module; [`Pipeline::open`] runs them in order.
pub struct Pipeline {
    pub id: Uuid,
    pub config: Arc<Config>,
    pub auth: Authenticator,
    pub auth_limiter: Arc<AuthFailureLimiter>,
    pub admission: Arc<Admission>,
    pub usage: Arc<UsageRecorder>,
    pub opener: TunnelOpener,
    pub open_tunnels: Arc<OpenTunnels>,
    pub stats: Arc<crate::metrics::Stats>,
    pub allowlist: Arc<crate::allowlist::Allowlist>,
}

impl Pipeline {
    /// Runs every stage for one tunnel; on failure the error says how to answer.
    pub async fn open(
        &self,
        ingress: Ingress,
        credentials: Option<Credentials>,
        target: TargetSpec<'_>,
        ticket: &ConnectionTicket,
    ) -> Result<Tunnel, ProxyError> {
        let started = Instant::now();
        match self.authenticate(credentials, ticket).await {
            Ok(client) => self.open_as(client, ingress, target, ticket, started).await,
            Err(e) => {
                self.stats.tunnel_failed(ingress, e.kind);
                access_log_refused(ingress, ticket.peer(), started, None, &e);
                Err(e)
            }
        }
    }

    /// The stages after authentication, for an ingress that must answer the
    /// login before it can read the target (SOCKS5). Only
    /// [`Pipeline::authenticate`] makes a [`Client`], so the order holds.
    pub async fn open_as(
        &self,
        client: Client,
        ingress: Ingress,
        target: TargetSpec<'_>,
        ticket: &ConnectionTicket,
        started: Instant,
    ) -> Result<Tunnel, ProxyError> {
        let opened = async {
            let target = target.parse()?;
            // Literal addresses the policy forbids never cost an exit a stream.
            self.opener.check_literal(&target)?;
            let (lease, quotas) = self.admit(&client).await?;
            let opened = self.opener.open(&target, &client).await?;
            Ok::<_, ProxyError>((target, lease, quotas, opened))
        }
        .await;
        let (target, lease, quotas, opened) = match opened {
            Ok(done) => done,
            Err(e) => {
                self.stats.tunnel_failed(ingress, e.kind);
                access_log_refused(ingress, ticket.peer(), started, Some(&client), &e);
                return Err(e);
            }
        };
        self.stats.tunnel_opened(ingress, started.elapsed());
        let meter = self.usage.meter(
            client.account_id,
            client.user_id,
            opened.exit_id,
            opened.source_type,
            &quotas,
        );
        self.usage.record_target(
            client.account_id,
            client.user_id,
            opened.exit_id,
            opened.egress_ip,
            target.host_string(),
            target.port,
        );
        let meter_view = meter.0.clone();
        let registration = self.open_tunnels.register(
            client.user_id,
            &client.username,
            client.credential_digest,
            opened.exit_id,
            client.network,
            ticket.cut().clone(),
        );
        Ok(Tunnel {
            io: Metered::new(opened.io, meter),
            exit_id: opened.exit_id,
            pin: opened.pin,
            holds: Holds {
                credential_digest: client.credential_digest,
                network: client.network,
                log: AccessLog {
                    id: Uuid::new_v4(),
                    ingress,
                    account_id: client.account_id,
                    user_id: client.user_id,
                    username: client.username,
                    exit_id: opened.exit_id,
                    egress_ip: opened.egress_ip,
                    target: target.to_string(),
                    peer: ticket.peer(),
                    started,
                    setup_ms: started.elapsed().as_secs_f64() * 1000.0,
                    meter: meter_view,
                    end: None,
                },
                _lease: lease,
                _in_flight: opened.in_flight,
                _registration: registration,
                ticket: ticket.clone(),
            },
        })
    }

    /// Parses the username grammar, then checks the base user's password.
    /// A grammar error is a 400 naming the problem; any credential failure is
    /// the one indistinguishable 407. Both are charged to the source address.
    /// A success frees the connection's pre-auth slot.
    pub async fn authenticate(
        &self,
        credentials: Option<Credentials>,
        ticket: &ConnectionTicket,
    ) -> Result<Client, ProxyError> {
        let result = self
            .check_credentials(credentials, ticket.peer().ip())
            .await;
        if result.is_ok() {
            ticket.authenticated();
        }
        crate::metrics::auth(match &result {
            Ok(_) => "ok",
            Err(e) if e.kind == ErrorKind::TooManyRequests => "limited",
            Err(e) if e.kind == ErrorKind::BadRequest => "bad_username",
            Err(e) if e.kind == ErrorKind::AuthRequired => "denied",
            Err(_) => "error",
        });
        result
    }

    async fn check_credentials(
        &self,
        credentials: Option<Credentials>,
        peer: IpAddr,
    ) -> Result<Client, ProxyError> {
        self.auth_limiter.check(peer)?;
        let Some(credentials) = credentials else {
            // No credentials at all: an allow-listed source address is a login.
            return self.allowlisted(peer).await;
        };
        // A header that did not decode: the one 407.
        if credentials.username.is_empty() {
            return Err(ProxyError::auth_required());
        }
        let request = match username::parse(&credentials.username) {
            Ok(request) => request,
            Err(e) => {
                self.auth_limiter.charge(peer)?;
                return Err(ProxyError::new(
                    ErrorKind::BadRequest,
                    format!("proxy username: {e}"),
                ));
            }
        };
        let verified = self
            .auth
            .authenticate(&request.user, credentials.password.expose(), || {
                self.auth_limiter.charge(peer)
            })
            .await?;
        self.client(request, verified)
    }

    /// A request without credentials from an allow-listed address: the
    /// user's `allowlist_options` stand in for the username's grammar.
    async fn allowlisted(&self, peer: IpAddr) -> Result<Client, ProxyError> {
        let (network, username) = self
            .allowlist
            .lookup(peer)
            .ok_or_else(ProxyError::auth_required)?;
        let verified = self.auth.allowlisted(&username).await?;
        let raw = match verified.record.allowlist_options.as_deref() {
            Some(options) if !options.is_empty() => format!("{username}-{options}"),
            _ => username,
        };
        let request = username::parse(&raw).map_err(|e| {
            ProxyError::new(
                ErrorKind::BadRequest,
                format!("allow-list options of this user: {e}"),
            )
        })?;
        let mut client = self.client(request, verified)?;
        client.network = Some(network);
        Ok(client)
    }

    /// The authenticated client, its username's asks bounded by what the
    /// account allows the user.
    fn client(
        &self,
        mut request: ParsedUsername,
        verified: crate::authenticate::Verified,
    ) -> Result<Client, ProxyError> {
        let user = &verified.record;
        // What the account allows this user bounds what the username may ask.
        let targeting = &mut request.targeting;
        if let (Some(asked), Some(allowed)) = (targeting.source_type, &user.allowed_source_types) {
            if !allowed.contains(&asked) {
                return Err(ProxyError::new(
                    ErrorKind::TargetingNotAllowed,
                    format!("this proxy user may not use type={}", asked.as_str()),
                ));
            }
        }
        if let (Some(asked), Some(allowed)) = (&targeting.country, &user.allowed_countries) {
            if !allowed.contains(asked) {
                return Err(ProxyError::new(
                    ErrorKind::TargetingNotAllowed,
                    format!("this proxy user may not use country={asked}"),
                ));
            }
        }
        if let (Some(asked), Some(allowed)) = (targeting.channel, &user.allowed_channels) {
            if !allowed.contains(&asked) {
                return Err(ProxyError::new(
                    ErrorKind::TargetingNotAllowed,
                    format!("this proxy user may not use channel={}", asked.as_str()),
                ));
            }
        }
        if let (Some(asked), Some(priced)) = (targeting.source_type, &user.plan_source_types) {
            if !priced.contains(&asked) {
                return Err(ProxyError::new(
                    ErrorKind::TargetingNotAllowed,
                    format!(
                        "the account's plan does not price type={} exits",
                        asked.as_str()
                    ),
                ));
            }
        }
        targeting.allowed_types = user.allowed_source_types.clone();
        targeting.allowed_countries = user.allowed_countries.clone();
        targeting.allowed_channels = user.allowed_channels.clone();
        targeting.plan_types = user.plan_source_types.clone();
        Ok(Client {
            user_id: user.id,
            account_id: user.account_id,
            username: user.username.clone(),
            credential_digest: verified.credential_digest,
            limits: UserLimits {
                max_concurrent_tunnels: user.max_concurrent_tunnels,
                max_new_tunnels_per_second: user.max_new_tunnels_per_second,
                bandwidth: user.bandwidth_bytes.map(|b| (b, user.quota_period)),
                account: user.account_limits,
            },
            request,
            network: None,
        })
    }

    /// Applies the user's and the account's quotas and tunnel limits; the
    /// leases live as long as the tunnel. Returns the quotas the tunnel's
    /// bytes count against, for its meter.
    async fn admit(&self, client: &Client) -> Result<(Leases, Vec<QuotaSpec>), ProxyError> {
        let mut quotas = Vec::new();
        let account_bandwidth = client
            .limits
            .account
            .and_then(|a| a.bandwidth_bytes.map(|b| (b, a.quota_period)));
        for (owner, bandwidth, whose) in [
            (
                QuotaOwner::User(client.user_id),
                client.limits.bandwidth,
                "user",
            ),
            (
                QuotaOwner::Account(client.account_id),
                account_bandwidth,
                "account",
            ),
        ] {
            let Some((limit, period)) = bandwidth else {
                continue;
            };
            // Redis away: judge by this instance's budget alone.
            let used = self.admission.quota_used(owner, period).await.unwrap_or(0);
            let spec = QuotaSpec {
                owner,
                limit,
                period,
                used,
            };
            if used >= limit || self.usage.budget_left(&spec) <= 0 {
                return Err(ProxyError::new(
                    ErrorKind::QuotaExhausted,
                    format!(
                        "bandwidth quota exhausted: the {whose}'s {limit} bytes per {} period",
                        period.as_str()
                    ),
                ));
            }
            quotas.push(spec);
        }
        let leases = self
            .admission
            .admit(client.user_id, client.account_id, client.limits)
            .await?;
        Ok((leases, quotas))
    }
}

/// An open tunnel: the metered stream to the exit and everything it holds.
pub struct Tunnel {
    pub io: Metered<ExitStream>,
    pub exit_id: Uuid,
    /// Set for sticky sessions.
    pub pin: Option<Pin>,
    pub holds: Holds,
}

/// What a tunnel holds until its bytes stop flowing; dropping it releases
/// them and writes the access-log line.
pub struct Holds {
    /// Who the tunnel runs for, as revocation sees it.
    pub credential_digest: [u8; 32],
    /// The allow-listed network it came in by, if any.
    network: Option<proxynet_protocol::egress::Cidr>,
    log: AccessLog,
    _lease: Leases,
    _in_flight: InFlight,
    _registration: Registration,
    ticket: ConnectionTicket,
}

impl Holds {
    /// Registers the client connection itself under this tunnel's user, for
    /// as long as the returned registration is kept: a kept-alive
    /// absolute-form connection is cut on revocation even between requests.
    pub fn register_connection(&self, open_tunnels: &Arc<OpenTunnels>) -> Registration {
        open_tunnels.register(
            self.log.user_id,
            &self.log.username,
            self.credential_digest,
            Uuid::nil(),
            self.network,
            self.ticket.cut().clone(),
        )
    }

    /// Resolves when the tunnel must end now (revocation, drain deadline).
    pub fn cut(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.ticket.cut().cancelled()
    }

    /// Records why the tunnel ended, for its access-log line.
    pub fn ended(&mut self, end: End) {
        self.log.end = Some(end);
    }
}

impl Tunnel {
    /// Splices `client` and the exit until the tunnel ends or is cut.
    pub async fn splice<C>(self, client: C, limits: TunnelLimits) -> SpliceOutcome
    where
        C: proxynet_protocol::splice::ChunkIo,
    {
        let Tunnel { io, mut holds, .. } = self;
        let outcome = splice_until(client, io, limits, holds.cut()).await;
        holds.ended(outcome.end);
        outcome
    }
}

/// One line per tunnel on the `proxynet::access` target: who, through which
/// exit and egress IP, to where, how it ended, bytes each way, timings. Never
/// a password; the username is the base user without its grammar.
struct AccessLog {
    id: Uuid,
    ingress: Ingress,
    account_id: Uuid,
    user_id: Uuid,
    username: String,
    exit_id: Uuid,
    egress_ip: IpAddr,
    target: String,
    peer: SocketAddr,
    started: Instant,
    setup_ms: f64,
    meter: Arc<Meter>,
    end: Option<End>,
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        let outcome = match self.end {
            None | Some(End::Closed) => "closed",
            Some(End::Idle) => "idle_timeout",
            Some(End::Lifetime) => "lifetime",
            Some(End::Cut) => "cut",
            Some(End::Error(_)) => "connection_terminated",
        };
        // Which side's I/O failed is in the kind (reset, broken pipe, ...).
        let error = match self.end {
            Some(End::Error(kind)) => Some(kind.to_string()),
            _ => None,
        };
        tracing::info!(
            target: "proxynet::access",
            tunnel = %self.id,
            ingress = self.ingress.as_str(),
            account = %self.account_id,
            user_id = %self.user_id,
            user = %self.username,
            exit = %self.exit_id,
            egress_ip = %self.egress_ip,
            target_addr = %self.target,
            client = %self.peer,
            outcome,
            error,
            bytes_up = self.meter.up(),
            bytes_down = self.meter.down(),
            setup_ms = self.setup_ms,
            duration_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            "tunnel"
        );
    }
}

fn access_log_refused(
    ingress: Ingress,
    peer: SocketAddr,
    started: Instant,
    client: Option<&Client>,
    error: &ProxyError,
) {
    tracing::info!(
        target: "proxynet::access",
        tunnel = %Uuid::new_v4(),
        ingress = ingress.as_str(),
        account = client.map(|c| c.account_id.to_string()),
        user_id = client.map(|c| c.user_id.to_string()),
        user = client.map(|c| c.username.as_str()),
        client = %peer,
        outcome = error.kind.proxy_status_error(),
        status = error.kind.status().as_u16(),
        bytes_up = 0u64,
        bytes_down = 0u64,
        setup_ms = started.elapsed().as_secs_f64() * 1000.0,
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
        "tunnel refused"
    );
}
