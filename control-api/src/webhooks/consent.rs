//! Where `exit.withdrawn` with cause `consent_expired` comes from.
//!
//! An expiring consent needs no control-plane action to bind: every
//! superproxy judges the instant itself (docs/provenance.md). What it lacks
//! is an event at that instant, so every control-api sweeps the consents
//! whose instant has just passed ([`SWEEP`]) and announces each one that is
//! still the exit's latest record, of a source that requires consent, on
//! an exit not withdrawn otherwise — once: the mark
//! (`consent_expiry_notices`, keyed by the consent record) is inserted in
//! the transaction that emits the event, and a second control-api's insert
//! of the same mark does nothing. The candidates' exit rows are locked
//! first (`FOR UPDATE`, as recording consent and opting out lock them), and
//! the marks are inserted by a second statement, whose fresh snapshot sees
//! a renewal or opt-out that committed meanwhile: neither is announced as
//! an expiry. An instant more than [`LOOK_BACK`] past (this control plane
//! was down all that time) is not announced late; marks a day older than
//! that are pruned ([`prune_marks`], hourly with the outbox).

use chrono::{DateTime, Utc};
use proxynet_common::tasks::Stop;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// How often the consents are looked at: an expiry is announced this long
/// after its instant at most (plus the delivery).
pub(crate) const SWEEP: Duration = Duration::from_secs(5);
/// Instants further back than this are not announced.
const LOOK_BACK: &str = "7 days";
/// Announcements per sweep (more wait for the next).
const PER_SWEEP: i64 = 500;

/// Announces expired consents every [`SWEEP`] until `stop`.
pub(crate) async fn run(db: PgPool, stop: Stop) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        match announce_expired(&db).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(exits = n, "expired consents announced"),
            Err(e) => tracing::warn!(error = %e, "cannot announce expired consents; retrying"),
        }
    }
}

/// One sweep: the expired consents announced.
pub(crate) async fn announce_expired(db: &PgPool) -> Result<u64, sqlx::Error> {
    // Which consents are due, and what makes one due, in both statements.
    let due = format!(
        "FROM consent_records c
           JOIN exits e ON e.id = c.exit_id
           JOIN sources s ON s.id = e.source_id
          WHERE c.state = 'granted' AND c.expires_at <= now()
            AND c.expires_at > now() - interval '{LOOK_BACK}'
            AND s.consent_required AND e.withdrawn_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM consent_records later
                             WHERE later.exit_id = c.exit_id AND later.version > c.version)
            AND NOT EXISTS (SELECT 1 FROM consent_expiry_notices n WHERE n.consent_id = c.id)"
    );
    let mut tx = db.begin().await?;
    // Exits another transaction holds (a consent being recorded, an opt-out)
    // wait for the next sweep.
    let candidates: Vec<(i64,)> = sqlx::query_as(&format!(
        "SELECT c.id {due} ORDER BY c.expires_at, c.id LIMIT {PER_SWEEP} FOR UPDATE OF e SKIP LOCKED"
    ))
    .fetch_all(&mut *tx)
    .await?;
    if candidates.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = candidates.into_iter().map(|(id,)| id).collect();
    let marked: Vec<(Uuid, i32, DateTime<Utc>)> = sqlx::query_as(&format!(
        "WITH marked AS (
             INSERT INTO consent_expiry_notices (consent_id, exit_id, expires_at)
             SELECT c.id, c.exit_id, c.expires_at {due} AND c.id = ANY ($1)
              ORDER BY c.id
             ON CONFLICT DO NOTHING
             RETURNING consent_id, exit_id)
         SELECT m.exit_id, c.version, c.expires_at
           FROM marked m JOIN consent_records c ON c.id = m.consent_id"
    ))
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    for (exit, version, expired_at) in &marked {
        let reason = format!(
            "consent version {version} expired at {}",
            expired_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        super::exit_withdrawn(
            &mut tx,
            *exit,
            super::Withdrawal::ConsentExpired,
            Some(&reason),
        )
        .await?;
    }
    tx.commit().await?;
    if !marked.is_empty() {
        super::wake();
    }
    Ok(u64::try_from(marked.len()).unwrap_or(u64::MAX))
}

/// Deletes the marks a day older than the sweep's look-back, which only take
/// room (with the outbox's hourly prune).
pub(crate) async fn prune_marks(db: &PgPool) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(&format!(
        "DELETE FROM consent_expiry_notices
          WHERE expires_at < now() - interval '{LOOK_BACK}' - interval '1 day'"
    ))
    .execute(db)
    .await?
    .rows_affected())
}
