//! API errors: one enum, one status mapping, RFC 9457 problem+json bodies.
//!
//! Clients get a precise title and detail for their own mistakes and an opaque
//! 500 for ours; the cause of a 500 goes to the log, never to the client.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

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
    /// A rate was exceeded: `429` with `Retry-After` (whole seconds).
    #[error("{detail}")]
    TooManyRequests { detail: String, retry_after: u64 },
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
        if database_unavailable(&err) {
            tracing::warn!(error = %err, "database unavailable");
            return ApiError::Unavailable(
                "the database is unavailable or read-only for now (a failover in progress?); retry shortly"
                    .into(),
            );
        }
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

/// Errors that say the database cannot be reached or takes no writes right
/// now — an outage or a failover, not a bug: 503, so clients retry.
fn database_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // 25006 read_only_sql_transaction (a standby), class 08
            // connection exception, 57P01..57P03 the server shutting down or
            // not accepting connections yet.
            code == "25006" || code.starts_with("08") || code.starts_with("57P")
        }
        _ => false,
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
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Rejected { status, .. } => *status,
            ApiError::Database(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// RFC 9457 problem details: the body of every error answer
/// (`application/problem+json`).
#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct Problem {
    /// Always `about:blank`: the status says what kind of problem it is.
    #[serde(rename = "type")]
    kind: &'static str,
    /// The status's reason phrase.
    title: &'static str,
    /// The HTTP status code.
    status: u16,
    /// What went wrong, for a person to read.
    detail: String,
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
        let body = Problem {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("error"),
            status: status.as_u16(),
            detail,
        };
        // A struct of strings and a number always serialises.
        let body = serde_json::to_string(&body).unwrap_or_default();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/problem+json"),
        );
        if let ApiError::TooManyRequests { retry_after, .. } = &self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(*retry_after));
        }
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
pub(crate) fn conflict_on_unique(err: sqlx::Error, message: &str) -> ApiError {
    match &err {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
            ApiError::Conflict(message.to_owned())
        }
        _ => ApiError::from(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database refusal with a given SQLSTATE, as Postgres would report it.
    #[derive(Debug)]
    struct Refusal {
        code: &'static str,
        constraint: Option<&'static str>,
    }

    impl std::fmt::Display for Refusal {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.code)
        }
    }

    impl std::error::Error for Refusal {}

    impl sqlx::error::DatabaseError for Refusal {
        fn message(&self) -> &str {
            "refused"
        }

        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.code.into())
        }

        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }

        fn constraint(&self) -> Option<&str> {
            self.constraint
        }

        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn refused(code: &'static str, constraint: Option<&'static str>) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Refusal { code, constraint }))
    }

    #[test]
    fn each_error_answers_its_status() {
        let cases = [
            (ApiError::BadRequest("x".into()), StatusCode::BAD_REQUEST),
            (ApiError::Unauthorized, StatusCode::UNAUTHORIZED),
            (ApiError::Forbidden("x".into()), StatusCode::FORBIDDEN),
            (ApiError::NotFound("exit"), StatusCode::NOT_FOUND),
            (ApiError::Conflict("x".into()), StatusCode::CONFLICT),
            (
                ApiError::Unavailable("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                ApiError::TooManyRequests {
                    detail: "x".into(),
                    retry_after: 1,
                },
                StatusCode::TOO_MANY_REQUESTS,
            ),
            (
                ApiError::Rejected {
                    status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    detail: "x".into(),
                },
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (
                ApiError::Database(sqlx::Error::RowNotFound),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                ApiError::Internal("x".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (error, status) in cases {
            assert_eq!(error.status(), status, "{error:?}");
        }
    }

    #[test]
    fn input_the_database_refuses_is_a_bad_request_naming_the_constraint() {
        match ApiError::from(refused("23514", Some("users_username_check"))) {
            ApiError::BadRequest(m) => {
                assert_eq!(
                    m,
                    "invalid input: constraint users_username_check rejected it"
                )
            }
            other => panic!("{other:?}"),
        }
        // Class 22 (data exception), e.g. a NUL byte in text, has no constraint.
        match ApiError::from(refused("22021", None)) {
            ApiError::BadRequest(m) => assert_eq!(m, "invalid input: a value rejected it"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_database_failures_stay_internal() {
        for error in [refused("40001", None), sqlx::Error::RowNotFound] {
            let mapped = ApiError::from(error);
            assert!(matches!(mapped, ApiError::Database(_)), "{mapped:?}");
            assert_eq!(mapped.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
    }

    #[test]
    fn only_a_unique_violation_becomes_a_conflict() {
        match conflict_on_unique(refused("23505", Some("users_pkey")), "username taken") {
            ApiError::Conflict(m) => assert_eq!(m, "username taken"),
            other => panic!("{other:?}"),
        }
        // A foreign-key violation is still bad input, not a conflict.
        let fk = conflict_on_unique(refused("23503", None), "username taken");
        assert_eq!(fk.status(), StatusCode::BAD_REQUEST);
        let lost = conflict_on_unique(sqlx::Error::RowNotFound, "username taken");
        assert_eq!(lost.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn an_unauthorized_answer_is_a_problem_with_a_bearer_challenge() {
        let response = ApiError::Unauthorized.into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(
            response.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"proxynet\""
        );
        let forbidden = ApiError::Forbidden("no".into()).into_response();
        assert!(forbidden.headers().get(header::WWW_AUTHENTICATE).is_none());
    }

    #[test]
    fn a_rate_refusal_says_when_to_retry() {
        let response = ApiError::TooManyRequests {
            detail: "slow down".into(),
            retry_after: 3,
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
    }

    async fn problem(error: ApiError) -> serde_json::Value {
        let body = axum::body::to_bytes(error.into_response().into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    #[tokio::test]
    async fn a_client_mistake_is_spelled_out_but_an_internal_cause_is_not() {
        let bad = problem(ApiError::BadRequest(
            "limits.period: daily or monthly".into(),
        ))
        .await;
        assert_eq!(bad["status"], 400);
        assert_eq!(bad["title"], "Bad Request");
        assert_eq!(bad["detail"], "limits.period: daily or monthly");
        let internal = problem(ApiError::Internal("pool of db-7.internal exhausted".into())).await;
        assert_eq!(internal["status"], 500);
        assert_eq!(internal["title"], "Internal Server Error");
        let detail = internal["detail"].as_str().unwrap();
        assert!(!detail.contains("db-7"), "{detail}");
    }
}
