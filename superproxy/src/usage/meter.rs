//! The hot path of accounting: a [`Meter`] per tunnel counting what crosses
//! it, and the byte [`Budget`]s of the quotas its bytes count against.
//!
//! A quota-bound tunnel *reserves* budget before it moves bytes and moves no
//! more than it reserved: a read or write is cut to what is left (a chunk
//! already received is truncated to it), and what a read or write did not
//! use is given back. Every tunnel of one user (and of one account) on this
//! instance draws on the same budget, so however many tunnels run in
//! parallel, this instance moves no more than the budget it holds: the
//! overshoot is bounded by what other instances moved since their last flush,
//! not by the number of tunnels times a read size.

use bytes::{Buf, Bytes};
use proxynet_store::{QuotaPeriod, SourceType};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use uuid::Uuid;

/// Bytes one quota owner (a user, or an account) may still move through
/// this instance.
#[derive(Debug)]
pub struct Budget {
    left: AtomicI64,
    /// Bytes reserved against it since it was made (net of give-backs), so
    /// a flush can tell which of them the shared counter has not seen yet.
    spent: AtomicU64,
    /// The limit and quota window it was made for: a raised limit or a new
    /// period makes a fresh budget.
    made_for: (u64, String),
}

impl Budget {
    pub fn new(left: i64) -> Self {
        Self::for_window(left, 0, String::new())
    }

    pub fn for_window(left: i64, limit: u64, window: String) -> Self {
        Self {
            left: AtomicI64::new(left),
            spent: AtomicU64::new(0),
            made_for: (limit, window),
        }
    }

    /// Whether it was made for this limit and quota window.
    pub fn is_for(&self, limit: u64, window: &str) -> bool {
        self.made_for.0 == limit && self.made_for.1 == window
    }

    /// Takes up to `want` bytes; how many it got (0 when nothing is left).
    pub fn reserve(&self, want: usize) -> usize {
        let want = i64::try_from(want).unwrap_or(i64::MAX);
        let mut current = self.left.load(Ordering::Relaxed);
        loop {
            if current <= 0 {
                return 0;
            }
            let take = want.min(current);
            match self.left.compare_exchange_weak(
                current,
                current - take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.spent.fetch_add(take as u64, Ordering::Relaxed);
                    return take as usize;
                }
                Err(now) => current = now,
            }
        }
    }

    /// Gives back reserved bytes that were not moved.
    pub fn release(&self, n: usize) {
        if n > 0 {
            self.left.fetch_add(n as i64, Ordering::AcqRel);
            self.spent.fetch_sub(n as u64, Ordering::Relaxed);
        }
    }

    pub fn left(&self) -> i64 {
        self.left.load(Ordering::Relaxed)
    }

    pub fn spent(&self) -> u64 {
        self.spent.load(Ordering::Acquire)
    }

    /// Replaces what is left (from the shared counter after a flush).
    pub fn reset(&self, left: i64) {
        self.left.store(left, Ordering::Release);
    }
}

/// Whose quota a budget is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaOwner {
    User(Uuid),
    Account(Uuid),
}

impl QuotaOwner {
    pub fn id(self) -> Uuid {
        match self {
            QuotaOwner::User(id) | QuotaOwner::Account(id) => id,
        }
    }
}

/// One quota a tunnel's bytes count against.
#[derive(Debug, Clone)]
pub struct QuotaBinding {
    pub owner: QuotaOwner,
    pub limit: u64,
    pub period: QuotaPeriod,
    pub budget: Arc<Budget>,
}

/// `Meter::billing`: the bytes are billed (every meter starts so).
const BILLABLE: u8 = 0;
/// `Meter::billing`: whether the bytes are billed is not known yet (an
/// attempt whose answer may turn out a ban the gateway retries elsewhere).
const HELD: u8 = 1;
/// `Meter::billing`: the bytes are recorded as not billable.
const NOT_BILLABLE: u8 = 2;
/// `Meter::billing`: held, then settled as billed (never held again).
const SETTLED_BILLABLE: u8 = 3;
/// Which side of a tunnel ended first, as its exit stream saw it: the exit
/// (its stream ended or failed: the target closed or reset, or the link
/// broke) or the client (it finished sending, so the stream was shut).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndSide {
    Exit,
    Client,
}

