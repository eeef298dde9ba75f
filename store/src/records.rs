//! The records kept in Redis, as serde JSON: users (with their accounts'
//! limits and the tombstones of deleted ones), exits, superproxies' running
//! totals, and the usage, target and audit rows the superproxies send the
//! control-api's ledger.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use uuid::Uuid;

use crate::policy;
use proxynet_wire::provenance::{Channel, SourceType};

/// What a superproxy needs to authenticate a proxy user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub id: Uuid,
    pub account_id: Uuid,
    pub username: String,
    /// argon2id PHC string. The password itself is never stored anywhere.
    pub password_hash: String,
    pub enabled: bool,
    /// Increases on every change, so caches can tell stale from current.
    pub version: i64,
    /// Most tunnels open at once across all superproxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_tunnels: Option<u32>,
    /// Most new tunnels per second across all superproxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tunnels_per_second: Option<u32>,
    /// Bytes (up + down) allowed per quota period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_bytes: Option<u64>,
    #[serde(default)]
    pub quota_period: QuotaPeriod,
    /// Source types this user may use (`None`: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_source_types: Option<Vec<SourceType>>,
    /// Countries (ISO 3166-1 alpha-2) this user may use (`None`: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_countries: Option<Vec<String>>,
    /// Acquisition channels this user may use (`None`: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_channels: Option<Vec<Channel>>,
    /// Username-grammar options for this user's IP-allow-listed traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowlist_options: Option<String>,
    /// The account's totals (its entitlements), enforced over all of its
    /// users together; the user's own limits apply besides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_limits: Option<AccountLimits>,
    /// Source types the account's plan prices: the only ones it may route
    /// through (`None`: the account has no plan, any type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_source_types: Option<Vec<SourceType>>,
    /// The user's own traffic policy (narrows the account's).
    #[serde(default, skip_serializing_if = "policy::TrafficPolicy::is_empty")]
    pub policy: policy::TrafficPolicy,
    /// The account's traffic policy, bounding all of its users; its domain
    /// limits count the account's tunnels together.
    #[serde(default, skip_serializing_if = "policy::TrafficPolicy::is_empty")]
    pub account_policy: policy::TrafficPolicy,
    /// The user's own ban rules, tried before the account's and the
    /// operator's ([`policy::rule_for`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_rules: Vec<policy::RetryRule>,
    /// The account's ban rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub account_retry_rules: Vec<policy::RetryRule>,
    /// The user always routes through its account's dedicated addresses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dedicated_only: bool,
    /// When none of the account's dedicated addresses is usable, route
    /// through shared ones instead of refusing (an account setting).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dedicated_fallback: bool,
}

/// An account's totals over all of its users, from its entitlements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_tunnels: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tunnels_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_bytes: Option<u64>,
    #[serde(default)]
    pub quota_period: QuotaPeriod,
}

/// What the user key holds: a live user, the tombstone of a deleted one, or
/// nothing (never projected, or Redis lost it — which is not a revocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserEntry {
    Present(Box<UserRecord>),
    Deleted,
    Absent,
}

/// The JSON a deleted user's key holds for a while, so that an older write
/// (a slow resync) cannot bring the user back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tombstone {
    pub deleted: bool,
    pub version: i64,
}

impl UserEntry {
    pub fn parse(json: Option<&str>) -> Self {
        let Some(json) = json else {
            return UserEntry::Absent;
        };
        if let Ok(record) = serde_json::from_str::<UserRecord>(json) {
            return UserEntry::Present(Box::new(record));
        }
        match serde_json::from_str::<Tombstone>(json) {
            Ok(t) if t.deleted => UserEntry::Deleted,
            // Unreadable: treat as absent (never as a live user).
            _ => UserEntry::Absent,
        }
    }
}

/// How long a deleted user's tombstone stays, seconds: far longer than any
/// resync that could still carry the user's older record.
pub const TOMBSTONE_TTL_SECS: u64 = 86_400;

/// The window a bandwidth quota counts over (UTC calendar day or month).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum QuotaPeriod {
    Daily,
    #[default]
    Monthly,
}

