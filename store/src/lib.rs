//! The shared Redis state: key layout, record shapes and the few scripts that
//! must be atomic.
//!
//! The control-api writes users and exits here (projected from Postgres); agents'
//! heartbeats keep exits in the live set; superproxies announce their link
//! addresses here and read everything else. Every key starts with a configurable
//! prefix so several stacks (or tests) can share one Redis. Keys built from user
//! input only ever contain validated usernames (`[A-Za-z0-9_.]`, at most 64 bytes)
//! or UUIDs, so they are bounded and need no escaping. Per-entity keys wrap the
//! entity id in `{}` so that a Redis Cluster hashes each entity's keys together;
//! user records are spread over [`USER_BUCKETS`] tags instead, each with its
//! index and projection marker beside it, so every multi-key operation,
//! script and transaction stays in one hash slot.
//!
//! Liveness uses sorted sets scored by expiry time taken from Redis' own clock
//! (`TIME` inside a script), so hosts with skewed clocks agree on who is alive.

pub mod policy;
pub mod redis_target;
pub mod site_cooldowns;

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use uuid::Uuid;

/// Key builder for one stack's namespace.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `UserRecord` JSON (or a deletion tombstone) for a proxy username. It
    /// sits in its bucket's slot, beside the bucket's index and marker.
    pub fn user(&self, username: &str) -> String {
        format!(
            "{}user:{{u{:02x}}}:{username}",
            self.prefix,
            user_bucket(username)
        )
    }

    /// Set of the usernames that have a key ([`Self::user`]) in `bucket`, so
    /// a full resync finds stale keys without SCAN (which sees one node of a
    /// cluster only).
    pub fn users_in_bucket(&self, bucket: u8) -> String {
        format!("{}users:{{u{bucket:02x}}}", self.prefix)
    }

    /// The projection marker beside `username`'s key (see [`Self::projection_markers`]).
    pub fn users_projected(&self, username: &str) -> String {
        self.users_projected_in_bucket(user_bucket(username))
    }

    fn users_projected_in_bucket(&self, bucket: u8) -> String {
        format!("{}projection:complete:{{u{bucket:02x}}}", self.prefix)
    }

    /// The projection marker beside the exit records.
    pub fn exits_projected(&self) -> String {
        format!("{}{{exits}}:projection:complete", self.prefix)
    }

    /// Written by the control-api after each full projection of Postgres into
    /// Redis: one beside each user bucket and one beside the exits. A missing
    /// marker means Redis lost that part of the projection (a restart without
    /// persistence, a flush, one cluster node restarted empty) and it is not
    /// yet rebuilt: an absent user or exit there then proves nothing, so
    /// superproxies keep their last known view instead of refusing known
    /// users or emptying the pool. Each marker shares its slot with what it
    /// vouches for, so a reader checks both in one transaction.
    pub fn projection_markers(&self) -> Vec<String> {
        (0..USER_BUCKETS)
            .map(|b| self.users_projected_in_bucket(b as u8))
            .chain([self.exits_projected()])
            .collect()
    }

    /// `ExitRecord` JSON. Every exit record shares the `{exits}` hash tag with
    /// the live and draining sets and the change stream: a record write and
    /// its change entry are one script, and a pool delta returns changed
    /// records in the same round trip (on a Redis Cluster: one slot).
    pub fn exit(&self, id: Uuid) -> String {
        format!("{}{{exits}}:exit:{id}", self.prefix)
    }

    /// What [`Self::exit`] keys start with (for scripts that build them).
    pub fn exit_prefix(&self) -> String {
        format!("{}{{exits}}:exit:", self.prefix)
    }

    /// Stream of exit changes (`id` field): a record written or deleted, an
    /// exit that became live, a drain announced or withdrawn. Superproxies
    /// follow it to keep their pool current in O(changes) instead of
    /// re-reading every exit ([`POOL_DELTA_SCRIPT`]).
    pub fn exit_changes(&self) -> String {
        format!("{}{{exits}}:changes", self.prefix)
    }

    /// Sorted set: exit id → heartbeat expiry (ms, Redis clock). Shares the
    /// `{exits}` hash tag with [`Self::exits_draining`]: one heartbeat script
    /// writes both.
    pub fn exits_live(&self) -> String {
        format!("{}{{exits}}:live", self.prefix)
    }

    /// Written by every control-api instance every half heartbeat interval,
    /// expiring after one: while it exists, the control plane is taking
    /// heartbeats; once it lapses, superproxies keep the exits that were
    /// live then, and to which they hold live, probed links, eligible for a
    /// bounded grace (the data plane outlives the control plane). In the
    /// `{exits}` slot, read by the pool scripts.
    pub fn control_plane_alive(&self) -> String {
        format!("{}{{exits}}:control-plane", self.prefix)
    }

    /// Set of exits whose agent announced it is draining (heartbeats own it).
    pub fn exits_draining(&self) -> String {
        format!("{}{{exits}}:draining", self.prefix)
    }

    /// Hash: exit id → JSON of its agent's admin listener addresses
    /// (`{"protected", "unverified", "at_ms"}`, each replaced by the exit's
    /// next report). Every exit is told to deny the protected ones, so a
    /// tunnel through one exit cannot reach a neighbour's admin routes; only
    /// addresses the control plane verified the exit holds are protected
    /// (the control-api's heartbeat), the rest are kept to be shown. Entries
    /// not rewritten for hours (the exit stopped beating) are pruned.
    pub fn agent_admin_addrs(&self) -> String {
        format!("{}agent-admin", self.prefix)
    }

    /// `SuperproxyRecord` JSON.
    pub fn superproxy(&self, id: Uuid) -> String {
        format!("{}superproxy:{{{id}}}", self.prefix)
    }

    /// Hash: superproxy id → that instance's JSON health view of the exit.
    pub fn health(&self, exit: Uuid) -> String {
        format!("{}health:{{{exit}}}", self.prefix)
    }

    /// Stream of usage batches from superproxies to the control-api's ledger.
    pub fn usage_stream(&self) -> String {
        format!("{}usage", self.prefix)
    }

    /// Sorted set of a user's tunnel leases: lease id → expiry (ms, Redis clock).
    pub fn leases(&self, user: Uuid) -> String {
        format!("{}leases:{{{user}}}", self.prefix)
    }

    /// Bytes a user has used in one quota period (see [`QuotaPeriod::window`]).
    pub fn quota_used(&self, user: Uuid, period_key: &str) -> String {
        format!("{}quota:{{{user}}}:{period_key}", self.prefix)
    }

    /// Bytes an account (all its users) has used in one quota period: its
    /// entitlement's bandwidth total.
    pub fn account_quota_used(&self, account: Uuid, period_key: &str) -> String {
        format!("{}acctquota:{{{account}}}:{period_key}", self.prefix)
    }

    /// Sorted set of an account's tunnel leases (its concurrency total).
    pub fn account_leases(&self, account: Uuid) -> String {
        format!("{}acctleases:{{{account}}}", self.prefix)
    }

    /// GCRA state of an account's new-tunnel rate total.
    pub fn account_tunnel_rate(&self, account: Uuid) -> String {
        format!("{}acctrate:{{{account}}}", self.prefix)
    }

    /// GCRA state of a user's new-tunnel rate.
    pub fn tunnel_rate(&self, user: Uuid) -> String {
        format!("{}rate:{{{user}}}", self.prefix)
    }

    /// Sorted set of a user's live sessions: session id → pin expiry (ms,
    /// Redis clock), in the user's slot beside the pins, so a new pin and
    /// the per-user session cap are one script.
    pub fn session_index(&self, user_id: Uuid) -> String {
        format!("{}sessions:{{{user_id}}}", self.prefix)
    }

    /// A sticky session's pin: the exit id, with the session's TTL.
    pub fn session(&self, user_id: Uuid, session: &str) -> String {
        format!("{}session:{{{user_id}}}:{session}", self.prefix)
    }

    /// Sorted set: superproxy id → announcement expiry (ms, Redis clock).
    pub fn superproxies_live(&self) -> String {
        format!("{}superproxies:live", self.prefix)
    }

    /// Hash: allow-listed source CIDR → username (IP allow-list login).
    pub fn allowlist(&self) -> String {
        format!("{}{{allowlist}}:map", self.prefix)
    }

    /// Where the next allow-list is built before it replaces the current one.
    pub fn allowlist_staging(&self) -> String {
        format!("{}{{allowlist}}:staging", self.prefix)
    }

    /// A superproxy's [`SuperproxyStats`] JSON (expires with the instance).
    pub fn stats(&self, superproxy: Uuid) -> String {
        format!("{}stats:{{{superproxy}}}", self.prefix)
    }

    /// The secret superproxies sign their egress reflections with and the
    /// control-api checks them by (hex): made by whichever needs it first
    /// ([`reflector_key`]), so agents cannot forge what a reflector saw.
    pub fn reflector_key(&self) -> String {
        format!("{}reflector-key", self.prefix)
    }

    /// The operator's [`policy::OperatorPolicy`] JSON (announced as `policy`).
    pub fn operator_policy(&self) -> String {
        format!("{}operator-policy", self.prefix)
    }

    /// Per-domain rate state of one owner: `scope` is `a:ACCOUNT` or
    /// `u:USER` (the operator's aggregate is [`Keys::shared_domain`]). The
    /// domain is hashed so any name makes a bounded key.
    pub fn domain_rate(&self, scope: &str, domain: &str) -> String {
        format!(
            "{}domain-rate:{scope}:{}",
            self.prefix,
            short_digest(domain)
        )
    }

    /// Per-domain lease set (see [`Keys::domain_rate`]).
    pub fn domain_leases(&self, scope: &str, domain: &str) -> String {
        format!(
            "{}domain-leases:{scope}:{}",
            self.prefix,
            short_digest(domain)
        )
    }

    /// The common stem of the operator's aggregate per-domain limit's keys,
    /// shared fairly between accounts (docs/policy.md): `STEM:leases` (the
    /// lease set, members `ACCOUNT|LEASE`), `STEM:holders` (leases held per
    /// account), `STEM:rate` (the aggregate GCRA), `STEM:rate:ACCOUNT` (one
    /// account's share of it) and `STEM:askers` (accounts that asked in the
    /// last second). The domain's digest is the hash tag, so every key of
    /// one domain is in one slot and one script reads and writes them all.
    pub fn shared_domain(&self, domain: &str) -> String {
        format!(
            "{}domain-shared:{{op:{}}}",
            self.prefix,
            short_digest(domain)
        )
    }

    /// Pub/sub channel announcing changed users and exits (`user:NAME`, `exit:ID`).
    pub fn events(&self) -> String {
        format!("{}events", self.prefix)
    }
}

