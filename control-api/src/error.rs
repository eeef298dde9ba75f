//! API errors: one enum, one status mapping, RFC 9457 problem+json bodies.
//!
//! Clients get a precise title and detail for their own mistakes and an opaque
//! 500 for ours; the cause of a 500 goes to the log, never to the client.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or invalid credentials")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unavailable(String),
    /// The request could not be read (malformed JSON, a bad path or query
    /// parameter, a missing content type): axum's own rejection, re-shaped.
    #[error("{detail}")]
    Rejected { status: StatusCode, detail: String },
    #[error("database error: {0}")]
    Database(sqlx::Error),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for ApiError {
    /// Input the database itself refuses (SQLSTATE class 22 "data exception",
    /// e.g. a NUL byte in text, and class 23 "integrity constraint violation")
    /// is the client's mistake, answered 400 — never an opaque 500. Handlers
    /// still validate what they can first, with field-level messages.
    fn from(err: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &err {
            let code = db.code().unwrap_or_default();
            if code.starts_with("22") || code.starts_with("23") {
                let what = db
                    .constraint()
                    .map_or_else(|| "a value".to_owned(), |c| format!("constraint {c}"));
                return ApiError::BadRequest(format!("invalid input: {what} rejected it"));
            }
        }
        ApiError::Database(err)
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Rejected { status, .. } => *status,
            ApiError::Database(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let detail = match &self {
            ApiError::Database(_) | ApiError::Internal(_) => {
                tracing::error!(error = %self, "request failed");
                "internal error; the cause is in the server log".to_owned()
            }
            other => other.to_string(),
        };
        let body = json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("error"),
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = (status, body.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"proxynet\""),
            );
        }
        response
    }
}

/// Maps a unique-constraint violation to a 409 with `message`; anything else
/// is mapped as any database error (bad input 400, the rest 500).
pub fn conflict_on_unique(err: sqlx::Error, message: &str) -> ApiError {
    match &err {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
            ApiError::Conflict(message.to_owned())
        }
        _ => ApiError::from(err),
    }
}
