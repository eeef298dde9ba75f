//! Tests of the delivery worker's signature, backoff and lease.

use super::*;

#[test]
fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
    let body = r#"{"id":"x"}"#;
    let sig = signature("pnwhsec_k", 1_700_000_000, body);
    // Independent of the call: HMAC over the exact bytes "1700000000.{body}".
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"pnwhsec_k").unwrap();
    mac.update(format!("1700000000.{body}").as_bytes());
    assert_eq!(sig, hex::encode(mac.finalize().into_bytes()));
    assert_eq!(
        signature_header("pnwhsec_k", 1_700_000_000, body),
        format!("t=1700000000,v1={sig}")
    );
    assert!(sig
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
}

#[test]
fn the_hmac_primitive_matches_rfc_4231() {
    // Test case 2: key "Jefe", data "what do ya want for nothing?".
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
    mac.update(b"what do ya want for nothing?");
    assert_eq!(
        hex::encode(mac.finalize().into_bytes()),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[test]
fn retries_back_off_from_five_seconds_doubling_to_an_hour() {
    assert_eq!(backoff(1), Duration::from_secs(5));
    assert_eq!(backoff(2), Duration::from_secs(10));
    assert_eq!(backoff(5), Duration::from_secs(80));
    assert_eq!(backoff(10), Duration::from_secs(2560));
    assert_eq!(backoff(11), MAX_RETRY);
    assert_eq!(backoff(MAX_ATTEMPTS), MAX_RETRY);
    assert_eq!(backoff(1000), MAX_RETRY);
    assert_eq!(backoff(0), FIRST_RETRY);
    // Fifteen attempts span hours, within the day's limit.
    let total: Duration = (1..MAX_ATTEMPTS).map(backoff).sum();
    assert!(total < GIVE_UP_AFTER, "{total:?}");
    assert!(total > Duration::from_secs(4 * 3600), "{total:?}");
}

#[test]
fn lease_outlasts_an_attempt() {
    assert!(LEASE > target::RESOLVE_TIMEOUT + TOTAL_TIMEOUT);
}
