//! The usage ledger's writer: consumes the superproxies' usage stream into
//! Postgres, exactly once per batch.
//!
//! A Redis consumer group delivers each batch to one control-api; a batch is
//! acknowledged (and deleted from the stream) only after the transaction that
//! records it commits. The batch id is the ledger's idempotency key, so a
//! batch delivered twice — a crash between commit and acknowledgement, or a
//! redelivery — is recorded once. On start the consumer first re-reads its own
//! unacknowledged batches, so a crash loses nothing, and every few seconds it
//! takes over batches another instance left unacknowledged for 30 s
//! (`XAUTOCLAIM`), so several control-apis share the stream and one of them
//! dying strands nothing. While Postgres is away, batches simply wait in the
//! stream.
//!
//! The same stream carries audit events from the data plane (field `audit`),
//! recorded into the audit log once each by their id.

use proxynet_store::redis_target::{RedisConnection, RedisTarget};
use proxynet_store::{AuditEvent, Keys, UsageBatch};
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

pub(crate) const GROUP: &str = "ledger";

/// How long one read waits for new usage batches.
const BLOCK: Duration = Duration::from_secs(1);

/// A batch delivered to another control-api and unacknowledged this long is
/// taken over (that instance is presumed dead: one batch takes milliseconds).
const CLAIM_IDLE: Duration = Duration::from_secs(30);
/// How often to look for such batches.
const CLAIM_EVERY: Duration = Duration::from_secs(5);

pub(crate) struct LedgerConsumer {
    pub db: PgPool,
    pub redis: RedisTarget,
    pub keys: Keys,
    /// Stable per control-api instance, so a restart finds its own pending batches.
    pub consumer: String,
}

impl LedgerConsumer {
    /// Consumes until `stop` (a batch cut off mid-way is delivered again:
    /// the ledger counts each batch id once).
    pub(crate) async fn run(self, stop: proxynet_common::tasks::Stop) {
        stop.run_until_cancelled(self.follow()).await;
    }

