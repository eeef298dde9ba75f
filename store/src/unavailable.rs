//! What a binary says when a backing store (Redis, Postgres) cannot be
//! reached at start-up: [`StoreUnavailable`], naming the store by its URL
//! with any password hidden ([`redact_url`]).

/// A backing store could not be reached at start-up.
#[derive(Debug, thiserror::Error)]
#[error("{what} is not reachable: {detail}")]
pub struct StoreUnavailable {
    pub what: &'static str,
    pub detail: String,
}

/// A store URL with any password replaced, fit for an error message or log.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***@{}", &url[..scheme_end + 3], user, &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}
