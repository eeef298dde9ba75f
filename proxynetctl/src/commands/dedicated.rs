//! `proxynetctl dedicated`: an account's dedicated addresses
//! (`/v1/accounts/{id}/dedicated-ips`) and the operators' map of every held
//! address (`/v1/dedicated-ips`); docs/dedicated.md. Every answer but a
//! release's 204 is `{"items": [...]}`, shown as a table.

use reqwest::Method;
use serde_json::{json, Value};

use super::common::{object, query, Ctx, Done};
use crate::cli::Dedicated;
use crate::client::{path, Body};
use crate::error::Failure;
use crate::output::{self, col, custom, fmt, Col, Fmt};

/// The users an address serves: `all` when none are listed, and
/// `(operator)` when an operator set them (the account cannot change them).
fn users_cell(v: &Value) -> String {
    let listed: Vec<&str> = v
        .get("users")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let who = if listed.is_empty() {
        "all".to_owned()
    } else {
        listed.join(",")
    };
    if v.get("users_by_operator").and_then(Value::as_bool) == Some(true) {
        format!("{who} (operator)")
    } else {
        who
    }
}

/// The exit by its name, else its id.
fn exit_cell(v: &Value) -> String {
    ["exit_name", "exit_id"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str).filter(|s| !s.is_empty()))
        .unwrap_or("-")
        .to_owned()
}

const DEDICATED: &[Col] = &[
    col("IP", "ip"),
    custom("EXIT", exit_cell),
    col("COUNTRY", "country"),
    col("STATE", "state"),
    custom("USERS", users_cell),
    fmt("SINCE", "allocated_at", Fmt::Time),
];

/// The operators' map: whose each address is.
const MAP: &[Col] = &[
    col("ACCOUNT", "account_id"),
    col("IP", "ip"),
    custom("EXIT", exit_cell),
    col("COUNTRY", "country"),
    col("STATE", "state"),
    custom("USERS", users_cell),
    fmt("SINCE", "allocated_at", Fmt::Time),
];

/// An address as the API's path takes it: a prefix by its network address
/// (`2001:db8:0:1::/64` → `2001:db8:0:1::`).
fn ip_segment(ip: &str) -> &str {
    ip.split_once('/').map_or(ip, |(address, _)| address)
}

/// `/v1/accounts/{id}/dedicated-ips`, then the address and `rest`.
fn account_path(account: &str, ip: Option<&str>, rest: &[&str]) -> Result<String, Failure> {
    let mut segments = vec!["v1", "accounts", account, "dedicated-ips"];
    if let Some(ip) = ip {
        segments.push(ip_segment(ip));
    }
    segments.extend_from_slice(rest);
    path(&segments)
}

/// `POST /v1/accounts/{id}/dedicated-ips`: by count (and targeting), or the
/// addresses named; what was not given is left out.
fn allocate_body(
    count: Option<u64>,
    country: Option<String>,
    city: Option<String>,
    source_type: Option<String>,
    ips: Vec<String>,
    users: Vec<String>,
) -> Value {
    object(vec![
        ("count", count.map(|n| json!(n))),
        ("country", country.map(Value::String)),
        ("city", city.map(Value::String)),
        ("source_type", source_type.map(Value::String)),
        ("ips", (!ips.is_empty()).then(|| json!(ips))),
        ("users", (!users.is_empty()).then(|| json!(users))),
    ])
}

/// `replacements 2026-12: 1 of 2 used (1 left)`, from a listing.
fn replacements(v: &Value) -> Option<String> {
    let r = v.get("replacements")?;
    let period = r.get("period").and_then(Value::as_str).unwrap_or("-");
    let used = r.get("used").and_then(Value::as_i64)?;
    let allowed = r.get("allowed").and_then(Value::as_i64)?;
    Some(format!(
        "replacements {period}: {used} of {allowed} used ({} left)",
        (allowed - used).max(0)
    ))
}

/// An answer's items as a table, then the replacement allowance if the
/// answer has it.
fn lines(v: &Value, cols: &[Col]) -> Vec<String> {
    let items = v
        .get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut lines = output::table(cols, &items);
    if let Some(line) = replacements(v) {
        lines.push(String::new());
        lines.push(line);
    }
    lines
}

/// One request answered `{"items": [...]}`: a table for people, the JSON as
/// it came for scripts.
async fn show(
    ctx: &Ctx,
    method: Method,
    p: &str,
    query: &[(String, String)],
    body: Option<Value>,
    cols: &[Col],
) -> Done {
    let answer = ctx
        .client
        .send(method, p, query, body.map(Body::Json))
        .await?;
    let value = answer.json()?;
    if ctx.json() {
        return output::print_json_text(&answer.text());
    }
    output::print_lines(&lines(&value, cols))
}

