//! argon2id hashing of proxy-user passwords, off the async runtime.
//!
//! Hashing costs ~100 ms of CPU by design, so it runs on the blocking pool and a
//! semaphore keeps a burst of user creations from starving everything else.

use argon2::password_hash::{rand_core::OsRng, PasswordHasher, SaltString};
use argon2::Argon2;
use proxynet_common::secret::Secret;
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
pub(crate) fn validate_password(password: &str) -> Result<(), ApiError> {
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
pub(crate) fn validate_username(username: &str) -> Result<(), ApiError> {
    if proxynet_wire::username::is_base_username(username) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "username: 1 to 64 characters from A-Z a-z 0-9 _ . (no '-')".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argon2::password_hash::{PasswordHash, PasswordVerifier};

    #[test]
    fn passwords_must_be_8_to_255_bytes() {
        assert!(validate_password(&"a".repeat(7)).is_err());
        assert!(validate_password(&"a".repeat(8)).is_ok());
        assert!(validate_password(&"a".repeat(255)).is_ok());
        assert!(validate_password(&"a".repeat(256)).is_err());
        // Bytes, not characters: SOCKS5 carries at most 255 bytes.
        assert!(validate_password(&"é".repeat(128)).is_err());
    }

    #[test]
    fn passwords_with_control_characters_are_refused() {
        for password in [
            "password\n",
            "pass\tword",
            "pass\u{0}word",
            "pass\u{7f}word",
        ] {
            assert!(validate_password(password).is_err(), "{password:?}");
        }
        assert!(validate_password("correct horse ünïcode").is_ok());
    }

    #[test]
    fn usernames_are_1_to_64_letters_digits_underscores_and_dots() {
        let longest = "a".repeat(64);
        for ok in ["alice", "a", "edge_01.eu", longest.as_str()] {
            assert!(validate_username(ok).is_ok(), "{ok:?}");
        }
        let too_long = "a".repeat(65);
        for bad in [
            "",
            "al-ice",
            "al ice",
            "ålice",
            "alice@example",
            too_long.as_str(),
        ] {
            assert!(validate_username(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn hashes_are_salted_argon2id_strings_that_verify_only_the_password() {
        let hashing = PasswordHashing::default();
        let first = hashing.hash(Secret::new("correct horse")).await.unwrap();
        let second = hashing.hash(Secret::new("correct horse")).await.unwrap();
        assert!(first.starts_with("$argon2id$"), "{first}");
        assert_ne!(first, second, "each hash has its own salt");
        let parsed = PasswordHash::new(&first).unwrap();
        let argon2 = Argon2::default();
        assert!(argon2.verify_password(b"correct horse", &parsed).is_ok());
        assert!(argon2.verify_password(b"correct horsE", &parsed).is_err());
    }
}
