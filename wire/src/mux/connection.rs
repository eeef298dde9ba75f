//! One mux connection: the handle that opens and accepts streams, and the
//! driver, the one task that reads and writes the transport.
//!
//! The driver never waits on a stream: an arriving DATA frame is appended to
//! its stream's buffer, which its credit bounds, so a stream whose reader
//! stopped cannot hold up the others. What it shares with the streams is in
//! `shared`; reading and dispatching frames is in `reader`, writing queued
//! ones in `writer`, keepalive and graceful close in `lifecycle`.

use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::error::{MuxError, OpenError};
use super::flow::{RecvBudget, INITIAL_STREAM_WINDOW, MIN_STREAM_WINDOW};
use super::frame::{Frame, Header, Kind, STREAM_WINDOW};
use super::shared::{Outbox, Shared, Slot, State};
use super::stream::MuxStream;

mod lifecycle;
mod reader;
mod writer;

/// Which end of the connection opens streams with odd ids (the superproxy)
/// and which with even ones; each side only accepts the other's parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

impl Role {
    fn first_id(self) -> u64 {
        match self {
            Role::Client => 1,
            Role::Server => 2,
        }
    }

    fn is_peer_id(self, id: u64) -> bool {
        id != 0 && (id % 2 == 1) == (self == Role::Server)
    }
}

#[derive(Debug, Clone)]
pub struct MuxConfig {
    /// Send a PING after this long without hearing from the peer...
    pub keepalive_interval: Duration,
    /// ...and give the connection up if nothing arrives within this long after it.
    pub keepalive_timeout: Duration,
    /// Streams the peer may have open at once; OPENs beyond are reset.
    pub max_streams: usize,
    /// Whether the peer may open streams at all. A side that only opens
    /// (the superproxy) says no, and an OPEN from the peer is then a protocol
    /// error that ends the link instead of state it would have to hold.
    pub accepts_streams: bool,
    /// The receive budget this connection's streams share with every other
    /// connection of the process: under pressure, credit is returned
    /// sparingly (see [`RecvBudget`]). `None`: every stream keeps its full
    /// window.
    pub recv_budget: Option<Arc<RecvBudget>>,
}

impl Default for MuxConfig {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            max_streams: 100_000,
            accepts_streams: true,
            recv_budget: None,
        }
    }
}

/// Opens (or accepts) streams on one connection. Clones share it; when every
/// handle is gone the connection stops taking new streams and closes once
/// its open streams have finished.
pub struct MuxHandle {
    shared: Arc<Shared>,
}

impl Clone for MuxHandle {
    fn clone(&self) -> Self {
        self.shared.lock().handles += 1;
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for MuxHandle {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.handles -= 1;
        if state.handles == 0 {
            state.local_goaway = true;
            state.outbox.wake_driver();
        }
    }
}

impl std::fmt::Debug for MuxHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("MuxHandle")
            .field("streams", &state.streams.len())
            .field("closed", &state.closed)
            .finish()
    }
}

/// A stream the peer opened, waiting for the application's answer.
pub struct Incoming {
    pub request: Bytes,
    stream: MuxStream,
}

impl Incoming {
    /// Starts this stream's send credit at `window` (what the opener said it
    /// grants, see [`MuxHandle::open_with_window`]); call before replying.
    pub fn start_window(&self, window: u32) {
        let window = window.clamp(MIN_STREAM_WINDOW, STREAM_WINDOW);
        let mut state = self.stream.shared().lock();
        if let Some(slot) = state.streams.get_mut(&self.stream.id()) {
            slot.credit = slot.credit.min(window);
        }
    }

    /// Sends `reply` and hands over the stream. A refusal is a reply too:
    /// send it, then drop the stream.
    pub fn reply(self, reply: Bytes) -> MuxStream {
        {
            let mut state = self.stream.shared().lock();
            if state.closed.is_none() {
                state
                    .outbox
                    .push(Frame::new(self.stream.id(), Kind::Reply, 0, reply));
            }
        }
        self.stream
    }
}

impl MuxHandle {
    /// Bytes queued for the driver (tests of the outbox bound).
    #[cfg(test)]
    pub(crate) fn queued_bytes(&self) -> usize {
        self.shared.lock().outbox.bytes
    }

    /// Opens a stream carrying `request`; resolves with the peer's reply.
    pub async fn open(&self, request: Bytes) -> Result<(Bytes, MuxStream), OpenError> {
        self.open_with_window(request, STREAM_WINDOW).await
    }

    /// The window the next stream may start with under this connection's
    /// receive budget ([`INITIAL_STREAM_WINDOW`], less under pressure;
    /// [`STREAM_WINDOW`] without a budget).
    pub fn next_window(&self) -> u32 {
        self.shared
            .lock()
            .recv_budget
            .as_ref()
            .map_or(STREAM_WINDOW, |b| b.window().min(INITIAL_STREAM_WINDOW))
    }

