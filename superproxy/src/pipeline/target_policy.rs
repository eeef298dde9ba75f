//! Stage between parsing the target and admission: may this client's
//! traffic go to this target at all (the operator's denied domains and
//! ports, the account's and the user's allowed/denied domains), and within
//! the per-domain limits (the operator's aggregate over every account, the
//! account's over its users, the user's own). Checked before any exit is
//! used, so a refused name is never even resolved. Rules and matching:
//! `proxynet_store::policy`; docs/policy.md.
//!
//! Without any domain limit set (the default) this stage costs no Redis
//! round trip: the denials are matched against lists already in memory.

use proxynet_store::policy::{
    normalize_host, OperatorPolicy, PolicyTarget, Refusal, TrafficPolicy,
};
use proxynet_store::UserRecord;
use proxynet_wire::datagram::DatagramAddr;
use std::net::IpAddr;
use std::sync::Arc;

use crate::admission::{Admission, Lease};
use crate::error::{ErrorKind, ProxyError};
use crate::operator_policy::OperatorRules;
use crate::request::Client;
use crate::target::{Host, Target};

pub struct TargetPolicy {
    operator: Arc<OperatorRules>,
    admission: Arc<Admission>,
}

/// A target the denials let through, before its per-domain limits.
pub(super) struct Judged {
    host: NormalizedHost,
    domain: Arc<str>,
    operator: Arc<OperatorPolicy>,
}

/// What the stage lets through: the per-domain leases the tunnel holds, the
/// normalised host (for revocation by a later policy change) and the
/// registrable domain its usage is counted under.
pub(super) struct Permitted {
    pub leases: Vec<Lease>,
    pub host: String,
    pub domain: Arc<str>,
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
pub fn customer_refuses(record: &UserRecord, host: &str) -> bool {
    customer_refusal(record, &PolicyTarget::from_normalized(host)).is_some()
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
    pub fn new(operator: Arc<OperatorRules>, admission: Arc<Admission>) -> Self {
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
        Ok(Judged {
            host,
            domain,
            operator,
        })
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
            operator,
        } = judged;
        let mut leases = Vec::new();
        if let Some((key, limit)) = operator.limit_for(&host.policy_target()) {
            leases.extend(
                self.admission
                    .admit_domain("op", &key, limit, "the network's")
                    .await?,
            );
        }
        let record = &client.record;
        if record.account_policy.has_domain_limits() {
            let scope = format!("a:{}", client.account_id);
            let limit = domain_limit(&record.account_policy);
            leases.extend(
                self.admission
                    .admit_domain(&scope, &domain, limit, "the account's")
                    .await?,
            );
        }
        if record.policy.has_domain_limits() {
            let scope = format!("u:{}", client.user_id);
            let limit = domain_limit(&record.policy);
            leases.extend(
                self.admission
                    .admit_domain(&scope, &domain, limit, "the user's")
                    .await?,
            );
        }
        Ok(Permitted {
            leases,
            host: host.text,
            domain,
        })
    }

    /// Whether a datagram may leave for its destination (by name or
    /// address): the same denials as a tunnel, no domain limits (an
    /// association is admitted once, like one tunnel).
    pub fn permits_datagram(&self, record: &UserRecord, destination: &DatagramAddr) -> bool {
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

fn domain_limit(policy: &TrafficPolicy) -> proxynet_store::policy::Limit {
    proxynet_store::policy::Limit {
        new_tunnels_per_second: policy.domain_new_tunnels_per_second,
        max_concurrent_tunnels: policy.domain_max_concurrent_tunnels,
    }
}
