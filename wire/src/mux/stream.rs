//! One stream of a mux connection as an ordinary byte stream.
//!
//! Reads take from what the driver buffered (and return credit as they go);
//! writes queue DATA frames within the stream's credit. Dropping a stream
//! that has not finished both ways resets it at the peer.

use bytes::Bytes;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::frame::{Frame, Kind, FLAG_FIN, MAX_DATA_PAYLOAD};
use super::recv_queue::RecvQueue;
use super::shared::Shared;
use proxynet_common::splice::ChunkIo;

pub struct MuxStream {
    shared: Arc<Shared>,
    id: u64,
}

impl MuxStream {
    /// What both read paths share: `take` takes received bytes (saying how
    /// many), whose credit is then returned; with nothing received, the
    /// peer's FIN is `at_end()`, a reset or lost link an error, else Pending.
    fn poll_receive<T>(
        &self,
        cx: &mut Context<'_>,
        take: impl FnOnce(&mut RecvQueue) -> Option<(T, usize)>,
        at_end: impl FnOnce() -> T,
    ) -> Poll<io::Result<T>> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let closed = state.closed.is_some();
        let Some(slot) = state.streams.get_mut(&self.id) else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        if let Some((taken, n)) = take(&mut slot.recv) {
            if let Some(credit) = slot.consumed(n) {
                if !closed {
                    state.outbox.push(credit_frame(self.id, credit));
                }
            }
            return Poll::Ready(Ok(taken));
        }
        if slot.recv_fin {
            return Poll::Ready(Ok(at_end()));
        }
        if slot.reset {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if closed {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        slot.read_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    pub(crate) fn new(shared: Arc<Shared>, id: u64) -> Self {
        Self { shared, id }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn id(&self) -> u64 {
        self.id
    }
}

impl std::fmt::Debug for MuxStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuxStream").field("id", &self.id).finish()
    }
}

impl Drop for MuxStream {
    fn drop(&mut self) {
        self.shared.lock().forget(self.id);
    }
}

impl AsyncRead for MuxStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_receive(
            cx,
            |recv| (!recv.is_empty()).then(|| ((), recv.read_into(buf))),
            || (),
        )
    }
}

impl ChunkIo for MuxStream {
    fn chunked(&self) -> bool {
        true
    }

    fn poll_read_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Bytes>>> {
        self.poll_receive(
            cx,
            |recv| {
                recv.pop_chunk().map(|chunk| {
                    let n = chunk.len();
                    (Some(chunk), n)
                })
            },
            || None,
        )
    }

    fn poll_write_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, chunk.len(), |n| chunk.split_to(n))
    }
}

impl MuxStream {
    /// Queues up to `len` bytes as one DATA frame within the stream's
    /// credit; `take(n)` supplies the first `n`.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        len: usize,
        take: impl FnOnce(usize) -> Bytes,
    ) -> Poll<io::Result<usize>> {
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if state.closed.is_some() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let Some(slot) = state.streams.get_mut(&self.id) else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        if slot.reset {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if slot.fin_sent {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if slot.credit == 0 {
            slot.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if state.outbox.is_full() {
            state.outbox.wait_for_room(cx.waker());
            return Poll::Pending;
        }
        let n = len.min(slot.credit as usize).min(MAX_DATA_PAYLOAD);
        slot.credit -= n as u32;
        state
            .outbox
            .push(Frame::new(self.id, Kind::Data, 0, take(n)));
        Poll::Ready(Ok(n))
    }
}

fn credit_frame(id: u64, credit: u32) -> Frame {
    Frame::new(
        id,
        Kind::Credit,
        0,
        Bytes::copy_from_slice(&credit.to_be_bytes()),
    )
}

impl AsyncWrite for MuxStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, buf.len(), |n| Bytes::copy_from_slice(&buf[..n]))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued frames are the driver's to write; there is nothing to push.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if state.closed.is_some() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let Some(slot) = state.streams.get_mut(&self.id) else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        if !slot.fin_sent && !slot.reset {
            slot.fin_sent = true;
            state
                .outbox
                .push(Frame::new(self.id, Kind::Data, FLAG_FIN, Bytes::new()));
        }
        Poll::Ready(Ok(()))
    }
}
