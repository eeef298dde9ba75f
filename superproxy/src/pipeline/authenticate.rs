//! Stage 1, authenticate: who is asking. Parses the username grammar and
//! checks the base user's password (argon2 behind the credential cache), or
//! takes an allow-listed source address as the login; every failure is
//! charged to the source address by the login throttle.

use proxynet_common::egress::Cidr;
use std::net::IpAddr;
use std::sync::Arc;

use crate::allowlist::Allowlist;
use crate::authenticate::{Authenticator, Verified};
use crate::error::{ErrorKind, ProxyError};
use crate::limits::AuthFailureLimiter;
use crate::request::Credentials;
use crate::username::{self, ParsedUsername};

/// The login stage: the credential checker, the throttle and the allow-list.
pub struct Login {
    auth: Authenticator,
    throttle: Arc<AuthFailureLimiter>,
    allowlist: Arc<Allowlist>,
}

/// A verified login, not yet bounded by what the account allows.
pub(super) struct LoggedIn {
    pub(super) request: ParsedUsername,
    pub(super) verified: Verified,
    /// The allow-listed network it logged in by, if it had no credentials.
    pub(super) network: Option<Cidr>,
}

impl Login {
    pub fn new(
        auth: Authenticator,
        throttle: Arc<AuthFailureLimiter>,
        allowlist: Arc<Allowlist>,
    ) -> Self {
        Self {
            auth,
            throttle,
            allowlist,
        }
    }

    /// A grammar error is a 400 naming the problem; any credential failure
    /// is the one indistinguishable 407. Both are charged to `peer`.
    pub(super) async fn check(
        &self,
        credentials: Option<Credentials>,
        peer: IpAddr,
    ) -> Result<LoggedIn, ProxyError> {
        self.throttle.check(peer)?;
        let Some(credentials) = credentials else {
            // No credentials at all: an allow-listed source address is a login.
            return self.allowlisted(peer).await;
        };
        // A header that did not decode: the one 407.
        if credentials.username.is_empty() {
            return Err(ProxyError::auth_required());
        }
        let request = match username::parse(&credentials.username) {
            Ok(request) => request,
            Err(e) => {
                self.throttle.charge(peer)?;
                return Err(ProxyError::new(
                    ErrorKind::BadRequest,
                    format!("proxy username: {e}"),
                ));
            }
        };
        let verified = self
            .auth
            .authenticate(&request.user, credentials.password.expose(), || {
                self.throttle.charge(peer)
            })
            .await?;
        Ok(LoggedIn {
            request,
            verified,
            network: None,
        })
    }

    /// A request without credentials from an allow-listed address: the
    /// user's `allowlist_options` stand in for the username's grammar.
    async fn allowlisted(&self, peer: IpAddr) -> Result<LoggedIn, ProxyError> {
        let (network, username) = self
            .allowlist
            .lookup(peer)
            .ok_or_else(ProxyError::auth_required)?;
        let verified = self.auth.allowlisted(&username).await?;
        let options = verified
            .record
            .allowlist_options
            .as_deref()
            .unwrap_or_default();
        let request = username::parse_options(&username, options).map_err(|e| {
            ProxyError::new(
                ErrorKind::BadRequest,
                format!("allow-list options of this user: {e}"),
            )
        })?;
        Ok(LoggedIn {
            request,
            verified,
            network: Some(network),
        })
    }
}
