//! The tunnel pipeline: the one order of stages every ingress goes through.
//! This file holds the order and nothing else; each stage is a file here:
//!
//! [`authenticate`] (who is asking) → [`authorize`] (what the account lets
//! them ask for) → parse the target and refuse literal addresses the egress
//! policy forbids → [`target_policy`] denials (the traffic policies, from
//! memory) → [`admit`] (quotas, limits, leases) → [`target_policy`]
//! per-domain limits → [`open`] (choose an exit, dial, safe retry) → meter
//! → [`Tunnel`] → [`access_log`] when it ends.
//!
//! CONNECT, absolute-form HTTP and SOCKS5 differ only in how they read the
//! credentials and the target off the wire and how they answer; they all call
//! [`Pipeline::open`] and get back a [`Tunnel`] that owns everything the
//! tunnel holds for exactly as long as the bytes flow.
//!
//! One stage may come after the answer: a `CONNECT` to an IP literal, while
//! some domain rule could apply, has its per-domain rules judged by the
//! server name in its client's TLS ClientHello ([`sni`]), read after the
//! `200` and before any client byte reaches the exit
//! ([`Pipeline::judge_first_bytes`], in [`first_bytes`]).
//!
//! A SOCKS5 UDP association goes through the same stages but the target's,
//! which are per datagram ([`association`]).

mod access_log;
mod admit;
mod association;
mod authenticate;
mod authorize;
mod first_bytes;
pub(crate) mod open;
pub mod sni;
mod target_policy;
#[cfg(test)]
pub(crate) mod test_support;
mod tunnel;

pub(crate) use admit::Admit;
pub(crate) use authenticate::Login;
pub(crate) use open::{Purpose, TunnelOpener};
pub(crate) use target_policy::{customer_refuses, TargetPolicy};
pub(crate) use tunnel::{Holds, Tunnel};

use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

use crate::accept::ConnectionTicket;
use crate::error::{ErrorKind, ProxyError};
use crate::metrics::Stats;
use crate::open_tunnels::OpenTunnels;
use crate::request::{Client, Credentials, Ingress, TargetAsk, TargetSpec};
use crate::usage::{Metered, UsageRecorder};

/// What the last stage keeps of the target: as logged, as policies match
/// it (for cutting it on a policy change), the registrable domain its
/// usage is counted under and the site its outcome is recorded for
/// (`None` for a UDP association: many targets).
struct HeldTarget {
    shown: String,
    policy_host: Option<(String, u16)>,
    domain: Option<Arc<str>>,
    site: Option<Arc<str>>,
}

/// The stages, built by the caller; [`Pipeline::open`] runs them in order.
pub(crate) struct Pipeline {
    login: Login,
    target_policy: TargetPolicy,
    admit: Admit,
    opener: TunnelOpener,
    usage: Arc<UsageRecorder>,
    open_tunnels: Arc<OpenTunnels>,
    stats: Arc<Stats>,
}

