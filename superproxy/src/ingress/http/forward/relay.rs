//! The answer's way back: what it tells the request's site of its exit
//! ([`judge`]), the head the client gets (end-to-end fields,
//! `Proxynet-Exit`, `Proxynet-Attempts`) with the body streaming behind it
//! ([`relay`]), and after a WebSocket `101` the two sides spliced under the
//! tunnel's holds.

use http::{header, HeaderValue, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use proxynet_common::splice::{splice_until, Plain, TunnelLimits};
use proxynet_store::policy::RetryRule;

use super::upstream::Answer;
use crate::ingress::http::expect::{AbortOnEnd, Gate};
use crate::ingress::http::hygiene::end_to_end;
use crate::ingress::http::response::{empty_body, ProxyBody, ATTEMPTS_HEADER};
use crate::pipeline::Pipeline;

/// Records what `answer` says of its exit for its site ([`crate::sites`]):
/// a ban when `rule` calls it one (the exit cooled for the site at once
/// when the rule says `cool`), a success for a 2xx, a 3xx or a `101`, and
/// nothing for any other answer (a 404 is the page's, a 500 the server's:
/// neither says the site refuses the exit). Whether it is a ban.
pub(super) fn judge(pipeline: &Pipeline, rule: Option<&RetryRule>, answer: &Answer) -> bool {
    let status = answer.response.status();
    let headers = answer.response.headers();
    let banned =
        rule.is_some_and(|rule| rule.bans(status.as_u16(), |name| headers.contains_key(name)));
    let fine = status.is_success()
        || status.is_redirection()
        || status == http::StatusCode::SWITCHING_PROTOCOLS;
    if let Some(site) = answer.site.as_ref().filter(|_| banned || fine) {
        let cool = rule.is_some_and(|rule| rule.cool);
        pipeline
            .sites()
            .record_http(answer.meter.account_id, answer.exit, site, banned, cool);
    }
    banned
}

/// The answer as the client gets it: its end-to-end fields plus
/// `Proxynet-Exit` (and a session's expiry), and `Proxynet-Attempts` when
/// a retry rule sent the request through more than one exit (`attempts`:
/// set when one could have). After a WebSocket `101` (`upgrade`: the
/// client's side and the splice's limits), the two sides are spliced.
pub(super) fn relay(
    answer: Answer,
    gate: Option<Gate>,
    upgrade: Option<(hyper::upgrade::OnUpgrade, TunnelLimits)>,
    attempts: Option<u8>,
) -> Response<ProxyBody> {
    let Answer {
        mut response,
        mut info,
        upgraded_rx,
        ..
    } = answer;
    if let Some(gate) = &gate {
        // A final answer before any 100: the body stays back for good.
        gate.answered();
    }
    if let Some(attempts) = attempts.filter(|n| *n > 1) {
        info.insert(ATTEMPTS_HEADER, HeaderValue::from(u16::from(attempts)));
    }
    if let (Some((client_upgrade, limits)), Some(upgraded_rx)) = (
        upgrade.filter(|_| response.status() == http::StatusCode::SWITCHING_PROTOCOLS),
        upgraded_rx,
    ) {
        let origin_upgrade = hyper::upgrade::on(&mut response);
        tokio::spawn(splice_upgraded(
            client_upgrade,
            origin_upgrade,
            upgraded_rx,
            limits,
        ));
        let (mut parts, _) = response.into_parts();
        parts.headers = end_to_end(&parts.headers);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts
            .headers
            .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        parts.headers.extend(info);
        return Response::from_parts(parts, empty_body());
    }
    let (mut parts, body) = response.into_parts();
    parts.headers = end_to_end(&parts.headers);
    if attempts == Some(1) {
        // Only the gateway says how many exits it tried.
        parts.headers.remove(ATTEMPTS_HEADER);
    }
    parts.headers.extend(info);
    let body: ProxyBody = match gate {
        // The origin has answered: once its answer is relayed, a body it
        // did not ask for is not sent.
        Some(gate) => AbortOnEnd::new(body, gate)
            .map_err(Box::from)
            .boxed_unsync(),
        None => body.map_err(Box::from).boxed_unsync(),
    };
    Response::from_parts(parts, body)
}

/// Splices a WebSocket client and origin after the origin's `101`, under
/// the tunnel's holds (lease, meter, ticket, access-log line) until either
/// side closes, the tunnel idles out or it is cut.
async fn splice_upgraded(
    client: hyper::upgrade::OnUpgrade,
    origin: hyper::upgrade::OnUpgrade,
    holds: tokio::sync::oneshot::Receiver<crate::pipeline::Holds>,
    limits: TunnelLimits,
) {
    let (client, origin, holds) = tokio::join!(client, origin, holds);
    let (Ok(client), Ok(origin), Ok(mut holds)) = (client, origin, holds) else {
        tracing::debug!("a side went away before the WebSocket splice started");
        return;
    };
    let outcome = splice_until(
        Plain(TokioIo::new(client)),
        Plain(TokioIo::new(origin)),
        limits,
        holds.cut(),
    )
    .await;
    holds.ended(outcome.end);
    tracing::debug!(up = outcome.up, down = outcome.down, end = ?outcome.end, "WebSocket closed");
}
