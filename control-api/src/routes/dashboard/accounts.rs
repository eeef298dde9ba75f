//! Usage, accounts (operators: any; an account session: its own), and a
//! user's sticky sessions.

use super::*;

mod queries;
mod render;

use queries::{by_day, by_domain, HeldAddress, HELD_ADDRESSES_SHOWN};
pub(crate) use render::users_served;
use render::{facts, held_addresses, limit, usage_sections};

#[derive(sqlx::FromRow)]
struct UsageRow {
    account_id: Uuid,
    account_name: String,
    username: Option<String>,
    bytes_up: i64,
    bytes_down: i64,
}

#[derive(Deserialize)]
pub(crate) struct Period {
    #[serde(default)]
    days: Option<i32>,
}

impl Period {
    fn days(&self) -> i32 {
        self.days
            .filter(|d| [1, 7, 30, 90].contains(d))
            .unwrap_or(1)
    }
}

/// Usage over a period (1, 7, 30 or 90 days): an account its own users;
/// the operator all.
pub(crate) async fn usage(
    State(state): State<AppState>,
    headers: HeaderMap,
    crate::extract::Query(period): crate::extract::Query<Period>,
) -> Response {
    let v = match viewer(&state, &headers).await {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let days = period.days();
    let rows: Result<Vec<UsageRow>, ApiError> = sqlx::query_as(
        "SELECT l.account_id, a.name AS account_name, u.username,
                SUM(l.bytes_up)::bigint AS bytes_up, SUM(l.bytes_down)::bigint AS bytes_down
           FROM usage_ledger l JOIN accounts a ON a.id = l.account_id
           LEFT JOIN proxy_users u ON u.id = l.user_id
          WHERE l.minute >= now() - make_interval(days => $2) AND ($1::uuid IS NULL OR l.account_id = $1)
          GROUP BY l.account_id, a.name, u.username ORDER BY a.name, u.username",
    )
    .bind(v.caller.scope())
    .bind(days)
    .fetch_all(&state.db)
    .await
    .map_err(ApiError::from);
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => return e.into_response(),
    };
    let mut body = String::from("<p class=\"tools\">Period: ");
    for d in [1, 7, 30, 90] {
        if d == days {
            let _ = write!(body, "<b aria-current=\"page\">{d} d</b> ");
        } else {
            let _ = write!(body, "<a href=\"/dashboard/usage?days={d}\">{d} d</a> ");
        }
    }
    let total: i64 = rows.iter().map(|r| r.bytes_up + r.bytes_down).sum();
    let _ = write!(
        body,
        "</p><p>Bytes through the gateway in the last {days} day{}, from the ledger: <b id=\"usage-total\">{}</b>.</p>",
        if days == 1 { "" } else { "s" },
        bytes(total as f64)
    );
    body.push_str(&usage_sections(
        days,
        &by_day(&state, v.caller.scope(), days).await,
        &by_domain(&state, v.caller.scope(), days).await,
    ));
    body.push_str("<h2>By user</h2><table id=\"usage\"><thead><tr><th scope=\"col\">account</th><th scope=\"col\">user</th><th scope=\"col\">up</th><th scope=\"col\">down</th><th scope=\"col\">total</th></tr></thead><tbody>");
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"5\">no traffic in this period</td></tr>");
    }
    for r in &rows {
        let _ = write!(
            body,
            "<tr data-account-id=\"{}\"><td><a href=\"/dashboard/accounts/{}\">{}</a></td><td>{}</td>\
<td class=\"num bytes\">{}</td><td class=\"num bytes\">{}</td><td class=\"num bytes\">{}</td></tr>",
            r.account_id,
            r.account_id,
            esc(&r.account_name),
            esc(r.username.as_deref().unwrap_or("–")),
            bytes(r.bytes_up as f64),
            bytes(r.bytes_down as f64),
            bytes((r.bytes_up + r.bytes_down) as f64),
        );
    }
    body.push_str("</tbody></table>");
    page_for(&v, "Usage", &body, &[]).into_response()
}

