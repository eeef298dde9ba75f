//! Moves bytes both ways between the client and the exit's tunnel stream.
//!
//! Buffers are taken only while data is moving: a direction whose read is
//! pending holds no buffer, so an idle tunnel costs no copy memory. A
//! direction stops reading until its last chunk is written, so a peer that
//! stops reading pushes back on the other side instead of growing memory.
//! A tunnel ends when both directions have finished (each half-close is passed
//! on), when nothing moved for `idle_timeout`, or at `max_lifetime`.
//!
//! A side that stores bytes in buffers of its own (a mux stream, see
//! [`ChunkIo`]) trades whole buffers with the splice instead: what it
//! received is written out straight from its buffer, and what is read for it
//! is handed over without a copy. On the data path that saves two of the
//! five memory copies each byte used to take through superproxy and agent.

use bytes::{Buf, Bytes, BytesMut};
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep_until, Instant};

use crate::buffers::{self, Class};

/// Copy buffer per direction while data flows.
pub const COPY_BUFFER: usize = Class::Copy.size();

/// First read of a direction whose writer takes whole buffers.
const FIRST_CHUNK_READ: usize = 16 * 1024;

fn take_buffer() -> Box<[u8]> {
    buffers::take(Class::Copy)
}

fn give_back(buffer: Box<[u8]>) {
    buffers::give_back(Class::Copy, buffer)
}

/// A byte stream the splice can use. Streams that keep received bytes in
/// buffers of their own (and can take ownership of buffers to send) say so
/// with [`ChunkIo::chunked`]; every other stream keeps the defaults and is
/// copied through the splice's pooled buffer.
pub trait ChunkIo: AsyncRead + AsyncWrite + Unpin {
    /// True when the two chunk methods below work.
    fn chunked(&self) -> bool {
        false
    }

    /// The next received buffer, `None` at the end of the stream.
    fn poll_read_chunk(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Bytes>>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }

    /// Takes bytes from the front of `chunk` (without copying them) to send;
    /// how many it took.
    fn poll_write_chunk(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _chunk: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }
}

impl ChunkIo for tokio::net::TcpStream {}
impl<T: AsyncRead + AsyncWrite + Unpin> ChunkIo for tokio::io::BufReader<T> {}
impl ChunkIo for tokio::io::DuplexStream {}

/// Any other stream, spliced by copying.
pub struct Plain<T>(pub T);

impl<T: AsyncRead + AsyncWrite + Unpin> ChunkIo for Plain<T> {}

impl<T: AsyncRead + Unpin> AsyncRead for Plain<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Plain<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct TunnelLimits {
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
}

/// Why a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both sides finished.
    Closed,
    Idle,
    Lifetime,
    /// Ended from outside: a revocation or a drain deadline.
    Cut,
    Error(io::ErrorKind),
}

#[derive(Debug, Clone, Copy)]
pub struct SpliceOutcome {
    /// Client → target bytes.
    pub up: u64,
    /// Target → client bytes.
    pub down: u64,
    pub end: End,
}

/// One direction of the copy.
#[derive(Default)]
struct Direction {
    /// The pooled copy buffer, `pos..cap` still to write.
    buf: Option<Box<[u8]>>,
    pos: usize,
    cap: usize,
    /// A buffer traded with a chunked side, still to write.
    chunk: Option<Bytes>,
    /// Size of the next buffer read for a chunked writer: small for a
    /// request/response exchange, doubling while reads fill it (bulk).
    next_read: usize,
    read_done: bool,
    done: bool,
    need_flush: bool,
    bytes: u64,
}

