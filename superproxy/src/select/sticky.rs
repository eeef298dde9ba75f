//! The session policy: a sticky session's pin is tried first while it is
//! usable; when it is not, a `soft` session is re-pinned to the candidate
//! most like the exit it lost (same country, city and ASN; else same
//! country and city; else same country; else any: [`Candidates::draw_like`])
//! and a `hard` one fails with a coded 502; a session keeps its egress IP
//! too. A pin whose exit is cooled for the tunnel's site (the site refuses
//! it: `crate::sites`) counts as lost for that tunnel: a soft session
//! re-pins, a hard one fails saying the site refuses its exit. Every change
//! of pin is one compare-and-set in Redis ([`Sticky::repin`]), so
//! superproxies agree on it. A `sessidle` session's
//! every tunnel through its pin moves the pin's idle deadline
//! ([`Sessions::touch`]).

use proxynet_store::ExitRecord;
use std::net::IpAddr;
use uuid::Uuid;

use super::sessions::{Pin, Sessions};
use super::{egress_ip_for, Candidate, Candidates};
use crate::error::{ErrorKind, ProxyError};
use crate::target::Target;
use proxynet_wire::username::{Session, SessionMode};

/// One tunnel's view of its session: what the username asked for and the
/// pin as last read or written.
pub(crate) struct Sticky<'a> {
    sessions: &'a Sessions,
    user: Uuid,
    session: &'a Session,
    pin: Option<Pin>,
}

impl<'a> Sticky<'a> {
    /// The session's current pin, read once per tunnel.
    pub(crate) async fn load(sessions: &'a Sessions, user: Uuid, session: &'a Session) -> Self {
        let pin = sessions.get(user, &session.id).await;
        Self {
            sessions,
            user,
            session,
            pin,
        }
    }

    /// The pin now in force.
    pub(crate) fn pin(&self) -> Option<Pin> {
        self.pin
    }

    /// The next exit for this session: the pinned one while usable;
    /// otherwise (soft) the next candidate, pinned. `Ok(None)`: no
    /// candidate is left. `record_of` finds a lost exit's last known record
    /// (it is usually no longer in the pool snapshot).
    pub(crate) async fn choose(
        &mut self,
        candidates: &mut Candidates<'_>,
        target: Option<&Target>,
        record_of: impl FnOnce(&Uuid) -> Option<std::sync::Arc<ExitRecord>>,
    ) -> Result<Option<Candidate>, ProxyError> {
        let mut lost = None;
        if let Some(current) = self.pin {
            // A pin the tunnel's site refuses (the exit is cooled for it) is
            // as lost as a pin that is gone, for this tunnel.
            let cooled = candidates.cooled(current.exit);
            let pinned = if cooled {
                None
            } else {
                candidates.exactly(current.exit)
            };
            if let Some(pinned) = pinned {
                if let Some(idle) = self.session.idle {
                    self.pin = Some(
                        self.sessions
                            .touch(self.user, &self.session.id, current, idle)
                            .await,
                    );
                }
                return Ok(Some(pinned));
            }
            // The pin is fine for the session's tunnels; only this
            // association cannot use it: moving the session would move them.
            if candidates.lacks_udp(current.exit) {
                return Err(ProxyError::new(
                    ErrorKind::NoExit,
                    "the session's exit does not carry UDP",
                ));
            }
            if self.session.mode == SessionMode::Hard {
                if let Some(site) = candidates.site().filter(|_| cooled) {
                    return Err(ProxyError::new(
                        ErrorKind::SessionExitLost,
                        format!(
                            "the session's exit is refused by the site {site} (cooled; sessmode=hard)"
                        ),
                    ));
                }
                return Err(ProxyError::new(
                    ErrorKind::SessionExitLost,
                    "the session's exit is no longer available (sessmode=hard)",
                ));
            }
            lost = Some(current.exit);
        }
        let drawn = match lost {
            // A soft re-pin: as like the lost exit as the pool allows.
            Some(lost) => candidates.draw_like(record_of(&lost).as_deref()),
            None => candidates.draw(),
        };
        let Some(drawn) = drawn else {
            return Ok(None);
        };
        // An association's address is kept once chosen (`keep_ip`).
        let ip = target.and_then(|t| egress_ip_for(&drawn, t, None, candidates.targeting()));
        let pinned = self.repin(drawn.record.id, ip).await?;
        // Another superproxy may have re-pinned first: follow it.
        Ok(Some(candidates.follow(pinned.exit, drawn)))
    }

    /// The session's egress IP on `exit`, if it is pinned there.
    pub(crate) fn egress_ip_on(&self, exit: Uuid) -> Option<IpAddr> {
        self.pin
            .filter(|p| p.exit == exit)
            .and_then(|p| p.egress_ip)
    }

    /// Records the egress IP now in use on the pinned exit, so the session
    /// keeps it.
    pub(crate) async fn keep_ip(&mut self, exit: Uuid, ip: IpAddr) -> Result<(), ProxyError> {
        match self.pin {
            Some(current) if current.exit == exit && current.egress_ip != Some(ip) => {
                self.repin(exit, Some(ip)).await.map(drop)
            }
            _ => Ok(()),
        }
    }

    /// The one way a pin changes: compare-and-set from the pin we know.
    async fn repin(&mut self, exit: Uuid, ip: Option<IpAddr>) -> Result<Pin, ProxyError> {
        let pin = self
            .sessions
            .set(self.user, self.session, self.pin, exit, ip)
            .await?;
        self.pin = Some(pin);
        Ok(pin)
    }
}
