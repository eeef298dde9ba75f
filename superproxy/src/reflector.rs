//! The egress reflector (`--reflector-listen`, off unless set): `GET
//! /whoami` answers `200 {"address": PEER, "at", "exit", "proof"}`, the
//! address the connection came from, signed with the reflector key that the
//! superproxies and the control-api share through Redis
//! ([`proxynet_store::reflector_key`]). Agents ask it from each of their
//! egress addresses to learn the public address their traffic leaves from
//! (behind NAT it is not the one they bind), and pass the signed answer to
//! the control-api, which records it for the abuse desk and checks declared
//! egress against it (docs/provenance.md). We run it ourselves so that no
//! third party learns our exits' addresses.
//!
//! It faces the internet, so it is bounded like nothing else here needs to
//! be: at most [`MAX_IN_FLIGHT`] connections (more are closed at once), one
//! request each (no keep-alive), the head within [`HEAD_TIMEOUT`] and the
//! whole exchange within [`CONNECTION_DEADLINE`]. Anything but `GET
//! /whoami` is `404`.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::Keys;
use proxynet_wire::reflector::{Reflection, WHOAMI_PATH};
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use uuid::Uuid;

/// Connections served at once; beyond it new ones are closed unanswered.
pub const MAX_IN_FLIGHT: usize = 256;
/// Time a client has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest one connection lives, answer included.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// How often the key is re-read from Redis: a Redis that lost it gets a new
/// one from whichever process asks first, and every signer follows within this.
const KEY_REFRESH: Duration = Duration::from_secs(30);

/// The reflector key as last read from Redis (`None` until the first read
/// succeeds: answers then carry no proof, which the control-api refuses).
pub struct ReflectorKey {
    redis: RedisConnection,
    keys: Keys,
    current: RwLock<Option<Arc<Vec<u8>>>>,
}

impl ReflectorKey {
    pub fn new(redis: RedisConnection, keys: Keys) -> Self {
        Self {
            redis,
            keys,
            current: RwLock::new(None),
        }
    }

    pub fn current(&self) -> Option<Arc<Vec<u8>>> {
        self.current.read().ok().and_then(|k| k.clone())
    }

    /// Reads (or makes) the key; on failure the last one stays.
    pub async fn refresh(&self) {
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
    pub async fn run(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(KEY_REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.refresh().await;
        }
    }
}

/// The reflector's listener and the key it signs with.
pub struct Reflector {
    pub listener: TcpListener,
    pub key: Arc<ReflectorKey>,
}

impl Reflector {
    pub async fn run(self, stop: Stop) {
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
            let key = self.key.clone();
            tokio::spawn(async move {
                let _slot = slot;
                // An IPv4 client of a dual-stack listener arrives as
                // `::ffff:a.b.c.d`: the address it sent from is the IPv4 one.
                let peer = peer.ip().to_canonical();
                let service = service_fn(move |req| {
                    let key = key.current();
                    async move {
                        Ok::<_, Infallible>(respond(
                            &req,
                            peer,
                            unix_now(),
                            key.as_deref().map(Vec::as_slice),
                        ))
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

/// The answer to one request from `peer` at `now`, signed with `key`.
fn respond<B>(
    req: &Request<B>,
    peer: IpAddr,
    now: i64,
    key: Option<&[u8]>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET || req.uri().path() != WHOAMI_PATH {
        return answer(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n".into(),
        );
    }
    let exit = match exit_of(req.uri().query()) {
        Ok(exit) => exit,
        Err(()) => {
            return answer(
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8",
                "exit: an exit id\n".into(),
            )
        }
    };
    let reflection = match key {
        Some(key) => Reflection::signed(key, peer, now, exit),
        None => Reflection {
            address: peer,
            at: now,
            exit,
            proof: None,
        },
    };
    match serde_json::to_string(&reflection) {
        Ok(body) => answer(StatusCode::OK, "application/json", body),
        Err(_) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "cannot encode the answer\n".into(),
        ),
    }
}

/// The `exit` query parameter, if given (an exit id, or the request is bad).
fn exit_of(query: Option<&str>) -> Result<Option<Uuid>, ()> {
    let Some(query) = query else {
        return Ok(None);
    };
    match query.split('&').find_map(|pair| pair.strip_prefix("exit=")) {
        None => Ok(None),
        Some(id) => id.parse().map(Some).map_err(|_| ()),
    }
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

    fn get(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    async fn body(r: Response<Full<Bytes>>) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn whoami_answers_the_peer_address_signed_for_the_exit_that_asked() {
        let key = b"reflector key for the unit test";
        let exit = Uuid::new_v4();
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        let r = respond(
            &get(&format!("/whoami?exit={exit}")),
            peer,
            1_800_000_000,
            Some(key),
        );
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let seen: Reflection = serde_json::from_str(&body(r).await).unwrap();
        assert_eq!(
            (seen.address, seen.at, seen.exit),
            (peer, 1_800_000_000, Some(exit))
        );
        assert!(seen.verify(key));

        // Without a key yet it still says what it saw, unproven.
        let r = respond(&get("/whoami"), peer, 1, None);
        let seen: Reflection = serde_json::from_str(&body(r).await).unwrap();
        assert_eq!((seen.exit, seen.proof), (None, None));
    }

    #[tokio::test]
    async fn anything_but_get_whoami_is_404_and_a_bad_exit_400() {
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        for uri in ["/", "/whoami/", "/metrics", "/whoamix"] {
            assert_eq!(
                respond(&get(uri), peer, 0, None).status(),
                StatusCode::NOT_FOUND,
                "{uri}"
            );
        }
        let post = Request::builder()
            .method(Method::POST)
            .uri("/whoami")
            .body(())
            .unwrap();
        assert_eq!(
            respond(&post, peer, 0, None).status(),
            StatusCode::NOT_FOUND
        );
        let bad = respond(&get("/whoami?exit=nope"), peer, 0, None);
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        // Other parameters are ignored.
        assert_eq!(
            respond(&get("/whoami?x=1"), peer, 0, None).status(),
            StatusCode::OK
        );
    }
}
