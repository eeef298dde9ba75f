//! The exit as the projector reads it from Postgres (its source and latest
//! consent record) and the record it projects for the superproxies.

use super::*;

#[derive(sqlx::FromRow)]
pub struct ExitRow {
    pub id: Uuid,
    pub name: String,
    pub source_type: String,
    pub owner: String,
    pub country: String,
    /// ISO 3166-2 subdivision, as declared on the enrollment token.
    pub region: Option<String>,
    pub egress_ips: Vec<String>,
    /// As enrolled: masked CIDRs (`2001:db8:1:2::/64`).
    pub egress_prefixes: Vec<String>,
    pub credential_sha256: String,
    pub city: Option<String>,
    pub asn: Option<i64>,
    /// Agent-reported or operator-set.
    pub draining: bool,
    pub disabled: bool,
    pub version: i64,
    pub withdrawn: bool,
    /// The source's fields; `None` when the exit has no source.
    pub channel: Option<String>,
    pub supplier: Option<String>,
    pub agreement_ref: Option<String>,
    pub notice_description: Option<String>,
    pub source_opt_out: Option<String>,
    pub liable_party: Option<String>,
    pub abuse_contact: Option<String>,
    pub countries: Option<Vec<String>>,
    pub consent_required: Option<bool>,
    /// The exit's latest consent record.
    pub consent_state: Option<String>,
    pub consent_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// As persisted (batched, see `liveness.rs`).
    pub last_heartbeat_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The verdict on its declared egress (`routes/egress.rs`).
    pub egress_verification: String,
    /// The public address the reflector last saw, per declared egress.
    pub observed_egress: Vec<String>,
    /// The addresses the reflector verified the exit holds (`routes/egress.rs`).
    pub verified_egress: Vec<String>,
    /// Its dedicated addresses held now, each `ADDRESS|ACCOUNT|USER,USER`
    /// (`routes/dedicated.rs`).
    pub dedicated: Vec<String>,
    /// An upstream exit's partner gateway, as enrolled.
    pub upstream: Option<sqlx::types::Json<UpstreamRow>>,
}

/// An upstream exit as stored (`exits.upstream`).
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, Default)]
pub struct UpstreamRow {
    pub scheme: String,
    pub host: String,
    pub port: u16,
    #[serde(default)]
    pub countries: Vec<String>,
    #[serde(default)]
    pub keys: Vec<String>,
}

impl ExitRow {
    /// Whether the exit's provenance answers the four questions (where the
    /// address comes from and through which channel, how its owner was
    /// informed, how they opt out, who is liable) and, where consent is
    /// required, whether it is granted and unrevoked. Expiry is judged here
    /// and, at the instant itself, by every superproxy. With `strict_egress`
    /// (`--strict-egress-verification`) an exit whose declared egress the
    /// reflector contradicts is blocked too, after the provenance reasons.
    pub fn provenance_block(&self, strict_egress: bool) -> Option<ProvenanceBlock> {
        if self.withdrawn {
            return Some(ProvenanceBlock::Withdrawn);
        }
        let filled = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
        let complete = self.channel.as_deref().and_then(Channel::parse).is_some()
            && [
                &self.supplier,
                &self.agreement_ref,
                &self.notice_description,
                &self.source_opt_out,
                &self.liable_party,
                &self.abuse_contact,
            ]
            .into_iter()
            .all(filled)
            && self
                .countries
                .as_ref()
                .is_some_and(|c| c.contains(&self.country));
        if !complete {
            return Some(ProvenanceBlock::IncompleteProvenance);
        }
        let consent = if self.consent_required != Some(true) {
            None
        } else {
            match self.consent_state.as_deref() {
                None => Some(ProvenanceBlock::NoConsent),
                Some("revoked") => Some(ProvenanceBlock::ConsentRevoked),
                _ if self
                    .consent_expires_at
                    .is_some_and(|t| t <= chrono::Utc::now()) =>
                {
                    Some(ProvenanceBlock::ConsentExpired)
                }
                _ => None,
            }
        };
        consent.or_else(|| {
            crate::routes::egress::blocks_routing(&self.egress_verification, strict_egress)
                .then_some(ProvenanceBlock::EgressUnverified)
        })
    }

