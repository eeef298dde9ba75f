//! The I/O side of metering: [`Metered`] wraps a stream to an exit, counts
//! what crosses it on its [`Meter`] and keeps it within its quotas' budgets
//! (a read or write cut to what is left, what it did not use given back).
//!
//! Its own file because it is the stream plumbing (reads, writes, chunks,
//! which side ended) over the counters [`super`] keeps.

use super::{Meter, MeterHandle, CLIENT_END, EXIT_END};
use bytes::{Buf, Bytes};
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// An I/O stream to an exit that counts what crosses it and keeps it within
/// its quotas' budgets.
pub(crate) struct Metered<IO> {
    io: IO,
    meter: MeterHandle,
}

impl<IO> Metered<IO> {
    pub(crate) fn new(io: IO, meter: MeterHandle) -> Self {
        Self { io, meter }
    }

    /// The stream and its meter apart, for a carrier that counts what it
    /// carries itself (a UDP association counts payload per datagram).
    pub(crate) fn into_parts(self) -> (IO, MeterHandle) {
        (self.io, self.meter)
    }

    /// The counters, for readers that outlive the stream's handover.
    pub(crate) fn meter(&self) -> Arc<Meter> {
        self.meter.0.clone()
    }

    fn quota_bound(&self) -> bool {
        !self.meter.0.quotas.is_empty()
    }

    /// After a write that reserved `reserved` bytes: gives back what it did
    /// not send and counts what it did.
    fn settle(&self, reserved: usize, result: &Poll<io::Result<usize>>) {
        let sent = match result {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        if self.quota_bound() {
            self.meter.0.release(reserved - sent);
        }
        if sent > 0 {
            self.meter.0.up.fetch_add(sent as u64, Ordering::Relaxed);
        }
    }

    /// Reserves for `want` bytes; an error when the quota is used up.
    fn reserve(&self, want: usize) -> io::Result<usize> {
        if want == 0 || !self.quota_bound() {
            return Ok(want);
        }
        match self.meter.0.reserve(want) {
            0 => {
                self.meter.0.cut();
                Err(quota_cut())
            }
            n => Ok(n),
        }
    }
}

fn quota_cut() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "bandwidth quota exhausted",
    )
}

impl<IO: AsyncRead + Unpin> AsyncRead for Metered<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.meter.0.is_cut() {
            return Poll::Ready(Err(quota_cut()));
        }
        let want = buf.remaining();
        let take = self.reserve(want)?;
        let (result, n) = if take == want {
            let before = buf.filled().len();
            let result = Pin::new(&mut self.io).poll_read(cx, buf);
            (result, buf.filled().len() - before)
        } else {
            // Only at the quota's edge: read no more than is left, through
            // a buffer of that size.
            let mut small = vec![0u8; take];
            let mut limited = ReadBuf::new(&mut small);
            let result = Pin::new(&mut self.io).poll_read(cx, &mut limited);
            let n = limited.filled().len();
            buf.put_slice(&small[..n]);
            (result, n)
        };
        if self.quota_bound() {
            self.meter.0.release(take - n);
        }
        if n > 0 {
            self.meter.0.down.fetch_add(n as u64, Ordering::Relaxed);
        }
        match &result {
            // The end of the exit's stream (a read with room got nothing),
            // or its failure: the exit's side ended.
            Poll::Ready(Ok(())) if n == 0 && want > 0 => self.meter.0.note_end(EXIT_END),
            Poll::Ready(Err(_)) => self.meter.0.note_end(EXIT_END),
            _ => {}
        }
        result
    }
}

impl<IO: proxynet_common::splice::ChunkIo> proxynet_common::splice::ChunkIo for Metered<IO> {
    fn chunked(&self) -> bool {
        self.io.chunked()
    }

    fn poll_read_chunk(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<bytes::Bytes>>> {
        if self.meter.0.is_cut() {
            return Poll::Ready(Err(quota_cut()));
        }
        let result = Pin::new(&mut self.io).poll_read_chunk(cx);
        match result {
            Poll::Ready(Ok(Some(mut chunk))) => {
                // The chunk is here already: pass on what the budget allows.
                let take = self.reserve(chunk.len())?;
                chunk.truncate(take);
                self.meter.0.down.fetch_add(take as u64, Ordering::Relaxed);
                Poll::Ready(Ok(Some(chunk)))
            }
            ended @ (Poll::Ready(Ok(None)) | Poll::Ready(Err(_))) => {
                self.meter.0.note_end(EXIT_END);
                ended
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write_chunk(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        if self.meter.0.is_cut() {
            return Poll::Ready(Err(quota_cut()));
        }
        let want = chunk.len();
        let take = self.reserve(want)?;
        let result = if take == want {
            Pin::new(&mut self.io).poll_write_chunk(cx, chunk)
        } else {
            // Send only the front the budget covers (a shared slice, no copy).
            let mut front = chunk.slice(..take);
            let result = Pin::new(&mut self.io).poll_write_chunk(cx, &mut front);
            if let Poll::Ready(Ok(n)) = &result {
                chunk.advance(*n);
            }
            result
        };
        self.settle(take, &result);
        if matches!(result, Poll::Ready(Err(_))) {
            self.meter.0.note_end(EXIT_END);
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Metered<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.meter.0.is_cut() {
            return Poll::Ready(Err(quota_cut()));
        }
        let take = self.reserve(buf.len())?;
        let result = Pin::new(&mut self.io).poll_write(cx, &buf[..take]);
        self.settle(take, &result);
        if matches!(result, Poll::Ready(Err(_))) {
            // The exit's stream is gone under the write.
            self.meter.0.note_end(EXIT_END);
        }
        result
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The client finished sending: its side ended (unless the exit's
        // did before).
        self.meter.0.note_end(CLIENT_END);
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
