//! What a caller may store as a user's limits: an operator's become the
//! user's ceilings; an account key's are fitted under those ceilings and
//! the account's entitlements ([`crate::ceilings`]).

use uuid::Uuid;

use crate::auth::Caller;
use crate::ceilings::{fit_under, Ceiling, Entitlements, Limits};
use crate::error::ApiError;

/// The account's entitlements, 404 if the account is absent or deleted.
pub(crate) async fn entitlements(
    db: impl sqlx::PgExecutor<'_>,
    account: Uuid,
) -> Result<Entitlements, ApiError> {
    let row: Option<(sqlx::types::Json<Entitlements>,)> =
        sqlx::query_as("SELECT entitlements FROM accounts WHERE id = $1 AND deleted_at IS NULL")
            .bind(account)
            .fetch_optional(db)
            .await?;
    row.map(|(e,)| e.0).ok_or(ApiError::NotFound("account"))
}

/// What the caller may store as a user's limits and ceilings: an operator's
/// limits become the ceilings; an account key's are fitted under the user's
/// ceilings and the account's entitlements.
pub(super) fn limits_to_store(
    caller: Caller,
    mut limits: Limits,
    ceilings: &Limits,
    entitled: &Entitlements,
) -> Result<(Limits, Limits), ApiError> {
    match caller {
        Caller::Operator => Ok((limits.clone(), limits)),
        Caller::Account(_) => {
            // What a left-out field takes: the user's ceiling, no higher
            // than the account's entitlement (else `{}` could never pass).
            let bounded = crate::ceilings::stricter(ceilings, &entitled.limits);
            let fill = Limits {
                max_concurrent_tunnels: ceilings
                    .max_concurrent_tunnels
                    .and(bounded.max_concurrent_tunnels),
                max_new_tunnels_per_second: ceilings
                    .max_new_tunnels_per_second
                    .and(bounded.max_new_tunnels_per_second),
                bandwidth_bytes: ceilings.bandwidth_bytes.and(bounded.bandwidth_bytes),
                period: ceilings.period.clone(),
                warn_percent: None,
                allowed_source_types: ceilings
                    .allowed_source_types
                    .as_ref()
                    .and(bounded.allowed_source_types),
                allowed_countries: ceilings
                    .allowed_countries
                    .as_ref()
                    .and(bounded.allowed_countries),
                allowed_channels: ceilings
                    .allowed_channels
                    .as_ref()
                    .and(bounded.allowed_channels),
            };
            fit_under(&mut limits, &fill, Ceiling::User)?;
            fit_under(&mut limits, &entitled.limits, Ceiling::Account)?;
            Ok((limits, ceilings.clone()))
        }
    }
}
