//! HTML fragments of the usage and account pages: usage charts and the
//! domain table, a user's limits, entitlements as a definition list, the
//! dedicated addresses an account holds.

use std::fmt::Write as _;

use super::queries::{HeldAddress, HELD_ADDRESSES_SHOWN};
use crate::routes::dashboard::{bytes, chart, esc, when, Axis};

pub(super) fn usage_sections(
    days: i32,
    per_day: &[(i64, f64)],
    domains: &[(String, i64, i64)],
) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<div class=\"charts\">{}</div>",
        chart(
            &format!("bytes per day, last {days} days (UTC)"),
            per_day,
            bytes,
            Axis::Days
        )
    );
    body.push_str("<h2>By target domain</h2><table class=\"compact\" id=\"usage-domains\"><thead><tr><th scope=\"col\">domain</th><th scope=\"col\">up</th><th scope=\"col\">down</th><th scope=\"col\">total</th></tr></thead><tbody>");
    if domains.is_empty() {
        body.push_str("<tr><td colspan=\"4\">no traffic in this period</td></tr>");
    }
    for (d, up, down) in domains {
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(d),
            bytes(*up as f64),
            bytes(*down as f64),
            bytes((up + down) as f64)
        );
    }
    body.push_str("</tbody></table>");
    body
}

/// Who a dedicated address serves: its users, or all of the account's.
pub(crate) fn users_served(usernames: &[String]) -> String {
    if usernames.is_empty() {
        "all users".to_owned()
    } else {
        esc(&usernames.join(", "))
    }
}

pub(super) fn limit(v: Option<i32>) -> String {
    v.map_or_else(|| "no limit".to_owned(), |n| n.to_string())
}

/// A JSON object's fields as a definition list (sizes with units).
pub(super) fn facts(v: &serde_json::Value) -> String {
    let mut out = String::from("<dl class=\"facts\">");
    let mut any = false;
    if let Some(o) = v.as_object() {
        for (k, val) in o {
            if val.is_null() {
                continue;
            }
            any = true;
            let text = match val {
                serde_json::Value::Number(n) if k.contains("bytes") => {
                    bytes(n.as_f64().unwrap_or(0.0))
                }
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(a) => a
                    .iter()
                    .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join(", "),
                other => other.to_string(),
            };
            let _ = write!(
                out,
                "<dt>{}</dt><dd>{}</dd>",
                esc(&k.replace('_', " ")),
                esc(&text)
            );
        }
    }
    if !any {
        out.push_str("<dt>–</dt><dd>none set</dd>");
    }
    out.push_str("</dl>");
    out
}

/// The account page's table of the dedicated addresses it holds now (an
/// exit links to its page for operators, who alone may see it).
pub(super) fn held_addresses(held: &Result<Vec<HeldAddress>, sqlx::Error>, op: bool) -> String {
    let mut out = String::from(
        "<h2>Dedicated addresses</h2><div class=\"scroll\"><table class=\"compact\" id=\"dedicated-ips\"><thead><tr>\
<th scope=\"col\">address</th><th scope=\"col\">exit</th><th scope=\"col\">country</th>\
<th scope=\"col\">since</th><th scope=\"col\">serves</th></tr></thead><tbody>",
    );
    match held {
        Ok(held) if held.is_empty() => {
            out.push_str("<tr><td colspan=\"5\">no dedicated addresses</td></tr>");
        }
        Ok(held) => {
            for h in held {
                let exit = if op {
                    format!(
                        "<a href=\"/dashboard/exits/{}\">{}</a>",
                        h.exit_id,
                        esc(&h.exit_name)
                    )
                } else {
                    esc(&h.exit_name)
                };
                let _ = write!(
                    out,
                    "<tr data-address=\"{a}\"><td><code>{a}</code></td><td>{exit}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(&h.country),
                    when(h.allocated_at),
                    users_served(&h.users),
                    a = esc(&h.address),
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the account's dedicated addresses");
            out.push_str(
                "<tr><td colspan=\"5\">the dedicated addresses cannot be read right now</td></tr>",
            );
        }
    }
    out.push_str("</tbody></table></div>");
    if held
        .as_ref()
        .is_ok_and(|held| held.len() as i64 >= HELD_ADDRESSES_SHOWN)
    {
        let _ = write!(
            out,
            "<p class=\"note\">The first {HELD_ADDRESSES_SHOWN} by allocation; \
<code>GET /v1/accounts/{{id}}/dedicated-ips</code> lists every one.</p>"
        );
    }
    out
}
