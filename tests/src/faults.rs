//! A TCP link the test can break: put it between a binary and a store to
//! simulate an outage without touching the shared servers other tests use.
//!
//! `blackhole()` is the nasty kind of outage: connections stay open and new
//! ones are accepted, but not a byte crosses, so clients wait for their own
//! timeouts (what a dead router or a hung database looks like).

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct FaultyLink {
    pub addr: SocketAddr,
    open: watch::Sender<bool>,
    /// Bumped by [`Self::cut`]: every connection then open is closed.
    epoch: watch::Sender<u64>,
    /// While set, new connections are closed at once (a crashed server).
    refusing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultyLink {
    /// Forwards every connection on a fresh loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, watch_open) = watch::channel(true);
        let (epoch, watch_epoch) = watch::channel(0u64);
        let refusing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refuse = refusing.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if refuse.load(std::sync::atomic::Ordering::Relaxed) {
                    drop(client);
                    continue;
                }
                let open = watch_open.clone();
                let mut epoch = watch_epoch.clone();
                // Only cuts from now on end this connection.
                epoch.borrow_and_update();
                tokio::spawn(async move {
                    let mut gate = open.clone();
                    if gate.wait_for(|o| *o).await.is_err() {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = tokio::spawn(pipe(cr, sw, open.clone()));
                    let down = tokio::spawn(pipe(sr, cw, open));
                    // A cut closes both directions at once.
                    let _ = epoch.changed().await;
                    up.abort();
                    down.abort();
                });
            }
        });
        Self {
            addr,
            open,
            epoch,
            refusing,
            task,
        }
    }

    /// What a crashed server looks like: every open connection is closed
    /// and new ones are refused until [`Self::restore`].
    pub fn cut(&self) {
        self.refusing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.epoch.send_modify(|e| *e += 1);
    }

    /// No byte crosses until [`Self::restore`]; connections stay open.
    pub fn blackhole(&self) {
        let _ = self.open.send(false);
    }

    pub fn restore(&self) {
        self.refusing
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let _ = self.open.send(true);
    }
}

impl Drop for FaultyLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut open: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Hold the bytes while the link is down.
        if open.wait_for(|o| *o).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A round-robin TCP balancer in front of several instances of one service
/// (two control-apis behind one address): each connection goes to the next
/// upstream that accepts it, so a dead instance costs a refused connect, not
/// a failed request.
pub struct Balancer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Balancer {
    pub async fn start(upstreams: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((client, _)) = listener.accept().await {
                let first = next;
                next = next.wrapping_add(1);
                let upstreams = upstreams.clone();
                tokio::spawn(async move {
                    for i in 0..upstreams.len() {
                        let upstream = upstreams[(first + i) % upstreams.len()];
                        if let Ok(server) = TcpStream::connect(upstream).await {
                            let (open, watch_open) = watch::channel(true);
                            let (cr, cw) = client.into_split();
                            let (sr, sw) = server.into_split();
                            tokio::spawn(pipe(cr, sw, watch_open.clone()));
                            pipe(sr, cw, watch_open).await;
                            drop(open);
                            return;
                        }
                    }
                });
            }
        });
        Self { addr, task }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
