//! The last stage, the access log: one line per tunnel on the
//! `proxynet::access` target — who, through which exit and egress IP, to
//! where, how it ended, bytes each way, timings — written when the tunnel
//! is dropped, or at once for a refused one. Never a password; the username
//! is the base user without its grammar.

use proxynet_common::splice::End;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};
use crate::request::{Client, Ingress};
use crate::usage::Meter;

/// The line of an open tunnel, written when it drops.
pub(super) struct AccessLog {
    pub(super) id: Uuid,
    pub(super) ingress: Ingress,
    pub(super) account_id: Uuid,
    pub(super) user_id: Uuid,
    pub(super) username: String,
    pub(super) exit_id: Uuid,
    pub(super) egress_ip: IpAddr,
    pub(super) target: String,
    pub(super) peer: SocketAddr,
    pub(super) started: Instant,
    pub(super) setup_ms: f64,
    pub(super) meter: Arc<Meter>,
    pub(super) end: Option<End>,
    /// Refused after it opened (by the server name in its first bytes):
    /// the error kind and the detail the line gives instead of an end.
    pub(super) refused: Option<(ErrorKind, String)>,
    /// Which attempt of a forwarded request this is, when a retry rule
    /// could send it through more than one exit (1, 2, ...).
    pub(super) attempt: Option<u8>,
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        if let Some((kind, detail)) = &self.refused {
            // The `200` was sent, but nothing reached the target: a refusal,
            // with what the exit's stream carried (nothing of the client's).
            tracing::info!(
                target: "proxynet::access",
                tunnel = %self.id,
                ingress = self.ingress.as_str(),
                account = %self.account_id,
                user_id = %self.user_id,
                user = %self.username,
                exit = %self.exit_id,
                egress_ip = %self.egress_ip,
                target_addr = %self.target,
                client = %self.peer,
                outcome = kind.proxy_status_error(),
                status = kind.status().as_u16(),
                cause = %detail,
                bytes_up = self.meter.up(),
                bytes_down = self.meter.down(),
                setup_ms = self.setup_ms,
                duration_ms = self.started.elapsed().as_secs_f64() * 1000.0,
                "tunnel refused"
            );
            return;
        }
        let outcome = match self.end {
            None | Some(End::Closed) => "closed",
            Some(End::Idle) => "idle_timeout",
            Some(End::Lifetime) => "lifetime",
            Some(End::Cut) => "cut",
            Some(End::Error(_)) => "connection_terminated",
        };
        // Which side's I/O failed is in the kind (reset, broken pipe, ...).
        let error = match self.end {
            Some(End::Error(kind)) => Some(kind.to_string()),
            _ => None,
        };
        tracing::info!(
            target: "proxynet::access",
            tunnel = %self.id,
            ingress = self.ingress.as_str(),
            account = %self.account_id,
            user_id = %self.user_id,
            user = %self.username,
            exit = %self.exit_id,
            egress_ip = %self.egress_ip,
            target_addr = %self.target,
            client = %self.peer,
            outcome,
            error,
            bytes_up = self.meter.up(),
            bytes_down = self.meter.down(),
            // `false` for an attempt given up for another exit (its bytes
            // are in the ledger as not billable).
            billable = self.meter.billable(),
            attempt = self.attempt,
            setup_ms = self.setup_ms,
            duration_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            "tunnel"
        );
    }
}

/// The line of a tunnel that never opened.
pub(super) fn refused(
    ingress: Ingress,
    peer: SocketAddr,
    started: Instant,
    client: Option<&Client>,
    error: &ProxyError,
) {
    tracing::info!(
        target: "proxynet::access",
        tunnel = %Uuid::new_v4(),
        ingress = ingress.as_str(),
        account = client.map(|c| c.account_id.to_string()),
        user_id = client.map(|c| c.user_id.to_string()),
        user = client.map(|c| c.username.as_str()),
        client = %peer,
        outcome = error.kind.proxy_status_error(),
        status = error.kind.status().as_u16(),
        cause = error.cause(),
        bytes_up = 0u64,
        bytes_down = 0u64,
        setup_ms = started.elapsed().as_secs_f64() * 1000.0,
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
        "tunnel refused"
    );
}

#[cfg(test)]
mod tests;
