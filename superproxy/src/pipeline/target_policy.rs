//! Stage between parsing the target and admission: may this client's
//! traffic go to this target at all (the operator's denied domains and
//! ports, the account's and the user's allowed/denied domains), and within
//! the per-domain limits (the operator's aggregate over every account, the
//! account's over its users, the user's own). Checked before any exit is
//! used, so a refused name is never even resolved. Rules and matching:
//! `proxynet_store::policy`; docs/policy.md.
//!
//! The operator's aggregate is shared fairly between the accounts using a
//! domain ([`Admission::admit_shared_domain`]); the account's and the
//! user's are each one owner's. A SOCKS5 UDP association's flows (one per
//! new destination) are held to the same limits as tunnels
//! ([`TargetPolicy::limit_datagram`]). A `CONNECT` to an IP literal, while
//! some domain rule could apply, is judged again by the server name its
//! client's TLS ClientHello carries, or else counted by its address block
//! ([`TargetPolicy::judge_server_name`]).
//!
//! Without any domain limit set (the default) this stage costs no Redis
//! round trip: the denials are matched against lists already in memory.

use proxynet_store::policy::{
    normalize_host, rule_for, OperatorPolicy, PolicyTarget, Refusal, RetryRule, TrafficPolicy,
};
use proxynet_store::UserRecord;
use proxynet_wire::datagram::DatagramAddr;
use std::net::IpAddr;
use std::sync::Arc;
use uuid::Uuid;

use crate::admission::{Admission, Lease};
use crate::error::{ErrorKind, ProxyError};
use crate::operator_policy::OperatorRules;
use crate::request::{Client, TargetSpec};
use crate::target::{Host, Target};

pub(crate) struct TargetPolicy {
    operator: Arc<OperatorRules>,
    admission: Arc<Admission>,
}

/// A target the denials let through, before its per-domain limits.
pub(super) struct Judged {
    host: NormalizedHost,
    domain: Arc<str>,
    site: Arc<str>,
    operator: Arc<OperatorPolicy>,
}

/// What the stage lets through: the per-domain leases the tunnel holds, the
/// normalised host (for revocation by a later policy change), the
/// registrable domain its usage is counted under and the site its exits
/// are judged for ([`site_of`]).
pub(super) struct Permitted {
    pub leases: Vec<Lease>,
    pub host: String,
    pub domain: Arc<str>,
    pub site: Arc<str>,
}

/// A target's host as policies match it, kept with its address when it is
/// one, so nothing parses the text again.
struct NormalizedHost {
    text: String,
    ip: Option<IpAddr>,
}

impl NormalizedHost {
    /// A name that cannot be one is a bad request (nothing could resolve it).
    fn of(target: &Target) -> Result<Self, ProxyError> {
        match &target.host {
            Host::Ip(ip) => Ok(Self::ip(*ip)),
            Host::Name(name) => normalize_host(name)
                .map(|text| Self { text, ip: None })
                .map_err(|e| ProxyError::new(ErrorKind::BadRequest, format!("target host: {e}"))),
        }
    }

    fn ip(ip: IpAddr) -> Self {
        let ip = ip.to_canonical();
        Self {
            text: ip.to_string(),
            ip: Some(ip),
        }
    }

    fn policy_target(&self) -> PolicyTarget<'_> {
        match self.ip {
            Some(ip) => PolicyTarget::Ip(ip),
            None => PolicyTarget::Name(&self.text),
        }
    }
}

fn denied(whose: &str, refusal: &Refusal) -> ProxyError {
    ProxyError::new(
        ErrorKind::TargetDenied,
        format!("the target is refused by {whose} traffic policy: {refusal}"),
    )
}

/// The customer's refusal of a target, if any, and whose it is: the
/// account's rules first (they bound the user's), then the user's.
fn customer_refusal(
    record: &UserRecord,
    target: &PolicyTarget<'_>,
) -> Option<(&'static str, Refusal)> {
    [
        ("the account's", &record.account_policy),
        ("the user's", &record.policy),
    ]
    .into_iter()
    .find_map(|(whose, policy)| policy.permits(target).err().map(|r| (whose, r)))
}

/// Whether the user's or account's policy in `record` refuses an open
/// tunnel's normalised host (a policy change re-judges what is open).
pub(crate) fn customer_refuses(record: &UserRecord, host: &str) -> bool {
    customer_refusal(record, &PolicyTarget::from_normalized(host)).is_some()
}

