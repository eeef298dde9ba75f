//! Allow-listed source networks of a proxy user (IP allow-list login):
//! checked against the account's [`AllowlistRules`] and the username
//! grammar, counted against the account's bound, and stored so that no two
//! users' networks overlap.

use uuid::Uuid;

use crate::ceilings::AllowlistRules;
use crate::error::ApiError;

/// Checks CIDRs (address/prefix, IPv4 or IPv6) against the account's rules
/// (prefix length, special ranges) and the allow-list options.
pub(super) fn validate_allowlist(
    username: &str,
    cidrs: &[String],
    options: &str,
    rules: &AllowlistRules,
) -> Result<(), ApiError> {
    if cidrs.len() > 256 {
        return Err(ApiError::BadRequest(
            "allowed_source_cidrs: at most 256".into(),
        ));
    }
    for c in cidrs {
        let cidr = c
            .parse::<proxynet_common::egress::Cidr>()
            .map_err(|e| ApiError::BadRequest(format!("allowed_source_cidrs: {e}")))?;
        check_allowlist_network(&cidr, rules)?;
    }
    if options.is_empty() {
        return Ok(());
    }
    if options.len() > proxynet_wire::username::MAX_OPTIONS_BYTES {
        return Err(ApiError::BadRequest(format!(
            "allowlist_options: at most {} bytes",
            proxynet_wire::username::MAX_OPTIONS_BYTES
        )));
    }
    // The superproxy's own parser, on the string it will parse at login:
    // options accepted here always parse there.
    proxynet_wire::username::parse_options(username, options)
        .map(drop)
        .map_err(|e| {
            ApiError::BadRequest(format!(
                "allowlist_options: {e} (key-value pairs of the username grammar, e.g. \
                 country-de-type-dc; docs/username.md)"
            ))
        })
}

/// One allow-listed network against the account's rules: no wider than the
/// account may claim (IPv4 /24, IPv6 /48 unless the operator allowed more),
/// and no special-purpose range (private, loopback, multicast, ...) unless the
/// operator allowed those: anyone behind such an address could otherwise
/// ride the account without a password. IPv4-mapped IPv6 networks are
/// refused: peers are matched as IPv4.
fn check_allowlist_network(
    cidr: &proxynet_common::egress::Cidr,
    rules: &AllowlistRules,
) -> Result<(), ApiError> {
    if let std::net::IpAddr::V6(v6) = cidr.network() {
        if v6.to_ipv4_mapped().is_some() && cidr.prefix_len() >= 96 {
            return Err(ApiError::BadRequest(format!(
                "allowed_source_cidrs: {cidr} is IPv4-mapped; write the IPv4 network"
            )));
        }
    }
    rules
        .permits(cidr)
        .map_err(|reason| ApiError::Forbidden(format!("allowed_source_cidrs: {reason}")))
}

/// Refuses more allow-listed networks than the account may hold, counting
/// those of its other users.
pub(super) async fn check_network_count(
    db: &sqlx::PgPool,
    account: Uuid,
    user: Option<Uuid>,
    adding: usize,
    rules: &AllowlistRules,
) -> Result<(), ApiError> {
    if adding == 0 {
        return Ok(());
    }
    let (others,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM user_source_cidrs c JOIN proxy_users u ON u.id = c.user_id
          WHERE u.account_id = $1 AND u.deleted_at IS NULL AND ($2::uuid IS NULL OR u.id <> $2)",
    )
    .bind(account)
    .bind(user)
    .fetch_one(db)
    .await?;
    let max = i64::from(rules.max_networks());
    if others + adding as i64 > max {
        return Err(ApiError::Forbidden(format!(
            "allowed_source_cidrs: the account may hold {max} allow-listed networks (an operator can allow more)"
        )));
    }
    Ok(())
}

/// Replaces a user's allow-listed CIDRs inside `tx`; an overlap with another
/// user's is a 409 that names neither that user, nor its account, nor its
/// network.
pub(super) async fn set_cidrs(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    user: Uuid,
    cidrs: &[String],
) -> Result<(), ApiError> {
    sqlx::query("DELETE FROM user_source_cidrs WHERE user_id = $1")
        .bind(user)
        .execute(&mut **tx)
        .await?;
    for c in cidrs {
        sqlx::query("INSERT INTO user_source_cidrs (user_id, cidr) VALUES ($1, $2::cidr)")
            .bind(user)
            .bind(c)
            .execute(&mut **tx)
            .await
            .map_err(|e| match &e {
                sqlx::Error::Database(db)
                    if matches!(db.code().as_deref(), Some("23P01") | Some("23505")) =>
                {
                    ApiError::Conflict(format!(
                        "allowed_source_cidrs: {c} cannot be allow-listed: it overlaps a network already in use"
                    ))
                }
                _ => ApiError::from(e),
            })?;
    }
    Ok(())
}
