//! `proxynetctl usage`: an account's bytes up and down
//! (`/v1/accounts/{id}/usage`), grouped by the dimensions asked for.

use reqwest::Method;
use serde_json::Value;

use super::common::{query, Ctx, Done};
use crate::cli::UsageArgs;
use crate::client::path;
use crate::output::{self, col, custom, fmt, Col, Fmt};

/// Usage dimensions (their `group_by` names), shown when asked for or
/// when the answer has them.
const USAGE_DIMENSIONS: &[(&str, Col)] = &[
    ("user", col("USER", "user_id")),
    ("exit", col("EXIT", "exit_id")),
    ("day", fmt("DAY", "day", Fmt::Time)),
    ("minute", fmt("MINUTE", "minute", Fmt::Time)),
    ("source_type", col("TYPE", "source_type")),
    ("domain", col("DOMAIN", "domain")),
    ("country", col("COUNTRY", "country")),
];

const USAGE_BYTES: &[Col] = &[
    fmt("UP", "bytes_up", Fmt::Bytes),
    fmt("DOWN", "bytes_down", Fmt::Bytes),
    custom("TOTAL", |v| {
        let n = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        output::bytes(n("bytes_up") + n("bytes_down"))
    }),
];

pub(super) async fn run(ctx: &Ctx, a: UsageArgs) -> Done {
    let q = query(&[
        ("from", a.from.as_deref()),
        ("to", a.to.as_deref()),
        ("group_by", a.group_by.as_deref()),
    ]);
    let p = path(&["v1", "accounts", &a.account, "usage"])?;
    let answer = ctx.client.send(Method::GET, &p, &q, None).await?;
    let value = answer.json()?;
    if ctx.json() {
        return output::print_json_text(&answer.text());
    }
    let rows = value.as_array().cloned().unwrap_or_default();
    // The dimensions the answer was grouped by, then its bytes.
    let asked: Vec<&str> = a
        .group_by
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .collect();
    let mut cols: Vec<Col> = USAGE_DIMENSIONS
        .iter()
        .filter(|(name, c)| {
            asked.contains(name)
                || match c.src {
                    output::Src::Field(f, _) => rows.iter().any(|r| r.get(f).is_some()),
                    output::Src::Custom(_) => false,
                }
        })
        .map(|(_, c)| *c)
        .collect();
    cols.extend_from_slice(USAGE_BYTES);
    output::print_lines(&output::table(&cols, &rows))
}