/// Whether the operator's policy limits any domain at all.
fn operator_limits_any(operator: &OperatorPolicy) -> bool {
    !operator.domain_limits.is_empty() || operator.default_domain_limit.is_some_and(|l| l.is_set())
}

/// No denial anywhere (the default): nothing to match.
fn denies_nothing(operator: &OperatorPolicy, record: &UserRecord) -> bool {
    let open = |p: &TrafficPolicy| p.allowed_domains.is_empty() && p.denied_domains.is_empty();
    operator.denied_domains.is_empty()
        && operator.denied_ports.is_empty()
        && open(&record.policy)
        && open(&record.account_policy)
}

impl TargetPolicy {
    pub(crate) fn new(operator: Arc<OperatorRules>, admission: Arc<Admission>) -> Self {
        Self {
            operator,
            admission,
        }
    }

    /// The denials: in memory, no Redis. Run before admission, so a refused
    /// target spends nobody's budget.
    pub(super) fn check(&self, client: &Client, target: &Target) -> Result<Judged, ProxyError> {
        let host = NormalizedHost::of(target)?;
        let policy_target = host.policy_target();
        let operator = self.operator.current();
        if !denies_nothing(&operator, &client.record) {
            operator
                .permits(&policy_target, target.port)
                .map_err(|r| denied("the operator's", &r))?;
            if let Some((whose, refusal)) = customer_refusal(&client.record, &policy_target) {
                return Err(denied(whose, &refusal));
            }
        }
        let domain: Arc<str> = Arc::from(policy_target.registrable_domain());
        let site = site_of(host.ip, &domain);
        Ok(Judged {
            host,
            domain,
            site,
            operator,
        })
    }

    /// The retry rule for a request to `target` by the client `record`
    /// authorized ([`rule_for`]: the user's list, then the account's, then
    /// the operator's; docs/policy.md, "Retry rules"), as a copy. Memory
    /// only; when no list holds a rule, `None` before the target is parsed.
    pub(super) fn retry_rule(
        &self,
        record: &UserRecord,
        target: TargetSpec<'_>,
    ) -> Option<RetryRule> {
        let operator = self.operator.current();
        if record.retry_rules.is_empty()
            && record.account_retry_rules.is_empty()
            && operator.retry_rules.is_empty()
        {
            return None;
        }
        let target = target.parse().ok()?;
        let host = NormalizedHost::of(&target).ok()?;
        rule_for(
            &record.retry_rules,
            &record.account_retry_rules,
            &operator.retry_rules,
            &host.policy_target(),
        )
        .cloned()
    }

    /// The per-domain limits, after the user's own admission: a client its
    /// quota or rate refuses never spends the network's per-domain budget.
    pub(super) async fn limit(
        &self,
        client: &Client,
        judged: Judged,
    ) -> Result<Permitted, ProxyError> {
        let Judged {
            host,
            domain,
            site,
            operator,
        } = judged;
        let owner = Owner {
            account: client.account_id,
            user: client.user_id,
            record: &client.record,
        };
        let operator_limit = operator.limit_for(&host.policy_target());
        let leases = self.limits(owner, operator_limit, &domain).await?;
        Ok(Permitted {
            leases,
            host: host.text,
            domain,
            site,
        })
    }

    /// Whether a tunnel to `target` should be judged again by the first
    /// bytes its client sends: the target is an IP literal (a name in a
    /// TLS ClientHello may say where it really goes) and some domain rule
    /// could apply to this client (a denied domain, or a domain limit).
    /// Memory only; false, and nothing peeked, in the default setup.
    pub(super) fn judges_server_name(&self, record: &UserRecord, target: &Target) -> bool {
        if !matches!(target.host, Host::Ip(_)) {
            return false;
        }
        let operator = self.operator.current();
        !operator.denied_domains.is_empty()
            || !record.policy.denied_domains.is_empty()
            || !record.account_policy.denied_domains.is_empty()
            || record.policy.has_domain_limits()
            || record.account_policy.has_domain_limits()
            || operator_limits_any(&operator)
    }