/// Every account (operators).
pub(crate) async fn accounts(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let v = match operator_only(&state, &headers).await {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let rows: Vec<(Uuid, String, i64, i64)> = sqlx::query_as(
        "SELECT a.id, a.name,
                (SELECT count(*) FROM proxy_users u WHERE u.account_id = a.id AND u.deleted_at IS NULL),
                COALESCE((SELECT SUM(l.bytes_up + l.bytes_down) FROM usage_ledger l
                           WHERE l.account_id = a.id AND l.minute >= now() - interval '24 hours'), 0)::bigint
           FROM accounts a WHERE a.deleted_at IS NULL ORDER BY a.name LIMIT 1000",
    )
    .fetch_all(&state.db)
    .await
    .unwrap_or_default();
    let mut body = String::from("<table id=\"accounts\"><thead><tr><th scope=\"col\">account</th><th scope=\"col\">id</th><th scope=\"col\">users</th><th scope=\"col\">last 24 h</th></tr></thead><tbody>");
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"4\">no accounts</td></tr>");
    }
    for (id, name, users, b) in rows {
        let _ = write!(
            body,
            "<tr><td><a href=\"/dashboard/accounts/{id}\">{}</a></td><td><code>{id}</code></td><td class=\"num\">{users}</td><td class=\"num\">{}</td></tr>",
            esc(&name),
            bytes(b as f64)
        );
    }
    body.push_str("</tbody></table>");
    page_for(&v, "Accounts", &body, &[]).into_response()
}

#[derive(sqlx::FromRow)]
struct UserRow {
    id: Uuid,
    username: String,
    enabled: bool,
    disabled_by_operator: bool,
    max_concurrent_tunnels: Option<i32>,
    max_new_tunnels_per_second: Option<i32>,
    bandwidth_bytes: Option<i64>,
    quota_period: String,
}

#[derive(sqlx::FromRow)]
struct KeyRow {
    id: Uuid,
    name: String,
    created_at: DateTime<Utc>,
    last_used_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    minted_by: Option<Uuid>,
}

