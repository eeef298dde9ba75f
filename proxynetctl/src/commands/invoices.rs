//! `proxynetctl invoices`: an account's invoice for a month
//! (`/v1/accounts/{id}/invoices`): its lines, dedicated addresses and total.

use reqwest::Method;
use serde_json::{json, Value};

use super::common::{query, Ctx, Done};
use crate::cli::InvoiceArgs;
use crate::client::path;
use crate::output::{self, col, custom, fmt, Col, Fmt};

pub(super) fn cents(v: &Value, key: &str) -> String {
    match v.get(key).and_then(Value::as_i64) {
        Some(c) => format!("{}.{:02}", c / 100, (c % 100).abs()),
        None => "-".into(),
    }
}

const INVOICE_LINES: &[Col] = &[
    col("SOURCE TYPE", "source_type"),
    fmt("UP", "bytes_up", Fmt::Bytes),
    fmt("DOWN", "bytes_down", Fmt::Bytes),
    col("GB", "gb"),
    col("CENTS/GB", "cents_per_gb"),
    custom("AMOUNT", |v| cents(v, "amount_cents")),
];

/// An invoice's dedicated addresses: one line per allocation interval in
/// the month (docs/dedicated.md).
pub(super) const INVOICE_DEDICATED: &[Col] = &[
    col("DEDICATED", "ip"),
    col("EXIT", "exit_id"),
    fmt("FROM", "from", Fmt::Time),
    fmt("TO", "to", Fmt::Time),
    col("DAYS", "address_days"),
    col("CENTS/MONTH", "cents_per_month"),
    custom("AMOUNT", |v| cents(v, "amount_cents")),
];

pub(super) async fn run(ctx: &Ctx, a: InvoiceArgs) -> Done {
    let q = query(&[
        ("month", a.month.as_deref()),
        ("format", a.csv.then_some("csv")),
    ]);
    let p = path(&["v1", "accounts", &a.account, "invoices"])?;
    let answer = ctx.client.send(Method::GET, &p, &q, None).await?;
    if a.csv || !answer.is_json() {
        return output::print_raw(&answer.text());
    }
    let v = answer.json()?;
    if ctx.json() {
        return output::print_json_text(&answer.text());
    }
    let rows = v
        .get("lines")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut lines = output::fields(&json!({
        "account_id": v.get("account_id"),
        "month": v.get("month"),
        "plan_id": v.get("plan_id"),
    }));
    lines.push(String::new());
    lines.extend(output::table(INVOICE_LINES, &rows));
    let dedicated = v
        .get("dedicated")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !dedicated.is_empty() {
        lines.push(String::new());
        lines.extend(output::table(INVOICE_DEDICATED, &dedicated));
        if let Some(days) = v.get("address_days") {
            lines.push(format!("address days  {days}"));
        }
    }
    lines.push(String::new());
    lines.push(format!("total  {}", cents(&v, "total_cents")));
    output::print_lines(&lines)
}
