//! A webhook receiver for the tests: a real HTTP server on 127.0.0.1 that
//! records every request and answers 500 to as many as it is told to, and
//! a check of `Proxynet-Signature` written here from SHA-256 (RFC 2104), not
//! with the server's code.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::net::TcpListener;
use uuid::Uuid;

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Hit {
    pub at: Instant,
    pub event: String,
    pub delivery: String,
    pub signature: String,
    pub body: String,
    /// What the receiver answered.
    pub answered: u16,
}

impl Hit {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// A webhook receiver: records every request; answers 500 to the first
/// `fail_next` requests, then 200.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
    /// Requests still to be answered 500.
    pub fail_next: Arc<AtomicUsize>,
}

impl Receiver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver = Self {
            addr: listener.local_addr().unwrap(),
            hits: Arc::default(),
            fail_next: Arc::default(),
        };
        let shared = receiver.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let r = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let r = r.clone();
                        async move { Ok::<_, std::convert::Infallible>(r.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        receiver
    }

    async fn answer(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<Full<Bytes>> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (event, delivery, signature) = (
            header("proxynet-event"),
            header("proxynet-delivery"),
            header("proxynet-signature"),
        );
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let fail = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let answered = if fail { 500 } else { 200 };
        self.hits.lock().unwrap().push(Hit {
            at: Instant::now(),
            event,
            delivery,
            signature,
            body: String::from_utf8(body.to_vec()).unwrap(),
            answered,
        });
        let mut response = hyper::Response::new(Full::new(Bytes::from_static(if fail {
            b"not yet"
        } else {
            b"ok"
        })));
        *response.status_mut() = hyper::StatusCode::from_u16(answered).unwrap();
        response
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook?token=receiver-own-token", self.addr)
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// The requests for `event` it accepted (answered 2xx).
    pub fn accepted(&self, event: &str) -> Vec<Hit> {
        self.hits()
            .into_iter()
            .filter(|h| h.event == event && h.answered == 200)
            .collect()
    }
}

/// HMAC-SHA256 (RFC 2104), written out: an independent check of the
/// server's (webhook signatures, the reflector's exit proofs).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Checks `Proxynet-Signature: t=UNIX,v1=HEX` over "UNIX.BODY" with
/// `secret`, and that the timestamp is now; the body as JSON.
pub fn verified(secret: &str, hit: &Hit) -> Value {
    let mut t = None;
    let mut v1 = None;
    for part in hit.signature.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = Some(value.to_owned()),
            Some(("v1", value)) => v1 = Some(value.to_owned()),
            _ => {}
        }
    }
    let (t, v1) = (t.expect("t="), v1.expect("v1="));
    let expected = hex::encode(hmac_sha256(
        secret.as_bytes(),
        format!("{t}.{}", hit.body).as_bytes(),
    ));
    assert_eq!(v1, expected, "signature of {}", hit.body);
    let sent: i64 = t.parse().unwrap();
    let now = chrono::Utc::now().timestamp();
    assert!((now - sent).abs() < 300, "timestamp {sent}, now {now}");
    let body = hit.json();
    assert_eq!(
        body["type"], hit.event,
        "Proxynet-Event names the body's type"
    );
    assert!(body["id"].as_str().unwrap().parse::<Uuid>().is_ok());
    assert!(body["created_at"].is_string());
    body
}
