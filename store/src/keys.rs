//! The key layout: [`Keys`] builds every key of one stack's namespace, and
//! [`user_bucket`] spreads user records over [`USER_BUCKETS`] hash tags (the
//! crate's doc says why keys are shaped as they are).

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
    /// re-reading every exit ([`POOL_DELTA_SCRIPT`](crate::POOL_DELTA_SCRIPT)).
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

    /// Bytes a user has used in one quota period (see
    /// [`QuotaPeriod::window`](crate::QuotaPeriod::window)).
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

    /// A superproxy's [`SuperproxyStats`](crate::SuperproxyStats) JSON (expires with the instance).
    pub fn stats(&self, superproxy: Uuid) -> String {
        format!("{}stats:{{{superproxy}}}", self.prefix)
    }

    /// The secret superproxies sign their egress reflections with and the
    /// control-api checks them by (hex): made by whichever needs it first
    /// ([`reflector_key`](crate::reflector_key)), so agents cannot forge what a reflector saw.
    pub fn reflector_key(&self) -> String {
        format!("{}reflector-key", self.prefix)
    }

    /// The operator's [`policy::OperatorPolicy`](crate::policy::OperatorPolicy) JSON
    /// (announced as `policy`).
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
