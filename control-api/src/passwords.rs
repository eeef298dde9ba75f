//! argon2id hashing of proxy-user passwords, off the async runtime.
//!
//! Hashing costs ~100 ms of CPU by design, so it runs on the blocking pool and a
//! semaphore keeps a burst of user creations from starving everything else.

use argon2::password_hash::{rand_core::OsRng, PasswordHasher, SaltString};
use argon2::Argon2;
use proxynet_protocol::secret::Secret;
use std::sync::Arc;
use tokio::sync::Semaphore;

use crate::error::ApiError;

#[derive(Clone)]
pub struct PasswordHashing {
    permits: Arc<Semaphore>,
}

impl Default for PasswordHashing {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            permits: Arc::new(Semaphore::new(cpus)),
        }
    }
}

impl PasswordHashing {
    /// The argon2id PHC string for `password` (default OWASP parameters: m=19 MiB, t=2, p=1).
    pub async fn hash(&self, password: Secret) -> Result<String, ApiError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| ApiError::Internal("password hashing pool closed".into()))?;
        tokio::task::spawn_blocking(move || {
            let salt = SaltString::generate(&mut OsRng);
            Argon2::default()
                .hash_password(password.expose().as_bytes(), &salt)
                .map(|h| h.to_string())
                .map_err(|e| ApiError::Internal(format!("argon2: {e}")))
        })
        .await
        .map_err(|e| ApiError::Internal(format!("hashing task: {e}")))?
    }
}

/// Checks a new password against the rules every ingress can carry it through:
/// RFC 1929 (SOCKS5) caps it at 255 bytes.
pub fn validate_password(password: &str) -> Result<(), ApiError> {
    if password.len() < 8 || password.len() > 255 {
        return Err(ApiError::BadRequest(
            "password: must be 8 to 255 bytes long".into(),
        ));
    }
    if password.chars().any(|c| c.is_control()) {
        return Err(ApiError::BadRequest(
            "password: must not contain control characters".into(),
        ));
    }
    Ok(())
}

/// Base usernames: letters, digits, `_` and `.`, 1–64 bytes. Never `-`, which the
/// username grammar uses to separate session and targeting keys.
pub fn validate_username(username: &str) -> Result<(), ApiError> {
    let ok = !username.is_empty()
        && username.len() <= 64
        && username
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "username: 1 to 64 characters from A-Z a-z 0-9 _ . (no '-')".into(),
        ))
    }
}
