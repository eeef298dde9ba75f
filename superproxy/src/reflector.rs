//! The egress reflector (`--reflector-listen`, off unless set): agents ask
//! it from each of their egress addresses to learn the public address
//! their traffic leaves from (behind NAT it is not the one they bind), and
//! pass the signed answer to the control-api, which records it for the
//! abuse desk, checks declared egress against it and lets an exit's admin
//! listener on a verified address into the fleet's protected set
//! (docs/provenance.md). We run it ourselves so that no third party learns
//! our exits' addresses.
//!
//! It signs only for the exit that asks, proven by the exit's credential
//! over a fresh challenge ([`proxynet_wire::reflector`]):
//! `GET /whoami/challenge` answers `{"challenge"}`, stateless (time, nonce
//! and the caller's address under the reflector key); `GET
//! /whoami?exit=ID&challenge=C&proof=P` from the same address within 30 s
//! answers `200 {"address": PEER, "at", "exit", "proof"}`, the address the
//! connection came from, signed with the reflector key that the
//! superproxies and the control-api share through Redis
//! ([`proxynet_store::reflector_key`]). The proof is checked against the
//! credential digest in the exit's record in Redis: a missing or wrong
//! proof, an unknown exit, a stale challenge or one issued to another
//! address is `403`. Its own addresses are in the protected set every exit
//! denies (`announce.rs`), so a request tunnelled through another exit
//! never reaches it.
//!
//! It faces the internet, so it is bounded like nothing else here needs to
//! be: at most [`MAX_IN_FLIGHT`] connections (more are closed at once), one
//! request each (no keep-alive), the head within [`HEAD_TIMEOUT`] and the
//! whole exchange within [`CONNECTION_DEADLINE`]. The challenge costs one
//! MAC and no state; an ask costs a MAC, and one Redis read only once its
//! challenge holds. Anything else is `404`.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{ExitRecord, Keys};
use proxynet_wire::reflector::{
    challenge_holds, exit_proof_holds, Challenge, Reflection, CHALLENGE_PATH, CHALLENGE_TTL_SECS,
    WHOAMI_PATH,
};
use redis::AsyncCommands;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use uuid::Uuid;

/// Connections served at once; beyond it new ones are closed unanswered.
pub(crate) const MAX_IN_FLIGHT: usize = 256;
/// Time a client has to send its request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest one connection lives, answer included.
pub(crate) const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// How often the key is re-read from Redis: a Redis that lost it gets a new
/// one from whichever process asks first, and every signer follows within this.
const KEY_REFRESH: Duration = Duration::from_secs(30);
/// Longest `challenge` and `proof` parameters read (both are far shorter).
const MAX_PARAM: usize = 256;

/// The reflector key as last read from Redis (`None` until the first read
/// succeeds: the reflector then answers `503`).
pub(crate) struct ReflectorKey {
    redis: RedisConnection,
    keys: Keys,
    current: RwLock<Option<Arc<Vec<u8>>>>,
}

impl ReflectorKey {
    pub(crate) fn new(redis: RedisConnection, keys: Keys) -> Self {
        Self {
            redis,
            keys,
            current: RwLock::new(None),
        }
    }

    pub(crate) fn current(&self) -> Option<Arc<Vec<u8>>> {
        self.current.read().ok().and_then(|k| k.clone())
    }

    /// Reads (or makes) the key; on failure the last one stays.
    pub(crate) async fn refresh(&self) {
        let mut redis = self.redis.clone();
        match proxynet_store::reflector_key(&mut redis, &self.keys).await {
            Ok(key) => {
                if let Ok(mut current) = self.current.write() {
                    *current = Some(Arc::new(key));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the reflector key; keeping the last one")
            }
        }
    }

    /// Re-reads the key every [`KEY_REFRESH`] until `stop`.
    pub(crate) async fn run(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(KEY_REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.refresh().await;
        }
    }
}

/// Where the reflector finds what an exit's proof is checked against: the
/// SHA-256 of its credential, in the exit's record in Redis (the digest the
/// link listener checks hellos against).
#[derive(Clone)]
pub(crate) struct ExitCredentials {
    redis: RedisConnection,
    keys: Keys,
}

impl ExitCredentials {
    pub(crate) fn new(redis: RedisConnection, keys: Keys) -> Self {
        Self { redis, keys }
    }

