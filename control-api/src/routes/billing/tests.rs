//! Tests of the invoice's dedicated-address arithmetic: address-days, amounts,
//! clipping to the month.

use super::dedicated::{address_days, clip_to_month, dedicated_amount};
use super::*;
use chrono::DateTime;

fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).single().unwrap()
}

fn interval(
    allocated_at: DateTime<Utc>,
    released_at: Option<DateTime<Utc>>,
    cents_per_month: i64,
) -> DedicatedInterval {
    DedicatedInterval {
        address: "192.0.2.7".into(),
        is_prefix: false,
        exit_id: Uuid::nil(),
        allocated_at,
        released_at,
        cents_per_month,
    }
}

#[test]
fn a_started_day_is_a_billed_day() {
    let t = at(2026, 12, 10, 8, 0, 0);
    assert_eq!(address_days(t, t), 0);
    assert_eq!(address_days(t, t + chrono::Duration::microseconds(1)), 1);
    assert_eq!(address_days(t, t + chrono::Duration::hours(23)), 1);
    assert_eq!(address_days(t, t + chrono::Duration::days(1)), 1);
    assert_eq!(
        address_days(
            t,
            t + chrono::Duration::days(1) + chrono::Duration::seconds(1)
        ),
        2
    );
    // 47 hours across three calendar days: two days of holding, not three.
    assert_eq!(address_days(t, at(2026, 12, 12, 7, 0, 0)), 2);
    assert_eq!(
        address_days(at(2026, 12, 1, 0, 0, 0), at(2027, 1, 1, 0, 0, 0)),
        31
    );
    // Backwards is nothing, never negative.
    assert_eq!(address_days(t, t - chrono::Duration::days(3)), 0);
}

#[test]
fn the_amount_is_the_days_share_of_the_month_rounded_up() {
    assert_eq!(dedicated_amount(3100, 31, 31), 3100);
    assert_eq!(dedicated_amount(3100, 2, 31), 200);
    // 1000 / 31 = 32.26 cents a day: one day bills 33.
    assert_eq!(dedicated_amount(1000, 1, 31), 33);
    assert_eq!(dedicated_amount(300, 10, 30), 100);
    assert_eq!(dedicated_amount(500, 29, 29), 500);
    assert_eq!(dedicated_amount(0, 31, 31), 0);
    assert_eq!(dedicated_amount(1000, 0, 31), 0);
    // No overflow: the product is taken in i128.
    assert_eq!(dedicated_amount(i64::MAX, 31, 31), i64::MAX);
    assert_eq!(dedicated_amount(i64::MAX, 1, 31), i64::MAX / 31 + 1);
}

#[test]
fn an_interval_is_clipped_to_the_month_and_an_open_one_ends_now() {
    let (start, end) = (at(2026, 12, 1, 0, 0, 0), at(2027, 1, 1, 0, 0, 0));
    let now = at(2026, 12, 15, 12, 0, 0);
    // Held since November, still held: from the month's start to now.
    assert_eq!(
        clip_to_month(at(2026, 11, 20, 0, 0, 0), None, now, start, end),
        Some((start, now))
    );
    // Released in January: up to the month's end.
    let later = at(2027, 2, 1, 0, 0, 0);
    assert_eq!(
        clip_to_month(
            at(2026, 12, 30, 0, 0, 0),
            Some(at(2027, 1, 5, 0, 0, 0)),
            later,
            start,
            end
        ),
        Some((at(2026, 12, 30, 0, 0, 0), end))
    );
    // Released the instant the month began, or allocated as it ended.
    assert_eq!(
        clip_to_month(at(2026, 11, 1, 0, 0, 0), Some(start), now, start, end),
        None
    );
    assert_eq!(clip_to_month(end, None, later, start, end), None);
    // A month not begun yet holds nothing of an open allocation.
    assert_eq!(
        clip_to_month(
            at(2026, 11, 1, 0, 0, 0),
            None,
            at(2026, 11, 30, 0, 0, 0),
            start,
            end
        ),
        None
    );
}

#[test]
fn a_line_bills_its_own_price_snapshot_for_its_days_in_the_month() {
    let (start, end) = (at(2028, 2, 1, 0, 0, 0), at(2028, 3, 1, 0, 0, 0));
    let now = at(2028, 6, 1, 0, 0, 0);
    // Held across the whole of February 2028 (29 days) and beyond.
    let line = dedicated_line(
        interval(at(2028, 1, 31, 23, 0, 0), None, 2900),
        now,
        start,
        end,
    )
    .unwrap();
    assert_eq!((line.from, line.to), (start, end));
    assert_eq!(line.address_days, 29);
    assert_eq!(line.amount_cents, 2900);
    // 47 hours: two days of 29 at 2900 a month.
    let line = dedicated_line(
        interval(
            at(2028, 2, 10, 8, 0, 0),
            Some(at(2028, 2, 12, 7, 0, 0)),
            2900,
        ),
        now,
        start,
        end,
    )
    .unwrap();
    assert_eq!(line.address_days, 2);
    assert_eq!(line.amount_cents, 200);
    assert_eq!(line.ip, "192.0.2.7");
    assert!(!line.prefix);
    // An interval of another month is no line.
    assert!(dedicated_line(
        interval(at(2028, 1, 1, 0, 0, 0), Some(at(2028, 1, 9, 0, 0, 0)), 2900),
        now,
        start,
        end
    )
    .is_none());
}
