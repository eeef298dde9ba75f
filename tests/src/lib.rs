//! Test support for proxynet: real Postgres and Redis, the real binaries on
//! free loopback ports, a whoami target, and thin wrappers over real clients.
//!
//! Postgres and Redis servers come from the environment (`scripts/test` starts
//! them and exports `PROXYNET_TEST_DATABASE_URL` / `PROXYNET_TEST_REDIS_URL`);
//! each test then creates its own database and its own Redis key prefix, and
//! starts its own processes on port 0, waiting for their ready lines.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod certs;
pub mod client;
pub mod dns;
pub mod faults;
pub mod metrics;
pub mod netns;
pub mod partners;
pub mod postgres_pair;
pub mod process;
pub mod protocol_bench;
pub mod reflector;
pub mod sentinel;
pub mod stack;
pub mod stores;
pub mod targets;
pub mod webhook_receiver;
pub mod whoami;
