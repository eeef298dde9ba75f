//! Real clients: curl for everything a user would type, raw sockets for what
//! no well-behaved client sends.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

pub struct CurlResult {
    pub status: u16,
    /// Response headers of the last response (and the CONNECT response with `-p`).
    pub headers: String,
    pub body: String,
    pub exit_code: i32,
}

/// Runs curl with `args`, capturing status, headers (`-D -` to a separate stream) and body.
pub async fn curl(args: &[&str]) -> CurlResult {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "30",
                "-o",
                "-",
                "-D",
                "/dev/stderr",
                "-w",
                "\n%{http_code}",
            ])
            .args(args)
            .output(),
    )
    .await
    .expect("curl finished in time")
    .expect("curl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", stdout.as_str()));
    CurlResult {
        status: code.trim().parse().unwrap_or(0),
        headers: String::from_utf8_lossy(&out.stderr).into_owned(),
        body: body.to_owned(),
        exit_code: out.status.code().unwrap_or(-1),
    }
}

/// Sends raw bytes to `addr` and reads until the peer closes or `timeout`.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(timeout, async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    // One response head is all these tests need.
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// A whole HTTP response read off a raw socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The head, header names lower-cased.
    pub head: String,
    pub body: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Sends raw bytes and reads one complete response (head and a
/// `Content-Length` body), or whatever arrived before `timeout`.
pub async fn raw_request(addr: SocketAddr, request: &[u8], timeout: Duration) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(timeout, async {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    break;
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    RawResponse {
        status: status_of(head),
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// The status code of a raw HTTP response.
pub fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A minimal SOCKS5 client for what curl cannot send (BIND, raw replies).
pub mod socks5 {
    use super::*;

    /// Greets, authenticates with username/password and returns the stream, or
    /// the RFC 1929 status byte on failure.
    pub async fn login(addr: SocketAddr, user: &str, pass: &str) -> Result<TcpStream, u8> {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(&[5, 1, 2]).await.unwrap();
        let mut choice = [0u8; 2];
        s.read_exact(&mut choice).await.unwrap();
        assert_eq!(choice, [5, 2], "server must choose username/password");
        let mut auth = vec![1, user.len() as u8];
        auth.extend_from_slice(user.as_bytes());
        auth.push(pass.len() as u8);
        auth.extend_from_slice(pass.as_bytes());
        s.write_all(&auth).await.unwrap();
        let mut status = [0u8; 2];
        s.read_exact(&mut status).await.unwrap();
        if status[1] == 0 {
            Ok(s)
        } else {
            Err(status[1])
        }
    }

    /// Sends a request (`cmd` 1 CONNECT, 2 BIND, 3 UDP) to a domain or IPv4
    /// target and returns the reply code.
    pub async fn request(s: &mut TcpStream, cmd: u8, host: &str, port: u16) -> u8 {
        let mut req = vec![5, cmd, 0];
        match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => {
                req.push(1);
                req.extend_from_slice(&ip.octets());
            }
            Ok(std::net::IpAddr::V6(ip)) => {
                req.push(4);
                req.extend_from_slice(&ip.octets());
            }
            Err(_) => {
                req.push(3);
                req.push(host.len() as u8);
                req.extend_from_slice(host.as_bytes());
            }
        }
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).await.unwrap();
        let mut head = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(20), s.read_exact(&mut head))
            .await
            .expect("reply in time")
            .expect("reply");
        assert_eq!(head[0], 5);
        head[1]
    }
}

/// Opens a CONNECT tunnel with Basic auth and reads the response head; the
/// stream is the tunnel when the head starts with `HTTP/1.1 200`.
pub async fn connect_tunnel(
    proxy: SocketAddr,
    user: &str,
    password: &str,
    target: SocketAddr,
) -> (TcpStream, String) {
    let auth = basic_credential(user, password);
    let mut s = TcpStream::connect(proxy)
        .await
        .expect("connect to the proxy");
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n").as_bytes())
        .await
        .expect("send CONNECT");
    let head = read_head(&mut s).await;
    (s, head)
}

/// Reads one response head byte by byte, so nothing after it (tunnel bytes,
/// a body) is consumed; stops early if the connection ends.
pub async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A CONNECT tunnel to an echo target as `user` (the stack's password),
/// proven by one round trip.
pub async fn open_echo_tunnel(proxy: SocketAddr, user: &str, echo: SocketAddr) -> TcpStream {
    let (mut s, head) = connect_tunnel(proxy, user, crate::stack::PASSWORD, echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    crate::targets::echo_round_trip(&mut s, b"ping")
        .await
        .expect("tunnel works");
    s
}

/// A gateway refusal as the error catalogue promises it: `status`, a
/// `Proxy-Status` naming `token`, and a one-line body.
pub fn assert_gateway_error(r: &RawResponse, status: u16, token: &str) {
    assert_eq!(r.status, status, "{r:?}");
    let proxy_status = r.header("proxy-status").unwrap_or_default();
    assert!(
        proxy_status.starts_with("proxynet; error=") && proxy_status.contains(token),
        "Proxy-Status {proxy_status:?} in {r:?}"
    );
    assert!(!r.body.trim().is_empty(), "a one-line body: {r:?}");
}

/// Reads until the peer closes the connection; true if it did within `within`.
pub async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

/// `http://USER:PASSWORD@proxy`: the stack's demo password under another
/// username (the grammar's keys, another user).
pub fn proxy_as(username: &str, proxy: SocketAddr) -> String {
    format!(
        "http://{username}:{}@{proxy}",
        crate::stack::PASSWORD.replace(' ', "%20")
    )
}

/// The address the whoami target saw one CONNECT tunnel (`-p`) through
/// `proxy_url` come from.
pub async fn egress_via(proxy_url: &str, target: &str) -> String {
    let r = curl(&["-p", "-x", proxy_url, target]).await;
    assert_eq!(r.status, 200, "{} {}", r.body, r.headers);
    serde_json::from_str::<crate::whoami::Seen>(&r.body)
        .unwrap()
        .peer
        .ip()
        .to_string()
}

/// `user:password` as a `Basic` credential's token.
pub fn basic_credential(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}