/// 16 hex digits of SHA-256: a fixed-size key part for untrusted text.
fn short_digest(text: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(text.as_bytes())[..8])
}

/// How many hash tags user records are spread over: enough to spread users
/// over the masters of any realistic cluster, few enough that the projection
/// markers (one per bucket) are checked in one cheap read.
pub const USER_BUCKETS: usize = 256;

/// The bucket of a username: FNV-1a, stable across versions and binaries
/// (both the control-api and the superproxy derive the key from it).
pub fn user_bucket(username: &str) -> u8 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in username.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % USER_BUCKETS as u32) as u8
}

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

/// `KEYS[1]` user key, `KEYS[2]` its bucket's index ([`Keys::users_in_bucket`]),
/// `ARGV[1]` JSON, `ARGV[2]` its version, `ARGV[3]` TTL in seconds or '',
/// `ARGV[4]` the username. Writes only if no record with this version or a
/// newer one is there (1 written, 0 kept): the projection is monotonic. The
/// username is indexed either way (a key for it exists).
pub const PUT_USER_SCRIPT: &str = r"
redis.call('SADD', KEYS[2], ARGV[4])
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  if ok and type(rec) == 'table' and tonumber(rec['version']) and tonumber(rec['version']) >= tonumber(ARGV[2]) then
    return 0
  end
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[3]))
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
";

