//! Dedicated addresses on an invoice: one allocation interval clipped to the
//! invoice's month and billed by the started address-day, at the price
//! snapshot taken when it was allocated (the rules are in `billing.rs`'s
//! module doc).

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

/// One dedicated allocation interval, clipped to the invoice's month.
#[derive(Debug, Serialize)]
pub(in crate::routes) struct DedicatedLine {
    /// The address, or the prefix with its length (`2001:db8:0:1::/64`).
    pub(super) ip: String,
    pub(super) prefix: bool,
    pub(super) exit_id: Uuid,
    pub(super) from: DateTime<Utc>,
    pub(super) to: DateTime<Utc>,
    pub(super) address_days: i64,
    pub(super) cents_per_month: i64,
    pub(super) amount_cents: i64,
}

/// A `dedicated_ips` row as the invoice reads it.
#[derive(sqlx::FromRow)]
pub(super) struct DedicatedInterval {
    pub(super) address: String,
    pub(super) is_prefix: bool,
    pub(super) exit_id: Uuid,
    pub(super) allocated_at: DateTime<Utc>,
    pub(super) released_at: Option<DateTime<Utc>>,
    pub(super) cents_per_month: i64,
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// The part of `[allocated_at, released_at)` inside `[month_start,
/// month_end)`, an open interval ending `now`; `None` when nothing of it is
/// (an interval that ends where the month starts, or one not begun by now).
pub(super) fn clip_to_month(
    allocated_at: DateTime<Utc>,
    released_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    month_start: DateTime<Utc>,
    month_end: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let from = allocated_at.max(month_start);
    let to = released_at.unwrap_or(now).min(month_end);
    (to > from).then_some((from, to))
}

/// Whole days from `from` to `to`, a started day counting as one (Postgres
/// keeps microseconds: a microsecond into a day starts it). 0 when `to` is
/// not after `from`.
pub(super) fn address_days(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    // Past ±292,000 years microseconds overflow: no allocation spans that.
    let micros = (to - from).num_microseconds().unwrap_or(i64::MAX).max(0);
    micros / MICROS_PER_DAY + i64::from(micros % MICROS_PER_DAY != 0)
}

/// `ceil(cents_per_month × address_days / days_in_month)` in integers
/// (i128: no product overflows), rounded up like a byte line: never a
/// fraction of a cent below the days' share of the month.
pub(super) fn dedicated_amount(cents_per_month: i64, address_days: i64, days_in_month: i64) -> i64 {
    let numerator = i128::from(cents_per_month.max(0)) * i128::from(address_days.max(0));
    let days_in_month = i128::from(days_in_month.max(1));
    let amount = (numerator + days_in_month - 1) / days_in_month;
    i64::try_from(amount).unwrap_or(i64::MAX)
}

/// The invoice line of one allocation interval in the month
/// `[month_start, month_end)` (module doc), or `None` when it lies outside.
pub(super) fn dedicated_line(
    interval: DedicatedInterval,
    now: DateTime<Utc>,
    month_start: DateTime<Utc>,
    month_end: DateTime<Utc>,
) -> Option<DedicatedLine> {
    let (from, to) = clip_to_month(
        interval.allocated_at,
        interval.released_at,
        now,
        month_start,
        month_end,
    )?;
    let days_in_month = (month_end - month_start).num_days();
    let days = address_days(from, to).min(days_in_month);
    Some(DedicatedLine {
        ip: interval.address,
        prefix: interval.is_prefix,
        exit_id: interval.exit_id,
        from,
        to,
        address_days: days,
        cents_per_month: interval.cents_per_month,
        amount_cents: dedicated_amount(interval.cents_per_month, days, days_in_month),
    })
}