    /// What a tunnel to an IP literal is let through with before its first
    /// bytes are in: the denials of the address passed; its per-domain
    /// limits are charged now under the address's block — its /24 (IPv4) or
    /// /64 (IPv6), so walking a block's addresses makes no fresh budgets; an
    /// operator limit on a network covering the address counts as that
    /// entry — before any exit is asked to connect, so a refused tunnel
    /// never reaches the target. A server name the client's first bytes
    /// carry adds its own limits on top ([`Self::judge_server_name`]); it
    /// never replaces these. Usage is counted under the address's
    /// registrable domain, as for any literal.
    pub(super) async fn defer(
        &self,
        client: &Client,
        judged: Judged,
        ip: IpAddr,
    ) -> Result<Permitted, ProxyError> {
        let owner = Owner {
            account: client.account_id,
            user: client.user_id,
            record: &client.record,
        };
        let target = PolicyTarget::Ip(ip.to_canonical());
        let block = address_block(ip);
        // The default limit counts per registrable domain, which for an
        // address is itself: its block instead.
        let default_key = target.registrable_domain();
        let operator_limit = judged.operator.limit_for(&target).map(|(key, limit)| {
            if key == default_key {
                (block.clone(), limit)
            } else {
                (key, limit)
            }
        });
        let leases = self.limits(owner, operator_limit, &block).await?;
        Ok(Permitted {
            leases,
            host: judged.host.text,
            domain: judged.domain,
            site: judged.site,
        })
    }

    /// The deferred judgement of a tunnel to an address, once its client's
    /// first bytes are in. With a server name (`server_name`, as the
    /// ClientHello carries it; one that does not normalise to a host name
    /// counts as none): the operator's and the customer's denied domains
    /// apply to it (the allow-list already let the address through), and
    /// the per-domain limits count the tunnel under its registrable domain
    /// as well — on top of the address's, charged by [`Self::defer`].
    /// Without one there is nothing more to charge.
    pub(super) async fn judge_server_name(
        &self,
        account: Uuid,
        user: Uuid,
        record: &UserRecord,
        port: u16,
        server_name: Option<&str>,
    ) -> Result<Vec<Lease>, ProxyError> {
        let name = server_name
            .and_then(|name| normalize_host(name).ok())
            .filter(|name| matches!(PolicyTarget::from_normalized(name), PolicyTarget::Name(_)));
        let Some(name) = name else {
            return Ok(Vec::new());
        };
        let operator = self.operator.current();
        let owner = Owner {
            account,
            user,
            record,
        };
        let target = PolicyTarget::Name(&name);
        operator
            .permits(&target, port)
            .map_err(|r| denied("the operator's", &r))?;
        for (whose, policy) in [
            ("the account's", &record.account_policy),
            ("the user's", &record.policy),
        ] {
            policy.denies(&target).map_err(|r| denied(whose, &r))?;
        }
        let domain = target.registrable_domain();
        self.limits(owner, operator.limit_for(&target), &domain)
            .await
    }

    /// Every per-domain limit that applies for `owner`: the operator's
    /// aggregate (`operator_limit`: the key it is counted under and the
    /// limit, [`OperatorPolicy::limit_for`]), shared fairly between
    /// accounts, then the account's and the user's, counted under `domain`
    /// (the target's registrable domain). Nothing is allocated and Redis is
    /// not asked unless one is set.
    async fn limits(
        &self,
        owner: Owner<'_>,
        operator_limit: Option<(String, proxynet_store::policy::Limit)>,
        domain: &str,
    ) -> Result<Vec<Lease>, ProxyError> {
        let mut leases = Vec::new();
        if let Some((key, limit)) = operator_limit {
            leases.extend(
                self.admission
                    .admit_shared_domain(&key, limit, owner.account, "the network's")
                    .await?,
            );
        }
        let record = owner.record;
        if record.account_policy.has_domain_limits() {
            let scope = format!("a:{}", owner.account);
            let limit = domain_limit(&record.account_policy);
            leases.extend(
                self.admission
                    .admit_domain(&scope, domain, limit, "the account's")
                    .await?,
            );
        }
        if record.policy.has_domain_limits() {
            let scope = format!("u:{}", owner.user);
            let limit = domain_limit(&record.policy);
            leases.extend(
                self.admission
                    .admit_domain(&scope, domain, limit, "the user's")
                    .await?,
            );
        }
        Ok(leases)
    }

    /// Whether any per-domain limit could apply to the traffic of `record`
    /// now (the operator's, its account's or its own). Memory only: a UDP
    /// association keeps a table of its flows only while this holds.
    pub(super) fn any_domain_limit(&self, record: &UserRecord) -> bool {
        record.policy.has_domain_limits()
            || record.account_policy.has_domain_limits()
            || operator_limits_any(&self.operator.current())
    }