/// `KEYS[1]` user key, `KEYS[2]` its bucket's index, `ARGV[1]` version,
/// `ARGV[2]` the username: deletes the key only if what it holds is not newer
/// than that version, and unindexes the name when no key is left.
pub const DEL_USER_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SREM', KEYS[2], ARGV[2])
  return 0
end
local ok, rec = pcall(cjson.decode, cur)
if ok and type(rec) == 'table' and tonumber(rec['version']) and tonumber(rec['version']) > tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
";

/// The window a bandwidth quota counts over (UTC calendar day or month).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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

/// Where an exit's traffic comes from: the provenance the customer targets by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceType {
    Dc,
    Isp,
    Res,
    Mobile,
}

impl SourceType {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceType::Dc => "dc",
            SourceType::Isp => "isp",
            SourceType::Res => "res",
            SourceType::Mobile => "mobile",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "dc" => Some(SourceType::Dc),
            "isp" => Some(SourceType::Isp),
            "res" => Some(SourceType::Res),
            "mobile" => Some(SourceType::Mobile),
            _ => None,
        }
    }
}

/// How an exit's IP address was obtained (the provenance's acquisition channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// Hardware we own, in our racks.
    Owned,
    /// A server leased from a hosting provider.
    Leased,
    /// Addresses under a contract with an ISP.
    Isp,
    /// An SDK in a partner's app on someone's device.
    Sdk,
    /// A browser extension on someone's computer.
    Extension,
    /// A bandwidth-sharing app its owner installed.
    Sharing,
    /// Bought from a reseller.
    Reseller,
}

