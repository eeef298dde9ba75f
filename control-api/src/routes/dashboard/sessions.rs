//! Dashboard sessions: a login becomes a random id in a cookie, bound to the
//! key it logged in with; failed logins are throttled per address.

use super::*;

pub(super) const COOKIE: &str = "pn_dashboard";
pub(super) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
pub(super) const MAX_SESSIONS: usize = 10_000;
/// Sessions one key may hold; the oldest goes when another opens.
pub(crate) const MAX_SESSIONS_PER_KEY: usize = 16;
/// How often a session re-checks that its key is still valid: a revoked
/// key's sessions end within this (at once on the instance that revoked it).
pub(crate) const SESSION_RECHECK: Duration = Duration::from_secs(2);
/// Failed logins allowed per source address (IPv6 per /64) per minute.
pub(super) const LOGIN_FAILURES_PER_MINUTE: u32 = 10;
pub(super) const FAILURE_WINDOW: Duration = Duration::from_secs(60);

pub(super) struct Session {
    caller: Caller,
    /// The key it logged in with (`None`: the bootstrap admin token).
    key_id: Option<Uuid>,
    opened: Instant,
    until: Instant,
    checked: Instant,
    /// This session's CSRF token: embedded in its pages, required on every
    /// action (besides the same-origin check).
    csrf: String,
}

/// Logged-in dashboard sessions (SHA-256 of the cookie → the session) and
/// the login throttle.
#[derive(Clone, Default)]
pub struct Sessions {
    map: Arc<Mutex<HashMap<String, Session>>>,
    /// Failed logins per source address: (window start, count).
    failures: Arc<Mutex<HashMap<std::net::IpAddr, (Instant, u32)>>>,
}

impl Sessions {
    pub(super) fn open(&self, caller: Caller, key_id: Option<Uuid>) -> String {
        let token = crate::auth::new_secret("pndash");
        if let Ok(mut m) = self.map.lock() {
            let now = Instant::now();
            if m.len() >= MAX_SESSIONS {
                m.retain(|_, s| s.until > now);
            }
            // A key's sessions are bounded: the oldest gives way.
            let mut own: Vec<(String, Instant)> = m
                .iter()
                .filter(|(_, s)| s.key_id == key_id && s.caller == caller)
                .map(|(k, s)| (k.clone(), s.opened))
                .collect();
            if own.len() >= MAX_SESSIONS_PER_KEY {
                own.sort_by_key(|(_, opened)| *opened);
                for (k, _) in own.iter().take(own.len() + 1 - MAX_SESSIONS_PER_KEY) {
                    m.remove(k);
                }
            }
            m.insert(
                proxynet_common::secret::sha256_hex(&token),
                Session {
                    caller,
                    key_id,
                    opened: now,
                    until: now + SESSION_TTL,
                    checked: now,
                    csrf: crate::auth::new_secret("pncsrf"),
                },
            );
        }
        token
    }

    /// The session's caller and CSRF token, if it is open and its key still valid.
    async fn caller(&self, state: &AppState, headers: &HeaderMap) -> Option<Viewer> {
        let token = cookie(headers)?;
        let digest = proxynet_common::secret::sha256_hex(&token);
        let now = Instant::now();
        let (caller, recheck) = {
            let m = self.map.lock().ok()?;
            let s = m.get(&digest).filter(|s| s.until > now)?;
            let due = now.duration_since(s.checked) >= SESSION_RECHECK;
            (
                Viewer {
                    caller: s.caller,
                    csrf: s.csrf.clone(),
                },
                s.key_id.filter(|_| due),
            )
        };
        if let Some(key) = recheck {
            // Revoked (here or on another control-api): the session ends.
            // The database unreachable: refuse too (fail closed).
            let valid = crate::auth::key_is_valid(state, key).await.unwrap_or(false);
            let mut m = self.map.lock().ok()?;
            if !valid {
                m.remove(&digest);
                return None;
            }
            if let Some(s) = m.get_mut(&digest) {
                s.checked = now;
            }
        }
        Some(caller)
    }

    pub(super) fn close(&self, headers: &HeaderMap) {
        if let (Some(token), Ok(mut m)) = (cookie(headers), self.map.lock()) {
            m.remove(&proxynet_common::secret::sha256_hex(&token));
        }
    }

    /// Ends every session opened with one of `keys` (they were revoked).
    pub fn end_keys(&self, keys: Vec<Uuid>) {
        if let Ok(mut m) = self.map.lock() {
            m.retain(|_, s| s.key_id.is_none_or(|k| !keys.contains(&k)));
        }
    }

    /// Whether `ip` may try a login now: fewer than
    /// [`LOGIN_FAILURES_PER_MINUTE`] failures in its current minute.
    /// Successes cost nothing, so operators behind one terminating proxy
    /// are not locked out by each other's logins.
    pub(super) fn login_allowed(&self, ip: std::net::IpAddr) -> bool {
        let Ok(failures) = self.failures.lock() else {
            return true;
        };
        failures.get(&limit_key(ip)).is_none_or(|(since, n)| {
            since.elapsed() >= FAILURE_WINDOW || *n < LOGIN_FAILURES_PER_MINUTE
        })
    }

