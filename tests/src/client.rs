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

/// The status code of a raw HTTP response.
pub fn status_of(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
