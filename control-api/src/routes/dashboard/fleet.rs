//! The fleet overview, its table's data (filtered, sorted and paged here,
//! so a 100,000-exit fleet sends the browser one page), and one exit's page.

use super::*;
use crate::observe::{ExitNow, ExitPoint, ExitState};
use proxynet_common::egress::Cidr;

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

#[derive(sqlx::FromRow)]
struct ExitFlags {
    admin_draining: bool,
    disabled: bool,
    behind_nat: bool,
    withdrawn_at: Option<DateTime<Utc>>,
    channel: Option<String>,
}

/// One field of a JSON object as text (`–` when absent).
fn field(v: &serde_json::Value, k: &str) -> String {
    match &v[k] {
        serde_json::Value::Null => "–".to_owned(),
        serde_json::Value::String(s) if s.is_empty() => "–".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn field_time(v: &serde_json::Value, k: &str) -> String {
    v[k].as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map_or_else(|| "–".to_owned(), |t| when(t.with_timezone(&Utc)))
}

/// A form posting `action` to `path` with the session's CSRF token; `extra`
/// is more of the form (a reason field).
pub(super) fn action_form(
    v: &Viewer,
    path: &str,
    id: &str,
    label: &str,
    class: &str,
    extra: &str,
) -> String {
    format!(
        "<form method=\"post\" action=\"{}\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">{extra}\
<button type=\"submit\" id=\"{}\" class=\"{class}\">{}</button></form>",
        esc(path),
        esc(&v.csrf),
        esc(id),
        esc(label)
    )
}

pub(crate) async fn exit_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<Uuid>,
) -> Response {
    let v = match operator_only(&state, &headers).await {
        Err(r) => return r.into_response(),
        Ok(v) => v,
    };
    let Some((now, points, events)) = state.observer.exit(id) else {
        return (
            StatusCode::NOT_FOUND,
            page_for(
                &v,
                "No such exit",
                "<p>Unknown exit (or not sampled yet).</p>",
                &[],
            ),
        )
            .into_response();
    };
    let flags: Option<ExitFlags> = sqlx::query_as(
        "SELECT e.admin_draining, e.disabled, e.behind_nat, e.withdrawn_at, s.channel
           FROM exits e LEFT JOIN sources s ON s.id = e.source_id WHERE e.id = $1",
    )
    .bind(id)
    .fetch_optional(&state.db)
    .await
    .unwrap_or_default();
    let series = |f: fn(&ExitPoint) -> Option<f64>| -> Vec<(i64, f64)> {
        points
            .iter()
            .filter_map(|p| f(p).map(|v| (p.t, v)))
            .collect()
    };
    let audit: Vec<(DateTime<Utc>, String, String)> = sqlx::query_as(
        "SELECT at, action, actor FROM audit_log WHERE subject = $1 AND (action LIKE 'exit.%' OR action LIKE 'consent.%')
          ORDER BY id DESC LIMIT 20",
    )
    .bind(id.to_string())
    .fetch_all(&state.db)
    .await
    .unwrap_or_default();
    let provenance = crate::routes::provenance::exit_provenance(
        Caller::Operator,
        State(state.clone()),
        Path(id),
    )
    .await
    .map(|Json(v)| v)
    .unwrap_or_default();
    let history: Vec<serde_json::Value> = crate::routes::provenance::consent_history(
        crate::auth::Operator,
        State(state.clone()),
        Path(id),
    )
    .await
    .ok()
    .and_then(|Json(rows)| serde_json::to_value(rows).ok())
    .and_then(|v| v.as_array().cloned())
    .unwrap_or_default();

    let s = now.state.as_str();
    let mut body = format!(
        "<p class=\"summary\">State <b class=\"state {s}\" id=\"state\"><span class=\"dot {s}\" aria-hidden=\"true\"></span>{s}</b>{why} · \
type {t} · country {c} · owner {o} · channel {ch} · open tunnels <b id=\"open-tunnels\">{open}</b> · \
seen by {rep} superproxies · last heartbeat {hb}</p>",
        why = now
            .blocked
            .map(|b| format!(" ({})", esc(b)))
            .unwrap_or_default(),
        t = esc(&now.source_type),
        c = esc(&now.country),
        o = esc(&now.owner),
        ch = esc(
            flags
                .as_ref()
                .and_then(|f| f.channel.as_deref())
                .unwrap_or("–")
        ),
        open = now.in_flight,
        rep = now.superproxies_reporting,
        hb = when_opt(now.last_heartbeat_at),
    );
    // Actions (operators only: this page is).
    let path = |a: &str| format!("/dashboard/exits/{id}/{a}");
    body.push_str("<div class=\"actions\" id=\"actions\">");
    if let Some(f) = &flags {
        body.push_str(&if f.admin_draining {
            action_form(&v, &path("undrain"), "undrain", "Undrain", "", "")
        } else {
            action_form(&v, &path("drain"), "drain", "Drain", "danger", "")
        });
        body.push_str(&if f.disabled {
            action_form(&v, &path("enable"), "enable", "Enable", "", "")
        } else {
            action_form(&v, &path("disable"), "disable", "Disable", "danger", "")
        });
        if f.withdrawn_at.is_some() {
            let _ = write!(
                body,
                " <span class=\"note\">withdrawn by its owner {}</span>",
                when_opt(f.withdrawn_at)
            );
        }
    }
    let consent_status = provenance["consent"]["status"]
        .as_str()
        .unwrap_or("unknown")
        .to_owned();
    if consent_status == "granted" {
        body.push_str(&action_form(
            &v,
            &path("revoke-consent"),
            "revoke-consent",
            "Revoke consent",
            "danger",
            "<label class=\"reason\">reason <input name=\"reason\" required maxlength=\"500\" value=\"revoked from the dashboard\"></label> ",
        ));
    }
    body.push_str("</div>");

    // Egress.
    let _ = write!(
        body,
        "<h2>Egress</h2><dl class=\"facts\"><dt>declared IPs</dt><dd id=\"egress-ips\">{ips}</dd>\
<dt>declared prefixes</dt><dd id=\"egress-prefixes\">{prefixes}</dd>\
<dt>observed public egress</dt><dd id=\"observed-egress\">{observed}</dd>\
<dt>egress check</dt><dd id=\"egress-verification\">{check}</dd></dl>",
        ips = esc(&now.egress_ips.join(", ")),
        prefixes = if now.egress_prefixes.is_empty() {
            "–".to_owned()
        } else {
            esc(&now.egress_prefixes.join(", "))
        },
        observed = if now.observed_egress.is_empty() {
            "–".to_owned()
        } else {
            esc(&now.observed_egress.join(", "))
        },
        check = esc(&now.egress_verification),
    );
    // Each declared egress beside the address the agent bound for it and
    // the one our reflector saw (the abuse desk's view of this exit).
    let behind_nat = flags.as_ref().is_some_and(|f| f.behind_nat);
    let observations =
        crate::routes::egress::latest_observations(&state.db, &[(id, behind_nat)]).await;
    let declared: Vec<&String> = now.egress_ips.iter().chain(&now.egress_prefixes).collect();
    if !declared.is_empty() {
        body.push_str(
            "<div class=\"scroll\"><table class=\"compact\" id=\"egress-observations\"><thead><tr>\
<th scope=\"col\">declared</th><th scope=\"col\">bound</th><th scope=\"col\">seen as</th>\
<th scope=\"col\">check</th><th scope=\"col\">first seen</th><th scope=\"col\">last seen</th></tr></thead><tbody>",
        );
        match &observations {
            Ok(observations) => {
                let same = |a: &str, b: &str| match (a.parse::<Cidr>(), b.parse::<Cidr>()) {
                    (Ok(a), Ok(b)) => a.masked() == b.masked(),
                    _ => a == b,
                };
                for egress in declared {
                    let seen = observations.iter().find(|(_, o)| same(&o.egress, egress));
                    let _ = match seen {
                        Some((_, o)) => write!(
                            body,
                            "<tr><td>{}</td><td class=\"bound\">{}</td><td class=\"observed\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                            esc(egress),
                            esc(&o.bound),
                            esc(&o.observed),
                            o.status.as_str(),
                            when(o.first_seen),
                            when(o.last_seen),
                        ),
                        None => write!(
                            body,
                            "<tr><td>{}</td><td class=\"bound\">–</td><td class=\"observed\">–</td><td>unobserved</td><td>–</td><td>–</td></tr>",
                            esc(egress),
                        ),
                    };
                }
            }
            Err(e) => {
                tracing::warn!(exit = %id, error = %e, "cannot read the exit's egress observations");
                body.push_str(
                    "<tr><td colspan=\"6\">the observations cannot be read right now</td></tr>",
                );
            }
        }
        body.push_str("</tbody></table></div>");
    }

    // Provenance: the source's four answers, and consent.
    let src = &provenance["source"];
    let _ = write!(
        body,
        "<div class=\"cols\"><section><h2>Provenance</h2><dl class=\"facts\" id=\"provenance\">\
<dt>source</dt><dd id=\"source-name\">{name}</dd>\
<dt>where the address comes from</dt><dd>{channel} · supplier {supplier} · agreement {agreement}</dd>\
<dt>what its owner was told</dt><dd>{notice}</dd>\
<dt>how its owner opts out</dt><dd>{opt_out}</dd>\
<dt>who answers for it</dt><dd>{liable} · abuse {abuse}</dd>\
<dt>routable</dt><dd>{routable}{blocked}</dd></dl></section>",
        name = esc(&field(src, "name")),
        channel = esc(&field(&provenance, "channel")),
        supplier = esc(&field(src, "supplier")),
        agreement = esc(&field(src, "agreement_ref")),
        notice = esc(&field(src, "notice_description")),
        opt_out = esc(&field(src, "opt_out")),
        liable = esc(&field(src, "liable_party")),
        abuse = esc(&field(src, "abuse_contact")),
        routable = if provenance["routable"].as_bool().unwrap_or(false) {
            "yes"
        } else {
            "no"
        },
        blocked = provenance["blocked"]
            .as_str()
            .map(|b| format!(" (blocked: {})", esc(b)))
            .unwrap_or_default(),
    );
    let c = &provenance["consent"];
    let _ = write!(
        body,
        "<section><h2>Consent</h2><dl class=\"facts\"><dt>state</dt><dd><b id=\"consent-state\" class=\"consent {cs}\">{label}</b></dd>\
<dt>method</dt><dd>{method}</dd><dt>granted</dt><dd>{granted}</dd><dt>expires</dt><dd>{expires}</dd>\
<dt>revoked</dt><dd>{revoked}</dd><dt>notice</dt><dd>{notice} <code>{sha}</code></dd><dt>evidence</dt><dd>{evidence}</dd></dl>",
        cs = esc(&consent_status),
        label = esc(&consent_status.replace('_', " ")),
        method = esc(&field(c, "method")),
        granted = field_time(c, "granted_at"),
        expires = field_time(c, "expires_at"),
        revoked = field_time(c, "revoked_at"),
        notice = esc(&field(c, "notice_version")),
        sha = esc(&field(c, "notice_sha256").chars().take(16).collect::<String>()),
        evidence = esc(&field(c, "evidence_ref")),
    );
    body.push_str("<h3>History</h3><table class=\"compact\" id=\"consent-history\"><thead><tr><th scope=\"col\">version</th><th scope=\"col\">state</th><th scope=\"col\">recorded</th><th scope=\"col\">by</th><th scope=\"col\">reason</th></tr></thead><tbody>");
    if history.is_empty() {
        body.push_str("<tr><td colspan=\"5\">no consent records</td></tr>");
    }
    for r in history.iter().rev() {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&field(r, "version")),
            esc(&field(r, "state")),
            field_time(r, "recorded_at"),
            esc(&field(r, "recorded_by")),
            esc(&field(r, "revoked_reason")),
        );
    }
    body.push_str("</tbody></table></section></div>");

    let _ = write!(
        body,
        "<h2>Last hour</h2><div class=\"charts\">{}{}{}{}</div>",
        chart_to("score", &series(|p| p.score), plain, Axis::Clock, Some(1.0)),
        chart(
            "probe RTT",
            &series(|p| p.probe_rtt_ms),
            millis,
            Axis::Clock
        ),
        chart(
            "connect success",
            &series(|p| p.success),
            percent,
            Axis::Clock
        ),
        chart(
            "throughput (up + down)",
            &series(|p| Some(p.bytes_per_sec)),
            rate,
            Axis::Clock
        ),
    );
    body.push_str(
        "<h2>Errors by Proxy-Status token</h2><p id=\"exit-errors\" class=\"note\">Not available per exit: \
the superproxies report failures by token for the whole fleet only (see the <a href=\"/dashboard\">fleet page</a>); \
this exit's connect success above counts its failures together.</p>",
    );
    body.push_str("<h2>Recent state changes</h2><table class=\"compact\" id=\"changes\"><thead><tr><th scope=\"col\">when</th><th scope=\"col\">what</th></tr></thead><tbody>");
    let mut changes: Vec<(DateTime<Utc>, String)> = events
        .iter()
        .map(|e| (e.at, esc(&e.what)))
        .chain(
            audit
                .iter()
                .map(|(at, action, actor)| (*at, format!("{} (by {})", esc(action), esc(actor)))),
        )
        .collect();
    changes.sort_by_key(|c| std::cmp::Reverse(c.0));
    if changes.is_empty() {
        body.push_str("<tr><td colspan=\"2\">no changes seen in the last hour</td></tr>");
    }
    for (at, what) in changes {
        let _ = write!(body, "<tr><td>{}</td><td>{what}</td></tr>", when(at));
    }
    body.push_str("</tbody></table>");
    page_for(&v, &format!("Exit {}", now.name), &body, &[]).into_response()
}