    /// Counts a failed login of `ip` (bounded map: old windows go first).
    pub(super) fn login_failed(&self, ip: std::net::IpAddr) {
        let Ok(mut failures) = self.failures.lock() else {
            return;
        };
        if failures.len() >= 100_000 {
            failures.retain(|_, (since, _)| since.elapsed() < FAILURE_WINDOW);
        }
        let entry = failures.entry(limit_key(ip)).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= FAILURE_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

/// The throttled address: IPv4 as is, IPv6 by its /64.
pub(super) fn limit_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                std::net::IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

pub(super) fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            c.trim()
                .strip_prefix(&format!("{COOKIE}="))
                .map(str::to_owned)
        })
}

/// Why a page is not shown.
pub(super) enum Refusal {
    /// No session: to the login form.
    Login,
    /// An account session on an operator page.
    Forbidden,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Login => Redirect::to("/dashboard/login").into_response(),
            Refusal::Forbidden => (
                StatusCode::FORBIDDEN,
                page(
                    "Forbidden",
                    "<p>This page is for operators. <a href=\"/dashboard/usage\">Your usage</a></p>",
                ),
            )
                .into_response(),
        }
    }
}

/// Who is looking at a page: the session's caller and its CSRF token.
#[derive(Clone)]
pub(super) struct Viewer {
    pub(super) caller: Caller,
    pub(super) csrf: String,
}

impl Viewer {
    pub(super) fn is_operator(&self) -> bool {
        self.caller == Caller::Operator
    }
}

/// The session's viewer (caller and CSRF token), or the way to the login form.
pub(super) async fn viewer(state: &AppState, headers: &HeaderMap) -> Result<Viewer, Refusal> {
    state
        .sessions
        .caller(state, headers)
        .await
        .ok_or(Refusal::Login)
}

/// An action's gate: from this origin, an operator session, and the
/// session's own CSRF token in the form (compared in constant time); the
/// operator's viewer when all hold.
pub(super) async fn operator_action(
    state: &AppState,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<Viewer, Response> {
    same_origin(headers).map_err(|r| *r)?;
    let v = viewer(state, headers)
        .await
        .map_err(IntoResponse::into_response)?;
    if !v.is_operator() {
        return Err(Refusal::Forbidden.into_response());
    }
    if csrf.is_empty()
        || !proxynet_common::secret::constant_time_eq(csrf.as_bytes(), v.csrf.as_bytes())
    {
        return Err((
            StatusCode::FORBIDDEN,
            page(
                "Forbidden",
                "<p>This form has expired or did not come from your session; reload the page and try again.</p>",
            ),
        )
            .into_response());
    }
    Ok(v)
}

pub(super) async fn operator_only(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Viewer, Refusal> {
    let v = viewer(state, headers).await?;
    match v.caller {
        Caller::Operator => Ok(v),
        Caller::Account(_) => Err(Refusal::Forbidden),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_key_holds_a_bounded_number_of_sessions_the_oldest_giving_way() {
        let sessions = Sessions::default();
        let id = Uuid::new_v4();
        let key = Some(id);
        let tokens: Vec<String> = (0..MAX_SESSIONS_PER_KEY + 1)
            .map(|_| sessions.open(Caller::Operator, key))
            .collect();
        let map = sessions.map.lock().unwrap();
        assert_eq!(map.len(), MAX_SESSIONS_PER_KEY);
        let digest = |t: &String| proxynet_common::secret::sha256_hex(t);
        assert!(!map.contains_key(&digest(&tokens[0])), "the oldest went");
        assert!(map.contains_key(&digest(&tokens[MAX_SESSIONS_PER_KEY])));
        drop(map);
        // Another key's sessions are its own.
        sessions.open(Caller::Operator, Some(Uuid::new_v4()));
        assert_eq!(sessions.map.lock().unwrap().len(), MAX_SESSIONS_PER_KEY + 1);
        sessions.end_keys(vec![id]);
        assert_eq!(sessions.map.lock().unwrap().len(), 1);
    }

    #[test]
    pub(super) fn the_policy_allows_the_table_script_by_its_hash_only() {
        let policy = csp();
        assert!(policy.contains("frame-ancestors 'none'"));
        assert!(policy.contains("script-src 'sha256-"));
        assert!(!policy.contains("script-src 'unsafe-inline'"));
        // Every script asset, by its hash.
        assert!(SCRIPTS.len() >= 2);
        assert_eq!(policy.matches("'sha256-").count(), SCRIPTS.len());
    }

    #[test]
    pub(super) fn every_session_has_its_own_csrf_token() {
        let sessions = Sessions::default();
        sessions.open(Caller::Operator, None);
        sessions.open(Caller::Operator, None);
        let map = sessions.map.lock().unwrap();
        let tokens: std::collections::HashSet<&String> = map.values().map(|s| &s.csrf).collect();
        assert_eq!(tokens.len(), 2);
        assert!(tokens.iter().all(|t| t.len() > 20));
    }
}