    /// The credential digest of `exit` (`None`: no such exit).
    async fn digest(&self, exit: Uuid) -> Result<Option<String>, redis::RedisError> {
        let mut redis = self.redis.clone();
        let json: Option<String> = redis.get(self.keys.exit(exit)).await?;
        Ok(json
            .and_then(|j| serde_json::from_str::<ExitRecord>(&j).ok())
            .map(|record| record.credential_sha256))
    }
}

/// The reflector's listener, the key it signs with and where it checks
/// exits' proofs.
pub(crate) struct Reflector {
    pub listener: TcpListener,
    pub key: Arc<ReflectorKey>,
    pub exits: ExitCredentials,
}

impl Reflector {
    pub(crate) async fn run(self, stop: Stop) {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => return,
                accepted = self.listener.accept() => accepted,
            };
            let Ok((stream, peer)) = accepted else {
                // Out of descriptors or similar: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                metrics::counter!("proxynet_reflector_refused_total").increment(1);
                continue;
            };
            let (key, exits) = (self.key.clone(), self.exits.clone());
            tokio::spawn(async move {
                let _slot = slot;
                // An IPv4 client of a dual-stack listener arrives as
                // `::ffff:a.b.c.d`: the address it sent from is the IPv4 one.
                let peer = peer.ip().to_canonical();
                let service = service_fn(move |req| {
                    // Everything the answer needs is taken off the request
                    // here: nothing of it is held across the Redis read.
                    let route = route(&req);
                    let key = key.current();
                    let exits = exits.clone();
                    async move {
                        let key = key.as_deref().map(Vec::as_slice);
                        Ok::<_, Infallible>(serve(route, peer, unix_now(), key, &exits).await)
                    }
                });
                let serving = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .keep_alive(false)
                    .max_buf_size(8 * 1024)
                    .serve_connection(TokioIo::new(stream), service);
                let _ = tokio::time::timeout(CONNECTION_DEADLINE, serving).await;
            });
        }
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// `GET /whoami/challenge`.
    Challenge,
    /// `GET /whoami` with an exit, a challenge and a proof.
    Ask(Ask),
    /// `GET /whoami` without the exit's proof: refused, with the reason.
    Unproven(&'static str),
    /// `GET /whoami` whose `exit` is not an exit id.
    BadExit,
    NotFound,
}

/// The parameters of step two, unchecked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ask {
    exit: Uuid,
    challenge: String,
    proof: String,
}

fn route<B>(req: &Request<B>) -> Route {
    if req.method() != Method::GET {
        return Route::NotFound;
    }
    match req.uri().path() {
        CHALLENGE_PATH => Route::Challenge,
        WHOAMI_PATH => ask_of(req.uri().query().unwrap_or_default()),
        _ => Route::NotFound,
    }
}

/// The ask in `query` (`exit=ID&challenge=C&proof=P`, in any order; other
/// parameters are ignored).
fn ask_of(query: &str) -> Route {
    let (mut exit, mut challenge, mut proof) = (None, None, None);
    for pair in query.split('&') {
        if let Some(v) = pair.strip_prefix("exit=") {
            exit = Some(v);
        } else if let Some(v) = pair.strip_prefix("challenge=") {
            challenge = Some(v);
        } else if let Some(v) = pair.strip_prefix("proof=") {
            proof = Some(v);
        }
    }
    let Some(exit) = exit else {
        return Route::Unproven("a reflection is signed only for an exit that proves it is one: GET /whoami/challenge, then /whoami?exit=ID&challenge=C&proof=P");
    };
    let Ok(exit) = exit.parse::<Uuid>() else {
        return Route::BadExit;
    };
    match (challenge, proof) {
        (Some(challenge), Some(proof))
            if !challenge.is_empty()
                && !proof.is_empty()
                && challenge.len() <= MAX_PARAM
                && proof.len() <= MAX_PARAM =>
        {
            Route::Ask(Ask {
                exit,
                challenge: challenge.to_owned(),
                proof: proof.to_owned(),
            })
        }
        _ => Route::Unproven("the exit's proof is missing: GET /whoami/challenge first, then /whoami?exit=ID&challenge=C&proof=P"),
    }
}