const NO_END: u8 = 0;
const EXIT_END: u8 = 1;
const CLIENT_END: u8 = 2;

/// Counters of one tunnel (or one forwarded request's upstream connection).
#[derive(Debug)]
pub struct Meter {
    pub account_id: Uuid,
    pub user_id: Uuid,
    pub exit_id: Uuid,
    /// The exit's source type when the tunnel opened: what its bytes are billed as.
    pub source_type: Option<SourceType>,
    /// The target's registrable domain (usage by domain); `None` for a UDP
    /// association, whose datagrams go to many.
    pub domain: Option<Arc<str>>,
    /// The quotas its bytes count against (the user's, the account's).
    pub quotas: Vec<QuotaBinding>,
    up: AtomicU64,
    down: AtomicU64,
    pub(super) done: AtomicBool,
    /// Set when a quota is exhausted: the stream fails its next I/O.
    pub(super) cut: AtomicBool,
    /// [`BILLABLE`], [`HELD`], [`NOT_BILLABLE`] or [`SETTLED_BILLABLE`]
    /// (only ever in that order, skipping some): while held, the usage
    /// recorder keeps the meter's bytes out of the ledger (not out of the
    /// quotas: they moved) until it is settled.
    billing: AtomicU8,
    /// Which side ended first ([`EndSide`]; 0 while neither has).
    first_end: AtomicU8,
}

impl Meter {
    pub fn new(
        account_id: Uuid,
        user_id: Uuid,
        exit_id: Uuid,
        source_type: Option<SourceType>,
        domain: Option<Arc<str>>,
        quotas: Vec<QuotaBinding>,
    ) -> Self {
        Self {
            account_id,
            user_id,
            exit_id,
            source_type,
            domain,
            quotas,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            done: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            billing: AtomicU8::new(BILLABLE),
            first_end: AtomicU8::new(NO_END),
        }
    }

