//! The exit's provenance as its viewer may see it: operators everything,
//! an account the customer view of an exit that carried its traffic.
//!
//! A customer learns the exit's public address only for the times the exit
//! carried that customer's traffic: an observation is shown when its time
//! of validity (from its first sighting to the next address's, or now)
//! overlaps a minute of the account's usage through the exit. A residential
//! or mobile address is a person's line, so a customer sees its network
//! (/24, /48), never the host.

use super::*;

#[derive(sqlx::FromRow)]
pub(super) struct ProvenanceRow {
    source_type: String,
    country: String,
    asn: Option<i64>,
    withdrawn_at: Option<DateTime<Utc>>,
    source_name: Option<String>,
    channel: Option<String>,
    supplier: Option<String>,
    agreement_ref: Option<String>,
    notice_description: Option<String>,
    source_opt_out: Option<String>,
    liable_party: Option<String>,
    abuse_contact: Option<String>,
    consent_required: Option<bool>,
    consent_state: Option<String>,
    granted_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    notice_version: Option<String>,
    notice_sha256: Option<String>,
    consent_method: Option<String>,
    consent_opt_out: Option<String>,
    evidence_ref: Option<String>,
    egress_verification: String,
    behind_nat: bool,
    /// The public addresses the reflector last saw, one per declared egress.
    observed_egress: Vec<String>,
}

/// `GET /v1/exits/{id}/provenance`: operators see everything; an account
/// key sees the customer view of an exit that carried its traffic (404 for
/// any other), never contracts or evidence references.
pub(crate) async fn exit_provenance(
    caller: Caller,
    State(state): State<AppState>,
    Path(exit): Path<Uuid>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(account) = caller.scope() {
        let carried: Option<(i32,)> = sqlx::query_as(
            "SELECT 1 FROM usage_ledger WHERE account_id = $1 AND exit_id = $2 LIMIT 1",
        )
        .bind(account)
        .bind(exit)
        .fetch_optional(&state.db)
        .await?;
        if carried.is_none() {
            return Err(ApiError::NotFound("exit"));
        }
    }
    let row: ProvenanceRow = sqlx::query_as(
        "SELECT e.source_type, e.country, e.asn, e.withdrawn_at, s.name AS source_name, s.channel,
                s.supplier, s.agreement_ref, s.notice_description, s.opt_out AS source_opt_out,
                s.liable_party, s.abuse_contact, s.consent_required,
                c.state AS consent_state, c.granted_at, c.expires_at, c.revoked_at, c.notice_version,
                c.notice_sha256, c.method AS consent_method, c.opt_out AS consent_opt_out, c.evidence_ref,
                e.egress_verification, e.behind_nat,
                ARRAY(SELECT DISTINCT ON (o.egress) host(o.observed_ip) FROM exit_egress_observations o
                       WHERE o.exit_id = e.id ORDER BY o.egress, o.first_seen DESC, o.id DESC) AS observed_egress
           FROM exits e LEFT JOIN sources s ON s.id = e.source_id
           LEFT JOIN LATERAL (SELECT * FROM consent_records WHERE exit_id = e.id ORDER BY version DESC LIMIT 1) c ON true
          WHERE e.id = $1",
    )
    .bind(exit)
    .fetch_optional(&state.db)
    .await?
    .ok_or(ApiError::NotFound("exit"))?;
    let record = state.projector.exit_record(exit).await.ok().flatten();
    let now_ms = Utc::now().timestamp_millis();
    let blocked = record.as_ref().and_then(|r| r.provenance_block(now_ms));
    let consent_status = match (row.consent_required, row.consent_state.as_deref()) {
        (Some(false) | None, _) => "not_required",
        (Some(true), None) => "missing",
        (Some(true), Some("revoked")) => "revoked",
        (Some(true), Some(_)) if row.expires_at.is_some_and(|e| e <= Utc::now()) => "expired",
        (Some(true), Some(_)) => "granted",
    };
    let mut observed = match caller.scope() {
        None => row.observed_egress.clone(),
        Some(account) => {
            let seen = observed_in_windows(&state, exit, account).await?;
            if matches!(row.source_type.as_str(), "res" | "mobile") {
                seen.iter().filter_map(|ip| network_of(ip)).collect()
            } else {
                seen
            }
        }
    };
    observed.sort_unstable();
    observed.dedup();
    let mut view = serde_json::json!({
        "exit_id": exit,
        "source_type": row.source_type,
        "channel": row.channel,
        "country": row.country,
        "asn": row.asn,
        "routable": blocked.is_none() && record.is_some(),
        "blocked": blocked.map(|b| b.as_str()),
        "withdrawn_at": row.withdrawn_at,
        // The public address(es) the world sees this exit's traffic come
        // from, as our reflector observed them, and whether they agree with
        // what the exit declared (`verified`, `behind_nat`, `unobserved`,
        // `mismatch`).
        "egress": {
            "verification": row.egress_verification,
            "behind_nat": row.behind_nat,
            "observed": observed,
        },
        "consent": {
            "status": consent_status,
            "granted_at": row.granted_at,
            "expires_at": row.expires_at,
            "revoked_at": row.revoked_at,
            "notice_version": row.notice_version,
            "notice_sha256": row.notice_sha256,
        },
    });
    if caller == Caller::Operator {
        view["source"] = serde_json::json!({
            "name": row.source_name,
            "supplier": row.supplier,
            "agreement_ref": row.agreement_ref,
            "notice_description": row.notice_description,
            "opt_out": row.source_opt_out,
            "liable_party": row.liable_party,
            "abuse_contact": row.abuse_contact,
        });
        view["consent"]["method"] = serde_json::json!(row.consent_method);
        view["consent"]["opt_out"] = serde_json::json!(row.consent_opt_out);
        view["consent"]["evidence_ref"] = serde_json::json!(row.evidence_ref);
    }
    Ok(Json(view))
}

