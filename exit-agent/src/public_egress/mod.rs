//! Learning the public address each egress leaves from.
//!
//! Behind NAT (a residential line, a mobile network, an SDK host) the
//! address an exit binds is not the one the world sees, and an abuse
//! complaint names the one the world saw. So at start, every
//! `--egress-observe-interval-secs` and after a link reconnects (a re-dial
//! often moves the public address), the agent asks one of proxynet's own
//! egress reflectors (`GET /whoami` on a superproxy's `--reflector-listen`,
//! never a third party) from each egress IP, and from one random address of
//! each egress prefix (bound with IP_FREEBIND, as tunnels are), and reports
//! the signed answers to the control-api (`POST /v1/agent/exits/{id}/egress`).
//! An egress it cannot observe (no reflector of its family, a timeout) is
//! reported as unobserved, never an error.
//!
//! Reflectors come from the heartbeat replies (every superproxy's, plus the
//! control-api's `--reflector-url`s) unless `--reflector-url` names them.
//!
//! A reflector signs only for the exit that proves it is one, so asking is
//! two requests from the same bound address: `GET /whoami/challenge`, then
//! `GET /whoami?exit=ID&challenge=C&proof=P`, `P` a MAC over the exit id and
//! `C` keyed with the SHA-256 of this exit's credential
//! ([`proxynet_wire::reflector::exit_proof`]). The credential itself never
//! leaves the agent.

use proxynet_common::egress::Cidr;
use proxynet_common::secret::sha256_hex;
use proxynet_common::tasks::Stop;
use proxynet_wire::reflector::{
    exit_proof, Challenge, EgressObservation, EgressReport, EgressUnobserved, Reflection,
    CHALLENGE_PATH,
};
use rand::Rng;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::time::Instant;

use crate::control::ControlClient;
use crate::tunnel::TunnelContext;

pub(crate) mod watch;

/// Connect, ask and read the answers (challenge and reflection) within
/// this, per egress.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest reflector answer read (it is a few hundred bytes).
const MAX_ANSWER: u64 = 8 * 1024;
/// Egress observed at once (an exit may declare 320).
const IN_FLIGHT: usize = 16;
/// A report the control-api did not take is sent again this soon.
const RETRY: Duration = Duration::from_secs(30);
/// Link reconnects re-observe, but not more often than this: a flapping
/// link must not turn into a stream of reports.
const MIN_RECHECK_GAP: Duration = Duration::from_secs(30);