    /// Holds the meter's bytes back from the ledger until
    /// [`Meter::settle_billing`] says whether they are billed: for an
    /// attempt that may be given up and retried through another exit.
    /// Called before any byte moves; a settled meter stays settled.
    pub fn hold_billing(&self) {
        let _ = self
            .billing
            .compare_exchange(BILLABLE, HELD, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Settles a held meter: its bytes (all of them, those moved before and
    /// after) are billed or recorded as not billable. Without a hold it
    /// changes nothing: only a held meter's bytes can be unbilled, so a
    /// late call cannot take back bytes already in the ledger as billed.
    pub fn settle_billing(&self, billable: bool) {
        let settled = if billable {
            SETTLED_BILLABLE
        } else {
            NOT_BILLABLE
        };
        let _ = self
            .billing
            .compare_exchange(HELD, settled, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether the meter's bytes are billed: `false` only once settled so.
    /// A meter still held counts as billed (what the ledger records when its
    /// tunnel ends before anyone settled it).
    pub fn billable(&self) -> bool {
        self.billing.load(Ordering::Acquire) != NOT_BILLABLE
    }

    /// Whether the meter is held ([`Meter::hold_billing`]) and not settled.
    pub fn billing_held(&self) -> bool {
        self.billing.load(Ordering::Acquire) == HELD
    }

    /// Which side of the tunnel ended first, if either has: what tells a
    /// target that closed a tunnel from a client that was done with it.
    pub fn first_end(&self) -> Option<EndSide> {
        match self.first_end.load(Ordering::Acquire) {
            EXIT_END => Some(EndSide::Exit),
            CLIENT_END => Some(EndSide::Client),
            _ => None,
        }
    }

    /// Notes that `side` ended, unless one did before.
    fn note_end(&self, side: u8) {
        let _ = self
            .first_end
            .compare_exchange(NO_END, side, Ordering::AcqRel, Ordering::Relaxed);
    }

    pub fn up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }
    pub fn down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }

    /// Stops the stream at its next read or write.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Reserves up to `want` bytes from every quota's budget: the least any
    /// of them grants. `want` itself when no quota applies.
    fn reserve(&self, want: usize) -> usize {
        let mut take = want;
        for (i, q) in self.quotas.iter().enumerate() {
            let got = q.budget.reserve(take);
            if got < take {
                // The earlier budgets granted more than this one: give it back.
                for earlier in &self.quotas[..i] {
                    earlier.budget.release(take - got);
                }
                take = got;
            }
            if take == 0 {
                break;
            }
        }
        take
    }

    /// Counts one datagram's payload, `up` (client to target) or down: a UDP
    /// association bills payload, not its framing on the link. Reserved
    /// from every quota first; `false` — and the meter cut — when a quota
    /// cannot cover the whole datagram (a datagram is not sent in part).
    pub fn charge_datagram(&self, up: bool, n: usize) -> bool {
        if self.is_cut() {
            return false;
        }
        if !self.quotas.is_empty() {
            let granted = self.reserve(n);
            if granted < n {
                self.release(granted);
                self.cut();
                return false;
            }
        }
        let counter = if up { &self.up } else { &self.down };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        true
    }

    fn release(&self, n: usize) {
        if n > 0 {
            for q in &self.quotas {
                q.budget.release(n);
            }
        }
    }
}

/// Marks its meter finished when dropped, so the next flush is its last.
pub struct MeterHandle(pub Arc<Meter>);

impl Drop for MeterHandle {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Release);
    }
}

/// An I/O stream to an exit that counts what crosses it and keeps it within
/// its quotas' budgets.
pub struct Metered<IO> {
    io: IO,
    meter: MeterHandle,
}

impl<IO> Metered<IO> {
    pub fn new(io: IO, meter: MeterHandle) -> Self {
        Self { io, meter }
    }

    /// The stream and its meter apart, for a carrier that counts what it
    /// carries itself (a UDP association counts payload per datagram).
    pub fn into_parts(self) -> (IO, MeterHandle) {
        (self.io, self.meter)
    }

    /// The counters, for readers that outlive the stream's handover.
    pub fn meter(&self) -> Arc<Meter> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn meter(quotas: Vec<QuotaBinding>) -> Arc<Meter> {
        Arc::new(Meter::new(
            Uuid::nil(),
            Uuid::nil(),
            Uuid::nil(),
            None,
            None,
            quotas,
        ))
    }

    #[tokio::test]
    async fn metered_streams_count_exactly_what_crosses_them() {
        let (near, mut far) = tokio::io::duplex(1024);
        let meter = meter(Vec::new());
        let mut metered = Metered::new(near, MeterHandle(meter.clone()));
        let writer = tokio::spawn(async move {
            metered.write_all(&vec![1u8; 100_000]).await.unwrap();
            let mut back = vec![0u8; 3_000];
            metered.read_exact(&mut back).await.unwrap();
            drop(metered);
        });
        let mut got = vec![0u8; 100_000];
        far.read_exact(&mut got).await.unwrap();
        far.write_all(&[2u8; 3_000]).await.unwrap();
        writer.await.unwrap();
        assert_eq!((meter.up(), meter.down()), (100_000, 3_000));
        assert!(
            meter.done.load(Ordering::Acquire),
            "dropping the stream finishes the meter"
        );
    }

