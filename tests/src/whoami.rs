//! The "whoami" target: an HTTP/1.1 server that answers every request with a
//! JSON description of what it saw — the peer address the exit connected from,
//! the method, path, headers and body size. Tests and the local demo use it to
//! show which egress IP a request left from and that no proxy credentials or
//! identifying headers reached the target.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use std::net::SocketAddr;
use tokio::net::TcpListener;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Seen {
    /// Address the request came from, i.e. the exit's egress IP and port.
    pub peer: SocketAddr,
    pub method: String,
    pub target: String,
    /// Header names (lower case) and values in the order received.
    pub headers: Vec<(String, String)>,
    pub body_bytes: usize,
}

impl Seen {
    pub fn has_header(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(peer, req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let target = req.uri().to_string();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body_bytes = match req.into_body().collect().await {
        Ok(body) => body.to_bytes().len(),
        Err(_) => 0,
    };
    let seen = Seen {
        peer,
        method,
        target,
        headers,
        body_bytes,
    };
    let json = serde_json::to_vec(&seen).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(json)));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
