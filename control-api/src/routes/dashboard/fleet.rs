//! The fleet overview and its table's data (filtered, sorted and paged here,
//! so a 100,000-exit fleet sends the browser one page). One exit's page is
//! [`super::exit`].

use super::*;
use crate::observe::{ExitNow, ExitState};

/// Exits per page of the fleet table.
pub(super) const PER_PAGE: usize = 50;

/// Columns of the exit table: (data key, heading).
const COLUMNS: [(&str, &str); 15] = [
    ("name", "exit"),
    ("source_type", "type"),
    ("country", "country"),
    ("owner", "owner"),
    ("egress_ips", "egress IPs"),
    ("egress_prefixes", "egress prefixes"),
    ("observed_egress", "observed egress"),
    ("egress_verification", "egress check"),
    ("state", "state"),
    ("score", "score"),
    ("probe_rtt_ms", "probe RTT"),
    ("success", "success"),
    ("in_flight", "open tunnels"),
    ("bytes_per_sec", "throughput"),
    ("last_heartbeat_at", "last heartbeat"),
];

/// Top accounts or domains by bytes over the last hour.
async fn top(state: &AppState, by_domain: bool) -> Vec<(String, String, i64)> {
    let sql = if by_domain {
        "SELECT COALESCE(l.domain, 'unknown') AS k, COALESCE(l.domain, 'unknown') AS label,
                SUM(l.bytes_up + l.bytes_down)::bigint AS b
           FROM usage_ledger l WHERE l.minute >= now() - interval '1 hour'
          GROUP BY 1, 2 ORDER BY b DESC LIMIT 10"
    } else {
        "SELECT l.account_id::text AS k, a.name AS label, SUM(l.bytes_up + l.bytes_down)::bigint AS b
           FROM usage_ledger l JOIN accounts a ON a.id = l.account_id
          WHERE l.minute >= now() - interval '1 hour'
          GROUP BY 1, 2 ORDER BY b DESC LIMIT 10"
    };
    sqlx::query_as(sql)
        .fetch_all(&state.db)
        .await
        .unwrap_or_default()
}

