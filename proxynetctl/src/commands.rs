//! Each subcommand: the operation it calls (only those of the control API's
//! `operations()` table) and how its answer is shown. One file per resource;
//! this root sends each subcommand to its file, `common` holds what they share.

use reqwest::Method;
use serde_json::Value;

use crate::cli::Command;

mod abuse;
mod accounts;
mod api;
mod audit;
mod common;
mod consent;
mod dedicated;
mod enrollment_tokens;
mod entitlements;
mod exits;
mod health;
mod invoices;
mod keys;
mod plans;
mod policy;
mod sessions;
mod sites;
mod sources;
mod usage;
mod users;
mod webhooks;

pub(crate) use self::common::Ctx;
use self::common::{object, Done, View};

pub(crate) async fn run(ctx: &Ctx, command: Command) -> Done {
    match command {
        Command::Accounts(c) => accounts::run(ctx, c).await,
        Command::Users(c) => users::run(ctx, c).await,
        Command::Keys(c) => keys::run(ctx, c).await,
        Command::Plans(c) => plans::run(ctx, c).await,
        Command::Entitlements(c) => entitlements::run(ctx, c).await,
        Command::Policy(c) => policy::run(ctx, c).await,
        Command::Sources(c) => sources::run(ctx, c).await,
        Command::Consent(c) => consent::run(ctx, c).await,
        Command::Exits(c) => exits::run(ctx, c).await,
        Command::EnrollmentTokens(c) => enrollment_tokens::run(ctx, c).await,
        Command::Dedicated(c) => dedicated::run(ctx, c).await,
        Command::Sessions(c) => sessions::run(ctx, c).await,
        Command::Sites(c) => sites::run(ctx, c).await,
        Command::Feedback {
            exit,
            session,
            user,
            site,
            verdict,
        } => {
            let body = object(vec![
                ("exit_id", exit.map(Value::String)),
                ("session", session.map(Value::String)),
                ("user_id", user.map(Value::String)),
                ("site", Some(Value::String(site))),
                ("verdict", Some(Value::String(verdict))),
            ]);
            ctx.one(Method::POST, "/v1/feedback", Some(body), View::Fields)
                .await
                .map(drop)
        }
        Command::Usage(a) => usage::run(ctx, a).await,
        Command::Invoices(a) => invoices::run(ctx, a).await,
        Command::Abuse(c) => abuse::run(ctx, c).await,
        Command::Webhooks(c) => webhooks::run(ctx, c).await,
        Command::Audit(a) => audit::run(ctx, a).await,
        Command::Health => health::run(ctx).await,
        Command::Api(a) => api::run(ctx, a).await,
        // Handled before a client exists.
        Command::Completion { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests;