impl QuotaPeriod {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "daily" => Some(Self::Daily),
            "monthly" => Some(Self::Monthly),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Daily => "daily",
            Self::Monthly => "monthly",
        }
    }

    /// The period containing `unix_secs`: its key suffix (`d20261130`,
    /// `m202611`) and its start and end as Unix seconds.
    pub fn window(self, unix_secs: i64) -> (String, i64, i64) {
        let days = unix_secs.div_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        match self {
            Self::Daily => (
                format!("d{y:04}{m:02}{d:02}"),
                days * 86_400,
                (days + 1) * 86_400,
            ),
            Self::Monthly => {
                let start = days_from_civil(y, m, 1) * 86_400;
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (
                    format!("m{y:04}{m:02}"),
                    start,
                    days_from_civil(ny, nm, 1) * 86_400,
                )
            }
        }
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Why an exit may not carry traffic for provenance reasons (the reason
/// class customers see in a 503; never private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProvenanceBlock {
    /// The source does not answer the four questions (where from and how,
    /// how the user was informed, how they opt out, who is liable).
    IncompleteProvenance,
    /// Consent is required and none was ever granted.
    NoConsent,
    /// The latest consent was revoked.
    ConsentRevoked,
    /// The latest consent expired (also judged live, from `consent_expires_at_ms`).
    ConsentExpired,
    /// The person behind the exit withdrew it (`exit-agent opt-out`).
    Withdrawn,
    /// A declared egress address is not what the reflector saw the exit's
    /// traffic leave from, and the exit declared no NAT (only with the
    /// control-api's `--strict-egress-verification`).
    EgressUnverified,
}

impl ProvenanceBlock {
    pub fn as_str(self) -> &'static str {
        match self {
            ProvenanceBlock::IncompleteProvenance => "incomplete_provenance",
            ProvenanceBlock::NoConsent => "no_consent",
            ProvenanceBlock::ConsentRevoked => "consent_revoked",
            ProvenanceBlock::ConsentExpired => "consent_expired",
            ProvenanceBlock::Withdrawn => "withdrawn",
            ProvenanceBlock::EgressUnverified => "egress_unverified",
        }
    }
}

/// What a superproxy needs to route through an exit and to admit its agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    pub id: Uuid,
    pub name: String,
    pub egress_ips: Vec<IpAddr>,
    /// Prefixes the exit sends from any address of (the superproxy picks
    /// one per tunnel; a session keeps its pick).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_prefixes: Vec<proxynet_common::egress::Cidr>,
    pub source_type: SourceType,
    /// ISO 3166-1 alpha-2, upper case.
    pub country: String,
    pub owner: String,
    /// ISO 3166-2 subdivision the operator declared on the enrollment
    /// token, upper case (`DE-BY`; its country part is `country`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Lower-case city name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub city: Option<String>,
    /// Autonomous system the egress IPs are announced from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asn: Option<u32>,
    /// An operator drained it: no new tunnels. (An agent's own drain
    /// announcement is in the [`Keys::exits_draining`](crate::Keys::exits_draining)
    /// set, owned by heartbeats.)
    pub draining: bool,
    /// An operator disabled the exit.
    pub disabled: bool,
    /// SHA-256 (hex) of the agent's link credential.
    pub credential_sha256: String,
    /// Projection version (newer always wins in Redis).
    #[serde(default)]
    pub version: i64,
    /// How the exit's address was obtained (from its source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
    /// Set when provenance or consent forbids routing through the exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<ProvenanceBlock>,
    /// When the exit's consent expires (Unix ms): it stops being eligible at
    /// that instant, without any event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consent_expires_at_ms: Option<i64>,
    /// The addresses the control plane verified the exit holds: for each
    /// declared egress whose latest reflector observation saw the exit's
    /// traffic leave from inside it, the address seen. Only on these does
    /// an agent's admin listener enter the fleet's protected set (the
    /// control-api's heartbeat); routing does not read it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verified_egress: Vec<IpAddr>,
    /// Egress addresses (or /64s of an egress prefix) allocated to one
    /// account: only its tunnels leave from them, and only when they ask for
    /// dedicated addresses; shared tunnels never do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dedicated: Vec<Dedication>,
    /// Set for an upstream exit (a partner's gateway behind the agent):
    /// what it serves besides its own record's country, and which of our
    /// targeting keys its partner honours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamExit>,
}

/// What selection needs to know of an upstream exit. Never its partner's
/// address or credentials.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpstreamExit {
    /// Countries the partner serves through it (upper case).
    #[serde(default)]
    pub countries: Vec<String>,
    /// Which of `session`, `country`, `city` its username template carries.
    #[serde(default)]
    pub keys: Vec<String>,
}

impl UpstreamExit {
    pub fn honours(&self, key: &str) -> bool {
        self.keys.iter().any(|k| k == key)
    }
}

/// One dedicated address of an exit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dedication {
    /// A single address (a /32 or /128) or a prefix.
    pub address: proxynet_common::egress::Cidr,
    pub account: Uuid,
    /// The account's users it serves (empty: all of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<Uuid>,
}

impl Dedication {
    /// Whether `user` of `account` may leave from this address.
    pub fn serves(&self, account: Uuid, user: Uuid) -> bool {
        self.account == account && (self.users.is_empty() || self.users.contains(&user))
    }
}

impl ExitRecord {
    /// Whether the exit leaves from `country`: its own, or one its partner
    /// serves through it (and lets us choose: the template has `{country}`).
    pub fn serves_country(&self, country: &str) -> bool {
        self.country == country
            || self
                .upstream
                .as_ref()
                .is_some_and(|u| u.honours("country") && u.countries.iter().any(|c| c == country))
    }

