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
