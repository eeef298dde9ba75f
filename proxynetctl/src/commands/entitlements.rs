//! `proxynetctl entitlements`: what an account is granted, read from the
//! account and replaced at `/v1/accounts/{id}/entitlements` (also
//! `accounts set-entitlements`).

use reqwest::Method;
use serde_json::Value;

use super::common::{Ctx, Done, View};
use crate::cli::Entitlements;
use crate::client::path;
use crate::output;

pub(super) async fn set_entitlements(ctx: &Ctx, account: &str, file: &str) -> Done {
    let body = ctx.json_file("entitlements", file)?;
    let p = path(&["v1", "accounts", account, "entitlements"])?;
    ctx.one(Method::PUT, &p, Some(body), View::Fields)
        .await
        .map(drop)
}

pub(super) async fn run(ctx: &Ctx, c: Entitlements) -> Done {
    match c {
        Entitlements::Get { account } => {
            let v = ctx
                .client
                .get(&path(&["v1", "accounts", &account])?, &[])
                .await?;
            let e = v.get("entitlements").cloned().unwrap_or(Value::Null);
            if ctx.json() {
                ctx.derived_json(&e)
            } else {
                output::print_lines(&output::fields(&e))
            }
        }
        Entitlements::Set { account, file } => set_entitlements(ctx, &account, &file).await,
    }
}