pub(crate) async fn overview(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let v = match viewer(&state, &headers).await {
        Err(r) => return r.into_response(),
        Ok(v) => v,
    };
    if !v.is_operator() {
        return Redirect::to("/dashboard/usage").into_response();
    }
    let fleet = state.observer.fleet();
    let mut body = String::new();
    let _ = write!(
        body,
        "<p class=\"meta\">Sampled <span id=\"sampled\">{}</span> (every few seconds; the page updates itself in place).</p>\
<h2>Exits by state</h2><div class=\"cards\" id=\"cards\">",
        when_opt(state.observer.sampled_at())
    );
    for state_name in ExitState::ALL {
        let s = state_name.as_str();
        let _ = write!(
            body,
            "<div class=\"card state-card {s}\"><span class=\"dot {s}\" aria-hidden=\"true\"></span>{s}<b id=\"card-{s}\">0</b></div>"
        );
    }
    for t in ["dc", "isp", "res", "mobile"] {
        let _ = write!(
            body,
            "<div class=\"card\">type {t}<b id=\"card-type-{t}\">0</b></div>"
        );
    }
    let last = fleet.last();
    let _ = write!(
        body,
        "<div class=\"card\">tunnels/s<b id=\"card-tunnels_per_sec\">{}</b></div>\
<div class=\"card\">throughput<b id=\"card-bytes_per_sec\">{}</b></div></div>",
        per_sec(last.map_or(0.0, |p| p.tunnels_per_sec)),
        rate(last.map_or(0.0, |p| p.bytes_per_sec)),
    );
    let tunnels: Vec<(i64, f64)> = fleet.iter().map(|p| (p.t, p.tunnels_per_sec)).collect();
    let bytes_s: Vec<(i64, f64)> = fleet.iter().map(|p| (p.t, p.bytes_per_sec)).collect();
    let _ = write!(
        body,
        "<h2>Last hour</h2><div class=\"charts\">{}{}</div>",
        chart("tunnels opened per second", &tunnels, per_sec, Axis::Clock),
        chart("throughput (up + down)", &bytes_s, rate, Axis::Clock),
    );
    body.push_str("<div class=\"cols\"><section><h2>Errors by Proxy-Status token</h2><table class=\"compact\"><thead><tr><th scope=\"col\">status:token</th><th scope=\"col\">per second (latest sample)</th></tr></thead><tbody id=\"errors\">");
    let errors: Vec<(&String, &f64)> = last
        .map(|p| p.errors_per_sec.iter().filter(|(_, r)| **r > 0.0).collect())
        .unwrap_or_default();
    if errors.is_empty() {
        body.push_str("<tr><td colspan=\"2\">no errors in the latest sample</td></tr>");
    }
    for (token, r) in errors {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td></tr>",
            esc(token),
            per_sec(*r)
        );
    }
    body.push_str("</tbody></table></section>");
    for (title, by_domain) in [("Top accounts", false), ("Top target domains", true)] {
        let _ = write!(
            body,
            "<section><h2>{title} (last hour)</h2><table class=\"compact\" id=\"{}\"><thead><tr><th scope=\"col\">{}</th><th scope=\"col\">bytes</th></tr></thead><tbody>",
            if by_domain { "top-domains" } else { "top-accounts" },
            if by_domain { "domain" } else { "account" },
        );
        let rows = top(&state, by_domain).await;
        if rows.is_empty() {
            body.push_str("<tr><td colspan=\"2\">no traffic in the last hour</td></tr>");
        }
        for (k, label, b) in rows {
            let name = if by_domain {
                esc(&label)
            } else {
                format!(
                    "<a href=\"/dashboard/accounts/{}\">{}</a>",
                    esc(&k),
                    esc(&label)
                )
            };
            let _ = write!(body, "<tr><td>{name}</td><td>{}</td></tr>", bytes(b as f64));
        }
        body.push_str("</tbody></table></section>");
    }
    body.push_str("</div><h2>Exits</h2><p class=\"tools\"><label>Filter <input id=\"filter\" type=\"search\" placeholder=\"any column: name, country, state…\" size=\"34\"></label> \
<span id=\"page-info\" aria-live=\"polite\"></span></p>\
<div class=\"scroll\"><table id=\"exit-table\"><thead><tr>");
    for (k, label) in COLUMNS {
        let _ = write!(
            body,
            "<th scope=\"col\" data-k=\"{k}\"><button type=\"button\" class=\"sort\" data-k=\"{k}\">{label}</button></th>"
        );
    }
    let _ = write!(
        body,
        "</tr></thead><tbody id=\"exits\"></tbody></table></div>\
<nav class=\"pager\" aria-label=\"exit table pages\"><button type=\"button\" id=\"first\">« First</button>\
<button type=\"button\" id=\"prev\">‹ Previous</button> <span id=\"page-no\">page 1 of 1</span> \
<button type=\"button\" id=\"next\">Next ›</button><button type=\"button\" id=\"last\">Last »</button></nav>"
    );
    page_for(&v, "Fleet", &body, &[TABLE_SCRIPT]).into_response()
}

#[derive(Deserialize)]
pub(crate) struct TableQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    sort: Option<String>,
    #[serde(default)]
    desc: Option<u8>,
    #[serde(default)]
    page: Option<usize>,
}

#[derive(PartialEq, PartialOrd)]
enum SortKey {
    Num(f64),
    Text(String),
    Missing,
}

fn sort_key(e: &ExitNow, k: &str) -> SortKey {
    let num = |v: Option<f64>| v.map_or(SortKey::Missing, SortKey::Num);
    match k {
        "name" => SortKey::Text(e.name.to_lowercase()),
        "source_type" => SortKey::Text(e.source_type.clone()),
        "country" => SortKey::Text(e.country.clone()),
        "owner" => SortKey::Text(e.owner.to_lowercase()),
        "egress_ips" => SortKey::Text(e.egress_ips.join(",")),
        "egress_prefixes" => SortKey::Text(e.egress_prefixes.join(",")),
        "observed_egress" => SortKey::Text(e.observed_egress.join(",")),
        "egress_verification" => SortKey::Text(e.egress_verification.clone()),
        "score" => num(e.score),
        "probe_rtt_ms" => num(e.probe_rtt_ms),
        "success" => num(e.success),
        "in_flight" => SortKey::Num(e.in_flight as f64),
        "bytes_per_sec" => SortKey::Num(e.bytes_per_sec),
        "last_heartbeat_at" => num(e.last_heartbeat_at.map(|t| t.timestamp() as f64)),
        // State, worst first (its declaration order).
        _ => SortKey::Num(
            ExitState::ALL
                .iter()
                .position(|s| *s == e.state)
                .unwrap_or(0) as f64,
        ),
    }
}

