//! `proxynetctl sites`: target sites and the exits cooled for each
//! (`/v1/sites`); lifting a cooldown.

use reqwest::Method;
use serde_json::Value;

use super::common::{query, Ctx, Done};
use crate::cli::Sites;
use crate::client::path;
use crate::output::{self, col, custom, Col};

/// A site's fleet cooldowns as `EXIT (TIME LEFT)`, the longest first.
fn cooled_exits(v: &Value) -> String {
    let cooled: Vec<String> = v
        .get("cooled_exits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let exit = c.get("exit_id").and_then(Value::as_str).unwrap_or("-");
            let left = c
                .get("remaining_ms")
                .and_then(Value::as_i64)
                .map_or_else(|| "-".to_owned(), output::millis);
            format!("{exit} ({left})")
        })
        .collect();
    if cooled.is_empty() {
        "-".into()
    } else {
        cooled.join(", ")
    }
}

const SITES: &[Col] = &[
    col("SITE", "site"),
    col("COOLED", "cooled"),
    custom("FOR ONE ACCOUNT", |v| {
        v.get("account_cooled_exits")
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
            .to_string()
    }),
    custom("EXITS (TIME LEFT)", cooled_exits),
];

pub(super) async fn run(ctx: &Ctx, c: Sites) -> Done {
    match c {
        Sites::List { site } => {
            let q = query(&[("site", site.as_deref())]);
            let answer = ctx.client.send(Method::GET, "/v1/sites", &q, None).await?;
            let value = answer.json()?;
            if ctx.json() {
                return output::print_json_text(&answer.text());
            }
            let rows = value
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            output::print_lines(&output::table(SITES, &rows))
        }
        Sites::Lift { site, exit_id } => {
            let p = path(&["v1", "sites", &site, "cooldowns", &exit_id])?;
            ctx.no_content(
                Method::DELETE,
                &p,
                None,
                format!("exit {exit_id} is no longer cooled for {site}"),
            )
            .await
        }
    }
}
