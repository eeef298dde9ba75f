//! `proxynetctl consent`: exits' consent records
//! (`/v1/exits/{id}/consent`) and the notices people saw
//! (`/v1/consent-notices`); the grant body is shared with `exits reinstate`.

use reqwest::Method;
use serde_json::{json, Value};

use super::common::{object, Ctx, Done, View};
use crate::cli::{Consent, GrantArgs, Notice};
use crate::client::path;
use crate::output::{self, col, fmt, Col, Fmt};

const CONSENT: &[Col] = &[
    col("VERSION", "version"),
    col("STATE", "state"),
    col("METHOD", "method"),
    col("NOTICE", "notice_version"),
    fmt("GRANTED", "granted_at", Fmt::Time),
    fmt("EXPIRES", "expires_at", Fmt::Time),
    fmt("REVOKED", "revoked_at", Fmt::Time),
    col("RECORDED BY", "recorded_by"),
];

pub(super) fn grant_body(g: GrantArgs) -> Value {
    object(vec![
        ("method", Some(json!(g.method))),
        ("notice_version", Some(json!(g.notice_version))),
        ("notice_sha256", g.notice_sha256.map(Value::String)),
        ("evidence_ref", Some(json!(g.evidence_ref))),
        ("opt_out", Some(json!(g.opt_out))),
        ("granted_at", g.granted_at.map(Value::String)),
        ("expires_at", g.expires_at.map(Value::String)),
    ])
}

pub(super) async fn run(ctx: &Ctx, c: Consent) -> Done {
    match c {
        Consent::History { exit } => {
            ctx.whole(&path(&["v1", "exits", &exit, "consent"])?, &[], CONSENT)
                .await
        }
        Consent::Grant { exit, grant } => ctx
            .one(
                Method::POST,
                &path(&["v1", "exits", &exit, "consent"])?,
                Some(grant_body(grant)),
                View::Fields,
            )
            .await
            .map(drop),
        Consent::Revoke { exit, reason } => ctx
            .one(
                Method::POST,
                &path(&["v1", "exits", &exit, "consent", "revoke"])?,
                Some(json!({ "reason": reason })),
                View::Fields,
            )
            .await
            .map(drop),
        Consent::Notice(Notice::Create { version, file }) => {
            let body = ctx.read_file("notice", &file)?;
            ctx.one(
                Method::POST,
                "/v1/consent-notices",
                Some(json!({ "version": version, "body": body })),
                View::Fields,
            )
            .await
            .map(drop)
        }
        Consent::Notice(Notice::Get { version }) => {
            let p = path(&["v1", "consent-notices", &version])?;
            let answer = ctx.client.send(Method::GET, &p, &[], None).await?;
            if let Some(sha) = answer
                .headers
                .get("proxynet-notice-sha256")
                .and_then(|v| v.to_str().ok())
            {
                eprintln!("sha256: {sha}");
            }
            output::print_raw(&answer.text())
        }
    }
}
