//! Who is calling: the operator (admin bearer token) or an enrolled agent.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use proxynet_protocol::secret::{constant_time_eq, sha256_hex};

use crate::error::ApiError;
use crate::AppState;

/// Extractor that admits only the operator's bearer token.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let presented = bearer(parts).ok_or(ApiError::Unauthorized)?;
        // Compare digests so the comparison time does not depend on the token's length.
        let expected = sha256_hex(state.admin_token.expose());
        if constant_time_eq(sha256_hex(presented).as_bytes(), expected.as_bytes()) {
            Ok(Operator)
        } else {
            Err(ApiError::Unauthorized)
        }
    }
}

/// The bearer token of a request, if it has a well-formed one.
pub fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// A new random secret: 32 bytes from the OS generator, hex-encoded, with a
/// readable prefix so leaked tokens are recognisable by secret scanners.
pub fn new_secret(prefix: &str) -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{prefix}_{}", hex::encode(bytes))
}