impl Channel {
    pub const ALL: [Channel; 7] = [
        Channel::Owned,
        Channel::Leased,
        Channel::Isp,
        Channel::Sdk,
        Channel::Extension,
        Channel::Sharing,
        Channel::Reseller,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Owned => "owned",
            Channel::Leased => "leased",
            Channel::Isp => "isp",
            Channel::Sdk => "sdk",
            Channel::Extension => "extension",
            Channel::Sharing => "sharing",
            Channel::Reseller => "reseller",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == value)
    }

    /// The address belongs to someone else, whose consent routing needs.
    pub fn borrows_someone_elses_line(self) -> bool {
        matches!(self, Channel::Sdk | Channel::Extension | Channel::Sharing)
    }
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
    /// announcement is in the [`Keys::exits_draining`] set, owned by heartbeats.)
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

/// A superproxy's announcement: where agents should dial and which certificate to pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuperproxyRecord {
    pub id: Uuid,
    pub link_addr: SocketAddr,
    /// SHA-256 (hex) of the DER certificate the link listener presents.
    pub cert_sha256: String,
    /// Every address this superproxy's listeners answer on (proxy, SOCKS,
    /// admin, link), unspecified binds expanded to its host's addresses:
    /// agents deny them as tunnel targets, however the target is spelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_addrs: Vec<SocketAddr>,
    /// Where this superproxy's egress reflector answers (`GET /whoami`):
    /// agents learn the public address their traffic leaves from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflector: Option<SocketAddr>,
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

/// `KEYS[1]` live set, `ARGV[1]` member, `ARGV[2]` ttl in ms: marks the member
/// alive until Redis' now + ttl and prunes members that expired long ago.
pub const TOUCH_LIVE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000)
return now
";

/// Entries kept in the exit change stream: a superproxy further behind than
/// this re-reads the whole pool once.
pub const EXIT_CHANGES_KEPT: u64 = 100_000;

/// `KEYS[1]` live set, `KEYS[2]` draining set, `KEYS[3]` change stream,
/// `ARGV[1]` exit id, `ARGV[2]` ttl in ms, `ARGV[3]` `1` if the agent is
/// draining, `ARGV[4]` entries kept in the stream: one agent heartbeat. Only
/// a transition (the exit was not live, or its drain flag flipped) becomes a
/// change entry; a steady beat writes nothing else.
pub const HEARTBEAT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = redis.call('ZSCORE', KEYS[1], ARGV[1])
local changed = (not prev) or tonumber(prev) <= now
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000)
local flipped
if ARGV[3] == '1' then
  flipped = redis.call('SADD', KEYS[2], ARGV[1])
else
  flipped = redis.call('SREM', KEYS[2], ARGV[1])
end
if changed or flipped == 1 then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'id', ARGV[1])
end
return now
";

/// `KEYS[1]` live set, `KEYS[2]` draining set, `KEYS[3]` change stream,
/// `KEYS[4]` the control plane's presence key:
/// `{now, last change id, live members, draining members, control plane
/// present (1/0)}`: the start of a
/// full pool read, and the point its deltas continue from. An empty stream
/// gets a placeholder entry (no exit id) so the cursor is always a real entry
/// whose disappearance (a flush, trimming past it) the delta can detect.
pub const LIVE_AND_DRAINING_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local cursor
if last[1] then
  cursor = last[1][1]
else
  cursor = redis.call('XADD', KEYS[3], '*', 'id', '')
end
return {now, cursor, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf'), redis.call('SMEMBERS', KEYS[2]), redis.call('EXISTS', KEYS[4])}
";

/// `KEYS[1]` record key, `KEYS[2]` change stream, `ARGV[1]` JSON, `ARGV[2]`
/// version, `ARGV[3]` exit id, `ARGV[4]` entries kept: writes an exit record
/// unless a newer one is there, and records the change. 1 if written.
pub const PUT_EXIT_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  if ok and type(rec) == 'table' and tonumber(rec['version']) and tonumber(rec['version']) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'id', ARGV[3])
return 1
";

