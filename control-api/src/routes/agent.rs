//! Exit enrollment and agent heartbeats.
//!
//! An operator creates a one-time enrollment token that names the exit's
//! source (its provenance: type, channel, supplier, ...) and fixes its
//! country, subdivision (`region`, ISO 3166-2), city and ASN. The agent exchanges it once for its own credential,
//! declaring its egress IPs and egress prefixes, and whether its host sits
//! behind NAT. From then on the agent heartbeats with that credential and
//! learns which superproxies to dial and which egress reflectors to ask
//! (`egress.rs` takes what they saw).

use crate::extract::Json;
use crate::extract::Path;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use proxynet_common::egress::{check_egress_prefix, Cidr};
use proxynet_common::secret::{constant_time_eq, sha256_hex, Secret};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use uuid::Uuid;

use crate::auth::{bearer, new_secret, Operator};
use crate::error::ApiError;
use crate::{audit, AppState};

mod deny;

use deny::{deny_list, sort_admin_claims};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateEnrollmentToken {
    name: String,
    /// The source (`POST /v1/sources`) the exit's address belongs to.
    source_id: Uuid,
    /// ISO 3166-1 alpha-2, upper case; one of the source's countries.
    #[schemars(regex(pattern = "^[A-Z]{2}$"))]
    country: String,
    /// ISO 3166-2 subdivision of `country` (`DE-BY`, any case), for the
    /// `state` / `region` username key.
    #[schemars(regex(pattern = "^[A-Za-z]{2}-[A-Za-z0-9]{1,3}$"))]
    region: Option<String>,
    /// Lower-case city (`a-z 0-9 _`), for city targeting.
    #[schemars(regex(pattern = "^[a-z0-9_]{1,64}$"))]
    city: Option<String>,
    /// Autonomous system number of the exit's egress IPs, for ASN targeting.
    #[schemars(range(min = 1))]
    asn: Option<u32>,
    /// Defaults to the server's `enrollment_ttl_secs`.
    #[schemars(range(min = 1, max = MAX_ENROLLMENT_TTL_SECS))]
    ttl_seconds: Option<u64>,
    /// The operator's word that the exit sits behind NAT (the world sees
    /// another public address than the one it binds). Only the token can
    /// say so: an agent's claim would dodge the egress mismatch flag.
    #[serde(default)]
    behind_nat: bool,
}

#[derive(Serialize)]
pub(super) struct EnrollmentToken {
    id: Uuid,
    /// Shown once; only its SHA-256 is stored.
    token: String,
    expires_at: DateTime<Utc>,
}

