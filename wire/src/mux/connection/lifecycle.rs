//! Keepalive and graceful close: PINGs a quiet peer, gives up on a silent
//! or non-reading one, sends GOAWAY when asked to, and shuts the transport
//! down once both sides are done.

use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};

use super::{Connection, Lifecycle};
use crate::mux::error::MuxError;
use crate::mux::frame::{Frame, Kind};

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    /// Keepalive and graceful close.
    pub(super) fn poll_lifecycle(&mut self, cx: &mut Context<'_>) -> Result<Lifecycle, MuxError> {
        let silent = self.last_heard.elapsed();
        let give_up_after = self.config.keepalive_interval + self.config.keepalive_timeout;
        if silent >= give_up_after {
            return Err(MuxError::KeepaliveTimeout);
        }
        if self
            .write_stalled_since
            .is_some_and(|since| since.elapsed() >= give_up_after)
        {
            return Err(MuxError::WriteStalled);
        }
        let mut state = self.shared.lock();
        let mut queued = false;
        if silent >= self.config.keepalive_interval && !self.ping_outstanding {
            self.ping_outstanding = true;
            queued = true;
            state
                .outbox
                .push(Frame::new(0, Kind::Ping, 0, Bytes::from_static(&[0; 8])));
            // Quiet for a keepalive interval: an idle link gives its header
            // buffer back.
            if self.read_buf.is_empty() {
                self.read_buf = BytesMut::new();
            }
        }
        // Our GOAWAY also answers the peer's once our streams are done, so it
        // sees a clean close rather than a lost link.
        let answer_peer = state.peer_goaway && !self.read_closed && state.streams.is_empty();
        if (state.local_goaway || answer_peer) && !state.goaway_sent && state.closed.is_none() {
            state.goaway_sent = true;
            queued = true;
            state
                .outbox
                .push(Frame::new(0, Kind::GoAway, 0, Bytes::new()));
        }
        // After the peer's clean close nothing we could still send matters
        // (credit, resets): it has finished every stream.
        let peer_done = self.read_closed && state.peer_goaway;
        let finished = peer_done
            || ((state.goaway_sent || state.peer_goaway)
                && state.streams.is_empty()
                && state.incoming.is_empty()
                && state.outbox.frames.is_empty()
                && self.writing.is_empty());
        drop(state);
        if finished {
            return Ok(match Pin::new(&mut self.io).poll_shutdown(cx) {
                Poll::Ready(_) => {
                    self.shut_down = true;
                    Lifecycle::Done
                }
                Poll::Pending => Lifecycle::Running,
            });
        }
        let mut next = if self.ping_outstanding {
            self.last_heard + give_up_after
        } else {
            self.last_heard + self.config.keepalive_interval
        };
        if let Some(since) = self.write_stalled_since {
            next = next.min(since + give_up_after);
        }
        if self.keepalive.deadline() != next {
            self.keepalive.as_mut().reset(next);
        }
        if self.keepalive.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
        Ok(if queued {
            Lifecycle::Queued
        } else {
            Lifecycle::Running
        })
    }
}