impl Pipeline {
    pub(crate) fn new(
        login: Login,
        target_policy: TargetPolicy,
        admit: Admit,
        opener: TunnelOpener,
        usage: Arc<UsageRecorder>,
        open_tunnels: Arc<OpenTunnels>,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            login,
            target_policy,
            admit,
            opener,
            usage,
            open_tunnels,
            stats,
        }
    }

    /// Runs every stage for one tunnel; on failure the error says how to
    /// answer. `options`: the `Proxynet-Options` header, when the request
    /// carried one ([`crate::request::OPTIONS_HEADER`]). `target`: a
    /// [`crate::request::TargetSpec`], or one with the client's
    /// `Proxynet-Report` ([`crate::request::TargetSpec::reported`]).
    pub(crate) async fn open<'t>(
        &self,
        ingress: Ingress,
        credentials: Option<Credentials>,
        options: Option<&str>,
        target: impl Into<TargetAsk<'t>>,
        ticket: &ConnectionTicket,
    ) -> Result<Tunnel, ProxyError> {
        let target: TargetAsk<'t> = target.into();
        let started = Instant::now();
        let client = self
            .authenticate(credentials, options, ticket, ingress, started)
            .await?;
        self.open_as(client, ingress, target, ticket, started).await
    }

    /// The stages after authentication, for an ingress that must answer the
    /// login before it can read the target (SOCKS5). Only
    /// [`Pipeline::authenticate`] makes a [`Client`], so the order holds.
    /// A report on the target's site (`Proxynet-Report`) is taken by the
    /// open stage, once the site is known and before the exit is chosen.
    pub(crate) async fn open_as<'t>(
        &self,
        client: Client,
        ingress: Ingress,
        target: impl Into<TargetAsk<'t>>,
        ticket: &ConnectionTicket,
        started: Instant,
    ) -> Result<Tunnel, ProxyError> {
        let TargetAsk {
            spec: target,
            report,
        }: TargetAsk<'t> = target.into();
        let opened = async {
            let target = target.parse()?;
            // Literal addresses the policy forbids never cost an exit a stream.
            self.opener.check_literal(&target)?;
            let judged = self.target_policy.check(&client, &target)?;
            let (lease, quotas) = self.admit.admit(&client).await?;
            // A tunnel to an address may carry its real destination in a
            // TLS server name: its per-domain rules wait for it.
            let first_bytes = matches!(
                ingress,
                Ingress::Connect | Ingress::H2Connect | Ingress::Socks5
            ) && self
                .target_policy
                .judges_server_name(&client.record, &target);
            let permitted = if let (true, crate::target::Host::Ip(ip)) = (first_bytes, &target.host)
            {
                self.target_policy.defer(&client, judged, *ip).await?
            } else {
                self.target_policy.limit(&client, judged).await?
            };
            let lease = lease.with_domain(permitted.leases);
            let opened = self
                .opener
                .open(
                    Purpose::Tunnel(&target),
                    &client,
                    Some(&permitted.site),
                    report,
                )
                .await?;
            let held = HeldTarget {
                shown: target.to_string(),
                policy_host: Some((permitted.host, target.port)),
                domain: Some(permitted.domain),
                site: Some(permitted.site),
            };
            Ok::<_, ProxyError>((target, held, lease, quotas, opened, first_bytes))
        }
        .await;
        let (target, held, lease, quotas, opened, first_bytes) = match opened {
            Ok(done) => done,
            Err(e) => {
                self.record_refusal(ingress, ticket, started, Some(&client), &e);
                return Err(e);
            }
        };
        // The host as policies match it (lower case, no trailing dot, IDNA
        // to ASCII), as the abuse desk looks it up.
        let recorded_host = held
            .policy_host
            .as_ref()
            .map_or_else(|| target.host_string(), |(host, _)| host.clone());
        self.usage.record_target(
            client.account_id,
            client.user_id,
            opened.exit_id,
            opened.egress_ip,
            recorded_host,
            target.port,
        );
        let mut tunnel = self.hold(
            client, ingress, held, lease, quotas, opened, ticket, started,
        );
        if first_bytes {
            if let crate::target::Host::Ip(ip) = target.host {
                tunnel.first_bytes = Some((ip, target.port));
            }
        }
        Ok(tunnel)
    }

    /// The last stage for every opened stream: the meter, the revocation
    /// registration and the holds that keep them as long as the bytes flow.
    #[allow(clippy::too_many_arguments)]
    fn hold(
        &self,
        client: Client,
        ingress: Ingress,
        target: HeldTarget,
        lease: crate::admission::Leases,
        quotas: Vec<crate::usage::QuotaSpec>,
        opened: open::Opened,
        ticket: &ConnectionTicket,
        started: Instant,
    ) -> Tunnel {
        self.stats.tunnel_opened(ingress, started.elapsed());
        let meter = self.usage.meter(
            client.account_id,
            client.user_id,
            opened.exit_id,
            opened.source_type,
            target.domain,
            &quotas,
        );
        let meter_view = meter.0.clone();
        let egress = crate::open_tunnels::TunnelEgress {
            account: client.account_id,
            user: client.user_id,
            ip: opened.egress_ip,
            other_ip: opened.other_egress_ip,
            dedicated: opened.dedicated,
        };
        let registration = self.open_tunnels.register(
            &client.username,
            client.credential_digest,
            opened.exit_id,
            client.network,
            match target.policy_host {
                Some((host, port)) => crate::open_tunnels::PolicyWatch::Target(host, port),
                None => crate::open_tunnels::PolicyWatch::Association(client.record.clone()),
            },
            Some(egress),
            ticket.cut().clone(),
        );
        // An allocation that landed while this tunnel was being opened: the
        // pool's cut ran before the registration, so the check is here (the
        // pool publishes its records before it cuts).
        // Likewise an exit blocked for provenance (consent revoked or
        // expired, a withdrawal) meanwhile: the pool cut its tunnels before
        // this one registered.
        let pool = &self.opener.pool;
        if pool
            .dedications_to_check(&opened.exit_id, egress.dedicated)
            .is_some_and(|record| egress.misplaced(&record.dedicated))
            || pool.barred(&opened.exit_id)
        {
            ticket.cut().cancel();
        }
        Tunnel {
            io: Metered::new(opened.io, meter),
            exit_id: opened.exit_id,
            pin: opened.pin,
            holds: Holds {
                credential_digest: client.credential_digest,
                network: client.network,
                log: access_log::AccessLog {
                    id: Uuid::new_v4(),
                    ingress,
                    account_id: client.account_id,
                    user_id: client.user_id,
                    username: client.username,
                    exit_id: opened.exit_id,
                    egress_ip: opened.egress_ip,
                    target: target.shown,
                    peer: ticket.peer(),
                    started,
                    setup_ms: started.elapsed().as_secs_f64() * 1000.0,
                    meter: meter_view,
                    end: None,
                    refused: None,
                    attempt: None,
                },
                _lease: lease,
                _in_flight: opened.in_flight,
                _registration: registration,
                ticket: ticket.clone(),
                record: client.record.clone(),
                site: target.site.map(|site| tunnel::SiteTag {
                    book: self.opener.sites.clone(),
                    site,
                }),
            },
            first_bytes: None,
        }
    }

    /// Which exits each site refuses (the forwarding path records what the
    /// answers it relays say).
    pub(crate) fn sites(&self) -> &Arc<crate::sites::SiteBook> {
        &self.opener.sites
    }

    /// The retry rule that applies to `client`'s request to `target`, if
    /// any (docs/policy.md, "Retry rules"): which answers are bans, how
    /// many other exits to try, whether a ban cools the exit. Memory only.
    pub(crate) fn retry_rule(
        &self,
        client: &Client,
        target: TargetSpec<'_>,
    ) -> Option<proxynet_store::policy::RetryRule> {
        self.target_policy.retry_rule(&client.record, target)
    }

    /// Takes one retry from the budget the opener's own retries draw on
    /// ([`open::RetryBudget`]): `false` when it is spent, and the caller
    /// does not retry.
    pub(crate) fn withdraw_retry(&self) -> bool {
        self.opener.retry_budget.withdraw()
    }

    /// Registers the client connection itself under `holds`' user, for as
    /// long as the returned registration is kept: a kept-alive absolute-form
    /// connection is cut on revocation even between requests.
    pub(crate) fn register_connection(&self, holds: &Holds) -> crate::open_tunnels::Registration {
        holds.register_connection(&self.open_tunnels)
    }

    /// Authenticates and authorizes the client. A success frees the
    /// connection's pre-auth slot; a refusal is counted and has its
    /// access-log line, for every ingress (`ingress`, `started`: the
    /// tunnel it was for). `options` (the `Proxynet-Options` header)
    /// replace the username's options; they are authorized as those are.
    pub(crate) async fn authenticate(
        &self,
        credentials: Option<Credentials>,
        options: Option<&str>,
        ticket: &ConnectionTicket,
        ingress: Ingress,
        started: Instant,
    ) -> Result<Client, ProxyError> {
        let result = self
            .login
            .check(credentials, options, ticket.peer().ip())
            .await
            .and_then(authorize::authorize);
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
        if let Err(e) = &result {
            self.record_refusal(ingress, ticket, started, None, e);
        }
        result
    }

    /// A tunnel refused before it opened, by any stage and for every
    /// ingress: the failure is counted for `ingress`, then the refusal has
    /// its access-log line (`client`: who it was for, once authenticated).
    /// The caller answers with the error as its ingress does.
    fn record_refusal(
        &self,
        ingress: Ingress,
        ticket: &ConnectionTicket,
        started: Instant,
        client: Option<&Client>,
        error: &ProxyError,
    ) {
        self.stats.tunnel_failed(ingress, error.kind);
        access_log::refused(ingress, ticket.peer(), started, client, error);
    }
}