pub(super) async fn create_enrollment_token(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<CreateEnrollmentToken>,
) -> Result<(StatusCode, Json<EnrollmentToken>), ApiError> {
    if body.name.trim().is_empty() || body.name.len() > 200 {
        return Err(ApiError::BadRequest(
            "name: must be 1 to 200 characters".into(),
        ));
    }
    if body.country.len() != 2 || !body.country.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ApiError::BadRequest(
            "country: ISO 3166-1 alpha-2 code in upper case, e.g. DE".into(),
        ));
    }
    if let Some(city) = &body.city {
        if city.is_empty()
            || city.len() > 64
            || !city
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(ApiError::BadRequest("city: 1 to 64 of a-z 0-9 _".into()));
        }
    }
    if body.asn == Some(0) {
        return Err(ApiError::BadRequest("asn: 1 to 4294967295".into()));
    }
    let region = match &body.region {
        None => None,
        Some(code) => Some(
            proxynet_wire::username::parse_subdivision(code)
                .filter(|r| r.starts_with(&format!("{}-", body.country)))
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "region: an ISO 3166-2 subdivision code of the exit's country, \
                         {}-XXX (1 to 3 letters or digits after the dash), e.g. DE-BY",
                        body.country
                    ))
                })?,
        ),
    };
    let ttl = body.ttl_seconds.unwrap_or(state.config.enrollment_ttl_secs);
    if ttl == 0 || ttl > MAX_ENROLLMENT_TTL_SECS {
        return Err(ApiError::BadRequest(format!(
            "ttl_seconds: 1 to {MAX_ENROLLMENT_TTL_SECS}"
        )));
    }
    let source: Option<(String, String, Vec<String>)> =
        sqlx::query_as("SELECT source_type, supplier, countries FROM sources WHERE id = $1")
            .bind(body.source_id)
            .fetch_optional(&state.db)
            .await?;
    let (source_type, supplier, countries) =
        source.ok_or_else(|| ApiError::BadRequest("source_id: no such source".into()))?;
    if !countries.contains(&body.country) {
        return Err(ApiError::BadRequest(format!(
            "country: {} is not among the source's countries",
            body.country
        )));
    }
    let token = new_secret("pnenroll");
    let id = Uuid::new_v4();
    let mut tx = state.db.begin().await?;
    let (expires_at,): (DateTime<Utc>,) = sqlx::query_as(
        "INSERT INTO enrollment_tokens (id, token_sha256, name, source_type, owner, country, expires_at, city, asn, source_id, behind_nat, region)
         VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $8, $9, $10, $11, $12)
         RETURNING expires_at",
    )
    .bind(id)
    .bind(sha256_hex(&token))
    .bind(body.name.trim())
    .bind(&source_type)
    .bind(&supplier)
    .bind(&body.country)
    .bind(ttl as f64)
    .bind(&body.city)
    .bind(body.asn.map(i64::from))
    .bind(body.source_id)
    .bind(body.behind_nat)
    .bind(&region)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(&mut tx, "operator", "enrollment_token.create", &id.to_string(),
        serde_json::json!({"name": body.name, "source_id": body.source_id, "country": body.country, "region": region, "behind_nat": body.behind_nat})).await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(EnrollmentToken {
            id,
            token,
            expires_at,
        }),
    ))
}

/// An exit needs at least one egress IP or egress prefix.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Enroll {
    /// The one-time enrollment token.
    #[schemars(with = "String")]
    token: Secret,
    #[serde(default)]
    #[schemars(length(max = MAX_EGRESS_IPS))]
    egress_ips: Vec<IpAddr>,
    /// Prefixes the exit sends from any address of (`--egress-prefix`):
    /// CIDR, IPv6 /48 to /128, IPv4 /24 to /32.
    #[serde(default)]
    #[schemars(with = "Vec<String>", length(max = MAX_EGRESS_PREFIXES))]
    egress_prefixes: Vec<Cidr>,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    agent_version: String,
    /// The agent says its host sits behind NAT (`--behind-nat`). Recorded
    /// in the audit line only: whether a public address other than the
    /// declared egress is expected is the operator's word, on the token.
    #[serde(default)]
    behind_nat: bool,
    /// An upstream exit's partner gateway (`--upstream`): where it is and
    /// what it serves, never its credentials.
    #[serde(default)]
    upstream: Option<EnrollUpstream>,
}

/// An upstream exit's partner gateway: where it is and what it serves.
#[derive(Deserialize, serde::Serialize, Clone, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnrollUpstream {
    #[schemars(extend("enum" = ["http", "socks5h"]))]
    scheme: String,
    /// A host name or address.
    #[schemars(length(min = 1, max = 255))]
    host: String,
    #[schemars(range(min = 1))]
    port: u16,
    /// Countries served (ISO 3166-1 alpha-2, upper case); the token's is
    /// always served, and more than one needs the `country` key.
    #[serde(default)]
    #[schemars(length(max = 250), inner(regex(pattern = "^[A-Z]{2}$")))]
    countries: Vec<String>,
    /// The targeting keys (`session`, `country`, `city`) the partner's
    /// username template carries.
    #[serde(default)]
    #[schemars(length(max = 3))]
    keys: Vec<String>,
}

