//! Unit tests of the login stage without a store: what it refuses before any
//! password is checked (the username's grammar, the `Proxynet-Options`
//! header, hostile input, a blocked address), which refusals are charged to
//! the source address, and that a user it cannot look up is a 503, never a
//! failed login.
//!
//! The store is away, so a login that got as far as looking its user up
//! answers `StoreUnavailable`: any other answer was given before.

use proxynet_common::secret::Secret;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::Login;
use crate::allowlist::Allowlist;
use crate::credentials::Authenticator;
use crate::error::{ErrorKind, ProxyError};
use crate::login_throttle::AuthFailureLimiter;
use crate::open_tunnels::OpenTunnels;
use crate::pipeline::test_support::{keys, peer, refused, store_away};
use crate::request::Credentials;

/// The login stage over a store that is away, with an empty allow-list and
/// a throttle allowing `failures_per_minute` charged attempts per address.
fn login(failures_per_minute: u32) -> Login {
    let ttl = Duration::from_secs(60);
    let auth = Authenticator::new(store_away(), keys(), ttl, ttl).expect("an authenticator");
    let allowlist = Allowlist::new(store_away(), keys(), Arc::new(OpenTunnels::default()));
    Login::new(
        auth,
        Arc::new(AuthFailureLimiter::new(failures_per_minute)),
        Arc::new(allowlist),
    )
}

fn credentials(username: &str, password: &str) -> Option<Credentials> {
    Some(Credentials {
        username: username.to_owned(),
        password: Secret::new(password),
    })
}

/// The refusal `login` answers the client at [`peer`] with.
async fn refusal(
    login: &Login,
    credentials: Option<Credentials>,
    options: Option<&str>,
) -> ProxyError {
    refused(login.check(credentials, options, peer().ip()).await)
}

/// Whether the address has spent its one attempt of a minute (a throttle of
/// one): a malformed username, always charged, is then refused as over
/// budget instead of as malformed.
async fn budget_spent(login: &Login) -> bool {
    let e = refusal(login, credentials("-", "pw"), None).await;
    assert!(
        matches!(e.kind, ErrorKind::BadRequest | ErrorKind::TooManyRequests),
        "{e}"
    );
    e.kind == ErrorKind::TooManyRequests
}

#[tokio::test]
async fn a_malformed_username_is_a_400_naming_the_problem_and_charged() {
    let login = login(1);
    let e = refusal(&login, credentials("alice-country", "pw"), None).await;
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert_eq!(e.detail, "proxy username: key \"country\" has no value");
    assert!(budget_spent(&login).await);
}

#[tokio::test]
async fn hostile_usernames_are_refused_by_the_grammar_and_never_echoed_raw() {
    let login = login(100);
    let long = "a".repeat(300);
    let hostile = [
        "alice\r\nProxy-Authorization: Basic eA==",
        "alice-x\u{0}\r\ny-1",
        "../../etc/passwd",
        "ålice",
        long.as_str(),
    ];
    for username in hostile {
        let e = refusal(&login, credentials(username, "pw"), None).await;
        assert_eq!(e.kind, ErrorKind::BadRequest, "{username:?}");
        assert!(e.detail.starts_with("proxy username: "), "{}", e.detail);
        assert!(!e.detail.chars().any(char::is_control), "{:?}", e.detail);
        assert!(!e.detail.contains("Authorization"), "{}", e.detail);
        assert!(!e.detail.contains(&long), "{username:?}");
    }
}

#[tokio::test]
async fn an_empty_or_overlong_password_is_the_one_407_without_a_lookup_or_a_charge() {
    let login = login(1);
    for password in [String::new(), "p".repeat(256)] {
        let e = refusal(&login, credentials("alice", &password), None).await;
        assert_eq!(e.kind, ErrorKind::AuthRequired, "{} bytes", password.len());
        assert_eq!(e.detail, "proxy authentication required");
    }
    assert!(!budget_spent(&login).await);
}

#[tokio::test]
async fn a_header_that_did_not_decode_is_the_one_407_and_costs_nothing() {
    let login = login(1);
    let e = refusal(&login, credentials("", "pw"), None).await;
    assert_eq!(e.kind, ErrorKind::AuthRequired);
    assert!(!budget_spent(&login).await);
}

#[tokio::test]
async fn no_credentials_from_an_address_not_allow_listed_is_the_one_407() {
    let login = login(1);
    let e = refusal(&login, None, None).await;
    assert_eq!(e.kind, ErrorKind::AuthRequired);
    // Header options do not make a login of an unknown address.
    let e = refusal(&login, None, Some("country-de")).await;
    assert_eq!(e.kind, ErrorKind::AuthRequired);
    assert!(!budget_spent(&login).await);
}

#[tokio::test]
async fn a_user_the_store_cannot_look_up_is_a_503_not_a_failed_login() {
    let login = login(1);
    for _ in 0..3 {
        let e = refusal(&login, credentials("alice", "correct horse"), None).await;
        assert_eq!(e.kind, ErrorKind::StoreUnavailable);
        assert_eq!(e.kind.status().as_u16(), 503);
        assert_eq!(e.retry_after, Some(1));
    }
    assert!(!budget_spent(&login).await, "no attempt was charged");
}

#[tokio::test]
async fn header_options_are_judged_before_the_password_and_charged_when_malformed() {
    let login = login(1);
    let e = refusal(&login, credentials("alice", "pw"), Some("country-zz")).await;
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert_eq!(
        e.detail,
        "Proxynet-Options: bad value for country: an ISO 3166-1 alpha-2 code"
    );
    assert!(budget_spent(&login).await);
}

#[tokio::test]
async fn header_options_too_long_or_hostile_are_a_400_naming_the_header() {
    let login = login(100);
    let long = "country-de-".repeat(20);
    let e = refusal(&login, credentials("alice", "pw"), Some(&long)).await;
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert_eq!(e.detail, "Proxynet-Options: at most 200 bytes");
    let e = refusal(
        &login,
        credentials("alice", "pw"),
        Some("country-de\r\nX-Injected: 1"),
    )
    .await;
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert!(e.detail.starts_with("Proxynet-Options: "), "{}", e.detail);
    assert!(!e.detail.chars().any(char::is_control), "{:?}", e.detail);
}

#[tokio::test]
async fn well_formed_header_options_let_the_login_go_on_to_the_user() {
    let login = login(1);
    // Surrounding blanks are no part of the options.
    let options = Some("  country-de-session-abc1  ");
    let e = refusal(&login, credentials("alice", "pw"), options).await;
    assert_eq!(e.kind, ErrorKind::StoreUnavailable, "{e}");
    assert!(!budget_spent(&login).await);
}

#[tokio::test]
async fn a_blocked_address_is_refused_before_anything_is_read() {
    let login = login(1);
    assert!(!budget_spent(&login).await);
    assert!(budget_spent(&login).await, "over budget: blocked");
    let asks = [
        (credentials("alice", "pw"), None),
        (credentials("alice", "pw"), Some("country-zz")),
        (credentials("", ""), None),
        (None, None),
    ];
    for (given, options) in asks {
        let e = refusal(&login, given, options).await;
        assert_eq!(e.kind, ErrorKind::TooManyRequests);
        assert!(e.retry_after.is_some_and(|secs| secs >= 1), "{e:?}");
    }
    // Another address is not held up.
    let other: IpAddr = "198.51.100.8".parse().unwrap();
    let e = refused(login.check(credentials("alice", "pw"), None, other).await);
    assert_eq!(e.kind, ErrorKind::StoreUnavailable);
}
