//! When a webhook stops getting events: its deliveries keep failing, or
//! its owner pauses it; and how it gets them again.
//!
//! A delivery that ends `failed` (every attempt spent) counts against its
//! webhook. After `disable_after_failures` of them in a row, the first at
//! least `disable_after` old, the webhook is disabled; failures more than
//! [`RUN_GAP`] apart do not make one run (a rarely used webhook that failed
//! once long ago is not disabled by a short outage now), and a delivery
//! ends the run. Disabling gives up its pending deliveries, queues no new
//! events for it and sends `webhook.disabled` to the account's other
//! webhooks and the operator's, until its owner enables it again
//! (`PATCH …/webhooks/{wid}`, which pauses it too, with [`disable`]).
//!
//! Who disabled it is kept ([`DisabledBy`]): a webhook the operator paused
//! stays paused until an operator enables it (an abusive receiver must not
//! be switched back on by the account that owns it); one its owner paused,
//! or its failures disabled, its owner may enable.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Transaction};
use std::time::Duration;
use uuid::Uuid;

use crate::audit;

/// Failed deliveries in a row that disable a webhook, by default.
pub(crate) const DISABLE_AFTER_FAILURES: u32 = 10;
/// How old their run must be, by default (s): an outage of a day or two
/// does not disable a receiver.
pub(crate) const DISABLE_AFTER_SECS: u64 = 3 * 24 * 3600;
/// Failures further apart than this start a new run.
pub(crate) const RUN_GAP: Duration = Duration::from_secs(3 * 24 * 3600);
/// Longest `disabled_reason` (the column's bound is 512 bytes).
const REASON_BYTES: usize = 500;
/// What a given-up delivery's `last_error` says.
pub(crate) const GIVEN_UP: &str = "the webhook was disabled";

/// Who disabled a webhook (`webhooks.disabled_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DisabledBy {
    /// An operator paused it: only an operator enables it again.
    Operator,
    /// Its account's key paused it.
    Owner,
    /// Its deliveries kept failing.
    Failures,
}

impl DisabledBy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DisabledBy::Operator => "operator",
            DisabledBy::Owner => "owner",
            DisabledBy::Failures => "failures",
        }
    }
}

/// Disables `webhook` inside `tx` with `reason`, recording `by`, and gives
/// up its pending deliveries (an attempt in flight is not recorded over
/// them): when, and how many were given up.
pub(crate) async fn disable(
    tx: &mut Transaction<'_, Postgres>,
    webhook: Uuid,
    reason: &str,
    by: DisabledBy,
) -> Result<(DateTime<Utc>, u64), sqlx::Error> {
    let (disabled_at,): (DateTime<Utc>,) = sqlx::query_as(
        "UPDATE webhooks SET disabled_at = now(), disabled_reason = $2, disabled_by = $3
          WHERE id = $1
         RETURNING disabled_at",
    )
    .bind(webhook)
    .bind(reason)
    .bind(by.as_str())
    .fetch_one(&mut **tx)
    .await?;
    Ok((disabled_at, give_up_pending(tx, webhook).await?))
}

/// Enables `webhook` inside `tx`: its run of failures starts from nothing,
/// and whatever an event queued while it was disabled (one emitted as the
/// disable committed) is given up, not sent late. How many were.
pub(crate) async fn enable(
    tx: &mut Transaction<'_, Postgres>,
    webhook: Uuid,
) -> Result<u64, sqlx::Error> {
    sqlx::query(
        "UPDATE webhooks SET disabled_at = NULL, disabled_reason = NULL, disabled_by = NULL,
                             failed_in_row = 0, failing_since = NULL, last_failed_at = NULL
          WHERE id = $1",
    )
    .bind(webhook)
    .execute(&mut **tx)
    .await?;
    give_up_pending(tx, webhook).await
}