    pub fn to_record(&self, strict_egress: bool) -> ExitRecord {
        let mut record = ExitRecord {
            id: self.id,
            name: self.name.clone(),
            egress_ips: self
                .egress_ips
                .iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
                .collect(),
            egress_prefixes: self
                .egress_prefixes
                .iter()
                .filter_map(|p| p.parse::<proxynet_common::egress::Cidr>().ok())
                .collect(),
            source_type: SourceType::parse(&self.source_type).unwrap_or(SourceType::Dc),
            country: self.country.clone(),
            owner: self.owner.clone(),
            region: self.region.clone(),
            city: self.city.clone(),
            asn: self.asn.and_then(|a| u32::try_from(a).ok()),
            draining: self.draining,
            disabled: self.disabled,
            credential_sha256: self.credential_sha256.clone(),
            version: self.version,
            channel: self.channel.as_deref().and_then(Channel::parse),
            blocked: self.provenance_block(strict_egress),
            consent_expires_at_ms: self
                .consent_expires_at
                .filter(|_| self.consent_required == Some(true))
                .map(|t| t.timestamp_millis()),
            verified_egress: Vec::new(),
            dedicated: self
                .dedicated
                .iter()
                .filter_map(|d| parse_dedication(d))
                .collect(),
            upstream: self
                .upstream
                .as_ref()
                .map(|u| proxynet_store::UpstreamExit {
                    countries: u.countries.clone(),
                    keys: u.keys.clone(),
                }),
        };
        // Only what lies inside the declared egress: the column is written
        // from observations of declared egress alone, and this keeps it so.
        let verified: Vec<IpAddr> = self
            .verified_egress
            .iter()
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .filter(|ip| record.can_egress_from(*ip))
            .collect();
        record.verified_egress = verified;
        record
    }
}

/// `ADDRESS|ACCOUNT|USER,USER` as [`EXIT_SELECT`] writes it.
fn parse_dedication(row: &str) -> Option<proxynet_store::Dedication> {
    let mut parts = row.split('|');
    let address = parts.next()?.parse().ok()?;
    let account = parts.next()?.parse().ok()?;
    let users = parts
        .next()
        .unwrap_or_default()
        .split(',')
        .filter(|u| !u.is_empty())
        .filter_map(|u| u.parse().ok())
        .collect();
    Some(proxynet_store::Dedication {
        address,
        account,
        users,
    })
}

/// An exit with its source and its latest consent record. The projected
/// `draining` is the operator's switch; the agent's own drain announcement
/// reaches Redis with its heartbeat (`liveness.rs`).
pub(super) const EXIT_SELECT: &str = "SELECT e.id, e.name, e.source_type, e.owner, e.country, e.region, e.egress_ips, \
     e.egress_prefixes, \
     e.credential_sha256, e.city, e.asn, e.admin_draining AS draining, e.disabled, e.version, \
     e.withdrawn_at IS NOT NULL AS withdrawn, s.channel, s.supplier, s.agreement_ref, \
     s.notice_description, s.opt_out AS source_opt_out, s.liable_party, s.abuse_contact, \
     s.countries, s.consent_required, c.state AS consent_state, c.expires_at AS consent_expires_at, \
     e.last_heartbeat_at, e.egress_verification, \
     ARRAY(SELECT v FROM unnest(e.verified_egress) v WHERE EXISTS \
            (SELECT 1 FROM exit_egress_observations o WHERE o.exit_id = e.id \
              AND host(o.observed_ip) = v AND o.last_seen > now() - interval '24 hours')) \
       AS verified_egress, \
     ARRAY(SELECT DISTINCT ON (o.egress) host(o.observed_ip) FROM exit_egress_observations o \
            WHERE o.exit_id = e.id ORDER BY o.egress, o.first_seen DESC, o.id DESC) AS observed_egress, \
     ARRAY(SELECT d.address || '|' || d.account_id || '|' || \
              COALESCE((SELECT string_agg(du.user_id::text, ',' ORDER BY du.user_id) \
                          FROM dedicated_ip_users du WHERE du.dedicated_ip_id = d.id), '') \
            FROM dedicated_ips d WHERE d.exit_id = e.id AND d.released_at IS NULL ORDER BY d.address) \
       AS dedicated, e.upstream \
     FROM exits e LEFT JOIN sources s ON s.id = e.source_id \
     LEFT JOIN LATERAL (SELECT state, expires_at FROM consent_records \
                         WHERE exit_id = e.id ORDER BY version DESC LIMIT 1) c ON true";
