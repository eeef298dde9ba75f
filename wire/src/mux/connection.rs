//! The state one mux connection shares between its driver and its streams,
//! and the driver: the one task that reads and writes the transport.
//!
//! One lock per connection guards every stream's buffers and credit and the
//! outgoing queue (as h2 does): stream handles only move bytes in memory and
//! queue frames; the driver alone touches the transport. It never waits on a
//! stream: an arriving DATA frame is appended to its stream's buffer, which
//! its credit bounds, so a stream whose reader stopped cannot hold up the
//! others.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::recv_queue::RecvQueue;

use super::frame::{Frame, Header, Kind, FLAG_FIN, HEADER_LEN, MAX_DATA_PAYLOAD, STREAM_WINDOW};
use super::stream::MuxStream;

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

/// Bounds what the process's streams hold for readers that do not read,
/// across every connection: the bytes queued in their receive buffers. A
/// stream the peer agreed to start small ([`MuxHandle::open_with_window`],
/// [`INITIAL_STREAM_WINDOW`]) grows its window only as its reader consumes:
/// each refill tops it up to what the budget allows now — the full
/// [`STREAM_WINDOW`] below half the limit, shrinking linearly towards
/// [`MIN_STREAM_WINDOW`] at the limit. So a stream whose reader never reads
/// holds at most its initial window, streams that read get full windows
/// while memory is plentiful, and idle streams (nothing queued) cost the
/// budget nothing.
#[derive(Debug)]
pub struct RecvBudget {
    limit: usize,
    queued: std::sync::atomic::AtomicUsize,
}

/// The least window a stream is given, however full the budget.
pub const MIN_STREAM_WINDOW: u32 = 32 * 1024;

/// The window a budgeted stream starts with: enough for a small response at
/// once, little for a reader that stalls at once.
pub const INITIAL_STREAM_WINDOW: u32 = 64 * 1024;

impl RecvBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(2 * STREAM_WINDOW as usize),
            queued: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The window a stream may have outstanding now.
    pub fn window(&self) -> u32 {
        let used = self.queued();
        let half = self.limit / 2;
        if used <= half {
            return STREAM_WINDOW;
        }
        let over = (used - half).min(half) as u64;
        let span = u64::from(STREAM_WINDOW - MIN_STREAM_WINDOW);
        STREAM_WINDOW - (span * over / half as u64) as u32
    }

    /// Bytes queued for readers across the process's streams.
    pub fn queued(&self) -> usize {
        self.queued.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add(&self, n: usize) {
        self.queued
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.queued
            .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }
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

/// Why a connection ended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MuxError {
    #[error("link i/o: {0}")]
    Io(Arc<io::Error>),
    #[error("peer broke the link protocol: {0}")]
    Protocol(&'static str),
    #[error("peer did not answer a keepalive in time")]
    KeepaliveTimeout,
    #[error("peer stopped reading the link")]
    WriteStalled,
    #[error("link closed")]
    Closed,
}

/// Why a stream could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpenError {
    /// The connection is closed or going away: the request was never sent.
    #[error("link is not taking new streams")]
    Unavailable,
    /// The connection failed after the request was sent.
    #[error("link lost while opening: {0}")]
    Lost(MuxError),
    /// The peer reset the stream without answering (e.g. over its stream limit).
    #[error("peer refused the stream")]
    Refused,
}

/// Credit is returned once a reader has consumed this much: a quarter of
/// the window keeps the sender busy without a CREDIT frame per read.
const CREDIT_THRESHOLD: u32 = STREAM_WINDOW / 4;

/// Outgoing bytes queued before writers wait for the driver. Shared fate is
/// right here: it only fills when the link's own socket is slow.
const MAX_QUEUED_BYTES: usize = 4 << 20;

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
const OWN_BUFFER_FROM: usize = super::recv_queue::SHORT;

/// How much one read into the header buffer may take: enough for a run of
/// small frames, little of a large payload (that much of it is copied).
const HEAD_READ: usize = 8 * 1024;

/// How much the driver reads before it turns to writing, and how much it
/// hands the transport per write call.
const READ_BATCH: usize = 1 << 20;
const WRITE_SLICES: usize = 64;

pub(crate) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Frames waiting for the driver.
#[derive(Default)]
pub(crate) struct Outbox {
    frames: VecDeque<Frame>,
    bytes: usize,
    driver: Option<Waker>,
    blocked_writers: Vec<Waker>,
}

impl Outbox {
    pub(crate) fn push(&mut self, frame: Frame) {
        self.bytes += frame.wire_len();
        self.frames.push_back(frame);
        if let Some(driver) = self.driver.take() {
            driver.wake();
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.bytes >= MAX_QUEUED_BYTES
    }

    pub(crate) fn wait_for_room(&mut self, waker: &Waker) {
        // A writer polled again while still blocked is already registered.
        if !self.blocked_writers.iter().any(|w| w.will_wake(waker)) {
            self.blocked_writers.push(waker.clone());
        }
    }

    pub(crate) fn wake_driver(&mut self) {
        if let Some(driver) = self.driver.take() {
            driver.wake();
        }
    }
}

/// One stream's half of the shared state.
pub(crate) struct Slot {
    /// The process-wide receive budget its queued bytes count in.
    budget: Option<Arc<RecvBudget>>,
    pub(crate) recv: RecvQueue,
    pub(crate) recv_fin: bool,
    /// What the peer may still send before we return credit.
    recv_allowed: u32,
    /// Consumed by our reader, not yet returned to the peer as credit.
    unacked: u32,
    pub(crate) read_waker: Option<Waker>,
    /// What we may still send.
    pub(crate) credit: u32,
    pub(crate) write_waker: Option<Waker>,
    pub(crate) fin_sent: bool,
    pub(crate) reset: bool,
    reply: Option<Bytes>,
    open_waker: Option<Waker>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.sub(self.recv.len());
        }
    }
}

