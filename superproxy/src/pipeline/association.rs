//! The SOCKS5 UDP association through the pipeline: admitted and opened
//! like a tunnel ([`Pipeline::open_association`]), then each datagram's
//! destination judged ([`Pipeline::datagram_allowed`]), its flows limited
//! per domain ([`Pipeline::admit_flow`]) and recorded in the target log
//! ([`Pipeline::record_datagram_target`]).

use proxynet_wire::datagram::DatagramAddr;
use std::net::IpAddr;
use std::time::Instant;

use crate::accept::ConnectionTicket;
use crate::error::ProxyError;
use crate::request::{Client, Ingress};

use super::{HeldTarget, Holds, Pipeline, Purpose, Tunnel};

impl Pipeline {
    /// The stages after authentication for a SOCKS5 UDP association: it is
    /// admitted like a tunnel (one concurrent-tunnel lease, the quotas, the
    /// targeting and session pin) and opened on an exit that carries UDP.
    /// Its destinations are per datagram: the relay records them
    /// ([`Pipeline::record_datagram_target`]) and asks
    /// [`Pipeline::datagram_allowed`] of each. Besides the tunnel: the
    /// association's egress address of the other family, if it has one.
    pub(crate) async fn open_association(
        &self,
        client: Client,
        ticket: &ConnectionTicket,
        started: Instant,
    ) -> Result<(Tunnel, Option<IpAddr>), ProxyError> {
        let ingress = Ingress::Socks5Udp;
        let opened = async {
            let (lease, quotas) = self.admit.admit(&client).await?;
            let opened = self
                .opener
                .open(Purpose::Association, &client, None, None)
                .await?;
            Ok::<_, ProxyError>((lease, quotas, opened))
        }
        .await;
        match opened {
            Ok((lease, quotas, opened)) => {
                let other_family = opened.other_egress_ip;
                let tunnel = self.hold(
                    client,
                    ingress,
                    HeldTarget {
                        shown: "udp".to_owned(),
                        policy_host: None,
                        domain: None,
                        site: None,
                    },
                    lease,
                    quotas,
                    opened,
                    ticket,
                    started,
                );
                Ok((tunnel, other_family))
            }
            Err(e) => {
                self.record_refusal(ingress, ticket, started, Some(&client), &e);
                Err(e)
            }
        }
    }

    /// Whether a datagram may leave for `destination`: literal addresses are
    /// checked against the egress policy here, names at the exit (which
    /// resolves them), as for tunnels.
    pub(crate) fn datagram_allowed(&self, holds: &Holds, destination: &DatagramAddr) -> bool {
        let literal_allowed = match destination {
            DatagramAddr::Ip(addr) => self.opener.policy.check(*addr).is_ok(),
            DatagramAddr::Name(..) => true,
        };
        literal_allowed
            && self
                .target_policy
                .permits_datagram(&holds.record, destination)
    }

    /// Whether any per-domain limit could apply to the association's
    /// datagrams now: only then does its relay keep a table of flows
    /// ([`Pipeline::admit_flow`]). Memory only.
    pub(crate) fn flows_limited(&self, holds: &Holds) -> bool {
        self.target_policy.any_domain_limit(&holds.record)
    }

    /// Admits one new flow of an association (its first datagram to a
    /// destination and port) under the per-domain limits, as a tunnel to
    /// that destination would be; the leases it holds while it is active.
    /// A refusal says why (429 with `Retry-After` for a limit).
    pub(crate) async fn admit_flow(
        &self,
        holds: &Holds,
        destination: &DatagramAddr,
    ) -> Result<Vec<crate::admission::Lease>, ProxyError> {
        self.target_policy
            .limit_datagram(
                holds.log.account_id,
                holds.log.user_id,
                &holds.record,
                destination,
            )
            .await
    }

    /// Records one destination of an association in the target log (the
    /// abuse desk's record), as a tunnel's target is recorded, under the
    /// egress address it leaves from: the one of its family; for a name
    /// (resolved at the exit, family unknown here) each of the two. Names
    /// are recorded as policies match them (lower case, no trailing dot,
    /// IDNA to ASCII; a name that cannot be normalised in lower case
    /// without its trailing dot), addresses canonical, so a lookup finds
    /// `VM.` as `vm`.
    pub(crate) fn record_datagram_target(
        &self,
        holds: &Holds,
        other_family: Option<IpAddr>,
        destination: &DatagramAddr,
    ) {
        let log = &holds.log;
        let (host, port, sources) = recorded_target(log.egress_ip, other_family, destination);
        for source in sources.into_iter().flatten() {
            self.usage.record_target(
                log.account_id,
                log.user_id,
                log.exit_id,
                source,
                host.clone(),
                port,
            );
        }
    }
}

/// Where the target log keeps one destination of an association: its host
/// (a name as [`recorded_name`] keeps it, an address canonical), its port,
/// and the egress addresses it is recorded under. An address: the one of
/// its family (`other_family` when `egress_ip` is of the other and there
/// is one; else `egress_ip`). A name, resolved at the exit: each of the two.
fn recorded_target(
    egress_ip: IpAddr,
    other_family: Option<IpAddr>,
    destination: &DatagramAddr,
) -> (String, u16, [Option<IpAddr>; 2]) {
    match destination {
        DatagramAddr::Ip(addr) => {
            let v4 = addr.ip().to_canonical().is_ipv4();
            let source = match other_family {
                Some(other) if egress_ip.is_ipv4() != v4 => other,
                _ => egress_ip,
            };
            (
                addr.ip().to_canonical().to_string(),
                addr.port(),
                [Some(source), None],
            )
        }
        DatagramAddr::Name(name, port) => {
            (recorded_name(name), *port, [Some(egress_ip), other_family])
        }
    }
}

/// A datagram's destination name as the target log keeps it: normalised as
/// policies match names ([`proxynet_store::policy::normalize_host`]), or, for
/// what cannot be a host name, in lower case without its trailing dot (the
/// abuse desk's lookup folds the same way).
fn recorded_name(name: &str) -> String {
    proxynet_store::policy::normalize_host(name)
        .unwrap_or_else(|_| name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase())
}

#[cfg(test)]
mod tests;