pub(super) async fn run(ctx: &Ctx, c: Dedicated) -> Done {
    match c {
        Dedicated::List { account } => {
            let p = account_path(&account, None, &[])?;
            show(ctx, Method::GET, &p, &[], None, DEDICATED).await
        }
        Dedicated::Allocate {
            account,
            count,
            country,
            city,
            source_type,
            ips,
            users,
        } => {
            let p = account_path(&account, None, &[])?;
            let body = allocate_body(count, country, city, source_type, ips, users);
            show(ctx, Method::POST, &p, &[], Some(body), DEDICATED).await
        }
        Dedicated::Release { account, ip } => {
            let p = account_path(&account, Some(ip.as_str()), &[])?;
            ctx.no_content(
                Method::DELETE,
                &p,
                None,
                format!("{ip} released by account {account}"),
            )
            .await
        }
        Dedicated::Replace { account, ip } => {
            let p = account_path(&account, Some(ip.as_str()), &["replace"])?;
            show(ctx, Method::POST, &p, &[], None, DEDICATED).await?;
            if !ctx.json() {
                eprintln!("{ip} is released; the address above replaces it");
            }
            Ok(())
        }
        Dedicated::Assign { account, ip, users } => {
            let p = account_path(&account, Some(ip.as_str()), &["users"])?;
            let body = json!({ "user_ids": users });
            show(ctx, Method::PUT, &p, &[], Some(body), DEDICATED).await
        }
        Dedicated::Map { account } => {
            let q = query(&[("account_id", account.as_deref())]);
            show(ctx, Method::GET, "/v1/dedicated-ips", &q, None, MAP).await
        }
        Dedicated::Move { ip, to } => {
            let p = path(&["v1", "dedicated-ips", ip_segment(&ip), "move"])?;
            let body = json!({ "account_id": to });
            show(ctx, Method::POST, &p, &[], Some(body), MAP).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing() -> Value {
        json!({
            "items": [
                {"ip": "127.0.0.2", "prefix": false, "exit_id": "e1", "exit_name": "exit-127.0.0.2",
                 "account_id": "a1", "country": "DE", "city": "berlin", "source_type": "dc",
                 "allocated_at": "2026-12-01T19:16:01.123456Z", "state": "live", "users": [],
                 "users_by_operator": false, "cents_per_month": 500},
                {"ip": "2001:db8:0:1::/64", "prefix": true, "exit_id": "e2", "exit_name": "",
                 "account_id": "a1", "country": "FR", "city": null, "source_type": "isp",
                 "allocated_at": "2026-12-02T00:00:00Z", "state": "down", "users": ["u1", "u2"],
                 "users_by_operator": true, "cents_per_month": 2000}
            ],
            "replacements": {"period": "2026-12", "used": 1, "allowed": 2}
        })
    }

    #[test]
    fn a_listing_reads_as_its_table_and_allowance() {
        assert_eq!(
            lines(&listing(), DEDICATED),
            vec![
                "IP                 EXIT            COUNTRY  STATE  USERS             SINCE",
                "127.0.0.2          exit-127.0.0.2  DE       live   all               2026-12-01 19:16:01Z",
                "2001:db8:0:1::/64  e2              FR       down   u1,u2 (operator)  2026-12-02 00:00:00Z",
                "",
                "replacements 2026-12: 1 of 2 used (1 left)",
            ]
        );
        // The map names the account; an answer without an allowance has no line for it.
        let mut map = listing();
        if let Some(m) = map.as_object_mut() {
            m.remove("replacements");
        }
        let shown = lines(&map, MAP);
        assert_eq!(shown.len(), 3);
        assert!(shown[0].starts_with("ACCOUNT  IP "));
        assert!(shown[1].starts_with("a1       127.0.0.2 "));
        assert_eq!(
            replacements(&json!({"replacements": {"period": "2026-12", "used": 3, "allowed": 2}})),
            Some("replacements 2026-12: 3 of 2 used (0 left)".to_owned())
        );
    }

    #[test]
    fn requests_name_the_address_and_leave_out_what_was_not_given() {
        assert_eq!(
            account_path("a", Some("2001:db8:0:1::/64"), &["replace"]).unwrap(),
            "/v1/accounts/a/dedicated-ips/2001%3Adb8%3A0%3A1%3A%3A/replace"
        );
        assert_eq!(
            account_path("a", Some("127.0.0.2"), &[]).unwrap(),
            "/v1/accounts/a/dedicated-ips/127.0.0.2"
        );
        assert_eq!(
            account_path("a", None, &[]).unwrap(),
            "/v1/accounts/a/dedicated-ips"
        );
        assert_eq!(
            allocate_body(
                Some(2),
                Some("DE".into()),
                None,
                Some("dc".into()),
                vec![],
                vec![]
            ),
            json!({"count": 2, "country": "DE", "source_type": "dc"})
        );
        assert_eq!(
            allocate_body(
                None,
                None,
                None,
                None,
                vec!["127.0.0.2".into(), "2001:db8:0:1::/64".into()],
                vec!["u1".into()]
            ),
            json!({"ips": ["127.0.0.2", "2001:db8:0:1::/64"], "users": ["u1"]})
        );
    }
}
