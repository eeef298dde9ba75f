//! The REST surface, one module per resource, and the one table of its
//! operations: the router is built from [`operations`] and `/openapi.json`
//! is rendered from the same table ([`crate::openapi`]), so neither can list a
//! route the other lacks.

use axum::Router;
use proxynet_store::policy::OperatorPolicy;
use proxynet_wire::heartbeat::HeartbeatRequest;
use proxynet_wire::reflector::EgressReport;

use crate::ceilings::Entitlements;
use crate::openapi::{Auth, Op};
use crate::webhooks::routes as webhooks;
use crate::AppState;

pub(crate) mod abuse;
pub(crate) mod accounts;
mod agent;
mod api_keys;
mod billing;
pub(crate) mod dashboard;
pub(crate) mod dedicated;
pub(crate) mod egress;
mod exits;
mod feedback;
mod health;
pub(crate) mod page;
mod policy;
mod provenance;
mod reconciliation;
mod sessions;
mod sites;
mod usage;
pub(crate) mod users;

#[cfg(test)]
mod tests;

/// Every operation the control API serves, with what its document says.
/// A `.body::<T>()` names the type the handler's `Json` extractor reads
/// (for `PUT /v1/policy`, which reads JSON and checks it by hand, the type
/// it checks it into): the document's schema is `T`'s.
pub(crate) fn operations() -> Vec<Op> {
    vec![
        Op::get("/healthz", health::healthz, "Process is alive", Auth::None),
        Op::get("/readyz", health::readyz, "Postgres and Redis answer", Auth::None),
        Op::get("/openapi.json", openapi_json, "This document", Auth::None),
        Op::get("/v1/accounts", accounts::list, "List accounts (?limit=&after=, Link rel=next)", Auth::Operator),
        Op::post("/v1/accounts", accounts::create, "Create an account", Auth::Operator).body::<accounts::CreateAccount>().status(201),
        Op::get("/v1/accounts/{id}", accounts::get_one, "Read an account (with its plan and entitlements)", Auth::Account),
        Op::patch("/v1/accounts/{id}", accounts::update, "Change an account's traffic policy (`{\"policy\": {...}}`; docs/policy.md)", Auth::Account).body::<accounts::UpdateAccount>(),
        Op::delete("/v1/accounts/{id}", accounts::delete, "Delete an account: its users disabled and cut, its keys revoked, its ledger kept", Auth::Operator).status(204),
        Op::put("/v1/accounts/{id}/entitlements", accounts::set_entitlements, "Replace what the account is granted: totals, restrictions, allow-list bounds", Auth::Operator).body::<Entitlements>(),
        Op::get("/v1/accounts/{id}/users", users::list, "List an account's proxy users (?limit=&after=, Link rel=next)", Auth::Account),
        Op::post("/v1/accounts/{id}/users", users::create, "Create a proxy user", Auth::Account).body::<users::CreateUser>().status(201),
        Op::get("/v1/users/{id}", users::get_one, "Read a proxy user", Auth::Account),
        Op::patch("/v1/users/{id}", users::update, "Enable/disable, rotate password, set limits", Auth::Account).body::<users::UpdateUser>(),
        Op::delete("/v1/users/{id}", users::delete, "Delete a proxy user", Auth::Account).status(204),
        Op::get("/v1/accounts/{id}/usage", usage::usage, "Bytes up/down from the ledger", Auth::Account),
        Op::get("/v1/accounts/{id}/invoices", billing::invoice, "A month's invoice (JSON or CSV)", Auth::Account),
        Op::put("/v1/accounts/{id}/plan", billing::set_plan, "Set the account's plan", Auth::Operator).body::<billing::SetPlan>().status(204),
        Op::get("/v1/plans", billing::list_plans, "List plans with their prices (?limit=&after=, Link rel=next)", Auth::Operator),
        Op::post("/v1/plans", billing::create_plan, "Create a plan with prices per GB", Auth::Operator).body::<billing::CreatePlan>().status(201),
        Op::get("/v1/accounts/{id}/dedicated-ips", dedicated::list, "The account's dedicated addresses and its replacement allowance (docs/dedicated.md)", Auth::Account),
        Op::post("/v1/accounts/{id}/dedicated-ips", dedicated::allocate, "Allocate dedicated addresses by targeting (operators may name them)", Auth::Account).body::<dedicated::Allocate>().status(201),
        Op::delete("/v1/accounts/{id}/dedicated-ips/{ip}", dedicated::release, "Release a dedicated address", Auth::Account).status(204),
        Op::post("/v1/accounts/{id}/dedicated-ips/{ip}/replace", dedicated::replace, "Swap a dedicated address for a free one of the same targeting (monthly allowance)", Auth::Account),
        Op::put("/v1/accounts/{id}/dedicated-ips/{ip}/users", dedicated::set_users, "Which of the account's users a dedicated address serves (empty: all)", Auth::Account).body::<dedicated::AssignUsers>(),
        Op::get("/v1/dedicated-ips", dedicated::map, "Every dedicated address held (?account_id=)", Auth::Operator),
        Op::post("/v1/dedicated-ips/{ip}/move", dedicated::move_to, "Move a dedicated address to another account", Auth::Operator).body::<dedicated::Move>(),
        Op::get("/v1/users/{id}/quota", billing::quota, "Current quota period state", Auth::Account),
        Op::get("/v1/accounts/{id}/api-keys", api_keys::list_for_account, "List the account's keys: who minted each, last use, revocation; never secrets", Auth::Account),
        Op::post("/v1/accounts/{id}/api-keys", api_keys::create_for_account, "Create an account API key (records the key that minted it)", Auth::Account).body::<api_keys::CreateKey>().status(201),
        Op::post("/v1/api-keys", api_keys::create_operator, "Create an operator API key", Auth::Operator).body::<api_keys::CreateKey>().status(201),
        Op::delete("/v1/api-keys/{id}", api_keys::revoke, "Revoke an API key", Auth::Account).status(204),
        Op::get("/v1/users/{id}/sessions", sessions::list, "List sticky sessions", Auth::Account),
        Op::get("/v1/users/{id}/sessions/{session}", sessions::get_one, "Read a sticky session", Auth::Account),
        Op::patch("/v1/users/{id}/sessions/{session}", sessions::set_time, "Set a sticky session's remaining life to sesstime_minutes from now (extend or shorten)", Auth::Account).body::<sessions::SetSessionTime>(),
        Op::delete("/v1/users/{id}/sessions/{session}", sessions::end, "End a sticky session", Auth::Account).status(204),
        Op::get("/v1/sites", sites::list, "Exits cooled per target site, worst first (?site=): the fleet for operators; for an account the sites it used in the last 24 h or reported, and its own cooldowns", Auth::Account),
        Op::delete("/v1/sites/{site}/cooldowns/{exit_id}", sites::lift, "Lift an exit's cooldown for a site on every superproxy (its back-off forgotten); audited", Auth::Operator).status(204),
        Op::post("/v1/feedback", feedback::report, "Report an exit (exit_id, or a session's pinned exit) blocked, slow or ok for a site: blocked cools it for the reporting account at once, for the fleet once 3 accounts agree within an hour (docs/health.md); rate-limited per key", Auth::Account).body::<feedback::Feedback>().status(201),
        Op::post("/v1/enrollment-tokens", agent::create_enrollment_token, "Create a one-time exit enrollment token", Auth::Operator).body::<agent::CreateEnrollmentToken>().status(201),
        Op::post("/v1/agent/enroll", agent::enroll, "Exchange an enrollment token for an exit credential", Auth::None).body::<agent::Enroll>().status(201),
        Op::post("/v1/agent/exits/{id}/heartbeat", agent::heartbeat, "Agent heartbeat; lists superproxies", Auth::Agent).body::<HeartbeatRequest>(),
        Op::post("/v1/agent/exits/{id}/egress", egress::report, "Agent report: the public address the reflector saw from each egress (signed answers only)", Auth::Agent).body::<EgressReport>(),
        Op::get("/v1/exits", exits::list, "Exits with provenance, liveness and fleet health (?limit=&after=, Link rel=next)", Auth::Operator),
        Op::get("/v1/exits/{id}", exits::get_one, "One exit, with its declared, bound and observed egress", Auth::Operator),
        Op::get("/v1/exits/{id}/reconciliation", reconciliation::reconciliation, "Bytes per UTC day through the exit as the ledger has them, with the source's cost and what customers were billed (?from=&to=; CSV with Accept: text/csv)", Auth::Operator),
        Op::post("/v1/exits/{id}/drain", exits::drain, "No new tunnels; open ones finish", Auth::Operator),
        Op::post("/v1/exits/{id}/undrain", exits::undrain, "Back into rotation", Auth::Operator),
        Op::post("/v1/exits/{id}/disable", exits::disable, "Out of rotation", Auth::Operator),
        Op::post("/v1/exits/{id}/enable", exits::enable, "Back into rotation", Auth::Operator),
        Op::get("/v1/sources", provenance::list_sources, "List sources with their completeness", Auth::Operator),
        Op::post("/v1/sources", provenance::create_source, "Create a provenance source (the four questions)", Auth::Operator).body::<provenance::SourceBody>().status(201),
        Op::get("/v1/sources/{id}", provenance::get_source, "One source", Auth::Operator),
        Op::put("/v1/sources/{id}", provenance::replace_source, "Replace a source's answers (its exits follow at once)", Auth::Operator).body::<provenance::SourceBody>(),
        Op::post("/v1/consent-notices", provenance::create_notice, "Store a consent notice text under a version", Auth::Operator).body::<provenance::NoticeBody>().status(201),
        Op::get("/v1/consent-notices/{version}", provenance::get_notice, "A consent notice text (public; Proxynet-Notice-Sha256)", Auth::None),
        Op::get("/v1/exits/{id}/consent", provenance::consent_history, "The exit's consent history (append-only)", Auth::Operator),
        Op::post("/v1/exits/{id}/consent", provenance::grant_consent, "Record granted consent (a new version)", Auth::Operator).body::<provenance::GrantConsent>().status(201),
        Op::post("/v1/exits/{id}/consent/revoke", provenance::revoke_consent, "Revoke consent (a new version)", Auth::Operator).body::<provenance::RevokeConsent>(),
        Op::post("/v1/exits/{id}/reinstate", provenance::reinstate, "Bring back an exit its owner withdrew, with a fresh consent record (the owner must also run exit-agent opt-in)", Auth::Operator).body::<provenance::GrantConsent>().status(201),
        Op::get("/v1/exits/{id}/provenance", provenance::exit_provenance, "Provenance: full for operators, the customer view for accounts whose traffic the exit carried", Auth::Account),
        Op::post("/v1/agent/exits/{id}/opt-out", provenance::agent_opt_out, "The exit's owner withdraws it (idempotent)", Auth::Agent).body::<provenance::OptOut>(),
        Op::get("/v1/abuse/lookup", abuse::lookup, "Who used an egress address (bound, or the public one observed) for a target around a time (?egress_ip=IP|CIDR&at=&target=&window_minutes=); audited", Auth::Operator),
        Op::get("/v1/abuse/export", abuse::export, "The abuse record of a time range, at most 31 days, streamed (?from=&to=&format=json|csv&egress_ip=&target=); audited", Auth::Operator),
        Op::get("/v1/policy", policy::get, "The operator's traffic policy for every account (docs/policy.md)", Auth::Operator),
        Op::put("/v1/policy", policy::put, "Replace the operator's traffic policy: denied domains and ports, aggregate per-domain limits", Auth::Operator).body::<OperatorPolicy>(),
        Op::get("/v1/audit", abuse::audit_log, "The audit log, newest first (?action=&subject=&actor=&from=&to=&limit=&after=)", Auth::Operator),
        Op::get("/v1/accounts/{id}/webhooks", webhooks::list_for_account, "List the account's webhooks (never their secrets)", Auth::Account),
        Op::post("/v1/accounts/{id}/webhooks", webhooks::create_for_account, "Create a signed webhook for the account's events (the secret is shown once; docs/webhooks.md)", Auth::Account).body::<webhooks::CreateWebhook>().status(201),
        Op::patch("/v1/accounts/{id}/webhooks/{wid}", webhooks::update_for_account, "Enable a webhook (one its failures disabled) or pause it (`{\"enabled\": bool}`)", Auth::Account).body::<webhooks::UpdateWebhook>(),
        Op::delete("/v1/accounts/{id}/webhooks/{wid}", webhooks::delete_for_account, "Delete a webhook (its pending deliveries go with it)", Auth::Account).status(204),
        Op::get("/v1/accounts/{id}/webhooks/{wid}/deliveries", webhooks::deliveries_for_account, "A webhook's delivery history, newest first (?limit=&after=, Link rel=next)", Auth::Account),
        Op::get("/v1/webhooks", webhooks::list_operator, "List the operator's webhooks (every account's events, and exit.withdrawn)", Auth::Operator),
        Op::post("/v1/webhooks", webhooks::create_operator, "Create an operator webhook (may subscribe to exit.withdrawn; the secret is shown once)", Auth::Operator).body::<webhooks::CreateWebhook>().status(201),
        Op::patch("/v1/webhooks/{wid}", webhooks::update_operator, "Enable or pause an operator webhook (`{\"enabled\": bool}`)", Auth::Operator).body::<webhooks::UpdateWebhook>(),
        Op::delete("/v1/webhooks/{wid}", webhooks::delete_operator, "Delete an operator webhook", Auth::Operator).status(204),
        Op::get("/v1/webhooks/{wid}/deliveries", webhooks::deliveries_operator, "An operator webhook's delivery history, newest first (?limit=&after=, Link rel=next)", Auth::Operator),
        Op::get("/dashboard", dashboard::overview, "Dashboard: fleet overview (HTML; session cookie from /dashboard/login)", Auth::None),
        Op::get("/dashboard/login", dashboard::login_form, "Dashboard login form (HTML)", Auth::None),
        Op::post("/dashboard/login", dashboard::login, "Exchange an API key (form field `key`) for an HttpOnly session cookie", Auth::None).status(303),
        Op::post("/dashboard/logout", dashboard::logout, "End the dashboard session", Auth::None).status(303),
        Op::get("/dashboard/data.json", dashboard::data, "Dashboard table data (operator session)", Auth::None),
        Op::get("/dashboard/exits/{id}", dashboard::exit_page, "One exit's last hour (HTML, operator session)", Auth::None),
        Op::get("/dashboard/usage", dashboard::usage, "Usage by day, domain and user over ?days=1|7|30|90: the session's account, or all for operators (HTML)", Auth::None),
        Op::get("/dashboard/accounts", dashboard::accounts, "Every account (HTML, operator session)", Auth::None),
        Op::get("/dashboard/accounts/{id}", dashboard::account_page, "One account: users, quotas, entitlements, keys, usage (HTML; operators any, an account its own)", Auth::None),
        Op::get("/dashboard/users/{id}/sessions", dashboard::user_sessions, "A user's sticky sessions (HTML)", Auth::None),
        Op::get("/dashboard/sites", dashboard::sites, "Target sites worst first: exits cooled per site, each with a lift button (HTML, operator session)", Auth::None),
        Op::post("/dashboard/exits/{id}/{action}", dashboard::exit_action, "Drain, undrain, disable, enable or revoke-consent an exit (form: csrf, confirm=yes, reason; operator session)", Auth::None).status(303),
        Op::post("/dashboard/api-keys/{id}/revoke", dashboard::key_revoke, "Revoke a key and its descendants (form: csrf, confirm=yes; operator session)", Auth::None).status(303),
        Op::post("/dashboard/users/{id}/{action}", dashboard::user_action, "Disable or enable a user (form: csrf, confirm=yes; operator session)", Auth::None).status(303),
        Op::post("/dashboard/users/{id}/sessions/{session}/end", dashboard::session_end, "End a sticky session (form: csrf, confirm=yes; operator session)", Auth::None).status(303),
        Op::post("/dashboard/sites/{site}/cooldowns/{exit_id}/lift", dashboard::site_lift, "Lift an exit's cooldown for a site (form: csrf; operator session)", Auth::None).status(303),
    ]
}

/// `/openapi.json`, rendered once from [`operations`].
async fn openapi_json() -> axum::Json<serde_json::Value> {
    static DOCUMENT: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    axum::Json(
        DOCUMENT
            .get_or_init(|| crate::openapi::document(operations()))
            .clone(),
    )
}

pub(crate) fn router(state: AppState) -> Router {
    let (mut api, mut pages) = (Router::new(), Router::new());
    for op in operations() {
        // The dashboard's pages carry its security headers (CSP, no framing,
        // no caching); the JSON API sets its own.
        if op.path == "/dashboard" || op.path.starts_with("/dashboard/") {
            pages = pages.route(op.path, op.handler);
        } else {
            api = api.route(op.path, op.handler);
        }
    }
    api.merge(pages.layer(axum::middleware::from_fn(dashboard::security_headers)))
        .with_state(state)
}
