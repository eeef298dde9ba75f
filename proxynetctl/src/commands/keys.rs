//! `proxynetctl keys`: API keys (`/v1/api-keys`, an account's
//! `/v1/accounts/{id}/api-keys`), minted and revoked; a key is shown once.

use reqwest::Method;
use serde_json::json;

use super::common::{Ctx, Done, View};
use crate::cli::Keys;
use crate::client::path;
use crate::output::{col, fmt, Col, Fmt};

const KEYS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("ACCOUNT", "account_id"),
    col("MINTED BY", "minted_by"),
    fmt("CREATED", "created_at", Fmt::Time),
    fmt("LAST USED", "last_used_at", Fmt::Time),
    fmt("REVOKED", "revoked_at", Fmt::Time),
];

pub(super) async fn run(ctx: &Ctx, c: Keys) -> Done {
    match c {
        Keys::List { account, page } => {
            let p = path(&["v1", "accounts", &account, "api-keys"])?;
            ctx.list(&p, &[], page.into(), KEYS).await
        }
        Keys::Create {
            account,
            operator: _,
            name,
        } => {
            let p = match &account {
                Some(a) => path(&["v1", "accounts", a, "api-keys"])?,
                None => "/v1/api-keys".to_owned(),
            };
            ctx.one(
                Method::POST,
                &p,
                Some(json!({ "name": name })),
                View::Fields,
            )
            .await?;
            if !ctx.json() {
                eprintln!("the key is shown once: store it now");
            }
            Ok(())
        }
        Keys::Revoke { id } => {
            let p = path(&["v1", "api-keys", &id])?;
            ctx.no_content(
                Method::DELETE,
                &p,
                None,
                format!("key {id} revoked, with every key it minted"),
            )
            .await
        }
    }
}
