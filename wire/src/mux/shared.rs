//! The state one mux connection shares between its driver and its streams.
//!
//! One lock per connection guards every stream's buffers and credit and the
//! outgoing queue (as h2 does): stream handles only move bytes in memory and
//! queue frames; the driver alone touches the transport.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use super::error::MuxError;
use super::flow::{RecvBudget, CREDIT_THRESHOLD};
use super::frame::{Frame, Kind, STREAM_WINDOW};
use super::recv_queue::RecvQueue;

/// Outgoing bytes queued before writers wait for the driver. Shared fate is
/// right here: it only fills when the link's own socket is slow.
pub(super) const MAX_QUEUED_BYTES: usize = 4 << 20;

pub(crate) struct Shared {
    pub(super) state: Mutex<State>,
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
    pub(super) frames: VecDeque<Frame>,
    pub(super) bytes: usize,
    pub(super) driver: Option<Waker>,
    pub(super) blocked_writers: Vec<Waker>,
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
    pub(super) recv_allowed: u32,
    /// Consumed by our reader, not yet returned to the peer as credit.
    unacked: u32,
    pub(crate) read_waker: Option<Waker>,
    /// What we may still send.
    pub(crate) credit: u32,
    pub(crate) write_waker: Option<Waker>,
    pub(crate) fin_sent: bool,
    pub(crate) reset: bool,
    pub(super) reply: Option<Bytes>,
    pub(super) open_waker: Option<Waker>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.sub(self.recv.len());
        }
    }
}

impl Slot {
    pub(super) fn new(recv_window: u32, budget: Option<Arc<RecvBudget>>) -> Self {
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

    pub(super) fn wake_all(&mut self) {
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
    pub(super) fn queue(&mut self, payload: Bytes) {
        if let Some(budget) = &self.budget {
            budget.add(payload.len());
        }
        self.recv.push(payload);
    }
}

pub(crate) struct State {
    pub(crate) streams: HashMap<u64, Slot>,
    pub(crate) outbox: Outbox,
    pub(super) incoming: VecDeque<(u64, Bytes)>,
    pub(super) accept_waker: Option<Waker>,
    pub(super) next_id: u64,
    pub(super) peer_last_id: u64,
    /// Set once the connection ended; every stream operation then fails.
    pub(crate) closed: Option<MuxError>,
    /// We open and accept no new streams (asked for, or every handle dropped).
    pub(super) local_goaway: bool,
    pub(super) goaway_sent: bool,
    pub(super) peer_goaway: bool,
    pub(super) handles: usize,
    pub(super) max_streams: usize,
    pub(super) accepts_streams: bool,
    pub(super) recv_budget: Option<Arc<RecvBudget>>,
    /// A PONG is queued and not yet taken by the driver: further PINGs
    /// before it leaves are answered by that one.
    pub(super) pong_queued: bool,
}

impl State {
    pub(super) fn close(&mut self, reason: MuxError) {
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
