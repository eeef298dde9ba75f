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
mod dns_rebinding;
mod degraded;
mod docs;
mod enrollment;
mod fault_matrix;
mod entitlements;
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
