//! Hand-built parts for the unit tests of admission and of the stages that
//! use it: a Redis that is away (so every store-backed part runs as it does
//! in an outage, and no socket is ever made) and an [`Admission`] over it.

use proxynet_store::redis_target::RedisConnection;
use proxynet_store::Keys;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

use crate::admission::Admission;
use crate::error::ProxyError;

/// How long the test admission's leases live (renewed every third of it).
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(30);

/// A Redis that never answers: a lazily connecting connection whose address
/// is a Unix path longer than a socket address holds, so every connection
/// attempt fails on the address, before any socket is made, and every
/// command fails at once as if the store were down. Needs a Tokio runtime.
pub(crate) fn store_away() -> RedisConnection {
    let url = format!("redis+unix:///nonexistent/{}", "x".repeat(200));
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    let config = redis::aio::ConnectionManagerConfig::new().set_number_of_retries(0);
    let manager = redis::aio::ConnectionManager::new_lazy_with_config(client, config)
        .expect("a lazy connection manager");
    RedisConnection::Single(manager)
}

/// Key names as a deployment would have them.
pub(crate) fn keys() -> Keys {
    Keys::new("test:")
}

/// Admission over a Redis that is away: limits count this instance's own
/// leases, as they do in an outage. `default_user_max`: the default cap of
/// users without a concurrency limit of their own.
pub(crate) fn admission(default_user_max: usize) -> Arc<Admission> {
    Arc::new(Admission::new(
        store_away(),
        keys(),
        Uuid::new_v4(),
        LEASE_TTL,
        default_user_max,
    ))
}

/// The refusal `result` must be (no `Debug` needed of what it admits).
pub(crate) fn refused<T>(result: Result<T, ProxyError>) -> ProxyError {
    match result {
        Ok(_) => panic!("admitted, expected a refusal"),
        Err(e) => e,
    }
}