    /// The per-domain limits for one new flow of a UDP association (its
    /// first datagram to a destination and port): the same limits, counted
    /// under the same registrable domain, as a tunnel to it. The leases
    /// are held as long as the flow is.
    pub(super) async fn limit_datagram(
        &self,
        account: Uuid,
        user: Uuid,
        record: &UserRecord,
        destination: &DatagramAddr,
    ) -> Result<Vec<Lease>, ProxyError> {
        let host = match destination {
            DatagramAddr::Ip(addr) => NormalizedHost::ip(addr.ip()),
            DatagramAddr::Name(name, _) => normalize_host(name)
                .map(|text| NormalizedHost { text, ip: None })
                .map_err(|e| {
                    ProxyError::new(ErrorKind::BadRequest, format!("datagram destination: {e}"))
                })?,
        };
        let target = host.policy_target();
        let domain = target.registrable_domain();
        let operator_limit = self.operator.current().limit_for(&target);
        let owner = Owner {
            account,
            user,
            record,
        };
        self.limits(owner, operator_limit, &domain).await
    }

    /// Whether a datagram may leave for its destination (by name or
    /// address): the same denials as a tunnel. The domain limits are the
    /// flow's, asked once per new flow ([`Self::limit_datagram`]).
    pub(crate) fn permits_datagram(&self, record: &UserRecord, destination: &DatagramAddr) -> bool {
        let operator = self.operator.current();
        if denies_nothing(&operator, record) {
            return true;
        }
        let (host, port) = match destination {
            DatagramAddr::Ip(addr) => (NormalizedHost::ip(addr.ip()), addr.port()),
            DatagramAddr::Name(name, port) => match normalize_host(name) {
                Ok(text) => (NormalizedHost { text, ip: None }, *port),
                Err(_) => return false,
            },
        };
        let target = host.policy_target();
        operator.permits(&target, port).is_ok() && customer_refusal(record, &target).is_none()
    }
}

/// Whose per-domain limits a tunnel or flow is held to.
#[derive(Clone, Copy)]
struct Owner<'a> {
    account: Uuid,
    user: Uuid,
    record: &'a UserRecord,
}

/// The site a target's exits are judged for (`crate::sites`): its
/// registrable domain (`domain`), or for an IPv4 literal its /24 (an IPv6
/// literal's registrable domain is already its /64), so a site spread over
/// a block is one site. Shares `domain` when they are the same.
fn site_of(ip: Option<IpAddr>, domain: &Arc<str>) -> Arc<str> {
    match ip {
        Some(ip @ IpAddr::V4(_)) => Arc::from(address_block(ip)),
        _ => domain.clone(),
    }
}

/// The block an address is counted under when no name is known: its /24
/// (IPv4) or /64 (IPv6).
fn address_block(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            format!("{a}.{b}.{c}.0/24")
        }
        v6 => PolicyTarget::Ip(v6).registrable_domain(),
    }
}

fn domain_limit(policy: &TrafficPolicy) -> proxynet_store::policy::Limit {
    proxynet_store::policy::Limit {
        new_tunnels_per_second: policy.domain_new_tunnels_per_second,
        max_concurrent_tunnels: policy.domain_max_concurrent_tunnels,
    }
}

#[cfg(test)]
mod tests {
    use super::{address_block, site_of};
    use std::sync::Arc;

    #[test]
    fn a_site_is_the_registrable_domain_or_the_addresss_block() {
        let domain: Arc<str> = Arc::from("example.com");
        assert!(Arc::ptr_eq(&site_of(None, &domain), &domain), "shared");
        let v4: Arc<str> = Arc::from("192.0.2.77");
        assert_eq!(
            &*site_of(Some("192.0.2.77".parse().unwrap()), &v4),
            "192.0.2.0/24"
        );
        let v6: Arc<str> = Arc::from("2001:db8:1:2::/64");
        assert_eq!(
            &*site_of(Some("2001:db8:1:2::9".parse().unwrap()), &v6),
            "2001:db8:1:2::/64"
        );
    }

    #[test]
    fn an_address_without_a_name_counts_as_its_block() {
        let block = |ip: &str| address_block(ip.parse().unwrap());
        assert_eq!(block("192.0.2.77"), "192.0.2.0/24");
        assert_eq!(block("::ffff:192.0.2.1"), "192.0.2.0/24");
        assert_eq!(block("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
    }
}