    /// Opens a stream whose peer starts with `window` of credit instead of
    /// [`STREAM_WINDOW`]: only for a peer that has agreed to read the window
    /// from `request` and [`Incoming::start_window`] it (anything else sends
    /// a full window and breaks the link).
    pub async fn open_with_window(
        &self,
        request: Bytes,
        window: u32,
    ) -> Result<(Bytes, MuxStream), OpenError> {
        let window = window.clamp(MIN_STREAM_WINDOW, STREAM_WINDOW);
        let stream = {
            let mut state = self.shared.lock();
            if state.closed.is_some() || state.local_goaway || state.peer_goaway {
                return Err(OpenError::Unavailable);
            }
            let id = state.next_id;
            state.next_id += 2;
            let budget = state.recv_budget.clone();
            state.streams.insert(id, Slot::new(window, budget));
            state.outbox.push(Frame::new(id, Kind::Open, 0, request));
            MuxStream::new(self.shared.clone(), id)
        };
        let reply = std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            let closed = state.closed.clone();
            let Some(slot) = state.streams.get_mut(&stream.id()) else {
                return Poll::Ready(Err(OpenError::Refused));
            };
            if let Some(reply) = slot.reply.take() {
                return Poll::Ready(Ok(reply));
            }
            if slot.reset {
                return Poll::Ready(Err(OpenError::Refused));
            }
            if let Some(reason) = closed {
                return Poll::Ready(Err(OpenError::Lost(reason)));
            }
            slot.open_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await?;
        Ok((reply, stream))
    }

    /// The next stream the peer opened; `None` once the connection ended or
    /// the peer said it opens no more.
    pub async fn accept(&self) -> Option<Incoming> {
        std::future::poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some((id, request)) = state.incoming.pop_front() {
                return Poll::Ready(Some(Incoming {
                    request,
                    stream: MuxStream::new(self.shared.clone(), id),
                }));
            }
            if state.closed.is_some() || state.peer_goaway || state.local_goaway {
                return Poll::Ready(None);
            }
            state.accept_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Stops opening and accepting streams; the connection closes once the
    /// open ones have finished.
    pub fn go_away(&self) {
        let mut state = self.shared.lock();
        state.local_goaway = true;
        state.outbox.wake_driver();
        if let Some(waker) = state.accept_waker.take() {
            waker.wake();
        }
    }

    /// Whether new streams can be opened on this connection.
    pub fn is_open(&self) -> bool {
        let state = self.shared.lock();
        state.closed.is_none() && !state.local_goaway && !state.peer_goaway
    }

    pub fn open_streams(&self) -> usize {
        self.shared.lock().streams.len()
    }
}

/// Starts a connection over `io`: the handle opens and accepts streams, the
/// [`Connection`] must be polled (spawned) for anything to move.
pub fn start<T>(io: T, role: Role, config: MuxConfig) -> (MuxHandle, Connection<T>)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            streams: HashMap::new(),
            outbox: Outbox::default(),
            incoming: VecDeque::new(),
            accept_waker: None,
            next_id: role.first_id(),
            peer_last_id: 0,
            closed: None,
            local_goaway: false,
            goaway_sent: false,
            peer_goaway: false,
            handles: 1,
            max_streams: config.max_streams,
            accepts_streams: config.accepts_streams,
            recv_budget: config.recv_budget.clone(),
            pong_queued: false,
        }),
    });
    let now = Instant::now();
    let first_keepalive = now + config.keepalive_interval;
    let connection = Connection {
        io,
        shared: shared.clone(),
        role,
        config,
        read_buf: BytesMut::new(),
        payload: None,
        read_closed: false,
        writing: VecDeque::new(),
        write_offset: 0,
        needs_flush: false,
        last_heard: now,
        ping_outstanding: false,
        write_stalled_since: None,
        keepalive: Box::pin(tokio::time::sleep_until(first_keepalive)),
        shut_down: false,
    };
    (MuxHandle { shared }, connection)
}

/// Drives one connection: reads and dispatches frames, writes queued ones,
/// keeps the link alive. Resolves when the connection has ended; every
/// stream still open then fails.
pub struct Connection<T> {
    io: T,
    shared: Arc<Shared>,
    role: Role,
    config: MuxConfig,
    /// Headers and short payloads; never shared, so it is reused in place.
    read_buf: BytesMut,
    /// A long DATA payload being read into its own buffer.
    payload: Option<(Header, BytesMut)>,
    read_closed: bool,
    /// Frames taken from the outbox, the first `write_offset` bytes written.
    writing: VecDeque<Frame>,
    write_offset: usize,
    needs_flush: bool,
    last_heard: Instant,
    ping_outstanding: bool,
    /// Since when queued frames have waited for a transport that took none:
    /// a peer that sends but never reads is given up on like a silent one.
    write_stalled_since: Option<Instant>,
    keepalive: Pin<Box<Sleep>>,
    shut_down: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Future for Connection<T> {
    type Output = Result<(), MuxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.poll_inner(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                let reason = result.clone().err().unwrap_or(MuxError::Closed);
                this.shared.lock().close(reason);
                Poll::Ready(result)
            }
        }
    }
}

impl<T> Drop for Connection<T> {
    fn drop(&mut self) {
        // A driver dropped without finishing (its task was aborted) must not
        // leave streams waiting for ever.
        self.shared.lock().close(MuxError::Closed);
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), MuxError>> {
        if self.shut_down {
            return Poll::Ready(Ok(()));
        }
        self.shared.lock().outbox.driver = Some(cx.waker().clone());
        // Each pass reads what is there, then writes what is queued; another
        // pass only if that moved something and the budget allows.
        for _ in 0..8 {
            let read = self.poll_read_frames(cx)?;
            let wrote = self.poll_write_frames(cx)?;
            let queued = match self.poll_lifecycle(cx)? {
                Lifecycle::Done => return Poll::Ready(Ok(())),
                Lifecycle::Queued => true,
                Lifecycle::Running => false,
            };
            if !read && !wrote && !queued {
                return Poll::Pending;
            }
        }
        // Budget spent with work left: yield, but come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

enum Lifecycle {
    Done,
    /// Queued a PING or GOAWAY: write it before waiting.
    Queued,
    Running,
}
