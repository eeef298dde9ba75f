//! The append-only audit log: who changed what, when. Written in the same
//! transaction as the change, so a change without its audit row cannot commit.

use sqlx::{Postgres, Transaction};

pub(crate) async fn record(
    tx: &mut Transaction<'_, Postgres>,
    actor: &str,
    action: &str,
    subject: &str,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit_log (actor, action, subject, detail) VALUES ($1, $2, $3, $4)")
        .bind(actor)
        .bind(action)
        .bind(subject)
        .bind(detail)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