/// One account: its users (limits, quota bars, sessions), the dedicated
/// addresses it holds, entitlements, keys, usage by day and by domain. The
/// operator any; an account its own (another's is answered as absent).
pub(crate) async fn account_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<Uuid>,
    crate::extract::Query(period): crate::extract::Query<Period>,
) -> Response {
    let v = match viewer(&state, &headers).await {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let not_found = || {
        (
            StatusCode::NOT_FOUND,
            page_for(&v, "No such account", "<p>Unknown account.</p>", &[]),
        )
            .into_response()
    };
    if v.caller.check_account(id).is_err() {
        return not_found();
    }
    let account: Option<(String, serde_json::Value)> = sqlx::query_as(
        "SELECT name, entitlements FROM accounts WHERE id = $1 AND deleted_at IS NULL",
    )
    .bind(id)
    .fetch_optional(&state.db)
    .await
    .unwrap_or_default();
    let Some((name, entitlements)) = account else {
        return not_found();
    };
    let users: Vec<UserRow> = sqlx::query_as(
        "SELECT id, username, enabled, disabled_by_operator, max_concurrent_tunnels,
                max_new_tunnels_per_second, bandwidth_bytes, quota_period
           FROM proxy_users WHERE account_id = $1 AND deleted_at IS NULL ORDER BY username LIMIT 200",
    )
    .bind(id)
    .fetch_all(&state.db)
    .await
    .unwrap_or_default();
    let keys: Vec<KeyRow> = sqlx::query_as(
        "SELECT id, name, created_at, last_used_at, revoked_at, minted_by FROM api_keys
          WHERE account_id = $1 ORDER BY created_at DESC LIMIT 200",
    )
    .bind(id)
    .fetch_all(&state.db)
    .await
    .unwrap_or_default();
    let held: Result<Vec<HeldAddress>, sqlx::Error> = sqlx::query_as(
        "SELECT d.address, d.exit_id, e.name AS exit_name, e.country, d.allocated_at,
                ARRAY(SELECT u.username || CASE WHEN u.deleted_at IS NULL THEN '' ELSE ' (deleted)' END
                        FROM dedicated_ip_users du JOIN proxy_users u ON u.id = du.user_id
                       WHERE du.dedicated_ip_id = d.id ORDER BY u.username) AS users
           FROM dedicated_ips d JOIN exits e ON e.id = d.exit_id
          WHERE d.account_id = $1 AND d.released_at IS NULL
          ORDER BY d.allocated_at, d.address LIMIT $2",
    )
    .bind(id)
    .bind(HELD_ADDRESSES_SHOWN)
    .fetch_all(&state.db)
    .await;
    let op = v.is_operator();
    let mut body = format!("<p class=\"meta\">Account <code id=\"account-id\">{id}</code></p>");
    body.push_str("<h2>Users</h2><div class=\"scroll\"><table id=\"users\"><thead><tr><th scope=\"col\">user</th><th scope=\"col\">status</th>\
<th scope=\"col\">tunnels at once</th><th scope=\"col\">new tunnels/s</th><th scope=\"col\">quota (this period)</th><th scope=\"col\">sessions</th>");
    if op {
        body.push_str("<th scope=\"col\">action</th>");
    }
    body.push_str("</tr></thead><tbody>");
    if users.is_empty() {
        body.push_str("<tr><td colspan=\"7\">no users</td></tr>");
    }
    for u in &users {
        let quota =
            crate::routes::billing::quota(Caller::Operator, State(state.clone()), Path(u.id))
                .await
                .ok()
                .and_then(|Json(q)| serde_json::to_value(q).ok())
                .unwrap_or_default();
        let used = quota["used_bytes"].as_i64().unwrap_or(0);
        let status = match (u.enabled, u.disabled_by_operator) {
            (true, _) => "enabled",
            (false, true) => "disabled by the operator",
            (false, false) => "disabled",
        };
        let _ = write!(
            body,
            "<tr data-user-id=\"{uid}\"><td>{name}</td><td class=\"{cls}\">{status}</td><td class=\"num\">{conc}</td><td class=\"num\">{rate}</td>\
<td class=\"quota-cell\">{bar} <span class=\"note\">{period}</span></td><td><a href=\"/dashboard/users/{uid}/sessions\">sessions</a></td>",
            uid = u.id,
            name = esc(&u.username),
            cls = if u.enabled { "live" } else { "disabled" },
            conc = limit(u.max_concurrent_tunnels),
            rate = limit(u.max_new_tunnels_per_second),
            bar = quota_bar(used, u.bandwidth_bytes),
            period = esc(&u.quota_period),
        );
        if op {
            let form = if u.enabled {
                action_form(
                    &v,
                    &format!("/dashboard/users/{}/disable", u.id),
                    &format!("disable-user-{}", u.id),
                    "Disable",
                    "danger",
                    "",
                )
            } else {
                action_form(
                    &v,
                    &format!("/dashboard/users/{}/enable", u.id),
                    &format!("enable-user-{}", u.id),
                    "Enable",
                    "",
                    "",
                )
            };
            let _ = write!(body, "<td>{form}</td>");
        }
        body.push_str("</tr>");
    }
    body.push_str("</tbody></table></div>");
    body.push_str(&held_addresses(&held, op));
    let _ = write!(
        body,
        "<div class=\"cols\"><section><h2>Entitlements: limits</h2>{}</section><section><h2>Entitlements: allow-lists</h2>{}</section></div>",
        facts(&entitlements["limits"]),
        facts(&entitlements["allowlist"])
    );
    body.push_str("<h2>API keys</h2><div class=\"scroll\"><table id=\"keys\"><thead><tr><th scope=\"col\">name</th><th scope=\"col\">id</th><th scope=\"col\">created</th>\
<th scope=\"col\">last used</th><th scope=\"col\">status</th><th scope=\"col\">minted by</th>");
    if op {
        body.push_str("<th scope=\"col\">action</th>");
    }
    body.push_str("</tr></thead><tbody>");
    if keys.is_empty() {
        body.push_str("<tr><td colspan=\"7\">no keys</td></tr>");
    }
    for k in &keys {
        let status = match k.revoked_at {
            Some(t) => format!("revoked {}", when(t)),
            None => "active".to_owned(),
        };
        let _ = write!(
            body,
            "<tr data-key-id=\"{}\"><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{status}</td><td>{}</td>",
            k.id,
            esc(if k.name.is_empty() { "–" } else { &k.name }),
            k.id,
            when(k.created_at),
            when_opt(k.last_used_at),
            k.minted_by
                .map_or_else(|| "operator".to_owned(), |m| format!("<code>{m}</code>")),
        );
        if op {
            let form = if k.revoked_at.is_none() {
                action_form(
                    &v,
                    &format!("/dashboard/api-keys/{}/revoke", k.id),
                    &format!("revoke-key-{}", k.id),
                    "Revoke",
                    "danger",
                    "",
                )
            } else {
                String::new()
            };
            let _ = write!(body, "<td>{form}</td>");
        }
        body.push_str("</tr>");
    }
    body.push_str("</tbody></table></div>");
    let days = period
        .days
        .filter(|d| [7, 30, 90].contains(d))
        .unwrap_or(30);
    let _ = write!(body, "<h2>Usage, last {days} days</h2>");
    body.push_str(&usage_sections(
        days,
        &by_day(&state, Some(id), days).await,
        &by_domain(&state, Some(id), days).await,
    ));
    page_for(&v, &format!("Account {name}"), &body, &[]).into_response()
}

/// A user's sticky sessions: each pin's exit, egress, time left, and (for
/// operators) an End button.
pub(crate) async fn user_sessions(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(user): Path<Uuid>,
) -> Response {
    let v = match viewer(&state, &headers).await {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let who = match crate::routes::users::fetch(&state, v.caller, user).await {
        Ok(u) => serde_json::to_value(u).unwrap_or_default(),
        Err(_) => {
            return (
                StatusCode::NOT_FOUND,
                page_for(&v, "No such user", "<p>Unknown user.</p>", &[]),
            )
                .into_response()
        }
    };
    let sessions = crate::routes::sessions::list(v.caller, State(state.clone()), Path(user)).await;
    let username = who["username"].as_str().unwrap_or("?").to_owned();
    let account = who["account_id"].as_str().unwrap_or_default().to_owned();
    let mut body = format!(
        "<p class=\"meta\">User <b>{}</b> of <a href=\"/dashboard/accounts/{a}\">its account</a>. A session pins one exit until it expires; ending it lets the next tunnel pick afresh.</p>",
        esc(&username),
        a = esc(&account)
    );
    let list = match sessions {
        Ok(Json(list)) => serde_json::to_value(list).unwrap_or_default(),
        Err(e) => {
            let _ = write!(
                body,
                "<p class=\"error\">Sessions unavailable: {}</p>",
                esc(&e.to_string())
            );
            serde_json::Value::Array(vec![])
        }
    };
    let op = v.is_operator();
    body.push_str("<table id=\"sessions\"><thead><tr><th scope=\"col\">session</th><th scope=\"col\">pinned exit</th><th scope=\"col\">egress IP</th><th scope=\"col\">time left</th><th scope=\"col\">idle timeout</th>");
    if op {
        body.push_str("<th scope=\"col\">action</th>");
    }
    body.push_str("</tr></thead><tbody>");
    let rows = list.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"6\">no live sessions</td></tr>");
    }
    for s in rows {
        let sid = s["session"].as_str().unwrap_or_default().to_owned();
        let exit = s["exit_id"].as_str().unwrap_or_default().to_owned();
        let exit_name = exit
            .parse::<Uuid>()
            .ok()
            .and_then(|e| state.observer.exit(e))
            .map_or_else(|| exit.clone(), |(now, _, _)| now.name);
        let exit_cell = if op {
            format!(
                "<a href=\"/dashboard/exits/{}\">{}</a>",
                esc(&exit),
                esc(&exit_name)
            )
        } else {
            esc(&exit_name)
        };
        let _ = write!(
            body,
            "<tr data-session=\"{sid_e}\"><td>{sid_e}</td><td>{exit_cell}</td><td>{}</td><td>{}</td><td>{}</td>",
            esc(s["egress_ip"].as_str().unwrap_or("–")),
            time_left(s["expires_in_ms"].as_i64().unwrap_or(0)),
            s["idle_expires_in_ms"]
                .as_i64()
                .map_or_else(|| "–".to_owned(), time_left),
            sid_e = esc(&sid),
        );
        if op {
            let form = action_form(
                &v,
                &format!("/dashboard/users/{user}/sessions/{sid}/end"),
                &format!("end-{sid}"),
                "End",
                "danger",
                "",
            );
            let _ = write!(body, "<td>{form}</td>");
        }
        body.push_str("</tr>");
    }
    body.push_str("</tbody></table>");
    page_for(&v, &format!("Sessions of {username}"), &body, &[]).into_response()
}
