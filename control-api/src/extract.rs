//! The request extractors handlers use: axum's `Json`, `Path` and `Query`,
//! with their rejections (malformed JSON, unknown fields, a bad UUID, a bad
//! query string, a missing content type) answered as RFC 9457 problem+json
//! like every other API error, never axum's plain-text bodies.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ApiError;

/// A JSON body (in) or answer (out).
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Json(value)),
            Err(rejection) => Err(json_rejected(rejection)),
        }
    }
}

/// `Option<Json<T>>`: no body (no content type) is `None`; a body must parse.
impl<T, S> axum::extract::OptionalFromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Option<Self>, Self::Rejection> {
        match <axum::Json<T> as axum::extract::OptionalFromRequest<S>>::from_request(req, state)
            .await
        {
            Ok(value) => Ok(value.map(|axum::Json(v)| Json(v))),
            Err(rejection) => Err(json_rejected(rejection)),
        }
    }
}

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// Path parameters.
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(path_rejected(rejection)),
        }
    }
}

/// Query parameters.
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(query_rejected(rejection)),
        }
    }
}

fn rejected(status: axum::http::StatusCode, detail: String) -> ApiError {
    ApiError::Rejected { status, detail }
}

fn path_rejected(rejection: PathRejection) -> ApiError {
    rejected(rejection.status(), rejection.body_text())
}

fn query_rejected(rejection: QueryRejection) -> ApiError {
    rejected(rejection.status(), rejection.body_text())
}

fn json_rejected(rejection: JsonRejection) -> ApiError {
    rejected(rejection.status(), rejection.body_text())
}
