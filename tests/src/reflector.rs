//! Asking the superproxy's egress reflector as an agent does, written out
//! independently of the agent's code: the two steps from one bound source
//! address, and the exit's proof (HMAC-SHA256 over `proxynet-reflector-ask/1`,
//! the exit id and the challenge, keyed with the SHA-256 hex of the exit's
//! credential), so a test can ask with the right proof, a wrong one, none,
//! or from the wrong address.

use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use uuid::Uuid;

/// `GET path` to the reflector at `reflector`, sent from `from` (any
/// loopback address binds on Linux): the status and the body.
pub async fn get(from: IpAddr, reflector: SocketAddr, path: &str) -> (u16, String) {
    let socket = if from.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut stream = tokio::time::timeout(Duration::from_secs(5), socket.connect(reflector))
        .await
        .expect("the reflector accepts within 5 s")
        .expect("connect to the reflector");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {reflector}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the reflector answers within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// Step one: a challenge issued to `from`.
pub async fn challenge(from: IpAddr, reflector: SocketAddr) -> String {
    let (status, body) = get(from, reflector, "/whoami/challenge").await;
    assert_eq!(status, 200, "a challenge: {body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    answer["challenge"].as_str().unwrap().to_owned()
}

/// The exit's proof over `challenge`, from its credential.
pub fn exit_proof(credential: &str, exit: Uuid, challenge: &str) -> String {
    use sha2::{Digest, Sha256};
    let key = hex::encode(Sha256::digest(credential.as_bytes()));
    hex::encode(crate::webhook_receiver::hmac_sha256(
        key.as_bytes(),
        format!("proxynet-reflector-ask/1\n{exit}\n{challenge}").as_bytes(),
    ))
}

/// Step two: `GET /whoami` for `exit` with `challenge` and `proof`.
pub async fn ask(
    from: IpAddr,
    reflector: SocketAddr,
    exit: Uuid,
    challenge: &str,
    proof: &str,
) -> (u16, String) {
    get(
        from,
        reflector,
        &format!("/whoami?exit={exit}&challenge={challenge}&proof={proof}"),
    )
    .await
}

/// Both steps from `from` as exit `exit` holding `credential`: the signed
/// reflection, as the agent passes it on.
pub async fn reflect(from: IpAddr, reflector: SocketAddr, exit: Uuid, credential: &str) -> Value {
    let challenge = challenge(from, reflector).await;
    let proof = exit_proof(credential, exit, &challenge);
    let (status, body) = ask(from, reflector, exit, &challenge, &proof).await;
    assert_eq!(
        status, 200,
        "a reflection for the exit that proved it: {body}"
    );
    serde_json::from_str(&body).unwrap()
}
