//! `CONNECT host:port`: a tunnel through an exit for any TCP protocol.
//!
//! The tunnel is fully open before `200` is sent, so every failure still has a
//! status and a `Proxy-Status` — except one: a tunnel to an IP literal whose
//! domain rules wait for the server name in its client's first bytes
//! ([`Pipeline::judge_first_bytes`]) is refused by closing it. From the
//! `200` on, the client connection carries tunnel bytes; bytes the client
//! pipelined behind its request head were held by the head guard and reach
//! the tunnel first. On HTTP/2 the
//! same code serves one stream (RFC 9113 §8.5): there is no head guard, and
//! the stream's DATA frames are the tunnel bytes.

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use proxynet_common::splice::Plain;
use std::sync::Arc;

use super::head_guard::TunnelSwitch;
use super::response::{connect_established, empty_body, ProxyBody};
use crate::accept::ConnectionTicket;
use crate::error::{ErrorKind, ProxyError};
use crate::pipeline::Pipeline;
use crate::request::{Ingress, TargetSpec};
use proxynet_common::splice::TunnelLimits;

pub(crate) async fn connect(
    pipeline: Arc<Pipeline>,
    limits: TunnelLimits,
    switch: Option<TunnelSwitch>,
    ticket: ConnectionTicket,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let ingress = if switch.is_some() {
        Ingress::Connect
    } else {
        Ingress::H2Connect
    };
    let authority = req
        .uri()
        .authority()
        .ok_or_else(|| ProxyError::new(ErrorKind::BadRequest, "CONNECT needs host:port"))?
        .as_str()
        .to_owned();
    let options = super::header_options(&req);
    let target = TargetSpec::Authority(&authority).reported(super::header_report(req.headers()));
    let mut tunnel = pipeline
        .open(
            ingress,
            super::credentials(&req),
            options.as_deref(),
            target,
            &ticket,
        )
        .await?;
    // The head guard is engaged by `handle` once it sees this 2xx.
    let response = connect_established(&tunnel).map(|()| empty_body());
    let on_client_upgrade = hyper::upgrade::on(req);
    let judge = tunnel.judges_first_bytes().then(|| pipeline.clone());
    tokio::spawn(async move {
        match on_client_upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                if let Some(pipeline) = judge {
                    if !pipeline.judge_first_bytes(&mut tunnel, &mut client).await {
                        return;
                    }
                }
                let outcome = tunnel.splice(Plain(client), limits).await;
                tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "tunnel closed");
            }
            Err(e) => tracing::debug!(error = %e, "client went away before the tunnel started"),
        }
    });
    Ok(response)
}
