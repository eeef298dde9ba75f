//! Stage 1, authenticate: who is asking. Parses the username grammar and
//! checks the base user's password (argon2 behind the credential cache), or
//! takes an allow-listed source address as the login; every failure is
//! charged to the source address by the login throttle.
//!
//! Options sent in the `Proxynet-Options` header replace those of the
//! username (or the allow-listed user's stored ones), parsed by the same
//! grammar; the base user always comes from the username or the
//! allow-list. They are only a request: the authorize stage bounds them
//! exactly as it bounds a username's.

use proxynet_common::egress::Cidr;
use std::net::IpAddr;
use std::sync::Arc;

use crate::allowlist::Allowlist;
use crate::credentials::{Authenticator, Verified};
use crate::error::{ErrorKind, ProxyError};
use crate::login_throttle::AuthFailureLimiter;
use crate::request::Credentials;
use proxynet_wire::username::{self, ParsedUsername};

/// The header's name as errors spell it.
const OPTIONS_HEADER_NAME: &str = "Proxynet-Options";

/// The login stage: the credential checker, the throttle and the allow-list.
pub(crate) struct Login {
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
    pub(crate) fn new(
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

    /// A grammar error (in the username or in `options`, the
    /// `Proxynet-Options` header) is a 400 naming the problem; any
    /// credential failure is the one indistinguishable 407. Both are
    /// charged to `peer`.
    pub(super) async fn check(
        &self,
        credentials: Option<Credentials>,
        options: Option<&str>,
        peer: IpAddr,
    ) -> Result<LoggedIn, ProxyError> {
        self.throttle.check(peer)?;
        let Some(credentials) = credentials else {
            // No credentials at all: an allow-listed source address is a login.
            return self.allowlisted(peer, options).await;
        };
        // A header that did not decode: the one 407.
        if credentials.username.is_empty() {
            return Err(ProxyError::auth_required());
        }
        let mut request = match username::parse(&credentials.username) {
            Ok(request) => request,
            Err(e) => {
                self.throttle.charge(peer)?;
                return Err(ProxyError::new(
                    ErrorKind::BadRequest,
                    format!("proxy username: {e}"),
                ));
            }
        };
        // Before the password is checked, as the username's grammar is:
        // a malformed header costs no hash.
        if let Some(options) = options {
            request = self.header_options(&request.user, options, peer)?;
        }
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
    /// `Proxynet-Options` header, or else the user's `allowlist_options`,
    /// stand in for the username's grammar.
    async fn allowlisted(
        &self,
        peer: IpAddr,
        options: Option<&str>,
    ) -> Result<LoggedIn, ProxyError> {
        let (network, username) = self
            .allowlist
            .lookup(peer)
            .ok_or_else(ProxyError::auth_required)?;
        let header = match options {
            Some(options) => Some(self.header_options(&username, options, peer)?),
            None => None,
        };
        let verified = self.auth.allowlisted(&username).await?;
        let request = match header {
            Some(request) => request,
            None => {
                let stored = verified
                    .record
                    .allowlist_options
                    .as_deref()
                    .unwrap_or_default();
                username::parse_options(&username, stored).map_err(|e| {
                    ProxyError::new(
                        ErrorKind::BadRequest,
                        format!("allow-list options of this user: {e}"),
                    )
                })?
            }
        };
        Ok(LoggedIn {
            request,
            verified,
            network: Some(network),
        })
    }

    /// `user` with the options of the `Proxynet-Options` header in place of
    /// any others. A malformed value is a 400 naming the header, charged to
    /// `peer` as a malformed username is.
    fn header_options(
        &self,
        user: &str,
        options: &str,
        peer: IpAddr,
    ) -> Result<ParsedUsername, ProxyError> {
        let options = options.trim();
        let parsed = if options.len() > username::MAX_OPTIONS_BYTES {
            Err(format!("at most {} bytes", username::MAX_OPTIONS_BYTES))
        } else {
            username::parse_options(user, options).map_err(|e| e.to_string())
        };
        match parsed {
            Ok(request) => Ok(request),
            Err(reason) => {
                self.throttle.charge(peer)?;
                Err(ProxyError::new(
                    ErrorKind::BadRequest,
                    format!("{OPTIONS_HEADER_NAME}: {reason}"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests;
