//! The REST surface, one module per resource.

use axum::routing::{get, post};
use axum::Router;

use crate::AppState;

pub(crate) mod abuse;
pub(crate) mod accounts;
mod agent;
mod api_keys;
mod billing;
pub(crate) mod dashboard;
mod exits;
mod health;
pub(crate) mod page;
mod provenance;
mod sessions;
mod usage;
pub(crate) mod users;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route(
            "/openapi.json",
            get(|| async { axum::Json(crate::openapi::document()) }),
        )
        .route("/v1/accounts", post(accounts::create).get(accounts::list))
        .route(
            "/v1/accounts/{id}",
            get(accounts::get_one).delete(accounts::delete),
        )
        .route(
            "/v1/accounts/{id}/entitlements",
            axum::routing::put(accounts::set_entitlements),
        )
        .route(
            "/v1/accounts/{id}/users",
            post(users::create).get(users::list),
        )
        .route(
            "/v1/users/{id}",
            get(users::get_one)
                .patch(users::update)
                .delete(users::delete),
        )
        .route("/v1/accounts/{id}/usage", get(usage::usage))
        .route("/v1/accounts/{id}/invoices", get(billing::invoice))
        .route(
            "/v1/accounts/{id}/plan",
            axum::routing::put(billing::set_plan),
        )
        .route(
            "/v1/plans",
            post(billing::create_plan).get(billing::list_plans),
        )
        .route("/v1/users/{id}/quota", get(billing::quota))
        .route(
            "/v1/accounts/{id}/api-keys",
            post(api_keys::create_for_account).get(api_keys::list_for_account),
        )
        .route("/v1/api-keys", post(api_keys::create_operator))
        .route("/v1/api-keys/{id}", axum::routing::delete(api_keys::revoke))
        .route("/v1/users/{id}/sessions", get(sessions::list))
        .route(
            "/v1/users/{id}/sessions/{session}",
            get(sessions::get_one).delete(sessions::end),
        )
        .route(
            "/v1/enrollment-tokens",
            post(agent::create_enrollment_token),
        )
        .route("/v1/agent/enroll", post(agent::enroll))
        .route("/v1/agent/exits/{id}/heartbeat", post(agent::heartbeat))
        .route("/v1/exits", get(exits::list))
        .route("/v1/exits/{id}", get(exits::get_one))
        .route("/v1/exits/{id}/drain", post(exits::drain))
        .route("/v1/exits/{id}/undrain", post(exits::undrain))
        .route("/v1/exits/{id}/disable", post(exits::disable))
        .route("/v1/exits/{id}/enable", post(exits::enable))
        .route(
            "/v1/sources",
            post(provenance::create_source).get(provenance::list_sources),
        )
        .route(
            "/v1/sources/{id}",
            get(provenance::get_source).put(provenance::replace_source),
        )
        .route("/v1/consent-notices", post(provenance::create_notice))
        .route("/v1/consent-notices/{version}", get(provenance::get_notice))
        .route(
            "/v1/exits/{id}/consent",
            post(provenance::grant_consent).get(provenance::consent_history),
        )
        .route(
            "/v1/exits/{id}/consent/revoke",
            post(provenance::revoke_consent),
        )
        .route("/v1/exits/{id}/reinstate", post(provenance::reinstate))
        .route(
            "/v1/exits/{id}/provenance",
            get(provenance::exit_provenance),
        )
        .route(
            "/v1/agent/exits/{id}/opt-out",
            post(provenance::agent_opt_out),
        )
        .route("/v1/abuse/lookup", get(abuse::lookup))
        .route("/v1/audit", get(abuse::audit_log))
        .merge(
            Router::new()
                .route("/dashboard", get(dashboard::overview))
                .route(
                    "/dashboard/login",
                    get(dashboard::login_form).post(dashboard::login),
                )
                .route("/dashboard/logout", post(dashboard::logout))
                .route("/dashboard/data.json", get(dashboard::data))
                .route("/dashboard/exits/{id}", get(dashboard::exit_page))
                .route("/dashboard/usage", get(dashboard::usage))
                .layer(axum::middleware::from_fn(dashboard::security_headers)),
        )
        .with_state(state)
}
