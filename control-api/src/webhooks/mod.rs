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
//! webhook (its receiver kept failing, or its owner paused it) gets nothing.

pub mod consent;
pub mod delivery;
pub mod disable;
pub mod quota;
pub(crate) mod routes;
pub mod target;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

pub use delivery::{Deliverer, DeliveryRules};

/// What a webhook can subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventType {
    QuotaWarning,
    QuotaExhausted,
    KeyRevoked,
    ExitWithdrawn,
    WebhookDisabled,
}

impl EventType {
    pub const ALL: [EventType; 5] = [
        EventType::QuotaWarning,
        EventType::QuotaExhausted,
        EventType::KeyRevoked,
        EventType::ExitWithdrawn,
        EventType::WebhookDisabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::QuotaWarning => "quota.warning",
            EventType::QuotaExhausted => "quota.exhausted",
            EventType::KeyRevoked => "key.revoked",
            EventType::ExitWithdrawn => "exit.withdrawn",
            EventType::WebhookDisabled => "webhook.disabled",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Events about the exit fleet, which only operator webhooks receive.
    pub fn operator_only(self) -> bool {
        matches!(self, EventType::ExitWithdrawn)
    }
}

/// Wakes this process's delivery workers (after a commit that emitted).
static WAKE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Tells this process's delivery worker that rows were committed: it looks
/// at once instead of at its next poll. Call it after the commit.
pub fn wake() {
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

/// Emits `event` inside `tx`: a pending delivery for every enabled webhook
/// that subscribed to it — the account's own (when `account` is given and
/// not deleted) and the operator's. Returns how many; [`wake`] after the
/// commit.
pub async fn emit(
    tx: &mut Transaction<'_, Postgres>,
    event: EventType,
    account: Option<Uuid>,
    data: Value,
) -> Result<u64, sqlx::Error> {
    let event_id = Uuid::new_v4();
    let body = body(event_id, event, Utc::now(), &data);
    let inserted = sqlx::query(
        "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event, body)
         SELECT gen_random_uuid(), w.id, $1, $2, $3 FROM webhooks w
          WHERE $2 = ANY (w.events) AND w.disabled_at IS NULL
            AND (w.account_id IS NULL
                 OR (w.account_id = $4 AND NOT $5
                     AND EXISTS (SELECT 1 FROM accounts a WHERE a.id = w.account_id AND a.deleted_at IS NULL)))",
    )
    .bind(event_id)
    .bind(event.as_str())
    .bind(&body)
    .bind(account)
    .bind(event.operator_only())
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted > 0 {
        metrics::counter!("proxynet_webhook_events_total", "event" => event.as_str()).increment(1);
    }
    Ok(inserted)
}

/// Why keys were revoked together.
#[derive(Debug, Clone, Copy)]
pub enum KeysRevoked {
    /// `DELETE /v1/api-keys/{id}`: this key, and the keys minted under it.
    Named(Uuid),
    /// `DELETE /v1/accounts/{id}`: every key of the account.
    AccountDeleted,
}

/// `key.revoked` for each of `keys`, revoked in `tx` for `cause`, by `actor`.
pub async fn keys_revoked(
    tx: &mut Transaction<'_, Postgres>,
    keys: &[Uuid],
    cause: KeysRevoked,
    actor: &str,
) -> Result<(), sqlx::Error> {
    if keys.is_empty() {
        return Ok(());
    }
    #[derive(sqlx::FromRow)]
    struct Revoked {
        id: Uuid,
        account_id: Option<Uuid>,
        name: String,
        minted_by: Option<Uuid>,
        revoked_at: Option<DateTime<Utc>>,
    }
    let rows: Vec<Revoked> = sqlx::query_as(
        "SELECT id, account_id, name, minted_by, revoked_at FROM api_keys WHERE id = ANY ($1)",
    )
    .bind(keys)
    .fetch_all(&mut **tx)
    .await?;
    for Revoked {
        id,
        account_id: account,
        name,
        minted_by,
        revoked_at,
    } in rows
    {
        let data = json!({
            "key_id": id,
            "account_id": account,
            "name": name,
            "minted_by": minted_by,
            "revoked_at": revoked_at,
            "revoked_by": actor,
            // Revoked because the key that minted it (or one above) was.
            "cascade_from": match cause {
                KeysRevoked::Named(root) => (id != root).then_some(root),
                KeysRevoked::AccountDeleted => None,
            },
            "cause": match cause {
                KeysRevoked::Named(root) if id == root => "revoked",
                KeysRevoked::Named(_) => "cascade",
                KeysRevoked::AccountDeleted => "account_deleted",
            },
        });
        emit(tx, EventType::KeyRevoked, account, data).await?;
    }
    Ok(())
}

/// Why an exit left the pool: for good after an opt-out (until an operator
/// reinstates it), or until a new consent is recorded (revoked, expired).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// The exit's owner ran `exit-agent opt-out`.
    OptOut,
    /// Its consent record was revoked.
    ConsentRevoked,
    /// Its consent record's `expires_at` passed ([`consent`]).
    ConsentExpired,
}

/// `exit.withdrawn` for `exit` (operator webhooks only), inside `tx`.
pub async fn exit_withdrawn(
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
