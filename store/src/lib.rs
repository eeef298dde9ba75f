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
//!
//! The parts: [`Keys`] (the key layout), the records stored under them
//! ([`UserRecord`], [`ExitRecord`], …), the scripts ([`HEARTBEAT_SCRIPT`],
//! …), how to reach Redis ([`redis_target`]), and what the superproxy and
//! the control-api both read or write beside them ([`policy`],
//! [`site_cooldowns`], [`session_pin`], [`reflector_key`]). The agents'
//! contract types the records carry ([`Channel`], [`SourceType`],
//! [`SuperproxyRecord`]) are `proxynet-wire`'s, re-exported here.

pub mod policy;
pub mod redis_target;
pub mod session_pin;
pub mod site_cooldowns;

mod keys;
mod records;
mod reflector;
mod scripts;
mod unavailable;

pub use keys::{user_bucket, Keys, USER_BUCKETS};
pub use proxynet_wire::heartbeat::SuperproxyRecord;
pub use proxynet_wire::provenance::{Channel, SourceType};
pub use records::{
    AccountLimits, AuditEvent, Dedication, ExitRecord, ProvenanceBlock, QuotaPeriod,
    SuperproxyStats, TargetRow, Tombstone, UpstreamExit, UsageBatch, UsageRow, UserEntry,
    UserRecord, TOMBSTONE_TTL_SECS,
};
pub use reflector::reflector_key;
pub use scripts::{
    DEL_EXIT_SCRIPT, DEL_USER_SCRIPT, EXIT_CHANGES_KEPT, HEARTBEAT_SCRIPT,
    LIVE_AND_DRAINING_SCRIPT, LIVE_MEMBERS_SCRIPT, POOL_DELTA_SCRIPT, PUT_EXIT_SCRIPT,
    PUT_USER_SCRIPT, TOUCH_LIVE_SCRIPT,
};
pub use unavailable::{redact_url, StoreUnavailable};

#[cfg(test)]
mod tests;
