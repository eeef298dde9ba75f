//! Signed webhooks (docs/webhooks.md): subscriptions, a Postgres outbox and
//! the worker that empties it.
//!
//! An event is *emitted* by inserting one `webhook_deliveries` row per
//! subscribed webhook in the transaction of the change that caused it (a key
//! revocation, an exit's withdrawal, the usage batch that crossed a quota),
//! so a rolled-back change sends nothing and a committed one loses nothing.
//! After the commit the caller [`wake`]s this instance's worker; the worker
//! also polls every second for rows other instances wrote. Any number of
//! control-apis may run the worker: a row is claimed with `FOR UPDATE SKIP
//! LOCKED`, and its `next_attempt_at` moved past the attempt's timeout is the
//! lease ([`delivery`]).
//!
//! Who receives what: an account's webhooks get that account's events; the
//! operator's webhooks (`/v1/webhooks`, `account_id` NULL) get every
//! account's events and the operator-only `exit.withdrawn`. A disabled
//! webhook (its receiver kept failing, or its owner or the operator paused
//! it) gets nothing.
//!
//! An account's webhooks hold at most [`max_pending_per_account`] pending
//! deliveries together: past it, new events are not queued for them (and
//! are counted), so an account whose receivers are gone cannot grow the
//! outbox without bound. Operator webhooks are not capped.

pub(crate) mod consent;
pub(crate) mod delivery;
pub(crate) mod disable;
pub(crate) mod quota;
pub(crate) mod routes;
pub(crate) mod target;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::{Postgres, Transaction};
use std::sync::atomic::{AtomicU64, Ordering};
use uuid::Uuid;

pub(crate) use delivery::{Deliverer, DeliveryRules};

/// What a webhook can subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum EventType {
    QuotaWarning,
    QuotaExhausted,
    KeyRevoked,
    ExitWithdrawn,
    WebhookDisabled,
    DedicatedIpAllocated,
    DedicatedIpReleased,
    DedicatedIpReplaced,
    DedicatedIpMoved,
}

impl EventType {
    pub(crate) const ALL: [EventType; 9] = [
        EventType::QuotaWarning,
        EventType::QuotaExhausted,
        EventType::KeyRevoked,
        EventType::ExitWithdrawn,
        EventType::WebhookDisabled,
        EventType::DedicatedIpAllocated,
        EventType::DedicatedIpReleased,
        EventType::DedicatedIpReplaced,
        EventType::DedicatedIpMoved,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::QuotaWarning => "quota.warning",
            EventType::QuotaExhausted => "quota.exhausted",
            EventType::KeyRevoked => "key.revoked",
            EventType::ExitWithdrawn => "exit.withdrawn",
            EventType::WebhookDisabled => "webhook.disabled",
            EventType::DedicatedIpAllocated => "dedicated_ip.allocated",
            EventType::DedicatedIpReleased => "dedicated_ip.released",
            EventType::DedicatedIpReplaced => "dedicated_ip.replaced",
            EventType::DedicatedIpMoved => "dedicated_ip.moved",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Events about the exit fleet, which only operator webhooks receive.
    pub(crate) fn operator_only(self) -> bool {
        matches!(self, EventType::ExitWithdrawn)
    }
}

// As a subscription names it: one of the names of `EventType::ALL`.
impl schemars::JsonSchema for EventType {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventType".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut schema = serde_json::Map::new();
        schema.insert("type".into(), "string".into());
        let names: Value = EventType::ALL.iter().map(|e| e.as_str()).collect();
        schema.insert("enum".into(), names);
        schema.insert(
            "description".into(),
            "An event a webhook can subscribe to".into(),
        );
        schemars::Schema::from(schema)
    }
}

/// Wakes this process's delivery workers (after a commit that emitted).
static WAKE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Tells this process's delivery worker that rows were committed: it looks
/// at once instead of at its next poll. Call it after the commit.
pub(crate) fn wake() {
    WAKE.notify_waiters();
}

