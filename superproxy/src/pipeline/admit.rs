//! Stage 3, admit: may this tunnel start now. The user's and the account's
//! bandwidth quotas (the shared counter and this instance's budget), then
//! their concurrency and new-tunnel rate limits as leases that live as long
//! as the tunnel.

use std::sync::Arc;

use crate::admission::{Admission, Leases};
use crate::error::{ErrorKind, ProxyError};
use crate::request::Client;
use crate::usage::{QuotaOwner, QuotaSpec, UsageRecorder};

/// The admission stage: the shared limits and the usage budgets.
pub(crate) struct Admit {
    admission: Arc<Admission>,
    usage: Arc<UsageRecorder>,
}

impl Admit {
    pub(crate) fn new(admission: Arc<Admission>, usage: Arc<UsageRecorder>) -> Self {
        Self { admission, usage }
    }

    /// The leases, and the quotas the tunnel's bytes count against (for its
    /// meter); or a 429 naming the exhausted quota or the limit reached.
    pub(super) async fn admit(
        &self,
        client: &Client,
    ) -> Result<(Leases, Vec<QuotaSpec>), ProxyError> {
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

#[cfg(test)]
mod tests;
