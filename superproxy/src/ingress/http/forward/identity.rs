//! What a kept-alive client connection remembers between its forwarded
//! requests ([`ConnectionIdentity`]): the user it last served, registered
//! for revocation, and the exit its last request used, which a
//! `rotate-tunnel` login's next request on it draws first.

use std::sync::Arc;
use uuid::Uuid;

/// What a kept-alive client connection remembers between its requests: the
/// user it last served, registered for revocation until the connection ends
/// or serves someone else, and the exit its last request used (for
/// `rotate-tunnel`).
#[derive(Clone, Default)]
pub(crate) struct ConnectionIdentity(Arc<std::sync::Mutex<ConnectionMemory>>);

#[derive(Default)]
struct ConnectionMemory {
    registration: Option<crate::open_tunnels::Registration>,
    last: Option<LastExit>,
}

/// The exit a connection's last request used, and the login it used it for.
struct LastExit {
    login: LoginKey,
    exit: Uuid,
}

/// How a request logged in, as far as keeping an exit goes: the full
/// username, grammar and all (`None` for an allow-listed login), and the
/// `Proxynet-Options` header, whose options replace the username's.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct LoginKey {
    pub(super) username: Option<String>,
    pub(super) options: Option<String>,
}

impl LoginKey {
    /// Whether its requests may keep their connection's exit, as far as
    /// can be told before logging in (`rotate-tunnel`, no session; an
    /// allow-listed login's stored options are only known once it is
    /// logged in, so it is asked then).
    fn may_keep(&self) -> bool {
        let Some(username) = &self.username else {
            return true;
        };
        let parsed = proxynet_wire::username::parse(username).and_then(|p| match &self.options {
            Some(options) => proxynet_wire::username::parse_options(&p.user, options.trim()),
            None => Ok(p),
        });
        parsed.is_ok_and(|p| keeps_exit(&p))
    }
}

impl ConnectionIdentity {
    /// The exit to keep for a request logging in as `login`: the last
    /// request's, when it logged in the same way (username and options
    /// header alike) and that login may keep one.
    pub(super) fn kept_for(&self, login: &LoginKey) -> Option<Uuid> {
        let memory = self.0.lock().ok()?;
        let last = memory.last.as_ref()?;
        (last.login == *login && login.may_keep()).then_some(last.exit)
    }

    pub(super) fn served(
        &self,
        registration: crate::open_tunnels::Registration,
        login: LoginKey,
        exit: Uuid,
    ) {
        if let Ok(mut memory) = self.0.lock() {
            memory.registration = Some(registration);
            memory.last = Some(LastExit { login, exit });
        }
    }
}

/// Whether a login's requests keep their connection's exit.
pub(super) fn keeps_exit(request: &proxynet_wire::username::ParsedUsername) -> bool {
    request.session.is_none() && request.rotate == proxynet_wire::username::Rotate::Tunnel
}
