//! The [`ConnectionTicket`] every connection, and every tunnel or HTTP/2
//! stream born on it, holds while it lives: its share of the connection
//! cap (a permit), its place in the drain count, its pre-auth slot until
//! the first login, the open-connections gauge and its cut token; and the
//! [`Issuer`] that makes a connection's ticket.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::pre_auth::PreAuthSlot;

/// What a client connection holds while it, or a tunnel on it, lives.
#[derive(Clone)]
pub(crate) struct ConnectionTicket(Arc<TicketInner>);

struct TicketInner {
    peer: SocketAddr,
    cut: CancellationToken,
    /// Stream tickets of this connection alive now (HTTP/2).
    streams: AtomicUsize,
    holds: TicketHolds,
}

/// What the ticket keeps alive: a connection's own places, or (for one
/// stream of a multiplexed connection) the connection's ticket.
enum TicketHolds {
    Connection {
        _counted: OpenConnection,
        /// Released at the first successful login (or when the connection ends).
        pre_auth: std::sync::Mutex<Option<PreAuthSlot>>,
        _permit: OwnedSemaphorePermit,
        _alive: mpsc::Sender<()>,
    },
    Stream(StreamPlace),
}

/// One stream's place on its connection: counted while it lives.
struct StreamPlace {
    connection: ConnectionTicket,
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        self.connection.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionTicket {
    /// The client's address: the TCP peer's, or the one a trusted
    /// balancer's PROXY protocol header carried.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.0.peer
    }

    /// The connection has logged in: it no longer counts against its
    /// address's pre-auth bound nor runs against the pre-auth deadline, and
    /// (at its first login) its address counts as known for a while.
    pub(crate) fn authenticated(&self) {
        match &self.0.holds {
            TicketHolds::Connection { pre_auth, .. } => {
                let slot = pre_auth.lock().ok().and_then(|mut slot| slot.take());
                if let Some(slot) = slot {
                    // Known first, then freed: the place goes to a waiter
                    // of the larger allowance.
                    slot.registry.logged_in(slot.source);
                    drop(slot);
                }
            }
            TicketHolds::Stream(place) => place.connection.authenticated(),
        }
    }

    /// A ticket for one stream of this (multiplexed) connection: it keeps
    /// the connection's places, and its own cut token is a child of the
    /// connection's, so revoking the user of one HTTP/2 stream cuts that
    /// stream and leaves the connection's other users' streams alone, while
    /// cutting the connection still cuts every stream.
    pub(crate) fn stream(&self) -> ConnectionTicket {
        self.0.streams.fetch_add(1, Ordering::Relaxed);
        ConnectionTicket(Arc::new(TicketInner {
            peer: self.0.peer,
            cut: self.0.cut.child_token(),
            streams: AtomicUsize::new(0),
            holds: TicketHolds::Stream(StreamPlace {
                connection: self.clone(),
            }),
        }))
    }

    /// Stream tickets of this connection alive now: requests in flight and
    /// the tunnels they opened.
    pub(crate) fn open_streams(&self) -> usize {
        self.0.streams.load(Ordering::Relaxed)
    }

    /// Cancelled when the connection must end now (revocation, drain deadline).
    pub(crate) fn cut(&self) -> &CancellationToken {
        &self.0.cut
    }
}

#[cfg(test)]
impl ConnectionTicket {
    /// A logged-in connection's ticket without a listener (unit tests of
    /// what a tunnel holds): a permit of `permits` and a drain place on
    /// `alive`; `None` when no permit is free.
    pub(crate) fn for_tests(
        peer: SocketAddr,
        permits: Arc<Semaphore>,
        alive: mpsc::Sender<()>,
    ) -> Option<Self> {
        let permit = permits.try_acquire_owned().ok()?;
        Some(ConnectionTicket(Arc::new(TicketInner {
            peer,
            cut: CancellationToken::new(),
            streams: AtomicUsize::new(0),
            holds: TicketHolds::Connection {
                _counted: OpenConnection::new(),
                pre_auth: std::sync::Mutex::new(None),
                _permit: permit,
                _alive: alive,
            },
        })))
    }
}

/// Keeps the open-connections gauge right however a ticket ends.
struct OpenConnection;

impl OpenConnection {
    fn new() -> Self {
        crate::metrics::connections_open(1);
        Self
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        crate::metrics::connections_open(-1);
    }
}

/// What turns a connection with a pre-auth slot into one with a ticket: a
/// connection permit and a place in the drain count. A waiting connection's
/// task holds one, so shutdown waits for it too (waiters are let go when the
/// listeners close).
pub(super) struct Issuer {
    pub(super) permits: Arc<Semaphore>,
    pub(super) alive: mpsc::Sender<()>,
}

impl Issuer {
    /// The connection's ticket; `None` when `max_connections` are open.
    pub(super) fn ticket(
        self,
        peer: SocketAddr,
        cut: CancellationToken,
        slot: PreAuthSlot,
    ) -> Option<ConnectionTicket> {
        let permit = self.permits.try_acquire_owned().ok()?;
        Some(ConnectionTicket(Arc::new(TicketInner {
            peer,
            cut,
            streams: AtomicUsize::new(0),
            holds: TicketHolds::Connection {
                _counted: OpenConnection::new(),
                pre_auth: std::sync::Mutex::new(Some(slot)),
                _permit: permit,
                _alive: self.alive,
            },
        })))
    }
}
