//! Keyset pagination for list routes: `?limit=N&after=CURSOR`, answered with
//! an array and, when more rows follow, `Link: <...?limit=N&after=...>; rel="next"`
//! (RFC 8288). Keyset, not offset: pages stay consistent while rows are added.

use axum::http::{header, HeaderMap, HeaderValue};
use serde::Deserialize;

use crate::error::ApiError;

pub(crate) const DEFAULT_LIMIT: i64 = 100;
pub(crate) const MAX_LIMIT: i64 = 1000;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    pub limit: Option<i64>,
    /// The sort key of the last row of the previous page.
    pub after: Option<String>,
}

impl PageQuery {
    pub(crate) fn limit(&self) -> Result<i64, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            Some(_) => Err(ApiError::BadRequest(format!("limit: 1 to {MAX_LIMIT}"))),
        }
    }
}

/// Trims the one extra row fetched to detect a next page and builds the
/// `Link` header pointing at it.
pub(crate) fn finish<T>(
    mut rows: Vec<T>,
    limit: i64,
    path: &str,
    key: impl Fn(&T) -> String,
) -> (HeaderMap, Vec<T>) {
    let mut headers = HeaderMap::new();
    if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        if let Some(last) = rows.last() {
            let link = format!("<{path}?limit={limit}&after={}>; rel=\"next\"", key(last));
            if let Ok(v) = HeaderValue::from_str(&link) {
                headers.insert(header::LINK, v);
            }
        }
    }
    (headers, rows)
}
