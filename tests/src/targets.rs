//! Local targets for tunnels beyond whoami: an echo server, and a pump that
//! pushes exact byte counts through a tunnel.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Echoes everything back until the client closes.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Sends `n` bytes through an open tunnel and reads the `n` echoed back.
pub async fn pump(stream: TcpStream, n: usize) {
    let (mut r, mut w) = stream.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![0x5a; 64 * 1024];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            w.write_all(&chunk[..k]).await.unwrap();
            left -= k;
        }
        w
    });
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    while got < n {
        let k = r.read(&mut buf).await.unwrap();
        assert!(k > 0, "tunnel closed early at {got} bytes");
        got += k;
    }
    assert_eq!(got, n);
    drop(writer.await.unwrap());
}

/// Round-trips `bytes` through a tunnel to an echo server; `None` if the
/// tunnel is closed (or closes) before they all came back.
pub async fn echo_round_trip(stream: &mut TcpStream, bytes: &[u8]) -> Option<()> {
    stream.write_all(bytes).await.ok()?;
    let mut back = vec![0u8; bytes.len()];
    stream.read_exact(&mut back).await.ok()?;
    (back == bytes).then_some(())
}

/// Writes to every connection as fast as it can, until the peer goes away;
/// the counter says how many bytes it managed to write in all.
pub async fn firehose() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = std::sync::Arc::new(AtomicU64::new(0));
    let counter = written.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            // Targets share this host's kernel with the stack under test: a
            // thousand streams each queueing megabytes unsent would push the
            // kernel into TCP memory pressure, testing the host, not us.
            proxynet_common::sockets::bound_unsent(&s);
            let counter = counter.clone();
            tokio::spawn(async move {
                let chunk = vec![0x42u8; 64 * 1024];
                while let Ok(n) = s.write(&chunk).await {
                    if n == 0 {
                        break;
                    }
                    counter.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (addr, written)
}

/// Sends exactly `size` bytes to every connection, then closes it.
pub async fn download_server(size: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let chunk = vec![0x33u8; 64 * 1024];
                let mut left = size;
                while left > 0 {
                    let k = left.min(chunk.len());
                    if s.write_all(&chunk[..k]).await.is_err() {
                        return;
                    }
                    left -= k;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// A WebSocket origin (RFC 6455): `GET /ws` with the upgrade headers gets
/// `101` with the right `Sec-WebSocket-Accept`, then every frame is echoed
/// back (unmasked, as a server sends); any other path is refused with `403`.
pub async fn websocket_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(websocket_session(stream));
        }
    });
    addr
}

async fn websocket_session(mut stream: TcpStream) {
    use base64::Engine;
    use sha1::Digest;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read_exact(&mut byte).await.is_err() || head.len() > 16 * 1024 {
            return;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let key = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("sec-websocket-key")
            .then(|| value.trim().to_owned())
    });
    let (Some(key), true) = (key, head.starts_with("GET /ws ")) else {
        let body = "no websocket here";
        let _ = stream
            .write_all(
                format!(
                    "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        return;
    };
    let accept = base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(
        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
    ));
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    if stream.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    loop {
        let mut first = [0u8; 2];
        if stream.read_exact(&mut first).await.is_err() {
            return;
        }
        let mut len = u64::from(first[1] & 0x7f);
        if len == 126 {
            let mut l = [0u8; 2];
            if stream.read_exact(&mut l).await.is_err() {
                return;
            }
            len = u64::from(u16::from_be_bytes(l));
        } else if len == 127 {
            let mut l = [0u8; 8];
            if stream.read_exact(&mut l).await.is_err() {
                return;
            }
            len = u64::from_be_bytes(l);
        }
        let mut mask = [0u8; 4];
        if first[1] & 0x80 != 0 && stream.read_exact(&mut mask).await.is_err() {
            return;
        }
        let mut payload = vec![0u8; len.min(1 << 20) as usize];
        if stream.read_exact(&mut payload).await.is_err() {
            return;
        }
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        let mut frame = vec![first[0]];
        if payload.len() < 126 {
            frame.push(payload.len() as u8);
        } else {
            frame.push(126);
            frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        frame.extend_from_slice(&payload);
        if stream.write_all(&frame).await.is_err() {
            return;
        }
    }
}

/// A UDP echo target on 127.0.0.1: answers every datagram with itself and
/// records the source address of each, so a test can see where the
/// datagrams left from.
pub async fn udp_echo() -> (
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<SocketAddr>>>,
) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            record.lock().unwrap().push(from);
            let _ = socket.send_to(&buf[..n], from).await;
        }
    });
    (addr, seen)
}

/// A site that refuses some exits: connections from an address in
/// `refused` are reset right after accept (`SO_LINGER` 0, then closed: an
/// RST), everyone else's are echoed, as [`echo_server`] does.
pub async fn resetting(refused: std::collections::HashSet<std::net::IpAddr>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, peer)) = listener.accept().await {
            if refused.contains(&peer.ip()) {
                let _ = s.set_zero_linger();
                drop(s);
                continue;
            }
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A site that bans some exits, as a bot wall does: an HTTP/1.1 server
/// answering `403` with `cf-mitigated: challenge` (and a short page) to
/// peers whose address is in `banned`, and `200` with `ok` to everyone
/// else.
pub async fn banning_http(banned: std::collections::HashSet<std::net::IpAddr>) -> SocketAddr {
    use bytes::Bytes;
    use http_body_util::Full;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let refused = banned.contains(&peer.ip());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |_req: hyper::Request<hyper::body::Incoming>| async move {
                        let response = if refused {
                            hyper::Response::builder()
                                .status(403)
                                .header("cf-mitigated", "challenge")
                                .body(Full::new(Bytes::from_static(b"blocked")))
                        } else {
                            hyper::Response::builder().body(Full::new(Bytes::from_static(b"ok")))
                        };
                        Ok::<_, std::convert::Infallible>(response.unwrap())
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}
