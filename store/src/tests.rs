//! Tests of the crate root's keys and records: key shapes, quota windows,
//! and records that older and newer writers must keep reading alike.

use super::*;
use uuid::Uuid;

#[test]
fn usage_rows_are_billable_unless_they_say_otherwise() {
    let old = serde_json::json!({
        "account_id": Uuid::nil(), "user_id": Uuid::nil(), "exit_id": Uuid::nil(),
        "minute": 60, "bytes_up": 1, "bytes_down": 2,
    });
    let row: UsageRow = serde_json::from_value(old.clone()).unwrap();
    assert!(row.billable, "a row from an older superproxy is billed");
    assert_eq!(
        serde_json::to_value(&row).unwrap(),
        old,
        "a billable row is written as before"
    );
    let held = UsageRow {
        billable: false,
        ..row
    };
    let json = serde_json::to_value(&held).unwrap();
    assert_eq!(json["billable"], false);
    assert_eq!(serde_json::from_value::<UsageRow>(json).unwrap(), held);
}

#[test]
fn user_records_without_retry_rules_read_and_write_as_before() {
    let record = serde_json::json!({
        "id": Uuid::nil(), "account_id": Uuid::nil(), "username": "alice",
        "password_hash": "x", "enabled": true, "version": 1,
    });
    let parsed: UserRecord = serde_json::from_value(record).unwrap();
    assert!(parsed.retry_rules.is_empty() && parsed.account_retry_rules.is_empty());
    let written = serde_json::to_value(&parsed).unwrap();
    assert!(written.get("retry_rules").is_none(), "{written}");
    assert!(written.get("account_retry_rules").is_none(), "{written}");
}

#[test]
fn keys_are_prefixed_and_hash_tagged() {
    let k = Keys::new("t1:");
    // FNV-1a("alice") = 0x872213e7 → bucket 0xe7.
    assert_eq!(k.user("alice"), "t1:user:{ue7}:alice");
    assert_eq!(k.users_projected("alice"), "t1:projection:complete:{ue7}");
    assert_eq!(k.users_in_bucket(user_bucket("alice")), "t1:users:{ue7}");
    assert_eq!(k.projection_markers().len(), USER_BUCKETS + 1);
    let id = Uuid::nil();
    assert_eq!(k.exit(id), format!("t1:{{exits}}:exit:{id}"));
    assert!(k.exit(id).starts_with(&k.exit_prefix()));
}

#[test]
fn quota_windows_are_calendar_days_and_months() {
    // 2026-11-30T12:00:00Z
    let t = 1_796_040_000;
    let (key, start, end) = QuotaPeriod::Daily.window(t);
    assert_eq!(key, "d20261130");
    assert_eq!((end - start), 86_400);
    assert!(start <= t && t < end);
    let (key, start, end) = QuotaPeriod::Monthly.window(t);
    assert_eq!(key, "m202611");
    assert_eq!((end - start) / 86_400, 30);
    assert!(start <= t && t < end);
    let (key, _, end) = QuotaPeriod::Monthly.window(1_798_761_600 - 1); // 2026-12-31T23:59:59Z
    assert_eq!(key, "m202612");
    assert_eq!(end, 1_798_761_600);
}

#[test]
fn exit_records_carry_prefixes_only_when_they_have_some() {
    let old = r#"{"id":"00000000-0000-0000-0000-000000000000","name":"a","egress_ips":["192.0.2.1"],
            "source_type":"dc","country":"DE","owner":"o","draining":false,"disabled":false,
            "credential_sha256":""}"#;
    let mut record: ExitRecord = serde_json::from_str(old).unwrap();
    assert!(record.egress_prefixes.is_empty());
    assert!(!serde_json::to_string(&record)
        .unwrap()
        .contains("egress_prefixes"));
    assert!(!record.has_egress_family(false));
    record.egress_prefixes = vec!["2001:db8:7::/48".parse().unwrap()];
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(
        json["egress_prefixes"],
        serde_json::json!(["2001:db8:7::/48"])
    );
    let back: ExitRecord = serde_json::from_value(json).unwrap();
    assert_eq!(back, record);
    assert!(back.can_egress_from("2001:db8:7:1::9".parse().unwrap()));
    assert!(back.can_egress_from("192.0.2.1".parse().unwrap()));
    assert!(!back.can_egress_from("2001:db8:8::1".parse().unwrap()));
    assert!(back.has_egress_family(false) && back.has_egress_family(true));
    // A record without a region (written before exits declared one) has none.
    assert_eq!(back.region, None);
    // Nor verified egress until the reflector saw some.
    assert!(back.verified_egress.is_empty());
    assert!(!json_has(&back, "verified_egress"));
    assert!(!json_has(&back, "region"));
    record.region = Some("DE-BY".into());
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["region"], "DE-BY");
    assert_eq!(serde_json::from_value::<ExitRecord>(json).unwrap(), record);
}

fn json_has(record: &ExitRecord, field: &str) -> bool {
    serde_json::to_value(record).unwrap().get(field).is_some()
}

#[test]
fn redact_hides_passwords() {
    assert_eq!(
        redact_url("postgres://u:secret@h:5/db"),
        "postgres://u:***@h:5/db"
    );
    assert_eq!(redact_url("redis://h:1/"), "redis://h:1/");
}