/// The JSON body every delivery of an event carries (and is signed over).
fn body(event_id: Uuid, event: EventType, created_at: DateTime<Utc>, data: &Value) -> String {
    json!({
        "id": event_id,
        "type": event.as_str(),
        "created_at": created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": data,
    })
    .to_string()
}

/// Pending deliveries an account's webhooks may hold together, by default
/// (`--webhook-max-pending-per-account`).
pub(crate) const MAX_PENDING_PER_ACCOUNT: u64 = 1000;

/// The cap in force in this process (0: none). A process-wide setting, not
/// a parameter: events are emitted from the routes, the ledger writer, the
/// delivery worker and the consent sweep, and every one of them obeys the
/// same cap.
static PENDING_CAP: AtomicU64 = AtomicU64::new(MAX_PENDING_PER_ACCOUNT);

/// Sets the cap on an account's pending deliveries (0: none); the
/// control-api sets it from its configuration at start.
pub(crate) fn set_max_pending_per_account(cap: u64) {
    PENDING_CAP.store(cap, Ordering::Relaxed);
}

/// The cap on an account's pending deliveries in force (0: none).
pub(crate) fn max_pending_per_account() -> u64 {
    PENDING_CAP.load(Ordering::Relaxed)
}

/// Whose webhooks an event is queued for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Audience {
    /// The account's (when there is one) and the operator's.
    Everyone,
    /// The operator's only.
    Operator,
    /// The account's only.
    Account,
}

/// Emits `event` inside `tx`: a pending delivery for every enabled webhook
/// that subscribed to it — the account's own (when `account` is given, not
/// deleted, and its webhooks' backlog is below the cap) and the operator's.
/// Returns how many; [`wake`] after the commit.
pub(crate) async fn emit(
    tx: &mut Transaction<'_, Postgres>,
    event: EventType,
    account: Option<Uuid>,
    data: Value,
) -> Result<u64, sqlx::Error> {
    emit_to(tx, event, account, Audience::Everyone, data).await
}

/// [`emit`] to `audience` only.
async fn emit_to(
    tx: &mut Transaction<'_, Postgres>,
    event: EventType,
    account: Option<Uuid>,
    audience: Audience,
    data: Value,
) -> Result<u64, sqlx::Error> {
    let to_operator = audience != Audience::Account;
    let mut to_account = audience != Audience::Operator && !event.operator_only();
    if let (Some(account), true) = (account, to_account) {
        if backlog_full(tx, account).await? {
            to_account = false;
            dropped(tx, event, account).await?;
        }
    }
    let event_id = Uuid::new_v4();
    let body = body(event_id, event, Utc::now(), &data);
    let inserted = sqlx::query(
        "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event, body, source_account)
         SELECT gen_random_uuid(), w.id, $1, $2, $3, $4 FROM webhooks w
          WHERE $2 = ANY (w.events) AND w.disabled_at IS NULL
            AND ((w.account_id IS NULL AND $6)
                 OR (w.account_id = $4 AND $5
                     AND EXISTS (SELECT 1 FROM accounts a WHERE a.id = w.account_id AND a.deleted_at IS NULL)))",
    )
    .bind(event_id)
    .bind(event.as_str())
    .bind(&body)
    .bind(account)
    .bind(to_account)
    .bind(to_operator)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted > 0 {
        metrics::counter!("proxynet_webhook_events_total", "event" => event.as_str()).increment(1);
    }
    Ok(inserted)
}

/// Whether `account`'s webhooks hold the cap's worth of pending deliveries
/// already. Counts at most the cap's rows (an index on pending rows by
/// webhook, and an account has at most ten webhooks). Two transactions
/// emitting at once may each see room for one more: the cap is a bound on
/// growth, not an exact count.
async fn backlog_full(
    tx: &mut Transaction<'_, Postgres>,
    account: Uuid,
) -> Result<bool, sqlx::Error> {
    let cap = max_pending_per_account();
    if cap == 0 {
        return Ok(false);
    }
    let cap = i64::try_from(cap).unwrap_or(i64::MAX);
    let (pending,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM (
             SELECT 1 FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
              WHERE w.account_id = $1 AND d.status = 'pending'
              LIMIT $2) AS queued",
    )
    .bind(account)
    .bind(cap)
    .fetch_one(&mut **tx)
    .await?;
    Ok(pending >= cap)
}

