//! `proxynetctl accounts`: the customers that own proxy users
//! (`/v1/accounts`), and setting an account's entitlements, policy and plan.

use reqwest::Method;
use serde_json::json;

use super::common::{Ctx, Done, View};
use super::entitlements::set_entitlements;
use crate::cli::Accounts;
use crate::client::path;
use crate::output::{col, fmt, Col, Fmt};

const ACCOUNTS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("PLAN", "plan_id"),
    fmt("CREATED", "created_at", Fmt::Time),
];

pub(super) async fn run(ctx: &Ctx, c: Accounts) -> Done {
    match c {
        Accounts::List(page) => ctx.list("/v1/accounts", &[], page.into(), ACCOUNTS).await,
        Accounts::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "accounts", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Accounts::Create { name } => ctx
            .one(
                Method::POST,
                "/v1/accounts",
                Some(json!({ "name": name })),
                View::Fields,
            )
            .await
            .map(drop),
        Accounts::Delete { id } => {
            let p = path(&["v1", "accounts", &id])?;
            ctx.no_content(Method::DELETE, &p, None, format!("account {id} deleted"))
                .await
        }
        Accounts::SetEntitlements { id, file } => set_entitlements(ctx, &id, &file).await,
        Accounts::SetPolicy { id, file } => {
            let policy = ctx.json_file("policy", &file)?;
            let p = path(&["v1", "accounts", &id])?;
            ctx.one(
                Method::PATCH,
                &p,
                Some(json!({ "policy": policy })),
                View::Fields,
            )
            .await
            .map(drop)
        }
        Accounts::SetPlan { id, plan } => {
            let p = path(&["v1", "accounts", &id, "plan"])?;
            ctx.no_content(
                Method::PUT,
                &p,
                Some(json!({ "plan_id": plan })),
                format!("account {id} is on plan {plan}"),
            )
            .await
        }
    }
}
