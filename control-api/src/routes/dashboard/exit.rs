//! One exit's page: its provenance and consent, its egress (declared, bound
//! and seen by the reflector) and which of it is dedicated to an account,
//! its last hour's charts and state changes, and the operator's actions on
//! it.

use super::*;
use crate::observe::ExitPoint;
use proxynet_common::egress::Cidr;

#[derive(sqlx::FromRow)]
struct ExitFlags {
    admin_draining: bool,
    disabled: bool,
    behind_nat: bool,
    withdrawn_at: Option<DateTime<Utc>>,
    channel: Option<String>,
}

/// One of the exit's addresses (or IPv6 prefixes) dedicated to an account now.
#[derive(sqlx::FromRow)]
struct Dedicated {
    address: String,
    account_id: Uuid,
    account_name: String,
    allocated_at: DateTime<Utc>,
    /// The users it serves, by name; none: every user of the account.
    users: Vec<String>,
}

/// Most dedicated addresses the exit page lists: an exit's IPv6 prefixes
/// hold many /64s (the API lists all).
const DEDICATED_SHOWN: i64 = 1_000;

/// The exit page's table of its dedicated addresses: tunnels of other
/// accounts never leave from them, so an operator reading the egress above
/// needs to know which they are.
fn dedicated_table(dedicated: &Result<Vec<Dedicated>, sqlx::Error>, id: Uuid) -> String {
    let mut out = String::from(
        "<h2>Dedicated addresses</h2><div class=\"scroll\"><table class=\"compact\" id=\"dedicated\"><thead><tr>\
<th scope=\"col\">address</th><th scope=\"col\">account</th><th scope=\"col\">since</th>\
<th scope=\"col\">serves</th></tr></thead><tbody>",
    );
    match dedicated {
        Ok(rows) if rows.is_empty() => {
            out.push_str(
                "<tr><td colspan=\"4\">none: every address of this exit is shared</td></tr>",
            );
        }
        Ok(rows) => {
            for d in rows {
                let _ = write!(
                    out,
                    "<tr data-address=\"{a}\" data-account-id=\"{acc}\"><td><code>{a}</code></td>\
<td><a href=\"/dashboard/accounts/{acc}\">{}</a></td><td>{}</td><td>{}</td></tr>",
                    esc(&d.account_name),
                    when(d.allocated_at),
                    users_served(&d.users),
                    a = esc(&d.address),
                    acc = d.account_id,
                );
            }
        }
        Err(e) => {
            tracing::warn!(exit = %id, error = %e, "cannot read the exit's dedicated addresses");
            out.push_str(
                "<tr><td colspan=\"4\">the dedicated addresses cannot be read right now</td></tr>",
            );
        }
    }
    out.push_str("</tbody></table></div>");
    if dedicated
        .as_ref()
        .is_ok_and(|rows| rows.len() as i64 >= DEDICATED_SHOWN)
    {
        let _ = write!(
            out,
            "<p class=\"note\">The first {DEDICATED_SHOWN} by address; \
<code>GET /v1/dedicated-ips</code> lists every one.</p>"
        );
    }
    out
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
    let dedicated: Result<Vec<Dedicated>, sqlx::Error> = sqlx::query_as(
        "SELECT d.address, d.account_id, a.name AS account_name, d.allocated_at,
                ARRAY(SELECT u.username || CASE WHEN u.deleted_at IS NULL THEN '' ELSE ' (deleted)' END
                        FROM dedicated_ip_users du JOIN proxy_users u ON u.id = du.user_id
                       WHERE du.dedicated_ip_id = d.id ORDER BY u.username) AS users
           FROM dedicated_ips d JOIN accounts a ON a.id = d.account_id
          WHERE d.exit_id = $1 AND d.released_at IS NULL
          ORDER BY d.address LIMIT $2",
    )
    .bind(id)
    .bind(DEDICATED_SHOWN)
    .fetch_all(&state.db)
    .await;
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
    body.push_str(&dedicated_table(&dedicated, id));

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