/// Counts (metric and log) the deliveries `event` would have queued for
/// `account`'s webhooks had their backlog not been full.
async fn dropped(
    tx: &mut Transaction<'_, Postgres>,
    event: EventType,
    account: Uuid,
) -> Result<(), sqlx::Error> {
    let (webhooks,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM webhooks
          WHERE account_id = $1 AND $2 = ANY (events) AND disabled_at IS NULL",
    )
    .bind(account)
    .bind(event.as_str())
    .fetch_one(&mut **tx)
    .await?;
    if webhooks > 0 {
        metrics::counter!("proxynet_webhook_deliveries_dropped_total",
            "event" => event.as_str(), "reason" => "account_backlog")
        .increment(u64::try_from(webhooks).unwrap_or(0));
        tracing::warn!(account = %account, event = event.as_str(), webhooks,
            cap = max_pending_per_account(),
            "an account's webhooks hold the most pending deliveries allowed; the event is not queued for them");
    }
    Ok(())
}

/// Why keys were revoked together.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeysRevoked {
    /// `DELETE /v1/api-keys/{id}`: this key, and the keys minted under it.
    Named(Uuid),
    /// `DELETE /v1/accounts/{id}`: every key of the account.
    AccountDeleted,
}

/// A revoked key, as `key.revoked` describes it.
#[derive(sqlx::FromRow)]
struct RevokedKey {
    id: Uuid,
    account_id: Option<Uuid>,
    name: String,
    minted_by: Option<Uuid>,
    revoked_at: Option<DateTime<Utc>>,
}

/// `key.revoked` for `keys`, revoked together in `tx` for `cause`, by
/// `actor`: one event for the lot, not one per key, so a cascade through a
/// long lineage queues one delivery per webhook. Its fields describe the
/// key the request named (else the first key revoked) and
/// `revoked_key_ids` lists every key revoked, oldest first.
///
/// When the keys belong to more than one owner (an operator key and the
/// account keys it minted), operator webhooks get one event listing them
/// all and each account's webhooks one listing that account's keys only:
/// an account hears nothing of the operator's keys or of other accounts'.
pub(crate) async fn keys_revoked(
    tx: &mut Transaction<'_, Postgres>,
    keys: &[Uuid],
    cause: KeysRevoked,
    actor: &str,
) -> Result<(), sqlx::Error> {
    if keys.is_empty() {
        return Ok(());
    }
    // A key is created after the key that minted it: oldest first puts the
    // top of the lineage first.
    let rows: Vec<RevokedKey> = sqlx::query_as(
        "SELECT id, account_id, name, minted_by, revoked_at FROM api_keys
          WHERE id = ANY ($1) ORDER BY created_at, id",
    )
    .bind(keys)
    .fetch_all(&mut **tx)
    .await?;
    let all: Vec<&RevokedKey> = rows.iter().collect();
    let mut owners: Vec<Option<Uuid>> = Vec::new();
    for row in &rows {
        if !owners.contains(&row.account_id) {
            owners.push(row.account_id);
        }
    }
    if let [owner] = owners.as_slice() {
        // One owner (the usual case): one event for its webhooks and the
        // operator's, with the same id everywhere.
        if let Some(data) = revoked_data(&all, cause, actor) {
            emit(tx, EventType::KeyRevoked, *owner, data).await?;
        }
        return Ok(());
    }
    if let Some(data) = revoked_data(&all, cause, actor) {
        let head = head_key(&all, cause).and_then(|k| k.account_id);
        emit_to(tx, EventType::KeyRevoked, head, Audience::Operator, data).await?;
    }
    for account in owners.into_iter().flatten() {
        let own: Vec<&RevokedKey> = all
            .iter()
            .copied()
            .filter(|k| k.account_id == Some(account))
            .collect();
        if let Some(data) = revoked_data(&own, cause, actor) {
            emit_to(
                tx,
                EventType::KeyRevoked,
                Some(account),
                Audience::Account,
                data,
            )
            .await?;
        }
    }
    Ok(())
}

