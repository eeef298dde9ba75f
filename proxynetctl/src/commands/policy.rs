//! `proxynetctl policy`: traffic policy by target domain, the operator's
//! (`/v1/policy`), an account's or a user's (the `policy` field of each).

use reqwest::Method;
use serde_json::{json, Value};

use super::common::{Ctx, Done};
use crate::cli::Policy;
use crate::client::path;
use crate::output;

pub(super) async fn run(ctx: &Ctx, c: Policy) -> Done {
    match c {
        Policy::Get { owner } => {
            let p = match (&owner.account, &owner.user) {
                (Some(a), _) => path(&["v1", "accounts", a])?,
                (None, Some(u)) => path(&["v1", "users", u])?,
                (None, None) => {
                    let answer = ctx
                        .client
                        .send(Method::GET, "/v1/policy", &[], None)
                        .await?;
                    answer.json()?;
                    return output::print_json_text(&answer.text());
                }
            };
            let v = ctx.client.get(&p, &[]).await?;
            ctx.derived_json(v.get("policy").unwrap_or(&Value::Null))
        }
        Policy::Set { owner, file } => {
            let mut body = ctx.json_file("policy", &file)?;
            let (method, p, body) = match (&owner.account, &owner.user) {
                (Some(a), _) => (
                    Method::PATCH,
                    path(&["v1", "accounts", a])?,
                    json!({ "policy": body }),
                ),
                (None, Some(u)) => (
                    Method::PATCH,
                    path(&["v1", "users", u])?,
                    json!({ "policy": body }),
                ),
                (None, None) => {
                    // What `policy get` printed, read-only fields and all.
                    if let Some(map) = body.as_object_mut() {
                        map.remove("version");
                        map.remove("updated_at");
                    }
                    (Method::PUT, "/v1/policy".to_owned(), body)
                }
            };
            let answer = ctx
                .client
                .send(method, &p, &[], Some(crate::client::Body::Json(body)))
                .await?;
            let v = answer.json()?;
            match (&owner.account, &owner.user) {
                (None, None) => output::print_json_text(&answer.text()),
                _ => ctx.derived_json(v.get("policy").unwrap_or(&Value::Null)),
            }
        }
    }
}
