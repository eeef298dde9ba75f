//! Bounded cardinality for usage by domain: the first
//! [`DOMAINS_PER_ACCOUNT_HOUR`] distinct registrable domains an account
//! reaches in an hour keep their names in the ledger; any further domain in
//! that hour is recorded as [`OTHER`]. The names kept are listed in
//! `usage_domains_hourly`, so the bound holds across batches, superproxies
//! and control-api instances (two concurrent ledger writers may overshoot
//! it by at most one batch's new names for that hour).
//!
//! The listing is kept for [`LISTED_HOURS`] ([`run_prune`]); usage that
//! arrives later than that for its hour (a superproxy's spill replayed after
//! a long outage) is recorded as [`OTHER`], so the bound holds for every
//! hour while the listing stays bounded.

use proxynet_store::UsageRow;
use std::collections::{HashMap, HashSet};
use uuid::Uuid;

pub(crate) const DOMAINS_PER_ACCOUNT_HOUR: i64 = 200;
/// What domains beyond the bound are recorded as.
pub(crate) const OTHER: &str = "other";
/// Longest domain stored (a DNS name's limit).
const MAX_DOMAIN: usize = 253;
/// Hours an account's listing is kept, counted back from now.
pub(crate) const LISTED_HOURS: i64 = 48;

/// Which of a batch's (account, hour, domain) keep their name.
pub(crate) struct Bounded(HashSet<(Uuid, i64, String)>);

impl Bounded {
    /// The domain the row is recorded under (`None`: the row has none).
    pub(crate) fn name(&self, row: &UsageRow) -> Option<String> {
        let domain = row.domain.as_deref()?;
        let key = (row.account_id, hour(row.minute), domain.to_owned());
        Some(if self.0.contains(&key) {
            key.2
        } else {
            OTHER.to_owned()
        })
    }
}

fn hour(minute: i64) -> i64 {
    minute - minute.rem_euclid(3600)
}

/// Claims a place for each new (account, hour, domain) of the batch while
/// the account's hour has room, in the ledger's transaction.
pub(crate) async fn bounded(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    rows: &[UsageRow],
) -> Result<Bounded, sqlx::Error> {
    let mut wanted: HashMap<(Uuid, i64), Vec<String>> = HashMap::new();
    // Hours whose listing may be pruned already claim nothing.
    let oldest = oldest_listed_hour(chrono::Utc::now().timestamp());
    for row in rows.iter().filter(|r| hour(r.minute) >= oldest) {
        if let Some(d) = row.domain.as_deref().filter(|d| d.len() <= MAX_DOMAIN) {
            let names = wanted
                .entry((row.account_id, hour(row.minute)))
                .or_default();
            if !names.iter().any(|n| n == d) {
                names.push(d.to_owned());
            }
        }
    }
    let mut kept = HashSet::new();
    // One statement per (account, hour): the names already listed, plus as
    // many new ones (in batch order) as the hour has room for.
    for ((account, hour_start), names) in wanted {
        let claimed: Vec<(String,)> = sqlx::query_as(
            "WITH asked AS (
                 SELECT name, nth FROM unnest($3::text[]) WITH ORDINALITY AS a(name, nth)),
             listed AS (
                 SELECT domain FROM usage_domains_hourly
                  WHERE account_id = $1 AND hour = to_timestamp($2)),
             fresh AS (
                 SELECT name FROM asked WHERE name NOT IN (SELECT domain FROM listed)
                  ORDER BY nth
                  LIMIT GREATEST(0, $4 - (SELECT count(*) FROM listed))),
             claimed AS (
                 INSERT INTO usage_domains_hourly (account_id, hour, domain)
                 SELECT $1, to_timestamp($2), name FROM fresh
                 ON CONFLICT DO NOTHING RETURNING domain)
             SELECT domain FROM claimed
             UNION
             SELECT name FROM asked WHERE name IN (SELECT domain FROM listed)",
        )
        .bind(account)
        .bind(hour_start as f64)
        .bind(&names)
        .bind(DOMAINS_PER_ACCOUNT_HOUR)
        .fetch_all(&mut **tx)
        .await?;
        kept.extend(
            claimed
                .into_iter()
                .map(|(name,)| (account, hour_start, name)),
        );
    }
    Ok(Bounded(kept))
}

/// Deletes listings older than [`LISTED_HOURS`], now and every hour.
pub(crate) async fn run_prune(db: sqlx::PgPool, stop: proxynet_common::tasks::Stop) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        match prune(&db).await {
            Ok(rows) if rows > 0 => {
                tracing::info!(rows, "old usage-domain listings deleted");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "usage-domain listing prune failed; retrying next hour");
            }
        }
    }
}

/// One round of [`run_prune`]: the listings deleted. The cutoff is the
/// ledger's own rule ([`oldest_listed_hour`]) with an hour's margin, on
/// this process's clock and in UTC whatever the session's time zone: a
/// ledger batch that read the cutoff just before an hour turned still finds
/// its hour listed.
pub(crate) async fn prune(db: &sqlx::PgPool) -> Result<u64, sqlx::Error> {
    let cutoff = oldest_listed_hour(chrono::Utc::now().timestamp()) - 3600;
    Ok(
        sqlx::query("DELETE FROM usage_domains_hourly WHERE hour < to_timestamp($1)")
            .bind(cutoff as f64)
            .execute(db)
            .await?
            .rows_affected(),
    )
}

/// The start of the oldest hour whose names are still claimed (Unix
/// seconds): the current hour and the [`LISTED_HOURS`] − 1 before it.
fn oldest_listed_hour(now: i64) -> i64 {
    hour(now) - (LISTED_HOURS - 1) * 3600
}
