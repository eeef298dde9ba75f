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
pub(crate) struct Json<T>(pub T);

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
pub(crate) struct Path<T>(pub T);

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
pub(crate) struct Query<T>(pub T);

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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::StatusCode;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rename {
        name: String,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Page {
        limit: u32,
    }

    fn post(content_type: Option<&str>, body: &'static str) -> Request {
        let mut request = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/exits");
        if let Some(value) = content_type {
            request = request.header(axum::http::header::CONTENT_TYPE, value);
        }
        request.body(Body::from(body)).unwrap()
    }

    async fn body(request: Request) -> Result<Rename, ApiError> {
        <Json<Rename> as FromRequest<()>>::from_request(request, &())
            .await
            .map(|Json(value)| value)
    }

    async fn query(uri: &str) -> Result<Page, ApiError> {
        let (mut parts, ()) = axum::http::Request::builder()
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts();
        <Query<Page> as FromRequestParts<()>>::from_request_parts(&mut parts, &())
            .await
            .map(|Query(value)| value)
    }

    #[tokio::test]
    async fn a_json_body_is_read_into_its_type() {
        let renamed = body(post(Some("application/json"), r#"{"name":"edge-1"}"#))
            .await
            .unwrap();
        assert_eq!(renamed.name, "edge-1");
    }

    #[tokio::test]
    async fn malformed_json_is_a_400_problem_with_axums_reason() {
        let error = body(post(Some("application/json"), "{")).await.unwrap_err();
        assert!(matches!(error, ApiError::Rejected { .. }), "{error:?}");
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        assert!(error.to_string().contains("JSON"), "{error}");
    }

    #[tokio::test]
    async fn well_formed_json_of_the_wrong_shape_is_a_422() {
        for json in [r#"{"name":"edge-1","extra":true}"#, r#"{"name":7}"#, "{}"] {
            let error = body(post(Some("application/json"), json))
                .await
                .unwrap_err();
            assert_eq!(
                error.status(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "{json}: {error}"
            );
        }
    }

    #[tokio::test]
    async fn a_body_without_a_json_content_type_is_a_415() {
        for content_type in [None, Some("text/plain")] {
            let error = body(post(content_type, r#"{"name":"edge-1"}"#))
                .await
                .unwrap_err();
            assert_eq!(error.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }
    }

    #[tokio::test]
    async fn query_parameters_that_do_not_parse_are_a_400() {
        assert_eq!(query("/v1/usage?limit=20").await.unwrap().limit, 20);
        let error = query("/v1/usage?limit=many").await.unwrap_err();
        assert!(matches!(error, ApiError::Rejected { .. }), "{error:?}");
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
    }
}