fn matches(e: &ExitNow, q: &str) -> bool {
    let hay = [
        e.id.to_string(),
        e.name.to_lowercase(),
        e.source_type.clone(),
        e.country.to_lowercase(),
        e.owner.to_lowercase(),
        e.state.as_str().to_owned(),
        e.egress_ips.join(" "),
        e.egress_prefixes.join(" "),
        e.observed_egress.join(" "),
        e.egress_verification.clone(),
        e.channel.clone().unwrap_or_default(),
    ];
    q.split_whitespace()
        .all(|w| hay.iter().any(|h| h.contains(w)))
}

/// The fleet page's data: counts, rates, errors and one page of the exit
/// table, filtered (`q`) and sorted (`sort`, `desc`) before paging (`page`,
/// from 0, [`PER_PAGE`] exits each).
pub(crate) async fn data(
    State(state): State<AppState>,
    headers: HeaderMap,
    crate::extract::Query(query): crate::extract::Query<TableQuery>,
) -> Response {
    if let Err(r) = operator_only(&state, &headers).await {
        return r.into_response();
    }
    let mut cards = serde_json::Map::new();
    for s in ExitState::ALL {
        cards.insert(s.as_str().into(), 0.into());
    }
    for t in ["dc", "isp", "res", "mobile"] {
        cards.insert(format!("type-{t}"), 0.into());
    }
    for ((s, t), n) in state.observer.counts() {
        let add = |v: &mut serde_json::Value| *v = (v.as_u64().unwrap_or(0) + n).into();
        if let Some(v) = cards.get_mut(&s) {
            add(v);
        }
        if let Some(v) = cards.get_mut(&format!("type-{t}")) {
            add(v);
        }
    }
    let last = state.observer.fleet().pop();
    cards.insert(
        "tunnels_per_sec".into(),
        per_sec(last.as_ref().map_or(0.0, |p| p.tunnels_per_sec)).into(),
    );
    cards.insert(
        "bytes_per_sec".into(),
        rate(last.as_ref().map_or(0.0, |p| p.bytes_per_sec)).into(),
    );
    let errors: Vec<(String, String)> = last
        .as_ref()
        .map(|p| {
            p.errors_per_sec
                .iter()
                .filter(|(_, r)| **r > 0.0)
                .map(|(k, r)| (k.clone(), per_sec(*r)))
                .collect()
        })
        .unwrap_or_default();
    let all = state.observer.exits();
    let total = all.len();
    let q = query.q.trim().to_lowercase();
    let mut shown: Vec<ExitNow> = all.into_iter().filter(|e| matches(e, &q)).collect();
    let sort = query.sort.as_deref().unwrap_or("state");
    let desc = query.desc.unwrap_or(0) == 1;
    shown.sort_by(|a, b| {
        let (x, y) = (sort_key(a, sort), sort_key(b, sort));
        // Missing values last whichever the direction.
        let o = match (&x, &y) {
            (SortKey::Missing, SortKey::Missing) => std::cmp::Ordering::Equal,
            (SortKey::Missing, _) => return std::cmp::Ordering::Greater,
            (_, SortKey::Missing) => return std::cmp::Ordering::Less,
            _ => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
        };
        let o = if desc { o.reverse() } else { o };
        o.then_with(|| a.name.cmp(&b.name)).then(a.id.cmp(&b.id))
    });
    let filtered = shown.len();
    let pages = filtered.div_ceil(PER_PAGE).max(1);
    let page_no = query.page.unwrap_or(0).min(pages - 1);
    let exits: Vec<ExitNow> = shown
        .into_iter()
        .skip(page_no * PER_PAGE)
        .take(PER_PAGE)
        .collect();
    Json(serde_json::json!({
        "sampled_at": state.observer.sampled_at(),
        "cards": cards,
        "errors": errors,
        "total": total,
        "filtered": filtered,
        "page": page_no,
        "pages": pages,
        "per_page": PER_PAGE,
        "exits": exits,
    }))
    .into_response()
}