    /// Whether `-city-…` can be honoured: the exit's own city, or any city
    /// its partner is asked for by name.
    pub fn serves_city(&self, city: &str) -> bool {
        self.city.as_deref() == Some(city)
            || self.upstream.as_ref().is_some_and(|u| u.honours("city"))
    }

    /// Whether `ip` is dedicated to some account (and so not shared).
    pub fn is_dedicated(&self, ip: IpAddr) -> bool {
        self.dedicated.iter().any(|d| d.address.contains(ip))
    }

    /// Whether the exit has an address left for shared tunnels: an egress
    /// IP nobody holds, or a prefix not allocated whole.
    pub fn has_shared_egress(&self) -> bool {
        self.dedicated.is_empty()
            || self.egress_ips.iter().any(|ip| !self.is_dedicated(*ip))
            || self
                .egress_prefixes
                .iter()
                .any(|p| !self.dedicated.iter().any(|d| d.address.covers(p)))
    }

    /// Whether the exit may send from `ip`: one of its egress IPs, or an
    /// address inside one of its egress prefixes.
    pub fn can_egress_from(&self, ip: IpAddr) -> bool {
        self.egress_ips.contains(&ip) || self.egress_prefixes.iter().any(|p| p.contains(ip))
    }

    /// Whether the exit has any address of `ip`'s family to send from.
    pub fn has_egress_family(&self, ipv4: bool) -> bool {
        self.egress_ips.iter().any(|ip| ip.is_ipv4() == ipv4)
            || self
                .egress_prefixes
                .iter()
                .any(|p| p.network().is_ipv4() == ipv4)
    }

    /// Whether the exit has an address to send from at all.
    pub fn has_egress(&self) -> bool {
        !self.egress_ips.is_empty() || !self.egress_prefixes.is_empty()
    }

    /// Why the exit may not carry traffic at `now_ms` for provenance reasons.
    pub fn provenance_block(&self, now_ms: i64) -> Option<ProvenanceBlock> {
        self.blocked.or_else(|| {
            self.consent_expires_at_ms
                .filter(|expiry| *expiry <= now_ms)
                .map(|_| ProvenanceBlock::ConsentExpired)
        })
    }
}

/// A superproxy's running totals, published each probe round for the
/// control-api's fleet view (rates are computed there between samples).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuperproxyStats {
    pub tunnels_opened: u64,
    /// `STATUS:proxy-status-token` → tunnels refused that way.
    pub tunnels_failed: std::collections::BTreeMap<String, u64>,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// Bytes one user moved through one exit in one minute (a ledger row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub account_id: Uuid,
    pub user_id: Uuid,
    pub exit_id: Uuid,
    /// Start of the minute, Unix seconds.
    pub minute: i64,
    /// Client → target.
    pub bytes_up: u64,
    /// Target → client.
    pub bytes_down: u64,
    /// The exit's source type when the bytes moved (what they are billed as).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_type: Option<SourceType>,
    /// The target's registrable domain ([`policy::registrable_domain`]);
    /// absent for a UDP association and from older superproxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Whether the bytes are billed: `false` for an attempt the gateway
    /// gave up on and retried through another exit (docs/usage.md). Only
    /// `false` is written, so readers that predate it see what they saw.
    #[serde(default = "billable_default", skip_serializing_if = "is_billable")]
    pub billable: bool,
}

/// [`UsageRow::billable`] when a row does not say: billed.
fn billable_default() -> bool {
    true
}

/// Serde's `skip_serializing_if` for [`UsageRow::billable`].
fn is_billable(billable: &bool) -> bool {
    *billable
}

/// Something a data-plane process saw that belongs in the control plane's
/// audit log (e.g. a second link presenting one exit's credential). Sent on
/// the usage stream as field `audit`; its id makes recording idempotent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditEvent {
    pub id: Uuid,
    pub actor: String,
    pub action: String,
    pub subject: String,
    pub detail: serde_json::Value,
}

/// Who reached which target through which egress IP in one minute: what an
/// abuse desk asks about. Host and port only, never a path or credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRow {
    pub account_id: Uuid,
    pub user_id: Uuid,
    pub exit_id: Uuid,
    pub egress_ip: IpAddr,
    pub target_host: String,
    pub target_port: u16,
    /// Start of the minute, Unix seconds.
    pub minute: i64,
    pub tunnels: u32,
}

/// One flush of one superproxy: the unit of idempotency in the ledger.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsageBatch {
    pub batch_id: Uuid,
    pub superproxy_id: Uuid,
    pub rows: Vec<UsageRow>,
    /// Tunnels opened since the last flush, per (user, exit, egress IP,
    /// target, minute): the abuse-lookup record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetRow>,
}
