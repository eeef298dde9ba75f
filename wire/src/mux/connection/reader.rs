//! Frames in: the driver reads the transport and dispatches every frame it
//! completes (DATA to its stream's buffer, OPENs to the accept queue,
//! credit, resets, PINGs and GOAWAY to the shared state).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::Connection;
use crate::mux::error::MuxError;
use crate::mux::frame::{Frame, Header, Kind, FLAG_FIN, HEADER_LEN, STREAM_WINDOW};
use crate::mux::shared::{Slot, State, MAX_QUEUED_BYTES};

/// Refusals the driver queues in answer to the peer's OPENs are not held back
/// by [`MAX_QUEUED_BYTES`] (PONGs are: one at most); a peer that keeps
/// opening while it stops reading would grow the outbox without bound, so a
/// refusal that finds the outbox past this ends the link as a protocol
/// violation. Our own frames never trip it.
const OUTBOX_HARD_LIMIT: usize = 2 * MAX_QUEUED_BYTES;

/// DATA payloads of at least this length are read straight from the
/// transport into a buffer of their own, exactly their size, which becomes
/// the payload handed to the stream's reader (no copy). Shorter payloads and
/// every control payload are copied out of the shared header buffer. Either
/// way a payload owns exactly its memory: a frame a stalled reader holds
/// never keeps a shared read block alive (slices of one 256 KiB block, held
/// by a hundred stalled tunnels, once made each hold ~3 MB instead of its
/// 512 KiB of credit).
const OWN_BUFFER_FROM: usize = crate::mux::recv_queue::SHORT;

/// How much one read into the header buffer may take: enough for a run of
/// small frames, little of a large payload (that much of it is copied).
const HEAD_READ: usize = 8 * 1024;

