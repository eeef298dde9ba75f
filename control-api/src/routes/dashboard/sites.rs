//! The Sites page: which target sites refuse which exits. Worst sites first
//! (most exits cooled fleet-wide), then each site's cooled exits with the
//! time left and a button that lifts the cooldown on every superproxy
//! ([`super::site_lift`], through the REST handler, so it is announced and
//! audited like `DELETE /v1/sites/{site}/cooldowns/{exit_id}`).
//!
//! A site whose cooled exits reach the live pool's size is flagged: the
//! superproxies' panic rule then routes it through cooled exits anyway, and
//! an operator reading "refused" tunnels should know why.

use super::*;

/// A path segment for `s`: everything but unreserved characters
/// percent-encoded, so an address block's `/` stays inside its segment.
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `GET /dashboard/sites`.
pub(crate) async fn sites(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let v = match operator_only(&state, &headers).await {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let live: u64 = state
        .observer
        .counts()
        .iter()
        .filter(|((s, _), _)| s == "live")
        .map(|(_, n)| *n)
        .sum();
    let mut body = String::from(
        "<p class=\"meta\">Exits a target site refuses are cooled for that site: the superproxies pick other exits for it until the cooldown ends \
(docs/health.md). Customers' <code>blocked</code> reports cool an exit for their own account at once, for everybody once three accounts agree. \
Lifting a cooldown puts the exit back for the site on every superproxy and forgets its back-off.</p>",
    );
    let items = match crate::routes::sites::view(&state, Caller::Operator, None).await {
        Ok(items) => items,
        Err(e) => {
            let _ = write!(
                body,
                "<p class=\"error\">Site cooldowns unavailable: {}</p>",
                esc(&e.to_string())
            );
            Vec::new()
        }
    };
    body.push_str("<h2>Worst sites</h2><table id=\"worst-sites\"><thead><tr><th scope=\"col\">site</th><th scope=\"col\">exits cooled</th><th scope=\"col\">of live exits</th><th scope=\"col\">cooled for one account</th><th scope=\"col\">note</th></tr></thead><tbody>");
    if items.is_empty() {
        body.push_str("<tr><td colspan=\"5\">no exit is cooled for any site</td></tr>");
    }
    for s in &items {
        let note = if live > 0 && s.cooled as u64 >= live {
            "every live exit cooled: the panic rule routes this site through them anyway"
        } else {
            ""
        };
        let _ = write!(
            body,
            "<tr data-site=\"{site}\"><td><a href=\"#site-{anchor}\">{site}</a></td><td class=\"num\">{}</td><td class=\"num\">{live}</td><td class=\"num\">{}</td><td>{note}</td></tr>",
            s.cooled,
            s.account_cooled_exits.len(),
            site = esc(&s.site),
            anchor = esc(&segment(&s.site)),
        );
    }
    body.push_str("</tbody></table>");
    for s in items.iter().filter(|s| s.cooled > 0) {
        let _ = write!(
            body,
            "<h2 id=\"site-{anchor}\">{site}</h2><table class=\"cooled-exits\" data-site=\"{site}\"><thead><tr><th scope=\"col\">exit</th><th scope=\"col\">level</th><th scope=\"col\">time left</th><th scope=\"col\">until</th><th scope=\"col\">action</th></tr></thead><tbody>",
            site = esc(&s.site),
            anchor = esc(&segment(&s.site)),
        );
        for c in &s.cooled_exits {
            let name = state
                .observer
                .exit(c.exit_id)
                .map_or_else(|| c.exit_id.to_string(), |(now, _, _)| now.name);
            let form = action_form(
                &v,
                &format!(
                    "/dashboard/sites/{}/cooldowns/{}/lift",
                    segment(&s.site),
                    c.exit_id
                ),
                &format!("lift-{}-{}", segment(&s.site), c.exit_id),
                "Lift",
                "",
                "",
            );
            let _ = write!(
                body,
                "<tr data-exit=\"{id}\"><td><a href=\"/dashboard/exits/{id}\">{}</a></td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{form}</td></tr>",
                esc(&name),
                c.level,
                time_left(c.remaining_ms),
                when(c.until),
                id = c.exit_id,
            );
        }
        body.push_str("</tbody></table>");
    }
    page_for(&v, "Sites", &body, &[]).into_response()
}