impl EnrollUpstream {
    /// The agent's word, checked; the token's country is always served.
    fn checked(mut self, token_country: &str) -> Result<Self, ApiError> {
        if !matches!(self.scheme.as_str(), "http" | "socks5h") {
            return Err(ApiError::BadRequest(
                "upstream.scheme: http or socks5h".into(),
            ));
        }
        if self.host.is_empty()
            || self.host.len() > 255
            || !self
                .host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'_'))
        {
            return Err(ApiError::BadRequest(
                "upstream.host: a host name or address".into(),
            ));
        }
        if self.port == 0 {
            return Err(ApiError::BadRequest("upstream.port: 1 to 65535".into()));
        }
        if self.countries.len() > 250
            || !self
                .countries
                .iter()
                .all(|c| c.len() == 2 && c.bytes().all(|b| b.is_ascii_uppercase()))
        {
            return Err(ApiError::BadRequest(
                "upstream.countries: ISO 3166-1 alpha-2 codes in upper case".into(),
            ));
        }
        if !self
            .keys
            .iter()
            .all(|k| matches!(k.as_str(), "session" | "country" | "city"))
            || self.keys.len() > 3
        {
            return Err(ApiError::BadRequest(
                "upstream.keys: session, country, city".into(),
            ));
        }
        if !self.countries.iter().any(|c| c == token_country) {
            self.countries.insert(0, token_country.to_owned());
        }
        if self.countries.len() > 1 && !self.keys.iter().any(|k| k == "country") {
            return Err(ApiError::BadRequest(
                "upstream.countries: more than one country needs {country} in the template".into(),
            ));
        }
        Ok(self)
    }
}

/// Egress prefixes one exit may declare (each may hold 2^80 addresses: the
/// bound is on rows and records, not on addresses).
const MAX_EGRESS_PREFIXES: usize = 64;
/// Egress IPs one exit may declare.
const MAX_EGRESS_IPS: usize = 256;
/// The longest an enrollment token may live: 30 days.
const MAX_ENROLLMENT_TTL_SECS: u64 = 30 * 24 * 3600;

#[derive(Serialize)]
pub(super) struct Enrolled {
    exit_id: Uuid,
    /// The agent's own credential; shown once, only its SHA-256 is stored.
    credential: String,
}

#[derive(sqlx::FromRow)]
struct TokenRow {
    id: Uuid,
    source_id: Option<Uuid>,
    name: String,
    source_type: String,
    owner: String,
    country: String,
    region: Option<String>,
    city: Option<String>,
    asn: Option<i64>,
    behind_nat: bool,
    expired: bool,
    used: bool,
}

