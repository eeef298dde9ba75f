//! The outbox's worker: claims due deliveries, sends each signed, records
//! what the receiver answered.
//!
//! A claim is one statement: up to [`BATCH`] due rows (fewer while attempts
//! are in flight: at most [`BATCH`] at once), locked with `FOR
//! UPDATE SKIP LOCKED` so concurrent control-apis take different rows, get
//! their attempt counted and `next_attempt_at` moved [`LEASE`] ahead. The
//! lease outlasts an attempt (resolve ≤ 5 s, then ≤ 10 s in all), so no other
//! instance takes the row while it is in flight, and an instance that dies
//! mid-attempt leaves the row due again when the lease runs out. The result
//! is written only if the row is still the one claimed (same attempt number,
//! still pending): at least once, never a delivered row sent again.
//!
//! A 2xx answer delivers; anything else (another status, a refused or
//! timed-out connection, an address the policy refuses now) is retried
//! after [`backoff`]: 5 s doubling to at most an hour, until
//! [`MAX_ATTEMPTS`] attempts or [`GIVE_UP_AFTER`] have passed (`failed`).
//! Redirects are not followed (a 3xx is a failure).
//!
//! A delivery that ends `failed` counts against its webhook, which is
//! disabled when its deliveries keep failing ([`super::disable`]).
//!
//! Operator webhooks have a lane of their own, so no customer delays them:
//! [`OPERATOR_SLOTS`] of the [`BATCH`] slots are theirs alone (customers'
//! webhooks together hold at most the rest), a claim takes their due rows
//! before any customer's, and within one operator webhook the due rows are
//! taken round-robin over the accounts their events are about, the fleet's
//! own events (`exit.withdrawn`) first in each round: an account whose loop
//! queues a thousand events for the operator's webhook delays an
//! `exit.withdrawn` by no more than one attempt.

use chrono::Utc;
use hmac::{Hmac, Mac};
use proxynet_common::egress::EgressPolicy;
use proxynet_common::tasks::Stop;
use sha2::Sha256;
use sqlx::PgPool;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

use super::{disable, target};

/// Most attempts of one delivery (by default; `--webhook-max-attempts`).
pub(crate) const MAX_ATTEMPTS: i32 = 15;
/// No attempt is made later than this after the event.
pub(crate) const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The wait after the first failed attempt; it doubles after each.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(5);
/// The longest wait between two attempts.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(3600);
/// Connecting to the receiver.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One attempt from connect to the end of the (capped) answer.
pub(crate) const TOTAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claimed row is left alone by other workers.
const LEASE: Duration = Duration::from_secs(60);
/// How often the outbox is looked at when nothing woke the worker (rows
/// written by other control-apis, retries coming due).
const POLL: Duration = Duration::from_secs(1);
/// Attempts in flight at once (and rows per claim).
const BATCH: i64 = 32;
/// Attempts in flight at once for one account's webhooks (an account may
/// have 10): accounts whose receivers hang cannot hold every slot.
pub(crate) const PER_ACCOUNT: i64 = 8;
/// Slots of the [`BATCH`] only operator webhooks' attempts may use:
/// accounts' webhooks together hold at most `BATCH - OPERATOR_SLOTS`.
pub(crate) const OPERATOR_SLOTS: i64 = 8;
/// Attempts in flight at once for every account's webhooks together.
pub(crate) const CUSTOMER_SLOTS: i64 = BATCH - OPERATOR_SLOTS;
/// Bytes of the receiver's answer kept (for the delivery history).
const SNIPPET_BYTES: usize = 256;
/// Characters of an error kept.
const ERROR_CHARS: usize = 300;
/// Finished deliveries are kept this long, quota bookkeeping twice a month.
const KEEP_DELIVERIES: &str = "30 days";
const KEEP_QUOTA_ROWS: &str = "62 days";
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// One attempt fewer in flight for `key`.
fn release(counts: &mut HashMap<Uuid, usize>, key: Uuid) {
    if let Some(n) = counts.get_mut(&key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(&key);
        }
    }
}