/// How much the driver reads before it turns to writing.
const READ_BATCH: usize = 1 << 20;

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    /// Reads and dispatches frames until the transport has nothing more or a
    /// batch was read; true if anything arrived.
    pub(super) fn poll_read_frames(&mut self, cx: &mut Context<'_>) -> Result<bool, MuxError> {
        let mut got = 0usize;
        while !self.read_closed && got < READ_BATCH {
            let read = match self.payload.as_mut() {
                Some((header, buf)) => {
                    let missing = header.len as usize - buf.len();
                    let mut into = (&mut *buf).limit(missing);
                    tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut into)
                }
                None => {
                    // A short frame is read whole; otherwise a header's worth.
                    let missing = self.frame_missing().max(HEAD_READ);
                    self.read_buf.reserve(missing);
                    let mut into = (&mut self.read_buf).limit(missing);
                    tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut into)
                }
            };
            match read {
                Poll::Pending => break,
                Poll::Ready(Err(e)) => return Err(MuxError::Io(Arc::new(e))),
                Poll::Ready(Ok(0)) => self.read_closed = true,
                Poll::Ready(Ok(n)) => {
                    got += n;
                    self.dispatch()?;
                }
            }
        }
        if got > 0 {
            self.last_heard = Instant::now();
            self.ping_outstanding = false;
        }
        if self.read_closed {
            // The peer closed its side. After its GOAWAY that is a clean
            // close: it only closes once every stream is finished or reset
            // on its side, so nothing more is owed to ours (what they have
            // buffered stays readable). Without a GOAWAY the link was lost.
            if !self.shared.lock().peer_goaway {
                return Err(MuxError::Io(Arc::new(io::ErrorKind::UnexpectedEof.into())));
            }
            if self.payload.is_some() || !self.read_buf.is_empty() {
                return Err(MuxError::Protocol("link closed in the middle of a frame"));
            }
        }
        Ok(got > 0)
    }

    /// Bytes the short frame at the front of the header buffer still lacks
    /// (0 when there is none, or it is complete, or it is a long DATA frame).
    fn frame_missing(&self) -> usize {
        if self.read_buf.len() < HEADER_LEN {
            return HEADER_LEN - self.read_buf.len();
        }
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(&self.read_buf[..HEADER_LEN]);
        match Header::decode(&raw) {
            Ok(h) if !(h.kind == Kind::Data && h.len as usize >= OWN_BUFFER_FROM) => {
                (HEADER_LEN + h.len as usize).saturating_sub(self.read_buf.len())
            }
            _ => 0,
        }
    }

    /// Whether a frame is complete (or a header is there to judge): a read
    /// that only added to a long payload dispatches nothing and takes no lock.
    fn frame_ready(&self) -> bool {
        match &self.payload {
            Some((header, buf)) => buf.len() >= header.len as usize,
            None => self.read_buf.len() >= HEADER_LEN && self.frame_missing() == 0,
        }
    }

    /// Dispatches every complete frame read so far (called after each read,
    /// under one lock per call that has something to dispatch).
    fn dispatch(&mut self) -> Result<(), MuxError> {
        if !self.frame_ready() {
            return Ok(());
        }
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        loop {
            if let Some((header, buf)) = &self.payload {
                if buf.len() < header.len as usize {
                    return Ok(());
                }
                let (header, buf) = self.payload.take().ok_or(MuxError::Closed)?;
                self.apply(state, header, buf.freeze())?;
                continue;
            }
            if self.read_buf.len() < HEADER_LEN {
                return Ok(());
            }
            let mut raw = [0u8; HEADER_LEN];
            raw.copy_from_slice(&self.read_buf[..HEADER_LEN]);
            let header =
                Header::decode(&raw).map_err(|_| MuxError::Protocol("malformed frame header"))?;
            let len = header.len as usize;
            if header.kind == Kind::Data && len >= OWN_BUFFER_FROM {
                // The rest of this payload is read into its own buffer; what
                // of it is already here moves there (at most a header read).
                self.read_buf.advance(HEADER_LEN);
                let here = self.read_buf.len().min(len);
                let mut own = BytesMut::with_capacity(len);
                own.extend_from_slice(&self.read_buf[..here]);
                self.read_buf.advance(here);
                self.payload = Some((header, own));
                continue;
            }
            if self.read_buf.len() < HEADER_LEN + len {
                return Ok(());
            }
            self.read_buf.advance(HEADER_LEN);
            let payload = Bytes::copy_from_slice(&self.read_buf[..len]);
            self.read_buf.advance(len);
            self.apply(state, header, payload)?;
        }
    }

    fn apply(&self, state: &mut State, header: Header, payload: Bytes) -> Result<(), MuxError> {
        let id = header.stream;
        match header.kind {
            Kind::Data => {
                // Frames for a stream we already forgot are dropped: its
                // handle is gone and a RESET is on its way to the peer.
                let Some(slot) = state.streams.get_mut(&id) else {
                    return Ok(());
                };
                let len = payload.len() as u32;
                if len > slot.recv_allowed {
                    return Err(MuxError::Protocol("stream sent beyond its credit"));
                }
                slot.recv_allowed -= len;
                if slot.recv_fin || slot.reset {
                    return Ok(());
                }
                if len > 0 {
                    slot.queue(payload);
                }
                if header.flags & FLAG_FIN != 0 {
                    slot.recv_fin = true;
                }
                if let Some(waker) = slot.read_waker.take() {
                    waker.wake();
                }
            }
            Kind::Open => {
                if !state.accepts_streams {
                    return Err(MuxError::Protocol("peer may not open streams"));
                }
                if !self.role.is_peer_id(id) || id <= state.peer_last_id {
                    return Err(MuxError::Protocol("stream id out of order"));
                }
                state.peer_last_id = id;
                if state.local_goaway
                    || state.closed.is_some()
                    || state.streams.len() >= state.max_streams
                {
                    if state.outbox.bytes > OUTBOX_HARD_LIMIT {
                        return Err(MuxError::Protocol(
                            "peer keeps opening streams while it does not read",
                        ));
                    }
                    state
                        .outbox
                        .push(Frame::new(id, Kind::Reset, 0, Bytes::new()));
                    return Ok(());
                }
                let budget = state.recv_budget.clone();
                state.streams.insert(id, Slot::new(STREAM_WINDOW, budget));
                state.incoming.push_back((id, payload));
                if let Some(waker) = state.accept_waker.take() {
                    waker.wake();
                }
            }
            Kind::Reply => {
                if let Some(slot) = state.streams.get_mut(&id) {
                    slot.reply = Some(payload);
                    if let Some(waker) = slot.open_waker.take() {
                        waker.wake();
                    }
                }
            }
            Kind::Credit => {
                let mut raw = [0u8; 4];
                if payload.len() != 4 {
                    return Err(MuxError::Protocol("credit frame without a count"));
                }
                raw.copy_from_slice(&payload);
                let credit = u32::from_be_bytes(raw);
                if let Some(slot) = state.streams.get_mut(&id) {
                    slot.credit = slot
                        .credit
                        .checked_add(credit)
                        .ok_or(MuxError::Protocol("credit overflow"))?;
                    if let Some(waker) = slot.write_waker.take() {
                        waker.wake();
                    }
                }
            }
            Kind::Reset => {
                if let Some(at) = state.incoming.iter().position(|(queued, _)| *queued == id) {
                    // Not accepted yet: no handle will ever forget it, so we do.
                    state.incoming.remove(at);
                    state.streams.remove(&id);
                } else if let Some(slot) = state.streams.get_mut(&id) {
                    slot.reset = true;
                    slot.wake_all();
                }
            }
            Kind::Ping => {
                if !state.pong_queued {
                    state.pong_queued = true;
                    state.outbox.push(Frame::new(0, Kind::Pong, 0, payload));
                }
            }
            Kind::Pong => {}
            Kind::GoAway => {
                state.peer_goaway = true;
                if let Some(waker) = state.accept_waker.take() {
                    waker.wake();
                }
            }
        }
        Ok(())
    }
}