impl Direction {
    /// Drives this direction; `Ready(Ok(()))` once it has finished.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
        moved: &mut bool,
    ) -> Poll<io::Result<()>>
    where
        R: ChunkIo + ?Sized,
        W: ChunkIo + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        if reader.chunked() || writer.chunked() {
            return self.poll_copy_chunks(cx, reader, writer, moved);
        }
        loop {
            if self.pos == self.cap && !self.read_done {
                let buf = self.buf.get_or_insert_with(take_buffer);
                let mut read_buf = ReadBuf::new(buf);
                match reader.as_mut().poll_read(cx, &mut read_buf) {
                    Poll::Pending => {
                        // Idle: give the buffer back; take one again when data comes.
                        if let Some(buf) = self.buf.take() {
                            give_back(buf);
                        }
                        if self.need_flush {
                            ready!(writer.as_mut().poll_flush(cx))?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(())) => {
                        let n = read_buf.filled().len();
                        if n == 0 {
                            self.read_done = true;
                            if let Some(buf) = self.buf.take() {
                                give_back(buf);
                            }
                        } else {
                            self.pos = 0;
                            self.cap = n;
                            self.bytes += n as u64;
                            *moved = true;
                        }
                    }
                }
            }
            while self.pos < self.cap {
                let Some(buf) = self.buf.as_ref() else { break };
                let n = ready!(writer.as_mut().poll_write(cx, &buf[self.pos..self.cap]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.pos += n;
                self.need_flush = true;
            }
            if self.read_done {
                ready!(writer.as_mut().poll_flush(cx))?;
                ready!(writer.as_mut().poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            self.pos = 0;
            self.cap = 0;
        }
    }

    /// The same loop, trading whole buffers with the chunked side.
    fn poll_copy_chunks<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
        moved: &mut bool,
    ) -> Poll<io::Result<()>>
    where
        R: ChunkIo + ?Sized,
        W: ChunkIo + ?Sized,
    {
        loop {
            if self.chunk.is_none() && !self.read_done {
                let read = if reader.chunked() {
                    reader.as_mut().poll_read_chunk(cx)
                } else if self.next_read <= FIRST_CHUNK_READ {
                    // A request/response exchange: read on the stack and hand
                    // over an exact-size copy, so a read that finds nothing
                    // (most wakeups of a short tunnel) allocates nothing.
                    let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); FIRST_CHUNK_READ];
                    let mut buf = ReadBuf::uninit(&mut stack);
                    match reader.as_mut().poll_read(cx, &mut buf) {
                        Poll::Ready(Ok(())) if buf.filled().is_empty() => Poll::Ready(Ok(None)),
                        Poll::Ready(Ok(())) => {
                            let filled = buf.filled();
                            if filled.len() >= FIRST_CHUNK_READ {
                                self.next_read = FIRST_CHUNK_READ * 2;
                            }
                            Poll::Ready(Ok(Some(Bytes::copy_from_slice(filled))))
                        }
                        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    }
                } else {
                    // Bulk: read into a buffer of its own, handed over whole.
                    // An idle tunnel does not keep it: it is dropped at Pending.
                    let size = self.next_read.clamp(FIRST_CHUNK_READ, COPY_BUFFER);
                    let mut buf = BytesMut::with_capacity(size);
                    match tokio_util::io::poll_read_buf(reader.as_mut(), cx, &mut buf) {
                        Poll::Ready(Ok(0)) => Poll::Ready(Ok(None)),
                        Poll::Ready(Ok(n)) => {
                            self.next_read = if n >= size { size * 2 } else { size };
                            Poll::Ready(Ok(Some(buf.freeze())))
                        }
                        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    }
                };
                match read {
                    Poll::Pending => {
                        if self.need_flush {
                            ready!(writer.as_mut().poll_flush(cx))?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(None)) => self.read_done = true,
                    Poll::Ready(Ok(Some(chunk))) => {
                        self.bytes += chunk.len() as u64;
                        *moved = true;
                        self.chunk = Some(chunk);
                    }
                }
            }
            if let Some(chunk) = self.chunk.as_mut() {
                while !chunk.is_empty() {
                    let n = if writer.chunked() {
                        ready!(writer.as_mut().poll_write_chunk(cx, chunk))?
                    } else {
                        let n = ready!(writer.as_mut().poll_write(cx, chunk))?;
                        chunk.advance(n);
                        n
                    };
                    if n == 0 {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    self.need_flush = true;
                }
                self.chunk = None;
            }
            if self.read_done {
                ready!(writer.as_mut().poll_flush(cx))?;
                ready!(writer.as_mut().poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Splices `client` and `exit` until the tunnel ends; never fails, reports why it ended.
pub async fn splice<C, E>(client: C, exit: E, limits: TunnelLimits) -> SpliceOutcome
where
    C: ChunkIo,
    E: ChunkIo,
{
    splice_until(client, exit, limits, std::future::pending::<()>()).await
}

/// [`splice`], also ending ([`End::Cut`]) as soon as `stop` resolves, with the
/// byte counts so far.
pub async fn splice_until<C, E, S>(
    mut client: C,
    mut exit: E,
    limits: TunnelLimits,
    stop: S,
) -> SpliceOutcome
where
    C: ChunkIo,
    E: ChunkIo,
    S: Future<Output = ()>,
{
    let start = Instant::now();
    let lifetime_end = start + limits.max_lifetime;
    let mut last_activity = start;
    let mut up = Direction::default();
    let mut down = Direction::default();
    let idle = sleep_until(start + limits.idle_timeout);
    let lifetime = sleep_until(lifetime_end);
    tokio::pin!(idle, lifetime, stop);

    let end = poll_fn(|cx| {
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Cut);
        }
        let mut moved = false;
        let up_result = up.poll_copy(cx, Pin::new(&mut client), Pin::new(&mut exit), &mut moved);
        let down_result =
            down.poll_copy(cx, Pin::new(&mut exit), Pin::new(&mut client), &mut moved);
        for result in [&up_result, &down_result] {
            if let Poll::Ready(Err(e)) = result {
                return Poll::Ready(End::Error(e.kind()));
            }
        }
        if up_result.is_ready() && down_result.is_ready() {
            return Poll::Ready(End::Closed);
        }
        if moved {
            last_activity = Instant::now();
            idle.as_mut().reset(last_activity + limits.idle_timeout);
        }
        if lifetime.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Lifetime);
        }
        if idle.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Idle);
        }
        Poll::Pending
    })
    .await;
    SpliceOutcome {
        up: up.bytes,
        down: down.bytes,
        end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const LONG: TunnelLimits = TunnelLimits {
        idle_timeout: Duration::from_secs(3600),
        max_lifetime: Duration::from_secs(3600),
    };

    #[tokio::test]
    async fn copies_both_ways_and_passes_half_close() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (exit, mut exit_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(splice(client, exit, LONG));
        let payload: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let expected = payload.clone();
        let writer = tokio::spawn(async move {
            client_peer.write_all(&payload).await.unwrap();
            client_peer.shutdown().await.unwrap();
            let mut back = Vec::new();
            client_peer.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        exit_peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, expected);
        exit_peer.write_all(b"pong").await.unwrap();
        exit_peer.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"pong");
        let outcome = task.await.unwrap();
        assert_eq!(
            (outcome.up, outcome.down, outcome.end),
            (200_000, 4, End::Closed)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnels_end_at_the_idle_timeout() {
        let (client, _client_peer) = tokio::io::duplex(64);
        let (exit, _exit_peer) = tokio::io::duplex(64);
        let limits = TunnelLimits {
            idle_timeout: Duration::from_secs(30),
            max_lifetime: Duration::from_secs(3600),
        };
        let started = Instant::now();
        let outcome = splice(client, exit, limits).await;
        assert_eq!(outcome.end, End::Idle);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn busy_tunnels_end_at_the_lifetime() {
        let (client, mut client_peer) = tokio::io::duplex(64);
        let (exit, mut exit_peer) = tokio::io::duplex(64);
        let limits = TunnelLimits {
            idle_timeout: Duration::from_secs(10),
            max_lifetime: Duration::from_secs(60),
        };
        tokio::spawn(async move {
            loop {
                if client_peer.write_all(b"x").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        tokio::spawn(async move {
            let mut b = [0u8; 64];
            while exit_peer.read(&mut b).await.is_ok_and(|n| n > 0) {}
        });
        let started = Instant::now();
        let outcome = splice(client, exit, limits).await;
        assert_eq!(outcome.end, End::Lifetime);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_reader_that_stops_pushes_back() {
        // The exit side never reads: the client's writes must stall once the
        // small pipe and one copy buffer are full, not grow memory.
        let (client, mut client_peer) = tokio::io::duplex(4096);
        let (exit, _exit_peer_not_reading) = tokio::io::duplex(4096);
        tokio::spawn(splice(client, exit, LONG));
        let chunk = vec![7u8; 1024];
        let mut written = 0usize;
        let stalled = tokio::time::timeout(Duration::from_millis(300), async {
            loop {
                client_peer.write_all(&chunk).await.unwrap();
                written += chunk.len();
            }
        })
        .await;
        assert!(stalled.is_err(), "writes never stalled");
        assert!(
            written <= 4096 + COPY_BUFFER + 4096,
            "{written} bytes accepted"
        );
    }
}