/// `KEYS[1]` record key, `KEYS[2]` change stream, `ARGV[1]` exit id,
/// `ARGV[2]` entries kept: removes a deleted exit's record, recording the change.
pub const DEL_EXIT_SCRIPT: &str = r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'id', ARGV[1])
  return 1
end
return 0
";

/// One pool delta. `KEYS[1]` live set, `KEYS[2]` draining set, `KEYS[3]`
/// change stream, `KEYS[4]` the control plane's presence key (its
/// existence is the reply's last element); `ARGV[1]` Redis time (ms) of the previous read, `ARGV[2]`
/// the last change id seen, `ARGV[3]` most changes returned, `ARGV[4]` the
/// exit record key prefix. Returns `{now, complete, cursor, expired, changed}`:
/// `complete` is 0 when the stream no longer holds the cursor (trimmed, or
/// Redis restarted) and the caller must read the pool in full; `expired` are
/// the exits whose liveness ran out since the previous read; `changed` is a
/// flat list of `id, live expiry or '', draining 0/1, record JSON or ''` for
/// every exit named by a change entry after the cursor, as they are now.
pub const POOL_DELTA_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cursor = ARGV[2]
local control = redis.call('EXISTS', KEYS[4])
if #redis.call('XRANGE', KEYS[3], cursor, cursor) == 0 then
  return {now, 0, cursor, {}, {}, control}
