//! Traffic policy by target domain (docs/policy.md): the customer's rules on
//! accounts and users (validated and normalised here, stored with them, and
//! projected in every user record), and the operator's rules for every
//! account (`GET/PUT /v1/policy`, projected to one Redis key and announced).
//! Matching itself lives in `proxynet_store::policy`, shared with the
//! superproxy, so what is accepted here is what is enforced there.

use crate::extract::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use proxynet_store::policy::{
    normalize_entry, normalize_list, normalize_retry_rules, OperatorPolicy, RetryRule,
    TrafficPolicy,
};
use serde::Serialize;
use serde_json::Value;

use crate::auth::Operator;
use crate::error::ApiError;
use crate::{audit, AppState};

/// The largest per-domain rate or concurrency a policy may name (as the
/// policies' schemas say).
const MAX_LIMIT: u32 = proxynet_store::policy::MAX_DOMAIN_LIMIT;

/// Fields of a JSON object outside `known`: refused, as every other body.
fn refuse_unknown(field: &str, value: &Value, known: &[&str]) -> Result<(), ApiError> {
    let Some(object) = value.as_object() else {
        return Err(ApiError::BadRequest(format!("{field}: an object")));
    };
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ApiError::BadRequest(format!(
            "{field}: unknown field {k:?} (one of {})",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

fn bad(e: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

fn check_limit(field: &str, value: Option<u32>) -> Result<(), ApiError> {
    match value {
        Some(v) if v == 0 || v > MAX_LIMIT => Err(ApiError::BadRequest(format!(
            "{field}: from 1 to {MAX_LIMIT}"
        ))),
        _ => Ok(()),
    }
}

/// A customer policy as sent (`{"policy": {...}}` on an account or user):
/// unknown fields refused, lists normalised (IDNA, lower case, no trailing
/// dot, networks canonical), limits in range.
pub(crate) fn customer_policy(value: Value) -> Result<TrafficPolicy, ApiError> {
    refuse_unknown("policy", &value, &TrafficPolicy::FIELDS)?;
    let mut policy: TrafficPolicy =
        serde_json::from_value(value).map_err(|e| ApiError::BadRequest(format!("policy: {e}")))?;
    policy.allowed_domains =
        normalize_list("policy.allowed_domains", &policy.allowed_domains).map_err(bad)?;
    policy.denied_domains =
        normalize_list("policy.denied_domains", &policy.denied_domains).map_err(bad)?;
    check_limit(
        "policy.domain_new_tunnels_per_second",
        policy.domain_new_tunnels_per_second,
    )?;
    check_limit(
        "policy.domain_max_concurrent_tunnels",
        policy.domain_max_concurrent_tunnels,
    )?;
    Ok(policy)
}

/// Retry rules as sent (`"retry_rules": [...]` on a user, an account, or
/// the operator's policy): a list of at most 20 rules, each's unknown
/// fields refused, sites normalised as policy entries, statuses, header and
/// `retry` checked ([`RetryRule::normalized`]). `field` names the list in
/// errors.
pub(crate) fn retry_rules(field: &str, value: Value) -> Result<Vec<RetryRule>, ApiError> {
    let Some(items) = value.as_array() else {
        return Err(ApiError::BadRequest(format!(
            "{field}: a list of rules ({{\"sites\", \"statuses\", \"header\", \"retry\", \"cool\"}})"
        )));
    };
    for item in items {
        refuse_unknown(&format!("{field}[]"), item, &RetryRule::FIELDS)?;
    }
    let rules: Vec<RetryRule> =
        serde_json::from_value(value).map_err(|e| ApiError::BadRequest(format!("{field}: {e}")))?;
    normalize_retry_rules(field, rules).map_err(bad)
}

/// A user's policy may narrow its account's, never widen it: its limits no
/// higher, its allow-list inside the account's. (Denials add up anyway, and
/// the superproxy checks both policies, so a later tightening of the
/// account binds users whose stored policy predates it.)
pub(crate) fn within_account(
    user: &TrafficPolicy,
    account: &TrafficPolicy,
) -> Result<(), ApiError> {
    for (field, own, bound) in [
        (
            "policy.domain_new_tunnels_per_second",
            user.domain_new_tunnels_per_second,
            account.domain_new_tunnels_per_second,
        ),
        (
            "policy.domain_max_concurrent_tunnels",
            user.domain_max_concurrent_tunnels,
            account.domain_max_concurrent_tunnels,
        ),
    ] {
        if let (Some(own), Some(bound)) = (own, bound) {
            if own > bound {
                return Err(ApiError::Forbidden(format!(
                    "{field}: {own} is above the account's {bound}"
                )));
            }
        }
    }
    if !account.allowed_domains.is_empty() {
        if let Some(outside) = user
            .allowed_domains
            .iter()
            .find(|e| !proxynet_store::policy::entry_within(e, &account.allowed_domains))
        {
            return Err(ApiError::Forbidden(format!(
                "policy.allowed_domains: {outside:?} is outside the account's allowed_domains"
            )));
        }
    }
    Ok(())
}

/// The stored policy of an account (an empty one when it has none).
pub(crate) async fn account_policy(
    db: &sqlx::PgPool,
    account: uuid::Uuid,
) -> Result<TrafficPolicy, ApiError> {
    let row: Option<(sqlx::types::Json<TrafficPolicy>,)> =
        sqlx::query_as("SELECT policy FROM accounts WHERE id = $1 AND deleted_at IS NULL")
            .bind(account)
            .fetch_optional(db)
            .await?;
    row.map(|(p,)| p.0).ok_or(ApiError::NotFound("account"))
}

#[derive(Serialize)]
pub(crate) struct OperatorPolicyView {
    #[serde(flatten)]
    policy: OperatorPolicy,
    version: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    updated_at: Option<DateTime<Utc>>,
}

/// `GET /v1/policy` (operators): the rules every account's traffic obeys.
pub(crate) async fn get(
    _: Operator,
    State(state): State<AppState>,
) -> Result<Json<OperatorPolicyView>, ApiError> {
    let row: Option<(sqlx::types::Json<OperatorPolicy>, i64, DateTime<Utc>)> =
        sqlx::query_as("SELECT body, version, updated_at FROM operator_policy")
            .fetch_optional(&state.db)
            .await?;
    Ok(Json(match row {
        Some((body, version, at)) => OperatorPolicyView {
            policy: body.0,
            version,
            updated_at: Some(at),
        },
        None => OperatorPolicyView {
            policy: OperatorPolicy::default(),
            version: 0,
            updated_at: None,
        },
    }))
}

/// `PUT /v1/policy` (operators): replaces the operator's rules, audited, and
/// announced to every superproxy (which re-reads them at once and cuts open
/// tunnels to what is now refused).
pub(crate) async fn put(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<Value>,
) -> Result<Json<OperatorPolicyView>, ApiError> {
    let policy = operator_policy(body)?;
    let mut tx = state.db.begin().await?;
    let (version, at): (i64, DateTime<Utc>) = sqlx::query_as(
        "INSERT INTO operator_policy (singleton, body) VALUES (true, $1)
         ON CONFLICT (singleton) DO UPDATE
            SET body = EXCLUDED.body, version = operator_policy.version + 1, updated_at = now()
         RETURNING version, updated_at",
    )
    .bind(sqlx::types::Json(&policy))
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        "operator",
        "policy.update",
        "operator-policy",
        serde_json::to_value(&policy).unwrap_or_default(),
    )
    .await?;
    tx.commit().await?;
    state.projector.operator_policy().await;
    Ok(Json(OperatorPolicyView {
        policy,
        version,
        updated_at: Some(at),
    }))
}

/// The operator's policy as sent, validated and normalised.
fn operator_policy(value: Value) -> Result<OperatorPolicy, ApiError> {
    refuse_unknown("policy", &value, &OperatorPolicy::FIELDS)?;
    // Checked apart (their own unknown fields, their bounds); a `null` is
    // left to the parse below, which refuses it as for every other list.
    let rules = match value.get("retry_rules").filter(|v| !v.is_null()) {
        Some(rules) => retry_rules("retry_rules", rules.clone())?,
        None => Vec::new(),
    };
    if let Some(limits) = value.get("domain_limits").and_then(Value::as_array) {
        for l in limits {
            refuse_unknown(
                "domain_limits[]",
                l,
                &["domain", "new_tunnels_per_second", "max_concurrent_tunnels"],
            )?;
        }
    }
    if let Some(default) = value.get("default_domain_limit").filter(|v| !v.is_null()) {
        refuse_unknown(
            "default_domain_limit",
            default,
            &["new_tunnels_per_second", "max_concurrent_tunnels"],
        )?;
    }
    let mut policy: OperatorPolicy =
        serde_json::from_value(value).map_err(|e| ApiError::BadRequest(format!("policy: {e}")))?;
    policy.retry_rules = rules;
    policy.denied_domains =
        normalize_list("denied_domains", &policy.denied_domains).map_err(bad)?;
    if policy.denied_ports.len() > 1000 || policy.denied_ports.contains(&0) {
        return Err(ApiError::BadRequest(
            "denied_ports: at most 1000 ports from 1 to 65535".into(),
        ));
    }
    policy.denied_ports.sort_unstable();
    policy.denied_ports.dedup();
    if policy.domain_limits.len() > proxynet_store::policy::MAX_ENTRIES {
        return Err(ApiError::BadRequest(
            "domain_limits: at most 1000 entries".into(),
        ));
    }
    let mut seen = Vec::with_capacity(policy.domain_limits.len());
    for l in &mut policy.domain_limits {
        l.domain = normalize_entry(&l.domain)
            .map_err(|e| ApiError::BadRequest(format!("domain_limits[].domain: {e}")))?;
        if seen.contains(&l.domain) {
            return Err(ApiError::BadRequest(format!(
                "domain_limits: {:?} appears twice",
                l.domain
            )));
        }
        seen.push(l.domain.clone());
        if !l.limit.is_set() {
            return Err(ApiError::BadRequest(format!(
                "domain_limits: {:?} sets neither new_tunnels_per_second nor max_concurrent_tunnels",
                l.domain
            )));
        }
        check_limit(
            "domain_limits[].new_tunnels_per_second",
            l.limit.new_tunnels_per_second,
        )?;
        check_limit(
            "domain_limits[].max_concurrent_tunnels",
            l.limit.max_concurrent_tunnels,
        )?;
    }
    if let Some(d) = &policy.default_domain_limit {
        check_limit(
            "default_domain_limit.new_tunnels_per_second",
            d.new_tunnels_per_second,
        )?;
        check_limit(
            "default_domain_limit.max_concurrent_tunnels",
            d.max_concurrent_tunnels,
        )?;
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn customer_policies_are_normalised_and_unknown_fields_refused() {
        let p = customer_policy(json!({"denied_domains": ["*.LocalHost.", "localhost"],
                                       "allowed_domains": ["Пример.рф"]}))
        .unwrap();
        assert_eq!(p.denied_domains, ["localhost"]);
        assert_eq!(p.allowed_domains, ["xn--e1afmkfd.xn--p1ai"]);
        assert!(customer_policy(json!({"denied_domain": []})).is_err());
        assert!(customer_policy(json!({"domain_new_tunnels_per_second": 0})).is_err());
        assert!(customer_policy(json!({"denied_domains": ["a..b"]})).is_err());
    }

    #[test]
    fn a_user_may_narrow_its_account_never_widen_it() {
        let account = customer_policy(json!({"allowed_domains": ["example.test"],
                                             "domain_new_tunnels_per_second": 5}))
        .unwrap();
        let ok = customer_policy(json!({"allowed_domains": ["api.example.test"],
                                        "domain_new_tunnels_per_second": 2}))
        .unwrap();
        assert!(within_account(&ok, &account).is_ok());
        let wider = customer_policy(json!({"domain_new_tunnels_per_second": 6})).unwrap();
        assert!(within_account(&wider, &account).is_err());
        let outside = customer_policy(json!({"allowed_domains": ["other.test"]})).unwrap();
        assert!(within_account(&outside, &account).is_err());
    }

    #[test]
    fn operator_policies_refuse_duplicates_and_empty_limits() {
        let p = operator_policy(
            json!({"denied_domains": ["Blocked.Test."], "denied_ports": [6667, 6667],
            "domain_limits": [{"domain": "Example.com", "new_tunnels_per_second": 3}]}),
        )
        .unwrap();
        assert_eq!(p.denied_domains, ["blocked.test"]);
        assert_eq!(p.denied_ports, [6667]);
        assert_eq!(p.domain_limits[0].domain, "example.com");
        assert!(operator_policy(json!({"domain_limits": [{"domain": "a.test"}]})).is_err());
        assert!(operator_policy(json!({"domain_limits": [
            {"domain": "a.test", "max_concurrent_tunnels": 1},
            {"domain": "A.test", "max_concurrent_tunnels": 2}]}))
        .is_err());
        assert!(operator_policy(json!({"denied_ports": [0]})).is_err());
        assert!(
            operator_policy(json!({"domain_limits": [{"domain": "a.test", "rate": 1}]})).is_err()
        );
    }

    #[test]
    fn retry_rules_refuse_unknown_fields_and_are_normalised() {
        let rules = retry_rules(
            "retry_rules",
            json!([{"sites": ["*.Example.com"], "statuses": [403, 429], "header": "CF-Mitigated",
                    "retry": 2, "cool": true}]),
        )
        .unwrap();
        assert_eq!(rules[0].sites, ["example.com"]);
        assert_eq!(rules[0].header.as_deref(), Some("cf-mitigated"));
        for bad in [
            json!({"sites": []}),
            json!([{"statuses": [403], "retries": 2}]),
            json!([{"statuses": [403], "retry": 4}]),
            json!([{"statuses": [403], "retry": -1}]),
            json!([{"statuses": [70000]}]),
            json!(["403"]),
            json!(vec![json!({"statuses": [403]}); 21]),
        ] {
            assert!(retry_rules("retry_rules", bad.clone()).is_err(), "{bad}");
        }
        let p = operator_policy(
            json!({"retry_rules": [{"statuses": [403], "header": "cf-mitigated", "retry": 1}]}),
        )
        .unwrap();
        // A header alone, or a success status, never makes a ban.
        assert!(operator_policy(json!({"retry_rules": [{"header": "cf-mitigated"}]})).is_err());
        assert!(operator_policy(json!({"retry_rules": [{"statuses": [200]}]})).is_err());
        assert_eq!(p.retry_rules.len(), 1);
        assert!(operator_policy(json!({"retry_rules": [{"header": "cf mitigated"}]})).is_err());
        assert!(operator_policy(json!({"retry_rules": [{"statuses": [403], "x": 1}]})).is_err());
    }
}
