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

use proxynet_store::policy::{normalize_host, PolicyTarget, Refusal, TrafficPolicy};
use proxynet_store::UserRecord;
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
    host: String,
    domain: Arc<str>,
    operator: Arc<proxynet_store::policy::OperatorPolicy>,
}

/// What the stage lets through: the per-domain leases the tunnel holds, the
/// normalised host (for revocation by a later policy change) and the
/// registrable domain its usage is counted under.
pub(super) struct Permitted {
    pub leases: Vec<Lease>,
    pub host: String,
    pub domain: Arc<str>,
}

fn denied(whose: &str, refusal: &Refusal) -> ProxyError {
    ProxyError::new(
        ErrorKind::TargetDenied,
        format!("the target is refused by {whose} traffic policy: {refusal}"),
    )
}

/// The normalised form policies match; a name that cannot be one is a bad
/// request (nothing could resolve it).
fn normalized(target: &Target) -> Result<String, ProxyError> {
    match &target.host {
        Host::Ip(ip) => Ok(ip.to_canonical().to_string()),
        Host::Name(name) => normalize_host(name)
            .map_err(|e| ProxyError::new(ErrorKind::BadRequest, format!("target host: {e}"))),
    }
}

/// The customer's refusal of a normalised target, if any: the account's
/// rules first (they bound the user's), then the user's.
pub fn customer_refusal(record: &UserRecord, host: &str) -> Option<ProxyError> {
    let target = PolicyTarget::from_normalized(host);
    for (whose, policy) in [
        ("the account's", &record.account_policy),
        ("the user's", &record.policy),
    ] {
        if let Err(refusal) = policy.permits(&target) {
            return Some(denied(whose, &refusal));
        }
    }
    None
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
        let host = normalized(target)?;
        let policy_target = PolicyTarget::from_normalized(&host);
        let operator = self.operator.current();
        operator
            .permits(&policy_target, target.port)
            .map_err(|r| denied("the operator's", &r))?;
        if let Some(refusal) = customer_refusal(&client.record, &host) {
            return Err(refusal);
        }
        let domain: Arc<str> = policy_target.registrable_domain().into();
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
        let policy_target = PolicyTarget::from_normalized(&host);
        let mut leases = Vec::new();
        if let Some((key, limit)) = operator.limit_for(&policy_target) {
            leases.extend(
                self.admission
                    .admit_domain("op", &key, limit, "the network's")
                    .await?,
            );
        }
        for (scope, whose, policy) in [
            (
                format!("a:{}", client.account_id),
                "the account's",
                &client.record.account_policy,
            ),
            (
                format!("u:{}", client.user_id),
                "the user's",
                &client.record.policy,
            ),
        ] {
            if policy.has_domain_limits() {
                leases.extend(
                    self.admission
                        .admit_domain(&scope, &domain, domain_limit(policy), whose)
                        .await?,
                );
            }
        }
        Ok(Permitted {
            leases,
            host,
            domain,
        })
    }

    /// Whether a datagram may leave for a destination (by name or address):
    /// the same denials as a tunnel, no domain limits (an association is
    /// admitted once, like one tunnel).
    pub fn permits_datagram(&self, record: &UserRecord, host: &str, port: u16) -> bool {
        let Ok(host) = normalize_host(host) else {
            return false;
        };
        self.operator
            .current()
            .permits(&PolicyTarget::from_normalized(&host), port)
            .is_ok()
            && customer_refusal(record, &host).is_none()
    }
}

fn domain_limit(policy: &TrafficPolicy) -> proxynet_store::policy::Limit {
    proxynet_store::policy::Limit {
        new_tunnels_per_second: policy.domain_new_tunnels_per_second,
        max_concurrent_tunnels: policy.domain_max_concurrent_tunnels,
    }
}
