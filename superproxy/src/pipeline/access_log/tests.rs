//! Unit tests of the access log's lines, as written through `tracing`: a
//! refused tunnel's and a served one's fields, and never a credential.

use proxynet_common::splice::End;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

use super::{refused, AccessLog};
use crate::error::{ErrorKind, ProxyError};
use crate::pipeline::test_support::{client, peer, user, Capture, Line};
use crate::request::Ingress;
use crate::usage::Meter;

const TARGET: &str = "proxynet::access";

/// The one access-log line `write` wrote.
fn one_line(write: impl FnOnce()) -> Line {
    let capture = Capture::default();
    capture.during(write);
    let mut lines = capture.lines(TARGET);
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.remove(0)
}

/// The line of an open tunnel, as the pipeline's last stage makes it.
fn open_line(meter: Arc<Meter>) -> AccessLog {
    AccessLog {
        id: Uuid::new_v4(),
        ingress: Ingress::Connect,
        account_id: meter.account_id,
        user_id: meter.user_id,
        username: "alice".to_owned(),
        exit_id: meter.exit_id,
        egress_ip: "203.0.113.9".parse::<IpAddr>().unwrap(),
        target: "example.test:443".to_owned(),
        peer: peer(),
        started: Instant::now(),
        setup_ms: 12.5,
        meter,
        end: None,
        refused: None,
        attempt: None,
    }
}

fn meter() -> Arc<Meter> {
    let ids = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    Arc::new(Meter::new(ids.0, ids.1, ids.2, None, None, Vec::new()))
}

#[test]
fn a_refusal_before_login_names_no_user_and_moved_nothing() {
    let line = one_line(|| {
        refused(
            Ingress::Socks5,
            peer(),
            Instant::now(),
            None,
            &ProxyError::auth_required(),
        )
    });
    assert_eq!(line.field("message"), Some("tunnel refused"));
    assert_eq!(line.field("ingress"), Some("socks5"));
    assert_eq!(line.field("client"), Some("198.51.100.7:40000"));
    assert_eq!(line.field("outcome"), Some("http_request_denied"));
    assert_eq!(line.field("status"), Some("407"));
    assert_eq!(line.field("bytes_up"), Some("0"));
    assert_eq!(line.field("bytes_down"), Some("0"));
    for absent in ["account", "user_id", "user", "cause"] {
        assert_eq!(line.field(absent), None, "{absent}");
    }
    assert!(line
        .field("tunnel")
        .is_some_and(|id| id.parse::<Uuid>().is_ok()));
}

#[test]
fn a_refusal_after_login_names_the_base_user_and_the_cause_never_the_password() {
    let client = client(user("alice"), "alice-country-de-session-s3cr3tsess");
    let error = ProxyError::new(ErrorKind::TooManyRequests, "the user's limit")
        .caused_by("redis: connection refused");
    let line = one_line(|| {
        refused(
            Ingress::Connect,
            peer(),
            Instant::now(),
            Some(&client),
            &error,
        )
    });
    assert_eq!(
        line.field("account"),
        Some(client.account_id.to_string().as_str())
    );
    assert_eq!(
        line.field("user_id"),
        Some(client.user_id.to_string().as_str())
    );
    // The base user: not the username's grammar, which may carry secrets
    // of the client's (its session ids).
    assert_eq!(line.field("user"), Some("alice"));
    assert_eq!(line.field("status"), Some("429"));
    assert_eq!(line.field("cause"), Some("redis: connection refused"));
    for value in line.fields.values() {
        assert!(!value.contains("s3cr3tsess"), "{value}");
        assert!(!value.contains("argon2"), "{value}");
    }
}

#[test]
fn a_served_tunnels_line_says_how_it_ended_and_what_it_moved() {
    let meter = meter();
    assert!(meter.charge_datagram(true, 10));
    assert!(meter.charge_datagram(false, 25));
    let mut log = open_line(meter.clone());
    log.end = Some(End::Idle);
    let line = one_line(|| drop(log));
    assert_eq!(line.field("message"), Some("tunnel"));
    assert_eq!(line.field("outcome"), Some("idle_timeout"));
    assert_eq!(line.field("error"), None);
    assert_eq!(line.field("bytes_up"), Some("10"));
    assert_eq!(line.field("bytes_down"), Some("25"));
    assert_eq!(line.field("billable"), Some("true"));
    assert_eq!(line.field("attempt"), None);
    assert_eq!(line.field("user"), Some("alice"));
    assert_eq!(line.field("exit"), Some(meter.exit_id.to_string().as_str()));
    assert_eq!(line.field("egress_ip"), Some("203.0.113.9"));
    assert_eq!(line.field("target_addr"), Some("example.test:443"));
    assert_eq!(line.field("client"), Some("198.51.100.7:40000"));
    assert_eq!(line.field("setup_ms"), Some("12.5"));
}

#[test]
fn each_end_has_its_outcome_and_an_io_error_says_which() {
    for (end, outcome) in [
        (None, "closed"),
        (Some(End::Closed), "closed"),
        (Some(End::Lifetime), "lifetime"),
        (Some(End::Cut), "cut"),
        (
            Some(End::Error(std::io::ErrorKind::ConnectionReset)),
            "connection_terminated",
        ),
    ] {
        let mut log = open_line(meter());
        log.end = end;
        let line = one_line(|| drop(log));
        assert_eq!(line.field("outcome"), Some(outcome), "{end:?}");
        let error = match end {
            Some(End::Error(kind)) => Some(kind.to_string()),
            _ => None,
        };
        assert_eq!(line.field("error"), error.as_deref(), "{end:?}");
    }
}

#[test]
fn an_attempt_given_up_for_another_exit_is_logged_as_not_billable() {
    let meter = meter();
    meter.hold_billing();
    meter.settle_billing(false);
    let mut log = open_line(meter);
    log.attempt = Some(2);
    let line = one_line(|| drop(log));
    assert_eq!(line.field("billable"), Some("false"));
    assert_eq!(line.field("attempt"), Some("2"));
}

#[test]
fn a_tunnel_refused_by_its_first_bytes_is_logged_as_a_refusal_not_an_end() {
    let mut log = open_line(meter());
    log.end = Some(End::Closed);
    log.refused = Some((
        ErrorKind::TargetDenied,
        "denied.example.test is denied".into(),
    ));
    let line = one_line(|| drop(log));
    assert_eq!(line.field("message"), Some("tunnel refused"));
    assert_eq!(line.field("outcome"), Some("http_request_denied"));
    assert_eq!(line.field("status"), Some("403"));
    assert_eq!(line.field("cause"), Some("denied.example.test is denied"));
    assert_eq!(line.field("billable"), None, "a refusal bills nothing");
    assert_eq!(line.field("target_addr"), Some("example.test:443"));
}
