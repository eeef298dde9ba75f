//! `proxynetctl audit`: the audit log (`/v1/audit`), newest first.

use serde_json::Value;

use super::common::{query, Ctx, Done};
use crate::cli::AuditArgs;
use crate::output::{col, custom, fmt, Col, Fmt};

const AUDIT: &[Col] = &[
    col("ID", "id"),
    fmt("AT", "at", Fmt::Time),
    col("ACTOR", "actor"),
    col("ACTION", "action"),
    col("SUBJECT", "subject"),
    custom("DETAIL", |v| {
        let text = v.get("detail").map(Value::to_string).unwrap_or_default();
        if text.chars().count() > 80 {
            format!("{}...", text.chars().take(77).collect::<String>())
        } else {
            text
        }
    }),
];

pub(super) async fn run(ctx: &Ctx, a: AuditArgs) -> Done {
    let q = query(&[
        ("action", a.action.as_deref()),
        ("subject", a.subject.as_deref()),
        ("actor", a.actor.as_deref()),
        ("from", a.from.as_deref()),
        ("to", a.to.as_deref()),
    ]);
    ctx.list("/v1/audit", &q, a.page.into(), AUDIT).await
}