impl Slot {
    fn new(recv_window: u32, budget: Option<Arc<RecvBudget>>) -> Self {
        Self {
            budget,
            recv: RecvQueue::default(),
            recv_fin: false,
            recv_allowed: recv_window,
            unacked: 0,
            read_waker: None,
            credit: STREAM_WINDOW,
            write_waker: None,
            fin_sent: false,
            reset: false,
            reply: None,
            open_waker: None,
        }
    }

    fn wake_all(&mut self) {
        for waker in [
            self.read_waker.take(),
            self.write_waker.take(),
            self.open_waker.take(),
        ]
        .into_iter()
        .flatten()
        {
            waker.wake();
        }
    }

    /// What the peer may still send plus what waits for our reader: the
    /// memory this stream can come to hold.
    fn outstanding(&self) -> usize {
        self.recv_allowed as usize + self.recv.len()
    }

    /// Records `n` bytes consumed by the reader; the credit to return, if
    /// enough has been consumed to be worth a frame. Under a receive budget
    /// the credit tops the stream's outstanding window up to what the
    /// budget allows now (less under pressure, all of it again once the
    /// pressure is gone).
    pub(crate) fn consumed(&mut self, n: usize) -> Option<u32> {
        if let Some(budget) = &self.budget {
            budget.sub(n);
        }
        if self.recv_fin || self.reset {
            return None;
        }
        let Some(budget) = &self.budget else {
            self.unacked = self.unacked.saturating_add(n as u32);
            if self.unacked < CREDIT_THRESHOLD {
                return None;
            }
            let credit = std::mem::take(&mut self.unacked);
            self.recv_allowed = self.recv_allowed.saturating_add(credit);
            return Some(credit);
        };
        let window = budget.window();
        let outstanding = self.outstanding() as u32;
        let credit = window.saturating_sub(outstanding);
        if credit < (window / 4).max(1) {
            return None;
        }
        self.recv_allowed = self.recv_allowed.saturating_add(credit);
        Some(credit)
    }

    /// A payload for the reader: queued, and counted in the budget.
    fn queue(&mut self, payload: Bytes) {
        if let Some(budget) = &self.budget {
            budget.add(payload.len());
        }
        self.recv.push(payload);
    }
}

pub(crate) struct State {
    pub(crate) streams: HashMap<u64, Slot>,
    pub(crate) outbox: Outbox,
    incoming: VecDeque<(u64, Bytes)>,
    accept_waker: Option<Waker>,
    next_id: u64,
    peer_last_id: u64,
    /// Set once the connection ended; every stream operation then fails.
    pub(crate) closed: Option<MuxError>,
    /// We open and accept no new streams (asked for, or every handle dropped).
    local_goaway: bool,
    goaway_sent: bool,
    peer_goaway: bool,
    handles: usize,
    max_streams: usize,
    accepts_streams: bool,
    recv_budget: Option<Arc<RecvBudget>>,
    /// A PONG is queued and not yet taken by the driver: further PINGs
    /// before it leaves are answered by that one.
    pong_queued: bool,
}

impl State {
    fn close(&mut self, reason: MuxError) {
        if self.closed.is_none() {
            self.closed = Some(reason);
        }
        for slot in self.streams.values_mut() {
            slot.wake_all();
        }
        self.incoming.clear();
        self.outbox.frames.clear();
        self.outbox.bytes = 0;
        for waker in self.outbox.blocked_writers.drain(..) {
            waker.wake();
        }
        if let Some(waker) = self.accept_waker.take() {
            waker.wake();
        }
    }

    /// Called when a stream handle goes away.
    pub(crate) fn forget(&mut self, id: u64) {
        let Some(slot) = self.streams.remove(&id) else {
            return;
        };
        let finished = slot.fin_sent && slot.recv_fin;
        if !finished && !slot.reset && self.closed.is_none() {
            self.outbox
                .push(Frame::new(id, Kind::Reset, 0, Bytes::new()));
        }
        if self.streams.is_empty() && (self.local_goaway || self.peer_goaway) {
            // The driver may now be able to finish the connection.
            self.outbox.wake_driver();
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

    /// Reads and dispatches frames until the transport has nothing more or a
    /// batch was read; true if anything arrived.
    fn poll_read_frames(&mut self, cx: &mut Context<'_>) -> Result<bool, MuxError> {
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

    /// Writes queued frames until the transport pushes back or nothing is
    /// left; true if anything was written.
    fn poll_write_frames(&mut self, cx: &mut Context<'_>) -> Result<bool, MuxError> {
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

    /// Keepalive and graceful close.
    fn poll_lifecycle(&mut self, cx: &mut Context<'_>) -> Result<Lifecycle, MuxError> {
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

enum Lifecycle {
    Done,
    /// Queued a PING or GOAWAY: write it before waiting.
    Queued,
    Running,
}