/// Observes and reports until `stop`: first as soon as a reflector is
/// known, then every interval or after a reconnect.
pub(crate) async fn run(ctx: Arc<TunnelContext>, control: ControlClient, stop: Stop) {
    let Some(every) = ctx.config.egress_observe_interval() else {
        return;
    };
    let mut learned = ctx.egress_watch.learned.subscribe();
    loop {
        let urls = if ctx.config.reflector_urls.is_empty() {
            learned.borrow_and_update().clone()
        } else {
            ctx.config.reflector_urls.clone()
        };
        if urls.is_empty() {
            // Nothing to ask yet: the first heartbeat reply names them.
            tokio::select! {
                () = stop.cancelled() => return,
                changed = learned.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let started = Instant::now();
        let report = observe(&ctx, &urls).await;
        let wait = match control.report_egress(&ctx.identity, &report).await {
            Ok(answer) => {
                tracing::info!(
                    observed = report.observed.len(),
                    unobserved = report.unobserved.len(),
                    verification = %answer["verification"].as_str().unwrap_or("?"),
                    "egress observed and reported"
                );
                every
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress report failed; retrying");
                every.min(RETRY)
            }
        };
        let recheck = async {
            ctx.egress_watch.recheck.notified().await;
            tokio::time::sleep_until(started + MIN_RECHECK_GAP).await;
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
            () = recheck => {}
        }
    }
}

/// One reflector: its URL's parts and the addresses its host has now.
struct Reflector {
    /// `Host:` header value (`host:port`, an IPv6 literal bracketed).
    authority: String,
    /// Path and query to ask.
    path: String,
    addrs: Vec<SocketAddr>,
}

impl Reflector {
    /// Where this reflector issues challenges: its path with the last
    /// segment (`/whoami`) replaced by [`CHALLENGE_PATH`], so a reflector
    /// named under a prefix is asked under it too; the query is not carried
    /// over.
    fn challenge_path(&self) -> String {
        let path = self.path.split('?').next().unwrap_or_default();
        match path.rsplit_once('/') {
            Some((base, _)) => format!("{base}{CHALLENGE_PATH}"),
            None => CHALLENGE_PATH.to_owned(),
        }
    }
}

/// Who asks: the exit's id and the SHA-256 (hex) of its credential, the
/// key of its proofs.
#[derive(Clone)]
struct Asker {
    exit: uuid::Uuid,
    credential_sha256: Arc<str>,
}

/// Resolves `urls` (skipping, with a warning, what does not parse or
/// resolve).
async fn reflectors(urls: &[String]) -> Vec<Reflector> {
    let mut out = Vec::new();
    for url in urls {
        let parsed = match reqwest::Url::parse(url) {
            Ok(u) if u.scheme() == "http" => u,
            _ => {
                tracing::warn!(%url, "not a reflector URL (http://HOST:PORT/whoami); skipped");
                continue;
            }
        };
        let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
            continue;
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => match tokio::net::lookup_host((bare, port)).await {
                Ok(found) => found.collect(),
                Err(e) => {
                    tracing::warn!(%url, error = %e, "cannot resolve a reflector; skipped");
                    continue;
                }
            },
        };
        let mut path = parsed.path().to_owned();
        if let Some(query) = parsed.query() {
            path = format!("{path}?{query}");
        }
        out.push(Reflector {
            authority: format!("{host}:{port}"),
            path,
            addrs,
        });
    }
    out
}

/// Every egress this exit declares, as (egress, address to bind, freebind):
/// the egress IPs as themselves, each prefix by one random address of it.
fn egress_to_observe(ctx: &TunnelContext) -> Vec<(Cidr, IpAddr, bool)> {
    let mut rng = rand::thread_rng();
    let ips = ctx.config.egress_ips.iter().filter_map(|ip| {
        let egress: Cidr = ip.to_string().parse().ok()?;
        Some((egress, *ip, false))
    });
    let prefixes = ctx.config.egress_prefixes.iter().map(|prefix| {
        let bound = prefix.host_address(rng.gen_range(prefix.usable_hosts()));
        (
            prefix.masked(),
            bound,
            ctx.config.egress_needs_freebind(bound),
        )
    });
    ips.chain(prefixes).collect()
}

/// Asks a reflector from every egress, [`IN_FLIGHT`] at a time.
async fn observe(ctx: &Arc<TunnelContext>, urls: &[String]) -> EgressReport {
    let reflectors = Arc::new(reflectors(urls).await);
    let asker = Asker {
        exit: ctx.identity.exit_id,
        credential_sha256: Arc::from(sha256_hex(ctx.identity.credential.expose())),
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut asking = tokio::task::JoinSet::new();
    for (egress, bound, freebind) in egress_to_observe(ctx) {
        let (reflectors, slots, asker) = (reflectors.clone(), slots.clone(), asker.clone());
        asking.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let answer = ask_any(&reflectors, bound, freebind, &asker).await;
            (egress, bound, answer)
        });
    }
    let mut report = EgressReport::default();
    while let Some(done) = asking.join_next().await {
        let Ok((egress, bound, answer)) = done else {
            continue;
        };
        let result = if answer.is_ok() {
            "observed"
        } else {
            "unobserved"
        };
        metrics::counter!("proxynet_agent_egress_observations_total", "result" => result)
            .increment(1);
        match answer {
            Ok(reflection) => report.observed.push(EgressObservation {
                egress,
                bound,
                reflection,
            }),
            Err(reason) => report.unobserved.push(EgressUnobserved {
                egress,
                bound,
                reason,
            }),
        }
    }
    report
}

/// The first answer a reflector of `bound`'s family gives.
async fn ask_any(
    reflectors: &[Reflector],
    bound: IpAddr,
    freebind: bool,
    asker: &Asker,
) -> Result<Reflection, String> {
    let mut last = format!(
        "no reflector has an {} address",
        if bound.is_ipv4() { "IPv4" } else { "IPv6" }
    );
    for reflector in reflectors {
        for addr in reflector
            .addrs
            .iter()
            .filter(|a| a.is_ipv4() == bound.is_ipv4())
        {
            let asked =
                tokio::time::timeout(ASK_TIMEOUT, ask(reflector, *addr, bound, freebind, asker))
                    .await;
            match asked {
                Ok(Ok(reflection)) => return Ok(reflection),
                Ok(Err(e)) => last = format!("{addr}: {e}"),
                Err(_) => last = format!("{addr}: timed out"),
            }
        }
    }
    Err(last)
}

/// One ask of the reflector at `addr`, sent from `bound`: a challenge,
/// then the reflection with the exit's proof over it. Both from `bound`:
/// a challenge holds only for the address it was issued to.
async fn ask(
    reflector: &Reflector,
    addr: SocketAddr,
    bound: IpAddr,
    freebind: bool,
    asker: &Asker,
) -> Result<Reflection, String> {
    let challenge: Challenge = parse_answer(
        &get(
            reflector,
            addr,
            bound,
            freebind,
            &reflector.challenge_path(),
        )
        .await?,
    )
    .map_err(|e| format!("challenge: {e}"))?;
    let proof = exit_proof(&asker.credential_sha256, asker.exit, &challenge.challenge)
        .ok_or_else(|| "cannot compute the exit's proof".to_owned())?;
    let separator = if reflector.path.contains('?') {
        '&'
    } else {
        '?'
    };
    let path = format!(
        "{}{separator}exit={}&challenge={}&proof={proof}",
        reflector.path, asker.exit, challenge.challenge
    );
    parse_answer(&get(reflector, addr, bound, freebind, &path).await?)
}

