//! End-to-end tests: real Postgres, Redis, binaries and clients on loopback.
//! One test binary, one module per area.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_admin;
mod allowlist;
mod api_contract;
mod clients;
mod connection_bounds;
mod control_plane;
mod dashboard_security;
mod defects;
mod degraded;
mod dns_rebinding;
mod docs;
mod enrollment;
mod entitlements;
mod fault_matrix;
mod forwarding;
mod hardening;
mod health;
mod ingress;
mod isolation;
mod key_lifecycle;
mod limits;
mod link_versions;
mod observability;
mod provenance;
mod quota;
mod selection;
mod spine;
mod startup;
mod tenancy;
mod usage;
mod user_limits;
