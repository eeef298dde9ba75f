//! Frames out: the driver takes queued frames from the outbox and writes
//! them to the transport, many per vectored write, waking writers that
//! waited for room.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::Connection;
use crate::mux::error::MuxError;
use crate::mux::frame::{Kind, MAX_DATA_PAYLOAD};
use crate::mux::shared::MAX_QUEUED_BYTES;

/// How many slices the driver hands the transport per write call.
const WRITE_SLICES: usize = 64;

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    /// Writes queued frames until the transport pushes back or nothing is
    /// left; true if anything was written.
    pub(super) fn poll_write_frames(&mut self, cx: &mut Context<'_>) -> Result<bool, MuxError> {
        let mut wrote = false;
        loop {
            if self.writing.is_empty() {
                let mut state = self.shared.lock();
                let outbox = &mut state.outbox;
                if outbox.frames.is_empty() {
                    self.write_stalled_since = None;
                    break;
                }
                let mut taken = 0;
                let mut pong_taken = false;
                while taken < MAX_DATA_PAYLOAD * 2 {
                    let Some(frame) = outbox.frames.pop_front() else {
                        break;
                    };
                    taken += frame.wire_len();
                    if frame.is(Kind::Pong) {
                        pong_taken = true;
                    }
                    self.writing.push_back(frame);
                }
                outbox.bytes -= taken;
                if pong_taken {
                    state.pong_queued = false;
                }
                let outbox = &mut state.outbox;
                if outbox.bytes < MAX_QUEUED_BYTES / 2 {
                    for waker in outbox.blocked_writers.drain(..) {
                        waker.wake();
                    }
                }
            }
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
            let mut count = 0;
            let mut skip = self.write_offset;
            'frames: for frame in &self.writing {
                for part in [&frame.header[..], &frame.payload[..]] {
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    slices[count] = IoSlice::new(&part[skip..]);
                    skip = 0;
                    count += 1;
                    if count == WRITE_SLICES {
                        break 'frames;
                    }
                }
            }
            let written = match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..count]) {
                Poll::Pending => {
                    self.write_stalled_since.get_or_insert_with(Instant::now);
                    break;
                }
                Poll::Ready(Err(e)) => return Err(MuxError::Io(Arc::new(e))),
                Poll::Ready(Ok(0)) => {
                    return Err(MuxError::Io(Arc::new(io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(n)) => n,
            };
            wrote = true;
            self.write_stalled_since = None;
            self.needs_flush = true;
            self.write_offset += written;
            while let Some(front) = self.writing.front() {
                if self.write_offset < front.wire_len() {
                    break;
                }
                self.write_offset -= front.wire_len();
                self.writing.pop_front();
            }
        }
        if self.needs_flush && self.writing.is_empty() {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.needs_flush = false,
                Poll::Ready(Err(e)) => return Err(MuxError::Io(Arc::new(e))),
                Poll::Pending => {}
            }
        }
        Ok(wrote)
    }
}