async fn give_up_pending(
    tx: &mut Transaction<'_, Postgres>,
    webhook: Uuid,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE webhook_deliveries SET status = 'failed', last_error = $2
          WHERE webhook_id = $1 AND status = 'pending'",
    )
    .bind(webhook)
    .bind(GIVEN_UP)
    .execute(&mut **tx)
    .await?
    .rows_affected())
}

/// Counts a delivery that ended failed against its webhook (in `db`), and
/// disables the webhook when its run of failures is long and old enough: at
/// least `disable_after_failures` in a row (0: never), the first of them at
/// least `disable_after` old. The delivery worker calls it with its rules.
pub(crate) async fn failed_delivery(
    db: &PgPool,
    disable_after_failures: u32,
    disable_after: Duration,
    webhook: Uuid,
    account: Option<Uuid>,
    error: &str,
) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    // Ages are the database's: its clock set every time compared here.
    // The SET expressions read the row as it is when locked (another
    // instance's failure that committed first included): no count is lost.
    let run: Option<(i32, DateTime<Utc>, bool)> = sqlx::query_as(
        "UPDATE webhooks
                SET failed_in_row = CASE WHEN failing_since IS NULL
                                           OR COALESCE(last_failed_at, failing_since)
                                              < now() - make_interval(secs => $2)
                                         THEN 1 ELSE failed_in_row + 1 END,
                    failing_since = CASE WHEN failing_since IS NULL
                                           OR COALESCE(last_failed_at, failing_since)
                                              < now() - make_interval(secs => $2)
                                         THEN now() ELSE failing_since END,
                    last_failed_at = now()
              WHERE id = $1 AND disabled_at IS NULL
             RETURNING failed_in_row, failing_since,
                       failing_since <= now() - make_interval(secs => $3)",
    )
    .bind(webhook)
    .bind(RUN_GAP.as_secs_f64())
    .bind(disable_after.as_secs_f64())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((failed, since, old_enough)) = run else {
        // Deleted, or disabled already.
        return tx.commit().await;
    };
    let due = disable_after_failures > 0
        && u32::try_from(failed).unwrap_or(0) >= disable_after_failures
        && old_enough;
    if !due {
        return tx.commit().await;
    }
    let reason = format!(
        "{failed} deliveries in a row failed (since {}); the last: {error}",
        since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    let reason = truncate(&reason, REASON_BYTES);
    let (disabled_at, given_up) = disable(&mut tx, webhook, &reason, DisabledBy::Failures).await?;
    audit::record(
        &mut tx,
        "control-api",
        "webhook.disable",
        &webhook.to_string(),
        serde_json::json!({"account_id": account, "cause": "failures",
                           "failed_in_row": failed, "given_up": given_up}),
    )
    .await?;
    super::emit(
        &mut tx,
        super::EventType::WebhookDisabled,
        account,
        serde_json::json!({
            "webhook_id": webhook,
            "account_id": account,
            "cause": "failures",
            "failed_deliveries": failed,
            "failing_since": since,
            "disabled_at": disabled_at,
            "reason": reason,
            "given_up": given_up,
        }),
    )
    .await?;
    tx.commit().await?;
    super::wake();
    metrics::counter!("proxynet_webhooks_disabled_total", "cause" => "failures").increment(1);
    tracing::warn!(webhook = %webhook, account = ?account, failed_in_row = failed,
        given_up, "webhook disabled: its deliveries keep failing");
    Ok(())
}

/// At most `bytes` of `text`, cut at a character boundary.
fn truncate(text: &str, bytes: usize) -> String {
    let mut end = text.len().min(bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_cut_at_a_character_boundary_within_its_bytes() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        // "é" is two bytes: never half of it.
        assert_eq!(truncate("aé", 2), "a");
        let long = "ü".repeat(400);
        let cut = truncate(&long, REASON_BYTES);
        assert!(cut.len() <= REASON_BYTES && cut.chars().all(|c| c == 'ü'));
    }
}