/// The public addresses observed for `exit` while it carried `account`'s
/// traffic: each observation holds from its first sighting until the next
/// observation of the same egress (the latest until now), and counts when
/// one of the account's usage minutes through the exit overlaps that span.
async fn observed_in_windows(
    state: &AppState,
    exit: Uuid,
    account: Uuid,
) -> Result<Vec<String>, ApiError> {
    let rows: Vec<(String,)> = sqlx::query_as(
        "WITH spans AS (
             SELECT o.observed_ip, o.first_seen,
                    COALESCE(LEAD(o.first_seen) OVER (PARTITION BY o.egress ORDER BY o.first_seen, o.id),
                             now()) AS until
               FROM exit_egress_observations o WHERE o.exit_id = $1)
         SELECT DISTINCT host(s.observed_ip) FROM spans s
          WHERE EXISTS (SELECT 1 FROM usage_ledger u
                         WHERE u.account_id = $2 AND u.exit_id = $1
                           AND u.minute < s.until
                           AND u.minute + interval '1 minute' > s.first_seen)",
    )
    .bind(exit)
    .bind(account)
    .fetch_all(&state.db)
    .await?;
    Ok(rows.into_iter().map(|(ip,)| ip).collect())
}

/// The network a residential address is shown as: its /24 (IPv4) or /48
/// (IPv6), as `198.51.100.0/24`.
fn network_of(address: &str) -> Option<String> {
    match address.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(v4) => {
            let masked = u32::from(v4) & 0xffff_ff00;
            Some(format!("{}/24", std::net::Ipv4Addr::from(masked)))
        }
        std::net::IpAddr::V6(v6) => {
            let masked = u128::from(v6) & (!0u128 << 80);
            Some(format!("{}/48", std::net::Ipv6Addr::from(masked)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::network_of;

    #[test]
    fn a_residential_address_is_shown_as_its_network() {
        assert_eq!(
            network_of("198.51.100.77").as_deref(),
            Some("198.51.100.0/24")
        );
        assert_eq!(
            network_of("2001:db8:1234:5678::9").as_deref(),
            Some("2001:db8:1234::/48")
        );
        assert_eq!(network_of("not an address"), None);
    }
}
