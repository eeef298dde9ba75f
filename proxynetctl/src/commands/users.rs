//! `proxynetctl users`: an account's proxy users (`/v1/accounts/{id}/users`,
//! `/v1/users/{id}`), their passwords, limits, policy, allow-lists and quota.

use reqwest::Method;
use serde_json::{json, Map, Value};

use super::common::{object, Ctx, Done, View};
use crate::cli::Users;
use crate::client::path;
use crate::error::Failure;
use crate::output::{col, fmt, Col, Fmt};

const USERS: &[Col] = &[
    col("ID", "id"),
    col("USERNAME", "username"),
    fmt("ENABLED", "enabled", Fmt::YesNo),
    col("TUNNELS", "max_concurrent_tunnels"),
    col("NEW/S", "max_new_tunnels_per_second"),
    fmt("BANDWIDTH", "bandwidth_bytes", Fmt::Bytes),
    col("PERIOD", "quota_period"),
    fmt("UPDATED", "updated_at", Fmt::Time),
];

pub(super) async fn run(ctx: &Ctx, c: Users) -> Done {
    match c {
        Users::List { account, page } => {
            let p = path(&["v1", "accounts", &account, "users"])?;
            ctx.list(&p, &[], page.into(), USERS).await
        }
        Users::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "users", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Users::Create {
            account,
            username,
            password_stdin,
            limits,
            allowed_source_cidrs,
            allowlist_options,
        } => {
            if !password_stdin {
                return Err(Failure::usage(
                    "a new user needs a password: pipe it in with --password-stdin \
                     (e.g. printf '%s\\n' \"$PASSWORD\" | proxynetctl users create ACCOUNT NAME --password-stdin)",
                ));
            }
            let limits = limits.map(|l| ctx.json_arg("--limits", &l)).transpose()?;
            let password = ctx.password()?;
            let body = object(vec![
                ("username", Some(json!(username))),
                ("password", Some(json!(password))),
                ("limits", limits),
                (
                    "allowed_source_cidrs",
                    (!allowed_source_cidrs.is_empty()).then(|| json!(allowed_source_cidrs)),
                ),
                ("allowlist_options", allowlist_options.map(Value::String)),
            ]);
            let p = path(&["v1", "accounts", &account, "users"])?;
            ctx.one(Method::POST, &p, Some(body), View::Fields)
                .await
                .map(drop)
        }
        Users::Update {
            id,
            enabled,
            password_stdin,
            limits,
            policy,
            allowed_source_cidrs,
            no_allowed_source_cidrs,
            allowlist_options,
        } => {
            let limits = limits.map(|l| ctx.json_arg("--limits", &l)).transpose()?;
            let policy = policy.map(|p| ctx.json_arg("--policy", &p)).transpose()?;
            let password = password_stdin.then(|| ctx.password()).transpose()?;
            let cidrs = if no_allowed_source_cidrs {
                Some(json!([]))
            } else {
                (!allowed_source_cidrs.is_empty()).then(|| json!(allowed_source_cidrs))
            };
            let body = object(vec![
                ("enabled", enabled.map(Value::Bool)),
                ("password", password.map(Value::String)),
                ("limits", limits),
                ("policy", policy),
                ("allowed_source_cidrs", cidrs),
                ("allowlist_options", allowlist_options.map(Value::String)),
            ]);
            if body.as_object().is_some_and(Map::is_empty) {
                return Err(Failure::usage(
                    "nothing to change: give --enabled, --password-stdin, --limits, --policy, \
                     --allowed-source-cidr, --no-allowed-source-cidrs or --allowlist-options",
                ));
            }
            ctx.one(
                Method::PATCH,
                &path(&["v1", "users", &id])?,
                Some(body),
                View::Fields,
            )
            .await
            .map(drop)
        }
        Users::Delete { id } => {
            let p = path(&["v1", "users", &id])?;
            ctx.no_content(Method::DELETE, &p, None, format!("user {id} deleted"))
                .await
        }
        Users::Quota { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "users", &id, "quota"])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
    }
}