pub(super) async fn enroll(
    State(state): State<AppState>,
    Json(body): Json<Enroll>,
) -> Result<(StatusCode, Json<Enrolled>), ApiError> {
    if body.egress_ips.len() > MAX_EGRESS_IPS {
        return Err(ApiError::BadRequest(format!(
            "egress_ips: at most {MAX_EGRESS_IPS} addresses"
        )));
    }
    if body.egress_prefixes.len() > MAX_EGRESS_PREFIXES {
        return Err(ApiError::BadRequest(format!(
            "egress_prefixes: at most {MAX_EGRESS_PREFIXES} prefixes"
        )));
    }
    if body.egress_ips.is_empty() && body.egress_prefixes.is_empty() {
        return Err(ApiError::BadRequest(
            "egress_ips, egress_prefixes: an exit needs at least one egress IP or prefix".into(),
        ));
    }
    // The agent's own rule (it refuses such flags); checked again here
    // because the body is the agent's word, not the operator's.
    let prefixes: Vec<String> = body
        .egress_prefixes
        .iter()
        .map(|p| {
            check_egress_prefix(p)
                .map(|p| p.to_string())
                .map_err(|e| ApiError::BadRequest(format!("egress_prefixes: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let mut tx = state.db.begin().await?;
    // Lock the token row so two agents racing with one token cannot both win.
    let token: Option<TokenRow> = sqlx::query_as(
        "SELECT id, source_id, name, source_type, owner, country, region, city, asn, behind_nat,
                expires_at <= now() AS expired, used_at IS NOT NULL AS used
           FROM enrollment_tokens WHERE token_sha256 = $1 FOR UPDATE",
    )
    .bind(sha256_hex(body.token.expose()))
    .fetch_optional(&mut *tx)
    .await?;
    let token = match token {
        None => return Err(ApiError::Forbidden("enrollment token is not valid".into())),
        Some(t) if t.used => {
            return Err(ApiError::Conflict(
                "enrollment token was already used; ask the operator for a new one".into(),
            ))
        }
        Some(t) if t.expired => {
            return Err(ApiError::Forbidden("enrollment token has expired".into()))
        }
        Some(t) => t,
    };
    let upstream = body
        .upstream
        .clone()
        .map(|u| u.checked(&token.country))
        .transpose()?;
    // The countries an upstream exit may serve are the operator's word, not
    // the agent's: only those its source covers.
    if let Some(upstream) = &upstream {
        let covered: Option<(Vec<String>,)> =
            sqlx::query_as("SELECT countries FROM sources WHERE id = $1")
                .bind(token.source_id)
                .fetch_optional(&mut *tx)
                .await?;
        let covered = covered.map(|(c,)| c).unwrap_or_default();
        if let Some(outside) = upstream.countries.iter().find(|c| !covered.contains(c)) {
            return Err(ApiError::BadRequest(format!(
                "upstream.countries: {outside} is not among the source's countries"
            )));
        }
    }
    let exit_id = Uuid::new_v4();
    let credential = new_secret("pnexit");
    let ips: Vec<String> = body.egress_ips.iter().map(ToString::to_string).collect();
    sqlx::query(
        "INSERT INTO exits (id, name, source_type, owner, country, egress_ips, credential_sha256, hostname, agent_version, city, asn, source_id, egress_prefixes, behind_nat, region, upstream)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    )
    .bind(exit_id)
    .bind(&token.name)
    .bind(&token.source_type)
    .bind(&token.owner)
    .bind(&token.country)
    .bind(&ips)
    .bind(sha256_hex(&credential))
    .bind(truncate(&body.hostname, 255))
    .bind(truncate(&body.agent_version, 64))
    .bind(&token.city)
    .bind(token.asn)
    .bind(token.source_id)
    .bind(&prefixes)
    .bind(token.behind_nat)
    .bind(&token.region)
    .bind(upstream.as_ref().map(sqlx::types::Json))
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE enrollment_tokens SET used_at = now(), exit_id = $2 WHERE id = $1")
        .bind(token.id)
        .bind(exit_id)
        .execute(&mut *tx)
        .await?;
    audit::record(
        &mut tx,
        "agent",
        "exit.enroll",
        &exit_id.to_string(),
        serde_json::json!({"token_id": token.id, "egress_ips": ips, "egress_prefixes": prefixes, "hostname": body.hostname, "behind_nat": token.behind_nat, "agent_says_behind_nat": body.behind_nat, "upstream": upstream}),
    )
    .await?;
    tx.commit().await?;
    state.projector.exit(exit_id).await;
    tracing::info!(exit = %exit_id, name = %token.name, "exit enrolled");
    Ok((
        StatusCode::CREATED,
        Json(Enrolled {
            exit_id,
            credential,
        }),
    ))
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

use proxynet_wire::heartbeat::{HeartbeatReply, HeartbeatRequest as Heartbeat};

/// Answers from Redis alone (liveness must not wait for Postgres, see
/// `liveness.rs`); Postgres hears of the beat in a later batch. Every agent
/// gets the same answer, so it is serialised once and reused briefly: at
/// 20,000 beats a second the reply is most of a beat's cost otherwise.
pub(super) async fn heartbeat(
    State(state): State<AppState>,
    Path(exit_id): Path<Uuid>,
    parts: Parts,
    Json(body): Json<Heartbeat>,
) -> Result<axum::response::Response, ApiError> {
    let presented = bearer(&parts).ok_or(ApiError::Unauthorized)?;
    let mut egress = None;
    let stored = match state.projector.exit_record(exit_id).await {
        Ok(Some(record)) => {
            let credential = record.credential_sha256.clone();
            egress = Some(record);
            credential
        }
        // Liveness lives in Redis: without it there is nothing to record.
        Err(e) => {
            return Err(ApiError::Unavailable(format!(
                "cannot record liveness: {e}"
            )))
        }
        // Redis has no record (restarted empty, not yet re-projected):
        // Postgres decides, briefly, and the record is projected again.
        Ok(None) => {
            let row: Option<(String,)> = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                sqlx::query_as("SELECT credential_sha256 FROM exits WHERE id = $1")
                    .bind(exit_id)
                    .fetch_optional(&state.db),
            )
            .await
            .map_err(|_| ApiError::Unavailable("cannot verify the exit right now".into()))??;
            let (stored,) = row.ok_or(ApiError::Unauthorized)?;
            state.projector.exit(exit_id).await;
            stored
        }
    };
    // Unknown exit and wrong credential answer the same.
    if !constant_time_eq(sha256_hex(presented).as_bytes(), stored.as_bytes()) {
        return Err(ApiError::Unauthorized);
    }
    // An agent beats once per interval (sooner only when retrying after a
    // failure, at most every half second, or to announce its drain): a
    // quarter interval apart is legitimate, anything faster is a loop.
    let min_gap =
        (state.config.heartbeat_interval() / 4).min(std::time::Duration::from_millis(500));
    if let Err(wait) = state.heartbeats.pace(exit_id, body.draining, min_gap) {
        return Err(ApiError::Rejected {
            status: axum::http::StatusCode::TOO_MANY_REQUESTS,
            detail: format!(
                "heartbeats come faster than the interval; retry in {} ms",
                wait.as_millis().max(1)
            ),
        });
    }
    state
        .projector
        .heartbeat(exit_id, body.draining, state.config.heartbeat_ttl())
        .await
        .map_err(|e| ApiError::Unavailable(format!("cannot record liveness: {e}")))?;
    state
        .heartbeats
        .beat(exit_id, body.draining, body.active_tunnels);
    // An agent's admin listener is protected fleet-wide only on an address
    // the control plane verified the exit holds (`sort_admin_claims`). Without
    // the exit's record (Redis restarted empty) nothing is known of it: what
    // was recorded before stands until the record is back.
    if let Some(record) = egress.as_ref() {
        let claims = sort_admin_claims(record, &body.admin_addrs);
        if state
            .heartbeats
            .admin_addrs_due(exit_id, &claims.protected, &claims.unverified)
        {
            if !claims.unverified.is_empty() {
                tracing::warn!(
                    exit = %exit_id,
                    unverified = ?claims.unverified,
                    verified_egress = ?record.verified_egress,
                    "admin addresses on egress the control plane has not verified the exit holds are ignored: no other exit is told to deny them"
                );
            }
            if let Err(e) = state
                .projector
                .record_agent_admin(exit_id, &claims.protected, &claims.unverified)
                .await
            {
                tracing::warn!(error = %e, "cannot record the agent's admin address; retried at its next beat");
                state.heartbeats.forget_admin_addrs(exit_id);
            }
        }
    }
    // Internal service addresses go only to an agent that says its policy
    // reaches internal ranges *and* whose exit egresses from one (a local
    // or private deployment): a public exit cannot ask for them.
    let internal = body.internal_targets
        && egress.as_ref().is_some_and(|r| {
            r.egress_ips
                .iter()
                .any(|ip| proxynet_common::egress::in_special_range(*ip))
                || r.egress_prefixes.iter().any(|p| p.touches_special_range())
        });
    let reply = state
        .projector
        .heartbeat_reply(internal, |inputs| {
            let (superproxies, protected) = deny_list(&state.protected, inputs, internal);
            HeartbeatReply {
                heartbeat_interval_ms: state.config.heartbeat_interval_ms,
                heartbeat_ttl_ms: state.config.heartbeat_ttl_ms,
                superproxies,
                protected,
                reflectors: state.config.reflector_urls.clone(),
            }
        })
        .await
        .map_err(|e| ApiError::Unavailable(format!("cannot list superproxies: {e}")))?;
    tracing::debug!(exit = %exit_id, active_tunnels = body.active_tunnels, "heartbeat");
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        reply,
    )
        .into_response())
}

#[cfg(test)]
mod tests;
