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
