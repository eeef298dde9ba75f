//! `proxynetctl webhooks`: signed webhooks, an account's
//! (`/v1/accounts/{id}/webhooks`) or the operator's (`/v1/webhooks`), and
//! their deliveries.

use reqwest::Method;
use serde_json::json;

use super::common::{Ctx, Done, View};
use crate::cli::Webhooks;
use crate::client::path;
use crate::error::Failure;
use crate::output::{col, fmt, Col, Fmt};

const WEBHOOKS: &[Col] = &[
    col("ID", "id"),
    col("ACCOUNT", "account_id"),
    col("URL", "url"),
    col("EVENTS", "events"),
    fmt("ENABLED", "enabled", Fmt::YesNo),
    col("FAILED IN A ROW", "failed_deliveries_in_row"),
    fmt("CREATED", "created_at", Fmt::Time),
];

const DELIVERIES: &[Col] = &[
    col("ID", "id"),
    col("EVENT", "event"),
    col("STATUS", "status"),
    col("ATTEMPTS", "attempts"),
    col("CODE", "last_status_code"),
    fmt("CREATED", "created_at", Fmt::Time),
    fmt("DELIVERED", "delivered_at", Fmt::Time),
    col("ERROR", "last_error"),
];

/// `/v1/accounts/{id}/webhooks...` or `/v1/webhooks...`.
pub(super) fn webhooks_path(account: Option<&str>, rest: &[&str]) -> Result<String, Failure> {
    let mut segments: Vec<&str> = match account {
        Some(a) => vec!["v1", "accounts", a, "webhooks"],
        None => vec!["v1", "webhooks"],
    };
    segments.extend_from_slice(rest);
    path(&segments)
}

pub(super) async fn run(ctx: &Ctx, c: Webhooks) -> Done {
    match c {
        Webhooks::List { account } => {
            ctx.whole(&webhooks_path(account.as_deref(), &[])?, &[], WEBHOOKS)
                .await
        }
        Webhooks::Create {
            account,
            url,
            events,
        } => {
            ctx.one(
                Method::POST,
                &webhooks_path(account.as_deref(), &[])?,
                Some(json!({ "url": url, "events": events })),
                View::Fields,
            )
            .await?;
            if !ctx.json() {
                eprintln!("the secret is shown once: give it to the receiver to check signatures");
            }
            Ok(())
        }
        Webhooks::Enable { id, account } => set_webhook_enabled(ctx, &id, account, true).await,
        Webhooks::Disable { id, account } => set_webhook_enabled(ctx, &id, account, false).await,
        Webhooks::Delete { id, account } => {
            let p = webhooks_path(account.as_deref(), &[&id])?;
            ctx.no_content(Method::DELETE, &p, None, format!("webhook {id} deleted"))
                .await
        }
        Webhooks::Deliveries { id, account, page } => {
            let p = webhooks_path(account.as_deref(), &[&id, "deliveries"])?;
            ctx.list(&p, &[], page.into(), DELIVERIES).await
        }
    }
}

/// `PATCH …/webhooks/{id} {enabled}`; prints the webhook as it is now.
async fn set_webhook_enabled(ctx: &Ctx, id: &str, account: Option<String>, enabled: bool) -> Done {
    ctx.one(
        Method::PATCH,
        &webhooks_path(account.as_deref(), &[id])?,
        Some(json!({ "enabled": enabled })),
        View::Fields,
    )
    .await?;
    Ok(())
}