/// The key an event about `keys` describes: the key the request named when
/// it is among them, else the first (the oldest: the top of what is left
/// of the lineage).
fn head_key<'k>(keys: &[&'k RevokedKey], cause: KeysRevoked) -> Option<&'k RevokedKey> {
    let named = match cause {
        KeysRevoked::Named(root) => keys.iter().copied().find(|k| k.id == root),
        KeysRevoked::AccountDeleted => None,
    };
    named.or_else(|| keys.first().copied())
}

/// `key.revoked`'s `data` for `keys` (none when there are none).
fn revoked_data(keys: &[&RevokedKey], cause: KeysRevoked, actor: &str) -> Option<Value> {
    let head = head_key(keys, cause)?;
    let ids: Vec<Uuid> = keys.iter().map(|k| k.id).collect();
    Some(json!({
        "key_id": head.id,
        "account_id": head.account_id,
        "name": head.name,
        "minted_by": head.minted_by,
        "revoked_at": head.revoked_at,
        "revoked_by": actor,
        // Revoked because the key that minted it (or one above) was.
        "cascade_from": match cause {
            KeysRevoked::Named(root) => (head.id != root).then_some(root),
            KeysRevoked::AccountDeleted => None,
        },
        "cause": match cause {
            KeysRevoked::Named(root) if head.id == root => "revoked",
            KeysRevoked::Named(_) => "cascade",
            KeysRevoked::AccountDeleted => "account_deleted",
        },
        "revoked_key_ids": ids,
    }))
}

/// Why an exit left the pool: for good after an opt-out (until an operator
/// reinstates it), or until a new consent is recorded (revoked, expired).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Withdrawal {
    /// The exit's owner ran `exit-agent opt-out`.
    OptOut,
    /// Its consent record was revoked.
    ConsentRevoked,
    /// Its consent record's `expires_at` passed ([`consent`]).
    ConsentExpired,
}

/// `exit.withdrawn` for `exit` (operator webhooks only), inside `tx`.
pub(crate) async fn exit_withdrawn(
    tx: &mut Transaction<'_, Postgres>,
    exit: Uuid,
    cause: Withdrawal,
    reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    let row: Option<(String, String, String, Option<DateTime<Utc>>)> =
        sqlx::query_as("SELECT name, source_type, country, withdrawn_at FROM exits WHERE id = $1")
            .bind(exit)
            .fetch_optional(&mut **tx)
            .await?;
    let Some((name, source_type, country, withdrawn_at)) = row else {
        return Ok(());
    };
    let data = json!({
        "exit_id": exit,
        "name": name,
        "source_type": source_type,
        "country": country,
        "cause": match cause {
            Withdrawal::OptOut => "opt_out",
            Withdrawal::ConsentRevoked => "consent_revoked",
            Withdrawal::ConsentExpired => "consent_expired",
        },
        "reason": reason,
        "withdrawn_at": withdrawn_at,
        "at": Utc::now(),
    });
    emit(tx, EventType::ExitWithdrawn, None, data).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_round_trip_and_only_exit_events_are_the_operators() {
        for e in EventType::ALL {
            assert_eq!(EventType::parse(e.as_str()), Some(e));
        }
        assert_eq!(EventType::parse("quota.other"), None);
        assert!(EventType::ExitWithdrawn.operator_only());
        assert!(!EventType::KeyRevoked.operator_only());
    }

    #[test]
    fn the_body_carries_id_type_time_and_data() {
        let id = Uuid::new_v4();
        let body = body(id, EventType::KeyRevoked, Utc::now(), &json!({"k": 1}));
        let parsed: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed["id"], id.to_string());
        assert_eq!(parsed["type"], "key.revoked");
        assert_eq!(parsed["data"]["k"], 1);
        assert!(parsed["created_at"].as_str().unwrap().ends_with('Z'));
    }
}
