//! Unit tests of the commands' tables and request bodies.

use serde_json::json;

use super::common::object;
use super::exits::{exit_state, EXITS};
use super::invoices::{cents, INVOICE_DEDICATED};
use super::webhooks::webhooks_path;
use crate::output;

#[test]
fn an_exit_reads_as_its_row() {
    let exit = json!({
        "id": "e1", "name": "exit-127.0.0.2", "country": "DE", "source_type": "dc",
        "egress_ips": ["127.0.0.2"], "egress_prefixes": ["2001:db8::/64"],
        "live": true, "disabled": false, "admin_draining": false, "draining": false,
        "health": {"score": 0.9321, "superproxies_ejecting_it": 0}
    });
    assert_eq!(
        output::table(EXITS, std::slice::from_ref(&exit)),
        vec![
            "ID  NAME            COUNTRY  TYPE  STATE  EGRESS                   SCORE",
            "e1  exit-127.0.0.2  DE       dc    live   127.0.0.2,2001:db8::/64  0.93",
        ]
    );
    let mut drained = exit.clone();
    drained["admin_draining"] = json!(true);
    assert_eq!(exit_state(&drained), "draining");
    let mut down = exit;
    down["live"] = json!(false);
    assert_eq!(exit_state(&down), "down");
}

#[test]
fn bodies_leave_out_what_was_not_given() {
    assert_eq!(
        object(vec![("a", Some(json!(1))), ("b", None)]),
        json!({"a": 1})
    );
    assert_eq!(cents(&json!({"c": 1234}), "c"), "12.34");
    assert_eq!(cents(&json!({"c": 5}), "c"), "0.05");
    assert_eq!(
        webhooks_path(Some("a"), &["w", "deliveries"]).unwrap(),
        "/v1/accounts/a/webhooks/w/deliveries"
    );
    assert_eq!(webhooks_path(None, &[]).unwrap(), "/v1/webhooks");
}

#[test]
fn an_invoices_dedicated_line_reads_as_its_row() {
    let line = json!({
        "ip": "127.0.0.2", "exit_id": "e1", "from": "2026-12-01T00:00:00Z",
        "to": "2026-12-11T00:00:00Z", "address_days": 10, "cents_per_month": 500,
        "amount_cents": 162
    });
    assert_eq!(
        output::table(INVOICE_DEDICATED, std::slice::from_ref(&line)),
        vec![
            "DEDICATED  EXIT  FROM                  TO                    DAYS  CENTS/MONTH  AMOUNT",
            "127.0.0.2  e1    2026-12-01 00:00:00Z  2026-12-11 00:00:00Z  10    500          1.62",
        ]
    );
}
