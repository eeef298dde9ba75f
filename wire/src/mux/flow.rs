//! Flow control: the per-stream windows and the process-wide receive budget
//! that decides how much credit a stream's reader returns to the peer.

use std::sync::Arc;

use super::frame::STREAM_WINDOW;

/// Bounds what the process's streams hold for readers that do not read,
/// across every connection: the bytes queued in their receive buffers. A
/// stream the peer agreed to start small
/// ([`MuxHandle::open_with_window`](crate::mux::MuxHandle::open_with_window),
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

    pub(super) fn add(&self, n: usize) {
        self.queued
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn sub(&self, n: usize) {
        self.queued
            .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Credit is returned once a reader has consumed this much: a quarter of
/// the window keeps the sender busy without a CREDIT frame per read.
pub(super) const CREDIT_THRESHOLD: u32 = STREAM_WINDOW / 4;