end
-- Liveness entries expired longer ago than the heartbeat script keeps them
-- (an hour) are gone from the live set: a reader that far behind cannot
-- learn of those expiries from it and must read in full.
if tonumber(ARGV[1]) < now - 3000000 then
  return {now, 0, cursor, {}, {}, control}
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], now)
local entries = redis.call('XRANGE', KEYS[3], '(' .. cursor, '+', 'COUNT', tonumber(ARGV[3]))
local seen = {}
local changed = {}
for _, entry in ipairs(entries) do
  cursor = entry[1]
  local fields = entry[2]
  local id = fields[2]
  if id and id ~= '' and not seen[id] then
    seen[id] = true
    local score = redis.call('ZSCORE', KEYS[1], id)
    local record = redis.call('GET', ARGV[4] .. id)
    changed[#changed + 1] = id
    changed[#changed + 1] = score or ''
    changed[#changed + 1] = redis.call('SISMEMBER', KEYS[2], id)
    changed[#changed + 1] = record or ''
  end
end
return {now, 1, cursor, expired, changed, control}
";

/// `KEYS[1]` live set: members whose expiry is still in the future by Redis' clock.
pub const LIVE_MEMBERS_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
";

/// The reflector key ([`Keys::reflector_key`]): the one in Redis, or a new
/// random one stored there first if there is none (`SET NX`, so of two
/// processes racing to make it, both end up with the same key).
pub async fn reflector_key(
    redis: &mut redis_target::RedisConnection,
    keys: &Keys,
) -> redis::RedisResult<Vec<u8>> {
    use redis::AsyncCommands;
    let key = keys.reflector_key();
    // Two v4 UUIDs: 244 random bits from the OS's generator.
    let fresh = format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    let _: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg(&fresh)
        .arg("NX")
        .query_async(redis)
        .await?;
    let stored: Option<String> = redis.get(&key).await?;
    Ok(stored.unwrap_or(fresh).into_bytes())
}

/// A backing store could not be reached at start-up.
#[derive(Debug, thiserror::Error)]
#[error("{what} is not reachable: {detail}")]
pub struct StoreUnavailable {
    pub what: &'static str,
    pub detail: String,
}

/// A store URL with any password replaced, fit for an error message or log.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***@{}", &url[..scheme_end + 3], user, &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_rows_are_billable_unless_they_say_otherwise() {
        let old = serde_json::json!({
            "account_id": Uuid::nil(), "user_id": Uuid::nil(), "exit_id": Uuid::nil(),
            "minute": 60, "bytes_up": 1, "bytes_down": 2,
        });
        let row: UsageRow = serde_json::from_value(old.clone()).unwrap();
        assert!(row.billable, "a row from an older superproxy is billed");
        assert_eq!(
            serde_json::to_value(&row).unwrap(),
            old,
            "a billable row is written as before"
        );
        let held = UsageRow {
            billable: false,
            ..row
        };
        let json = serde_json::to_value(&held).unwrap();
        assert_eq!(json["billable"], false);
        assert_eq!(serde_json::from_value::<UsageRow>(json).unwrap(), held);
    }

    #[test]
    fn user_records_without_retry_rules_read_and_write_as_before() {
        let record = serde_json::json!({
            "id": Uuid::nil(), "account_id": Uuid::nil(), "username": "alice",
            "password_hash": "x", "enabled": true, "version": 1,
        });
        let parsed: UserRecord = serde_json::from_value(record).unwrap();
        assert!(parsed.retry_rules.is_empty() && parsed.account_retry_rules.is_empty());
        let written = serde_json::to_value(&parsed).unwrap();
        assert!(written.get("retry_rules").is_none(), "{written}");
        assert!(written.get("account_retry_rules").is_none(), "{written}");
    }

    #[test]
    fn keys_are_prefixed_and_hash_tagged() {
        let k = Keys::new("t1:");
        // FNV-1a("alice") = 0x872213e7 → bucket 0xe7.
        assert_eq!(k.user("alice"), "t1:user:{ue7}:alice");
        assert_eq!(k.users_projected("alice"), "t1:projection:complete:{ue7}");
        assert_eq!(k.users_in_bucket(user_bucket("alice")), "t1:users:{ue7}");
        assert_eq!(k.projection_markers().len(), USER_BUCKETS + 1);
        let id = Uuid::nil();
        assert_eq!(k.exit(id), format!("t1:{{exits}}:exit:{id}"));
        assert!(k.exit(id).starts_with(&k.exit_prefix()));
    }

    #[test]
    fn quota_windows_are_calendar_days_and_months() {
        // 2026-11-30T12:00:00Z
        let t = 1_796_040_000;
        let (key, start, end) = QuotaPeriod::Daily.window(t);
        assert_eq!(key, "d20261130");
        assert_eq!((end - start), 86_400);
        assert!(start <= t && t < end);
        let (key, start, end) = QuotaPeriod::Monthly.window(t);
        assert_eq!(key, "m202611");
        assert_eq!((end - start) / 86_400, 30);
        assert!(start <= t && t < end);
        let (key, _, end) = QuotaPeriod::Monthly.window(1_798_761_600 - 1); // 2026-12-31T23:59:59Z
        assert_eq!(key, "m202612");
        assert_eq!(end, 1_798_761_600);
    }

    #[test]
    fn exit_records_carry_prefixes_only_when_they_have_some() {
        let old = r#"{"id":"00000000-0000-0000-0000-000000000000","name":"a","egress_ips":["192.0.2.1"],
            "source_type":"dc","country":"DE","owner":"o","draining":false,"disabled":false,
            "credential_sha256":""}"#;
        let mut record: ExitRecord = serde_json::from_str(old).unwrap();
        assert!(record.egress_prefixes.is_empty());
        assert!(!serde_json::to_string(&record)
            .unwrap()
            .contains("egress_prefixes"));
        assert!(!record.has_egress_family(false));
        record.egress_prefixes = vec!["2001:db8:7::/48".parse().unwrap()];
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json["egress_prefixes"],
            serde_json::json!(["2001:db8:7::/48"])
        );
        let back: ExitRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
        assert!(back.can_egress_from("2001:db8:7:1::9".parse().unwrap()));
        assert!(back.can_egress_from("192.0.2.1".parse().unwrap()));
        assert!(!back.can_egress_from("2001:db8:8::1".parse().unwrap()));
        assert!(back.has_egress_family(false) && back.has_egress_family(true));
        // A record without a region (written before exits declared one) has none.
        assert_eq!(back.region, None);
        // Nor verified egress until the reflector saw some.
        assert!(back.verified_egress.is_empty());
        assert!(!json_has(&back, "verified_egress"));
        assert!(!json_has(&back, "region"));
        record.region = Some("DE-BY".into());
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["region"], "DE-BY");
        assert_eq!(serde_json::from_value::<ExitRecord>(json).unwrap(), record);
    }

    fn json_has(record: &ExitRecord, field: &str) -> bool {
        serde_json::to_value(record).unwrap().get(field).is_some()
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redact_url("redis://h:1/"), "redis://h:1/");
    }
}