    #[tokio::test]
    async fn the_meter_knows_which_side_ended_first() {
        // The far end (the exit) closes first.
        let (near, far) = tokio::io::duplex(64);
        let m = meter(Vec::new());
        let mut metered = Metered::new(near, MeterHandle(m.clone()));
        assert_eq!(m.first_end(), None);
        drop(far);
        let mut buf = [0u8; 8];
        assert_eq!(metered.read(&mut buf).await.unwrap(), 0);
        assert_eq!(m.first_end(), Some(EndSide::Exit));
        let _ = metered.shutdown().await;
        assert_eq!(m.first_end(), Some(EndSide::Exit), "the first stays");
        // The client finishes sending first.
        let (near, mut far) = tokio::io::duplex(64);
        let m = meter(Vec::new());
        let mut metered = Metered::new(near, MeterHandle(m.clone()));
        metered.shutdown().await.unwrap();
        assert_eq!(m.first_end(), Some(EndSide::Client));
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        drop(far);
        assert_eq!(metered.read(&mut buf).await.unwrap(), 0);
        assert_eq!(m.first_end(), Some(EndSide::Client));
    }

    #[tokio::test]
    async fn parallel_streams_never_move_more_than_their_shared_budget() {
        let budget = Arc::new(Budget::new(300_000));
        let binding = QuotaBinding {
            owner: QuotaOwner::User(Uuid::nil()),
            limit: 300_000,
            period: QuotaPeriod::Daily,
            budget: budget.clone(),
        };
        let mut tasks = Vec::new();
        let mut meters = Vec::new();
        for _ in 0..40 {
            let (near, mut far) = tokio::io::duplex(64 * 1024);
            let meter = meter(vec![binding.clone()]);
            meters.push(meter.clone());
            let mut metered = Metered::new(near, MeterHandle(meter));
            tasks.push(tokio::spawn(async move {
                // The far end sends far more than the quota; the metered side
                // reads until it is cut.
                let feeder = tokio::spawn(async move {
                    let _ = far.write_all(&vec![7u8; 1_000_000]).await;
                });
                let mut sink = vec![0u8; 256 * 1024];
                while let Ok(n) = metered.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
                feeder.abort();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let moved: u64 = meters.iter().map(|m| m.down()).sum();
        assert_eq!(
            moved, 300_000,
            "exactly the budget, whatever the parallelism"
        );
        assert_eq!(budget.left(), 0);
        assert_eq!(budget.spent(), 300_000);
    }

    #[test]
    fn billing_is_held_until_settled_and_settled_once() {
        let m = meter(Vec::new());
        assert!(m.billable() && !m.billing_held(), "billed by default");
        m.settle_billing(false);
        assert!(m.billable(), "only a held meter can be unbilled");
        m.hold_billing();
        assert!(m.billing_held() && m.billable(), "held counts as billed");
        m.settle_billing(false);
        assert!(!m.billable() && !m.billing_held());
        m.hold_billing();
        m.settle_billing(true);
        assert!(!m.billable(), "settled stays settled");
        let m = meter(Vec::new());
        m.hold_billing();
        m.settle_billing(true);
        assert!(m.billable() && !m.billing_held());
        m.hold_billing();
        assert!(!m.billing_held(), "a settled meter is not held again");
    }

    #[test]
    fn a_two_quota_reservation_takes_the_smaller_grant_from_both() {
        let user = Arc::new(Budget::new(1_000));
        let account = Arc::new(Budget::new(100));
        let bind = |owner, budget: &Arc<Budget>| QuotaBinding {
            owner,
            limit: 0,
            period: QuotaPeriod::Monthly,
            budget: budget.clone(),
        };
        let m = meter(vec![
            bind(QuotaOwner::User(Uuid::nil()), &user),
            bind(QuotaOwner::Account(Uuid::nil()), &account),
        ]);
        assert_eq!(m.reserve(500), 100);
        assert_eq!((user.left(), account.left()), (900, 0));
        assert_eq!(m.reserve(10), 0);
        assert_eq!(user.left(), 900, "a refused reservation takes nothing");
        m.release(40);
        assert_eq!((user.left(), account.left()), (940, 40));
    }
}
