//! End-to-end tests: real Postgres, Redis, binaries and clients on loopback.
//! One test binary, one module per area.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_admin;
mod allowlist;
mod api_contract;
mod clients;
mod connect_tunnels;
mod connection_bounds;
mod control_plane;
mod dashboard_security;
mod degraded;
mod deployment;
mod dns_rebinding;
mod docs;
mod drain;
mod egress_policy;
mod enrollment;
mod entitlements;
mod fault_matrix;
mod forwarding;
mod health;
mod ingress;
mod isolation;
mod key_lifecycle;
mod limits;
mod link_replacement;
mod link_versions;
mod login_throttle;
mod malformed_requests;
mod observability;
mod postgres_outage;
mod provenance;
mod quota;
mod revocation;
mod secrets;
mod selection;
mod sessions;
mod spine;
mod startup;
mod tenancy;
mod usage;
mod usage_durability;
mod user_limits;