/// One `GET path` to `addr`, sent from `bound`: the raw answer.
async fn get(
    reflector: &Reflector,
    addr: SocketAddr,
    bound: IpAddr,
    freebind: bool,
    path: &str,
) -> Result<Vec<u8>, String> {
    let socket = if bound.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|e| format!("socket: {e}"))?;
    if freebind {
        crate::egress::allow_nonlocal_bind(&socket, bound).map_err(|e| format!("freebind: {e}"))?;
    }
    socket
        .bind(SocketAddr::new(bound, 0))
        .map_err(|e| format!("bind {bound}: {e}"))?;
    let mut stream = socket
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: proxynet-exit-agent/{}\r\nConnection: close\r\n\r\n",
        reflector.authority,
        env!("CARGO_PKG_VERSION"),
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read: {e}"))?;
    Ok(answer)
}

/// The JSON body of a reflector's HTTP answer (a `200`): a challenge or a
/// reflection.
fn parse_answer<T: serde::de::DeserializeOwned>(answer: &[u8]) -> Result<T, String> {
    let text = std::str::from_utf8(answer).map_err(|_| "the answer is not text".to_owned())?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "the answer has no complete head".to_owned())?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        // A refusal says why in its body (an old agent's ask, a stale
        // challenge): worth the log line.
        let why: String = body.trim().chars().take(200).collect();
        return Err(format!("the reflector answered {status:?}: {why}"));
    }
    serde_json::from_str(body).map_err(|e| format!("the answer is not what was asked for: {e}"))
}

#[cfg(test)]
mod tests {
    use super::watch::EgressWatch;
    use super::*;
    use proxynet_wire::heartbeat::HeartbeatReply;

    #[test]
    fn a_reflector_answer_parses_only_when_it_is_a_200_reflection() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"address\":\"203.0.113.4\",\"at\":7,\"proof\":\"ab\"}";
        let seen: Reflection = parse_answer(ok).unwrap();
        assert_eq!(seen.address.to_string(), "203.0.113.4");
        assert_eq!(seen.proof.as_deref(), Some("ab"));
        let refused = b"HTTP/1.1 403 Forbidden\r\n\r\nunknown exit or wrong proof\n";
        let why = parse_answer::<Reflection>(refused).unwrap_err();
        assert!(why.contains("403") && why.contains("wrong proof"), "{why}");
        assert!(parse_answer::<Reflection>(b"HTTP/1.1 200 OK\r\n\r\n{}").is_err());
        assert!(parse_answer::<Reflection>(b"HTTP/1.1 200 OK\r\n").is_err());
        let challenge: Challenge =
            parse_answer(b"HTTP/1.1 200 OK\r\n\r\n{\"challenge\":\"1.ab.cd\"}").unwrap();
        assert_eq!(challenge.challenge, "1.ab.cd");
    }

    #[tokio::test]
    async fn the_challenge_is_asked_where_the_reflector_is_mounted() {
        let found = reflectors(&[
            "http://127.0.0.1:81/whoami?v=1".into(),
            "http://127.0.0.1:82/edge/whoami".into(),
        ])
        .await;
        assert_eq!(found[0].challenge_path(), "/whoami/challenge");
        assert_eq!(found[1].challenge_path(), "/edge/whoami/challenge");
    }

    #[test]
    fn reflectors_are_learned_from_the_superproxies_and_the_control_api() {
        let watch = EgressWatch::default();
        let mut updates = watch.learned.subscribe();
        let record = |reflector: Option<&str>| proxynet_store::SuperproxyRecord {
            id: uuid::Uuid::new_v4(),
            link_addr: "192.0.2.1:7443".parse().unwrap(),
            cert_sha256: String::new(),
            service_addrs: Vec::new(),
            reflector: reflector.map(|r| r.parse().unwrap()),
        };
        let reply = HeartbeatReply {
            heartbeat_interval_ms: 1_000,
            heartbeat_ttl_ms: 3_000,
            superproxies: vec![record(Some("[2001:db8::1]:8099")), record(None)],
            protected: Vec::new(),
            reflectors: vec!["http://192.0.2.9:8099/whoami".into()],
        };
        watch.learn(&reply);
        assert!(updates.has_changed().unwrap());
        assert_eq!(
            *updates.borrow_and_update(),
            [
                "http://192.0.2.9:8099/whoami",
                "http://[2001:db8::1]:8099/whoami"
            ]
        );
        // The same list again is no change.
        watch.learn(&reply);
        assert!(!updates.has_changed().unwrap());
    }

    #[tokio::test]
    async fn reflector_urls_resolve_to_where_and_what_to_ask() {
        let found = reflectors(&[
            "http://[2001:db8::1]:8099/whoami".into(),
            "http://127.0.0.1:81/whoami?v=1".into(),
            "https://192.0.2.1/whoami".into(),
        ])
        .await;
        assert_eq!(found.len(), 2, "https is no reflector");
        assert_eq!(found[0].authority, "[2001:db8::1]:8099");
        assert_eq!(found[0].addrs, ["[2001:db8::1]:8099".parse().unwrap()]);
        assert_eq!(found[1].path, "/whoami?v=1");
    }
}