    async fn follow(&self) {
        loop {
            // Blocking reads get a connection of their own, whose response
            // timeout outlasts the block (the client's default of 500 ms
            // would end every idle one-second XREADGROUP in an error).
            match self
                .redis
                .connect_with_reply_timeout(BLOCK + Duration::from_secs(5))
                .await
            {
                Ok(mut conn) => {
                    if let Err(e) = self.consume(&mut conn).await {
                        tracing::warn!(error = %e, "usage consumer interrupted; resuming");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "usage consumer cannot reach Redis yet"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn consume(&self, conn: &mut RedisConnection) -> Result<(), ConsumeError> {
        let stream = self.keys.usage_stream();
        let created: Result<(), _> = conn.xgroup_create_mkstream(&stream, GROUP, "0").await;
        if let Err(e) = created {
            if e.code() != Some("BUSYGROUP") {
                return Err(e.into());
            }
        }
        // Our own unacknowledged batches first ("0"), then new ones (">").
        let mut cursor = "0".to_owned();
        let mut last_claim = std::time::Instant::now();
        loop {
            // Batches another control-api took and never acknowledged (it
            // died): after CLAIM_IDLE they become ours, and are read with
            // our own pending ones. Recording is idempotent by batch id, so
            // a slow peer finishing one as well counts it once.
            if cursor == ">" && last_claim.elapsed() >= CLAIM_EVERY {
                last_claim = std::time::Instant::now();
                let claimed: (String, Vec<String>) = redis::cmd("XAUTOCLAIM")
                    .arg(&stream)
                    .arg(GROUP)
                    .arg(&self.consumer)
                    .arg(CLAIM_IDLE.as_millis() as u64)
                    .arg("0-0")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("JUSTID")
                    .query_async::<(String, Vec<String>, Vec<String>)>(conn)
                    .await
                    .map(|(next, ids, _)| (next, ids))?;
                if !claimed.1.is_empty() {
                    tracing::info!(
                        batches = claimed.1.len(),
                        "took over usage batches another control-api left unacknowledged"
                    );
                    cursor = "0".to_owned();
                }
            }
            let options = StreamReadOptions::default()
                .group(GROUP, &self.consumer)
                .count(100)
                .block(BLOCK.as_millis() as usize);
            let reply: StreamReadReply =
                conn.xread_options(&[&stream], &[&cursor], &options).await?;
            let entries: Vec<_> = reply.keys.into_iter().flat_map(|k| k.ids).collect();
            if entries.is_empty() && cursor == "0" {
                cursor = ">".to_owned();
                continue;
            }
            for entry in entries {
                let field = |name: &str| {
                    entry
                        .map
                        .get(name)
                        .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                };
                let batch: Option<UsageBatch> =
                    field("batch").and_then(|json| serde_json::from_str(&json).ok());
                let audit: Option<AuditEvent> =
                    field("audit").and_then(|json| serde_json::from_str(&json).ok());
                // Stream ids start with the entry's time in ms: how far behind we are.
                if let Some(ms) = entry
                    .id
                    .split('-')
                    .next()
                    .and_then(|m| m.parse::<i64>().ok())
                {
                    let lag = (chrono::Utc::now().timestamp_millis() - ms).max(0) as f64 / 1000.0;
                    metrics::gauge!("proxynet_ledger_lag_seconds").set(lag);
                }
                match (batch, audit) {
                    (Some(batch), _) => {
                        if let Err(e) = self.record(&batch).await {
                            metrics::counter!("proxynet_store_errors_total", "store" => "postgres", "op" => "ledger").increment(1);
                            return Err(e);
                        }
                    }
                    (None, Some(event)) => self.record_audit(&event).await?,
                    (None, None) => {
                        tracing::error!(id = %entry.id, "unreadable stream entry; acknowledged to unblock the stream")
                    }
                }
                let _: () = redis::pipe()
                    .xack(&stream, GROUP, &[&entry.id])
                    .xdel(&stream, &[&entry.id])
                    .query_async(conn)
                    .await?;
            }
        }
    }

    /// Records a data-plane audit event once.
    pub(crate) async fn record_audit(&self, event: &AuditEvent) -> Result<(), ConsumeError> {
        sqlx::query(
            "INSERT INTO audit_log (actor, action, subject, detail, source_ref)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (source_ref) DO NOTHING",
        )
        .bind(&event.actor)
        .bind(&event.action)
        .bind(&event.subject)
        .bind(&event.detail)
        .bind(event.id)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// Records one batch in one transaction; a batch already recorded is skipped.
    pub(crate) async fn record(&self, batch: &UsageBatch) -> Result<(), ConsumeError> {
        let mut tx = self.db.begin().await?;
        let inserted = sqlx::query("INSERT INTO usage_batches (batch_id, superproxy_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(batch.batch_id)
            .bind(batch.superproxy_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if inserted == 0 {
            tracing::info!(batch = %batch.batch_id, "usage batch already recorded; skipped");
            return Ok(());
        }
        // Fix the money now: each row carries the source type the superproxy
        // saw when the bytes moved (older superproxies send none: the exit's
        // type now, the nearest record there is) and the account's plan and
        // price at this moment, so nothing later can re-price it.
        let exits: Vec<Uuid> = batch.rows.iter().map(|r| r.exit_id).collect();
        let mut types: std::collections::HashMap<Uuid, String> = Default::default();
        let mut countries: std::collections::HashMap<Uuid, String> = Default::default();
        for (id, source_type, country) in sqlx::query_as::<_, (Uuid, String, String)>(
            "SELECT id, source_type, country FROM exits WHERE id = ANY($1)",
        )
        .bind(&exits)
        .fetch_all(&mut *tx)
        .await?
        {
            types.insert(id, source_type);
            countries.insert(id, country);
        }
        let domains = crate::usage_domains::bounded(&mut tx, &batch.rows).await?;
        // Each account's plan history: a row is priced by the plan in force
        // at its minute, however late it is recorded.
        let accounts: Vec<Uuid> = batch.rows.iter().map(|r| r.account_id).collect();
        let mut history: std::collections::HashMap<Uuid, Vec<(i64, Option<Uuid>)>> =
            Default::default();
        for (account, from, plan) in sqlx::query_as::<_, (Uuid, f64, Option<Uuid>)>(
            "SELECT account_id, COALESCE(EXTRACT(EPOCH FROM from_at), -1e18)::float8, plan_id
               FROM account_plan_history WHERE account_id = ANY($1) ORDER BY from_at",
        )
        .bind(&accounts)
        .fetch_all(&mut *tx)
        .await?
        {
            history
                .entry(account)
                .or_default()
                .push((from as i64, plan));
        }
        let plan_at = |account: Uuid, minute: i64| -> Option<Uuid> {
            history
                .get(&account)?
                .iter()
                .take_while(|(from, _)| *from <= minute + 59)
                .last()
                .and_then(|(_, plan)| *plan)
        };
        let plan_ids: Vec<Uuid> = history.values().flatten().filter_map(|(_, p)| *p).collect();
        let prices: std::collections::HashMap<(Uuid, String), i64> = sqlx::query_as::<
            _,
            (Uuid, String, i64),
        >(
            "SELECT plan_id, source_type, cents_per_gb FROM plan_prices WHERE plan_id = ANY($1)",
        )
        .bind(&plan_ids)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|(plan, t, c)| ((plan, t), c))
        .collect();
        for row in &batch.rows {
            let source_type = row
                .source_type
                .map(|t| t.as_str().to_owned())
                .or_else(|| types.get(&row.exit_id).cloned());
            let plan = plan_at(row.account_id, row.minute);
            let cents = match (&source_type, plan) {
                (Some(t), Some(plan)) => prices.get(&(plan, t.clone())).copied(),
                _ => None,
            };
            sqlx::query(
                "INSERT INTO usage_ledger (batch_id, account_id, user_id, exit_id, minute, bytes_up, bytes_down,
                                           source_type, plan_id, cents_per_gb, domain, country, billable)
                 VALUES ($1, $2, $3, $4, to_timestamp($5), $6, $7, $8, $9, $10, $11, $12, $13)",
            )
            .bind(batch.batch_id)
            .bind(row.account_id)
            .bind(row.user_id)
            .bind(row.exit_id)
            .bind(row.minute as f64)
            .bind(i64::try_from(row.bytes_up).unwrap_or(i64::MAX))
            .bind(i64::try_from(row.bytes_down).unwrap_or(i64::MAX))
            .bind(&source_type)
            .bind(plan)
            .bind(cents)
            .bind(domains.name(row))
            .bind(countries.get(&row.exit_id))
            // Priced all the same (what the bytes would have cost); the
            // invoice leaves them out.
            .bind(row.billable)
            .execute(&mut *tx)
            .await?;
        }
        for t in &batch.targets {
            sqlx::query(
                "INSERT INTO target_log (minute, egress_ip, exit_id, account_id, user_id, target_host, target_port, tunnels)
                 VALUES (to_timestamp($1), $2::inet, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (egress_ip, minute, exit_id, user_id, target_host, target_port)
                 DO UPDATE SET tunnels = target_log.tunnels + EXCLUDED.tunnels",
            )
            .bind(t.minute as f64)
            .bind(t.egress_ip.to_string())
            .bind(t.exit_id)
            .bind(t.account_id)
            .bind(t.user_id)
            .bind(&t.target_host)
            .bind(i32::from(t.target_port))
            .bind(i64::from(t.tunnels))
            .execute(&mut *tx)
            .await?;
        }
        // Quota webhooks: a crossing is emitted with the batch that made it.
        let emitted = crate::webhooks::quota::after_batch(&mut tx, &batch.rows).await?;
        tx.commit().await?;
        if emitted {
            crate::webhooks::wake();
        }
        metrics::counter!("proxynet_usage_batches_recorded_total").increment(1);
        for row in &batch.rows {
            let source_type = row
                .source_type
                .map(|t| t.as_str().to_owned())
                .or_else(|| types.get(&row.exit_id).cloned())
                .unwrap_or_else(|| "unknown".into());
            metrics::counter!("proxynet_usage_bytes_total", "account" => row.account_id.to_string(), "source_type" => source_type)
                .increment(row.bytes_up + row.bytes_down);
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsumeError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("postgres: {0}")]
    Database(#[from] sqlx::Error),
}