/// The answer to `route` from `peer` at `now`, signed with `key`.
async fn serve(
    route: Route,
    peer: IpAddr,
    now: i64,
    key: Option<&[u8]>,
    exits: &ExitCredentials,
) -> Response<Full<Bytes>> {
    let (ask, key) = match decide(route, peer, now, key) {
        Ok(checked) => checked,
        Err(answer) => return *answer,
    };
    match exits.digest(ask.exit).await {
        Ok(digest) => reflect(&ask, digest.as_deref(), peer, now, key),
        Err(e) => {
            tracing::warn!(error = %e, "the reflector cannot read an exit's record");
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot check the exit's proof right now",
            )
        }
    }
}

/// A reflector's answer (boxed where it is a function's early return).
type Answer = Response<Full<Bytes>>;

/// Everything decided before Redis is asked: the answer, or an ask whose
/// challenge holds (with the key), left for its proof to be checked. The
/// cheap check comes first, so a flood of made-up asks costs no Redis read.
fn decide(
    route: Route,
    peer: IpAddr,
    now: i64,
    key: Option<&[u8]>,
) -> Result<(Ask, &[u8]), Box<Answer>> {
    let ask = match route {
        Route::NotFound => return Err(Box::new(text(StatusCode::NOT_FOUND, "not found"))),
        Route::BadExit => return Err(Box::new(text(StatusCode::BAD_REQUEST, "exit: an exit id"))),
        Route::Unproven(why) => return Err(Box::new(refused(why))),
        Route::Challenge => return Err(Box::new(challenge(peer, now, key))),
        Route::Ask(ask) => ask,
    };
    let Some(key) = key else {
        return Err(Box::new(no_key()));
    };
    if !challenge_holds(key, &ask.challenge, peer, now) {
        return Err(Box::new(refused(&format!(
            "the challenge is not one this reflector issued to this address in the last {CHALLENGE_TTL_SECS} seconds"
        ))));
    }
    Ok((ask, key))
}

/// `GET /whoami/challenge`: a challenge for `peer`.
fn challenge(peer: IpAddr, now: i64, key: Option<&[u8]>) -> Response<Full<Bytes>> {
    let Some(key) = key else {
        return no_key();
    };
    let nonce = Uuid::new_v4().simple().to_string();
    match Challenge::issue(key, peer, now, &nonce).map(|c| serde_json::to_string(&c)) {
        Some(Ok(body)) => answer(StatusCode::OK, "application/json", body),
        _ => text(StatusCode::INTERNAL_SERVER_ERROR, "cannot make a challenge"),
    }
}

/// Step two once the challenge holds: the reflection of `peer`, signed for
/// the exit when its proof holds under `digest` (its credential's SHA-256;
/// `None`: no such exit, answered like a wrong proof).
fn reflect(
    ask: &Ask,
    digest: Option<&str>,
    peer: IpAddr,
    now: i64,
    key: &[u8],
) -> Response<Full<Bytes>> {
    let proven = digest.is_some_and(|d| exit_proof_holds(d, ask.exit, &ask.challenge, &ask.proof));
    if !proven {
        return refused("unknown exit or wrong proof");
    }
    metrics::counter!("proxynet_reflector_asks_total", "result" => "reflected").increment(1);
    match serde_json::to_string(&Reflection::signed(key, peer, now, Some(ask.exit))) {
        Ok(body) => answer(StatusCode::OK, "application/json", body),
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the answer",
        ),
    }
}

/// `403` with the reason: no reflection without the exit's proof.
fn refused(why: &str) -> Response<Full<Bytes>> {
    metrics::counter!("proxynet_reflector_asks_total", "result" => "refused").increment(1);
    text(StatusCode::FORBIDDEN, why)
}

