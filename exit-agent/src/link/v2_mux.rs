//! Link v2, the mux, from the agent's side: accept streams until told to
//! stop, then GOAWAY and let the open tunnels finish; each stream's OPEN is a
//! probe, a tunnel request or a UDP association (`udp.rs`).

use bytes::Bytes;
use proxynet_common::splice::splice_until;
use proxynet_wire::link::{Outcome, StreamRequest};
use proxynet_wire::mux::{self, Incoming, MuxConfig, Role};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use super::LinkStream;
use crate::tunnel::{admit, count, open, probe_outcome, TunnelContext, TunnelRequest};

/// Serves a v2 link: accepts mux streams until `stop`, then sends GOAWAY
/// and lets the open tunnels finish.
pub(super) async fn serve(
    tls: LinkStream,
    ctx: Arc<TunnelContext>,
    stop: &CancellationToken,
) -> Result<(), String> {
    let config = MuxConfig {
        // Streams past our tunnel limit would only be refused: reset them at
        // the mux, before any work.
        max_streams: ctx.config.max_tunnels.saturating_add(64),
        ..MuxConfig::default()
    };
    let (handle, connection) = mux::start(tls, Role::Server, config);
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            ended = connection.as_mut() => return ended.map_err(|e| e.to_string()),
            incoming = handle.accept(), if !stopping => match incoming {
                Some(incoming) => {
                    tokio::spawn(serve_stream(ctx.clone(), incoming));
                }
                // No more streams will come; the connection ends when the
                // open ones finish.
                None => stopping = true,
            },
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                handle.go_away();
            }
        }
    }
}

/// Serves one v2 (mux) stream: probe, tunnel or UDP association.
async fn serve_stream(ctx: Arc<TunnelContext>, incoming: Incoming) {
    let request = serde_json::from_slice::<StreamRequest>(&incoming.request);
    let (guard, tcp) = match request {
        Ok(StreamRequest::Probe) => {
            reply(incoming, probe_outcome(&ctx));
            return;
        }
        Err(_) => {
            reply(incoming, Outcome::BadRequest);
            return;
        }
        Ok(StreamRequest::Udp { .. }) if ctx.upstream.is_some() => {
            // An upstream exit said it carries no UDP; a superproxy asking
            // anyway is refused before anything is bound.
            reply(incoming, Outcome::BadRequest);
            return;
        }
        Ok(StreamRequest::Udp {
            egress_ips,
            budget_ms: _,
            window,
        }) => {
            crate::udp::serve(ctx, incoming, egress_ips, window).await;
            return;
        }
        Ok(StreamRequest::Tunnel {
            target,
            egress_ip,
            budget_ms,
            window,
            upstream,
        }) => {
            // Before anything is sent: the superproxy grants what it named.
            if let Some(window) = window {
                incoming.start_window(window);
            }
            let Some(guard) = admit(&ctx) else {
                reply(incoming, Outcome::Capacity);
                return;
            };
            let opened = match TunnelRequest::from_target(&target, egress_ip, budget_ms) {
                Ok(request) => open(&ctx, &request.with_upstream(upstream)).await,
                Err(outcome) => Err(outcome),
            };
            match opened {
                Ok(tcp) => (guard, tcp),
                Err(outcome) => {
                    reply(incoming, outcome);
                    return;
                }
            }
        }
    };
    count(Outcome::Connected);
    let stream = incoming.reply(Bytes::from_static(Outcome::Connected.as_str().as_bytes()));
    let _guard = guard;
    let cut = ctx.cut_token();
    let outcome = splice_until(stream, tcp, ctx.config.tunnel_limits(), cut.cancelled()).await;
    tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "tunnel closed");
}

/// Answers a v2 stream that will carry no bytes (and so resets it).
fn reply(incoming: Incoming, outcome: Outcome) {
    count(outcome);
    drop(incoming.reply(Bytes::from_static(outcome.as_str().as_bytes())));
}