/// `Proxynet-Signature`'s `v1`: lower-case hex HMAC-SHA256 of
/// `"{timestamp}.{body}"` keyed with the webhook's secret (its bytes as shown).
pub(crate) fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()) else {
        // HMAC takes a key of any length: unreachable.
        return String::new();
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The `Proxynet-Signature` header value for `body` sent at `timestamp`.
pub(crate) fn signature_header(secret: &str, timestamp: i64, body: &str) -> String {
    format!("t={timestamp},v1={}", signature(secret, timestamp, body))
}

/// The wait after `attempts` failed attempts (≥ 1).
pub(crate) fn backoff(attempts: i32) -> Duration {
    let doublings = u32::try_from(attempts.saturating_sub(1))
        .unwrap_or(0)
        .min(20);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

/// How long a delivery is tried, and when a failing webhook is disabled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeliveryRules {
    /// Attempts of one delivery before it is `failed`.
    pub max_attempts: i32,
    /// Failed deliveries in a row that disable a webhook (0: never)…
    pub disable_after_failures: u32,
    /// …once the first of them is at least this old.
    pub disable_after: Duration,
}

impl Default for DeliveryRules {
    fn default() -> Self {
        Self {
            max_attempts: MAX_ATTEMPTS,
            disable_after_failures: disable::DISABLE_AFTER_FAILURES,
            disable_after: Duration::from_secs(disable::DISABLE_AFTER_SECS),
        }
    }
}

/// The delivery worker (one per control-api; any number side by side).
#[derive(Clone)]
pub(crate) struct Deliverer {
    db: PgPool,
    policy: Arc<EgressPolicy>,
    rules: DeliveryRules,
}

/// A claimed row and its webhook. No `Debug`: it holds the secret.
#[derive(sqlx::FromRow)]
pub(crate) struct Claimed {
    id: Uuid,
    pub(crate) webhook_id: Uuid,
    /// `None`: an operator webhook.
    pub(crate) account_id: Option<Uuid>,
    event: String,
    body: String,
    /// Including this one.
    attempts: i32,
    url: String,
    secret: String,
}

/// What one attempt came to.
enum Outcome {
    Delivered {
        code: u16,
        snippet: Option<String>,
    },
    Failed {
        code: Option<u16>,
        error: String,
        snippet: Option<String>,
    },
}

impl Deliverer {
    /// A worker sending from `db`'s outbox to targets `policy` allows.
    pub(crate) fn new(db: PgPool, policy: EgressPolicy) -> Self {
        Self {
            db,
            policy: Arc::new(policy),
            rules: DeliveryRules::default(),
        }
    }

    /// The same worker under `rules`.
    pub(crate) fn with_rules(self, rules: DeliveryRules) -> Self {
        Self { rules, ..self }
    }

    /// Delivers until `stop`: at once when [`super::wake`]d, else every
    /// [`POLL`]. Up to [`BATCH`] attempts are in flight at once, and a
    /// finished one makes room for the next claim at once: a receiver that
    /// hangs until the attempt's timeout holds up only its own deliveries
    /// (a webhook with an attempt in flight is not claimed for again). An
    /// attempt cut off by the stop is sent again after its lease.
    pub(crate) async fn run(self, stop: Stop) {
        let mut pruned: Option<Instant> = None;
        let mut running: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
        // Each attempt in flight, by task, and how many each webhook has.
        let mut attempts: HashMap<tokio::task::Id, (Uuid, Option<Uuid>)> = HashMap::new();
        let mut busy: HashMap<Uuid, usize> = HashMap::new();
        let mut busy_accounts: HashMap<Uuid, usize> = HashMap::new();
        loop {
            let woken = super::WAKE.notified();
            tokio::pin!(woken);
            // Registered before the outbox is read: a wake during the read
            // is not lost.
            woken.as_mut().enable();
            let room = usize::try_from(BATCH)
                .unwrap_or(1)
                .saturating_sub(running.len());
            let mut filled = false;
            if room > 0 {
                let skip: Vec<Uuid> = busy.keys().copied().collect();
                let account_room: Vec<(Uuid, i64)> = busy_accounts
                    .iter()
                    .map(|(a, n)| (*a, PER_ACCOUNT - i64::try_from(*n).unwrap_or(PER_ACCOUNT)))
                    .collect();
                let customers_busy: usize = busy_accounts.values().sum();
                let customer_room = CUSTOMER_SLOTS
                    .saturating_sub(i64::try_from(customers_busy).unwrap_or(CUSTOMER_SLOTS))
                    .max(0);
                match stop
                    .run_until_cancelled(self.claim(room, &skip, &account_room, customer_room))
                    .await
                {
                    None => return,
                    Some(Ok(claimed)) => {
                        filled = claimed.len() == room;
                        for row in claimed {
                            *busy.entry(row.webhook_id).or_default() += 1;
                            if let Some(account) = row.account_id {
                                *busy_accounts.entry(account).or_default() += 1;
                            }
                            let webhook = (row.webhook_id, row.account_id);
                            let worker = self.clone();
                            let task = running.spawn(async move {
                                let outcome = worker.attempt(&row).await;
                                if let Err(e) = worker.record(&row, outcome).await {
                                    // The lease runs out and the row is tried again.
                                    tracing::warn!(delivery = %row.id, error = %e, "cannot record a webhook attempt");
                                }
                            });
                            attempts.insert(task.id(), webhook);
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "webhook outbox unavailable; retrying");
                    }
                }
            }
            if pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                pruned = Some(Instant::now());
                if let Err(e) = self.prune().await {
                    tracing::debug!(error = %e, "cannot prune old webhook deliveries");
                }
            }
            // When the claim took all the room left, more may be due at
            // once: only a finished attempt (making room) is waited for.
            tokio::select! {
                () = stop.cancelled() => return,
                Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                    // This one and whatever else finished meanwhile: one
                    // claim for all the room they made.
                    let mut finished = vec![done];
                    while let Some(more) = running.try_join_next_with_id() {
                        finished.push(more);
                    }
                    for done in finished {
                        let task = match done {
                            Ok((task, ())) => task,
                            Err(e) => e.id(),
                        };
                        if let Some((webhook, account)) = attempts.remove(&task) {
                            release(&mut busy, webhook);
                            if let Some(account) = account {
                                release(&mut busy_accounts, account);
                            }
                        }
                    }
                }
                () = &mut woken, if !filled => {}
                () = tokio::time::sleep(POLL), if !filled => {}
            }
        }
    }

    /// Claims up to `room` due rows: at most two per webhook and none of a
    /// webhook in `skip` (an attempt of its is in flight here); an
    /// account's webhooks together at most its room (`account_room` for one
    /// with attempts in flight, else [`PER_ACCOUNT`]), and every account's
    /// together at most `customer_room`. Operator webhooks' rows come
    /// first; then every webhook's first due row before any webhook's
    /// second. Within a webhook, due rows are taken round-robin over the
    /// accounts their events are about, the fleet's own events first in
    /// each round.
    pub(crate) async fn claim(
        &self,
        room: usize,
        skip: &[Uuid],
        account_room: &[(Uuid, i64)],
        customer_room: i64,
    ) -> Result<Vec<Claimed>, sqlx::Error> {
        let (accounts, rooms): (Vec<Uuid>, Vec<i64>) = account_room.iter().copied().unzip();
        sqlx::query_as(
            "WITH due_rows AS (
                 SELECT d.id, d.webhook_id, d.next_attempt_at, d.source_account, w.account_id,
                        row_number() OVER (PARTITION BY d.webhook_id, d.source_account
                                           ORDER BY d.next_attempt_at) AS source_nth
                   FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
                  WHERE d.status = 'pending' AND d.next_attempt_at <= now()
                    AND w.disabled_at IS NULL AND d.webhook_id <> ALL ($3)),
             per_webhook AS (
                 SELECT id, next_attempt_at, account_id,
                        row_number() OVER (PARTITION BY webhook_id
                                           ORDER BY source_nth, source_account IS NOT NULL,
                                                    next_attempt_at) AS nth
                   FROM due_rows),
             per_account AS (
                 SELECT id, next_attempt_at, account_id, nth,
                        row_number() OVER (PARTITION BY account_id ORDER BY nth, next_attempt_at) AS account_nth
                   FROM per_webhook WHERE nth <= 2),
             eligible AS (
                 SELECT id, next_attempt_at, account_id, nth,
                        row_number() OVER (PARTITION BY account_id IS NULL
                                           ORDER BY nth, next_attempt_at) AS lane_nth
                   FROM per_account r
                  WHERE r.account_id IS NULL
                     OR r.account_nth <= COALESCE(
                            (SELECT a.room FROM unnest($4::uuid[], $5::bigint[]) AS a(account, room)
                              WHERE a.account = r.account_id), $6)),
             due AS (
                 SELECT d.id FROM webhook_deliveries d JOIN eligible r ON r.id = d.id
                  WHERE (r.account_id IS NULL OR r.lane_nth <= $7)
                    AND d.status = 'pending' AND d.next_attempt_at <= now()
                  ORDER BY r.account_id IS NOT NULL, r.nth, r.next_attempt_at
                  LIMIT $1
                  FOR UPDATE OF d SKIP LOCKED)
             UPDATE webhook_deliveries d
                SET attempts = d.attempts + 1,
                    next_attempt_at = now() + make_interval(secs => $2)
               FROM due, webhooks w
              WHERE d.id = due.id AND w.id = d.webhook_id
             RETURNING d.id, d.webhook_id, w.account_id, d.event, d.body, d.attempts, w.url, w.secret",
        )
        .bind(i64::try_from(room).unwrap_or(BATCH))
        .bind(LEASE.as_secs_f64())
        .bind(skip)
        .bind(&accounts)
        .bind(&rooms)
        .bind(PER_ACCOUNT)
        .bind(customer_room)
        .fetch_all(&self.db)
        .await
    }

    /// One attempt: the addresses checked now, dialled pinned, the body signed.
    async fn attempt(&self, row: &Claimed) -> Outcome {
        let failed = |error: String| Outcome::Failed {
            code: None,
            error,
            snippet: None,
        };
        let target = match target::parse(&row.url) {
            Ok(t) => t,
            Err(e) => return failed(e),
        };
        let addrs = match target::resolve(&target).await {
            Ok(a) => a,
            Err(e) => return failed(e),
        };
        // The history of an account's webhook is the account's to read:
        // the addresses its name resolved to are not (they go to the log).
        let reveal = row.account_id.is_none();
        let addrs = match target::allowed(&self.policy, &target.host, &addrs, reveal) {
            Ok(a) => a,
            Err(e) => return failed(e),
        };
        let client = match client(&target, &addrs) {
            Ok(c) => c,
            Err(e) => return failed(describe(e)),
        };
        let now = Utc::now().timestamp();
        let sent = client
            .post(target.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Proxynet-Event", &row.event)
            .header("Proxynet-Delivery", row.id.to_string())
            .header(
                "Proxynet-Signature",
                signature_header(&row.secret, now, &row.body),
            )
            .body(row.body.clone())
            .send()
            .await;
        let mut response = match sent {
            Ok(r) => r,
            Err(e) => return failed(describe(e)),
        };
        let code = response.status();
        let mut snippet = Vec::new();
        while snippet.len() < SNIPPET_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = SNIPPET_BYTES - snippet.len();
                    snippet.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                Ok(None) | Err(_) => break,
            }
        }
        let snippet = (!snippet.is_empty()).then(|| String::from_utf8_lossy(&snippet).into_owned());
        if code.is_success() {
            Outcome::Delivered {
                code: code.as_u16(),
                snippet,
            }
        } else {
            Outcome::Failed {
                code: Some(code.as_u16()),
                error: format!("the receiver answered {code}"),
                snippet,
            }
        }
    }

    /// Writes an attempt's result, unless the row moved on without us (its
    /// lease ran out and another attempt claimed it, or it was deleted).
    async fn record(&self, row: &Claimed, outcome: Outcome) -> Result<(), sqlx::Error> {
        match outcome {
            Outcome::Delivered { code, snippet } => {
                let recorded = sqlx::query(
                    "UPDATE webhook_deliveries
                        SET status = 'delivered', delivered_at = now(), last_status_code = $3,
                            last_error = NULL, last_response = $4
                      WHERE id = $1 AND attempts = $2 AND status = 'pending'",
                )
                .bind(row.id)
                .bind(row.attempts)
                .bind(i32::from(code))
                .bind(snippet)
                .execute(&self.db)
                .await?
                .rows_affected();
                metrics::counter!("proxynet_webhook_attempts_total", "outcome" => "delivered")
                    .increment(1);
                tracing::info!(delivery = %row.id, webhook = %row.webhook_id, event = %row.event,
                    attempt = row.attempts, status = code, "webhook delivered");
                // A delivery ends the run of failures (no write when there
                // was none). Only one this attempt recorded: a row given up
                // meanwhile, or whose lease ran out, says nothing.
                if recorded == 1 {
                    sqlx::query(
                        "UPDATE webhooks SET failed_in_row = 0, failing_since = NULL
                          WHERE id = $1 AND failed_in_row > 0 AND disabled_at IS NULL",
                    )
                    .bind(row.webhook_id)
                    .execute(&self.db)
                    .await?;
                }
            }
            Outcome::Failed {
                code,
                error,
                snippet,
            } => {
                let error: String = error.chars().take(ERROR_CHARS).collect();
                let wait = backoff(row.attempts);
                let out_of_attempts = row.attempts >= self.rules.max_attempts;
                let (status,): (String,) = sqlx::query_as(
                    "UPDATE webhook_deliveries
                        SET status = CASE WHEN $3 OR now() + make_interval(secs => $4) > created_at + make_interval(secs => $5)
                                          THEN 'failed' ELSE 'pending' END,
                            next_attempt_at = now() + make_interval(secs => $4),
                            last_status_code = $6, last_error = $7, last_response = $8
                      WHERE id = $1 AND attempts = $2 AND status = 'pending'
                     RETURNING status",
                )
                .bind(row.id)
                .bind(row.attempts)
                .bind(out_of_attempts)
                .bind(wait.as_secs_f64() * jitter())
                .bind(GIVE_UP_AFTER.as_secs_f64())
                .bind(code.map(i32::from))
                .bind(&error)
                .bind(snippet)
                .fetch_optional(&self.db)
                .await?
                .unwrap_or(("gone".into(),));
                if status == "failed" {
                    metrics::counter!("proxynet_webhook_attempts_total", "outcome" => "failed")
                        .increment(1);
                    tracing::warn!(delivery = %row.id, webhook = %row.webhook_id, event = %row.event,
                        attempts = row.attempts, error = %error, "webhook delivery failed; giving up");
                    self.failed_delivery(row.webhook_id, row.account_id, &error)
                        .await?;
                } else {
                    metrics::counter!("proxynet_webhook_attempts_total", "outcome" => "retry")
                        .increment(1);
                    tracing::info!(delivery = %row.id, webhook = %row.webhook_id, event = %row.event,
                        attempt = row.attempts, error = %error, retry_in_secs = wait.as_secs(),
                        "webhook attempt failed; will retry");
                }
            }
        }
        Ok(())
    }

    /// Counts a failed delivery against its webhook, disabling it when its
    /// failures run long enough under these rules ([`disable::failed_delivery`]).
    pub(crate) async fn failed_delivery(
        &self,
        webhook: Uuid,
        account: Option<Uuid>,
        error: &str,
    ) -> Result<(), sqlx::Error> {
        let (failures, after) = (self.rules.disable_after_failures, self.rules.disable_after);
        disable::failed_delivery(&self.db, failures, after, webhook, account, error).await
    }

    async fn prune(&self) -> Result<(), sqlx::Error> {
        // An event emitted while its webhook's disable committed can still
        // have queued a row (the emit read the webhook before): given up.
        sqlx::query(
            "UPDATE webhook_deliveries d SET status = 'failed', last_error = $1
               FROM webhooks w
              WHERE w.id = d.webhook_id AND w.disabled_at IS NOT NULL AND d.status = 'pending'",
        )
        .bind(disable::GIVEN_UP)
        .execute(&self.db)
        .await?;
        super::consent::prune_marks(&self.db).await?;
        sqlx::query(&format!(
            "DELETE FROM webhook_deliveries WHERE status <> 'pending' AND created_at < now() - interval '{KEEP_DELIVERIES}'"
        ))
        .execute(&self.db)
        .await?;
        // Customers' site reports: corroboration looks back an hour, the
        // audit a month (docs/health.md); the table does not grow for good.
        sqlx::query("DELETE FROM site_reports WHERE created_at < now() - interval '30 days'")
            .execute(&self.db)
            .await?;
        for table in ["quota_usage", "quota_notices"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE window_start < now() - interval '{KEEP_QUOTA_ROWS}'"
            ))
            .execute(&self.db)
            .await?;
        }
        Ok(())
    }
}

/// 1.0 to 1.1: retries of many deliveries that failed together spread out.
fn jitter() -> f64 {
    use rand::Rng;
    rand::thread_rng().gen_range(1.0..1.1)
}

/// A client for one attempt: no proxy from the environment, no redirects,
/// bounded timeouts, and a name dialled only at `addrs` (checked just now).
fn client(
    target: &target::Target,
    addrs: &[SocketAddr],
) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(TOTAL_TIMEOUT)
        .user_agent(concat!("proxynet-webhooks/", env!("CARGO_PKG_VERSION")));
    if target.literal.is_none() {
        builder = builder.resolve_to_addrs(&target.host, addrs);
    }
    builder.build()
}

/// An error as the delivery history shows it: what failed, never the URL
/// (it may carry the receiver's own token).
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(&e);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests;