/// Without the key there is neither a challenge nor a signature to give.
fn no_key() -> Response<Full<Bytes>> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the reflector has no key yet",
    )
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    answer(status, "text/plain; charset=utf-8", format!("{body}\n"))
}

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let headers = r.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use proxynet_wire::reflector::exit_proof;

    fn get(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    async fn body(r: Response<Full<Bytes>>) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    const KEY: &[u8] = b"reflector key for the unit test";
    const DIGEST: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    /// Step one's challenge for `peer` at `now`.
    async fn challenge_for(peer: IpAddr, now: i64) -> String {
        let r = challenge(peer, now, Some(KEY));
        assert_eq!(r.status(), StatusCode::OK);
        serde_json::from_str::<Challenge>(&body(r).await)
            .unwrap()
            .challenge
    }

    fn ask(exit: Uuid, challenge: &str, digest: &str) -> Ask {
        Ask {
            exit,
            challenge: challenge.to_owned(),
            proof: exit_proof(digest, exit, challenge).unwrap(),
        }
    }

    #[tokio::test]
    async fn whoami_answers_the_peer_address_signed_for_the_exit_that_proves_it_asked() {
        let exit = Uuid::new_v4();
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        let now = 1_800_000_000;
        let c = challenge_for(peer, now).await;
        let r = reflect(&ask(exit, &c, DIGEST), Some(DIGEST), peer, now + 1, KEY);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let seen: Reflection = serde_json::from_str(&body(r).await).unwrap();
        assert_eq!(
            (seen.address, seen.at, seen.exit),
            (peer, now + 1, Some(exit))
        );
        assert!(seen.verify(KEY));

        // A proof made without the exit's credential, another exit's, or
        // for an exit Redis does not know: refused.
        let wrong = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9";
        for (a, digest) in [
            (ask(exit, &c, wrong), Some(DIGEST)),
            (ask(Uuid::new_v4(), &c, DIGEST), Some(wrong)),
            (ask(exit, &c, DIGEST), None),
        ] {
            let r = reflect(&a, digest, peer, now, KEY);
            assert_eq!(r.status(), StatusCode::FORBIDDEN);
        }
    }

    #[tokio::test]
    async fn an_ask_needs_a_fresh_challenge_issued_to_the_same_address() {
        let exit = Uuid::new_v4();
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        let other: IpAddr = "203.0.113.10".parse().unwrap();
        let now = 1_800_000_000;
        let c = challenge_for(peer, now).await;
        let route = || Route::Ask(ask(exit, &c, DIGEST));
        assert!(decide(route(), peer, now + 2, Some(KEY)).is_ok());
        // Issued to another address, or too long ago: refused before Redis
        // is asked.
        for (from, at) in [(other, now), (peer, now + CHALLENGE_TTL_SECS + 1)] {
            let Err(r) = decide(route(), from, at, Some(KEY)) else {
                panic!("a challenge of {peer} at {now} held for {from} at {at}");
            };
            assert_eq!(r.status(), StatusCode::FORBIDDEN);
            assert!(body(*r).await.contains("issued to this address"));
        }
        // Two challenges for one address differ (a nonce each).
        assert_ne!(c, challenge_for(peer, now).await);
        // No key yet: neither a challenge nor a reflection.
        assert_eq!(
            challenge(peer, now, None).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let Err(r) = decide(route(), peer, now, None) else {
            panic!("an ask held without a key");
        };
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Without a proof, whatever else it says: refused.
        let Err(r) = decide(ask_of(&format!("exit={exit}")), peer, now, Some(KEY)) else {
            panic!("an ask without a proof held");
        };
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn requests_are_routed_and_whoami_without_a_proof_is_unproven() {
        let exit = Uuid::new_v4();
        for uri in [
            "/",
            "/whoami/",
            "/metrics",
            "/whoamix",
            "/whoami/challenge/x",
        ] {
            assert_eq!(route(&get(uri)), Route::NotFound, "{uri}");
        }
        let post = Request::builder()
            .method(Method::POST)
            .uri("/whoami")
            .body(())
            .unwrap();
        assert_eq!(route(&post), Route::NotFound);
        assert_eq!(route(&get("/whoami/challenge")), Route::Challenge);
        assert_eq!(route(&get("/whoami?exit=nope")), Route::BadExit);
        for unproven in [
            "/whoami".to_owned(),
            "/whoami?x=1".to_owned(),
            format!("/whoami?exit={exit}"),
            format!("/whoami?exit={exit}&challenge=1.ab.cd"),
            format!("/whoami?exit={exit}&challenge=&proof=ab"),
            format!(
                "/whoami?exit={exit}&challenge=1.ab.cd&proof={}",
                "a".repeat(300)
            ),
        ] {
            assert!(
                matches!(route(&get(&unproven)), Route::Unproven(_)),
                "{unproven}"
            );
        }
        assert_eq!(
            route(&get(&format!(
                "/whoami?proof=ff&x=1&exit={exit}&challenge=1.ab.cd"
            ))),
            Route::Ask(Ask {
                exit,
                challenge: "1.ab.cd".into(),
                proof: "ff".into()
            })
        );
    }
}
