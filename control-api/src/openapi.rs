//! The OpenAPI 3.1 document served at `/openapi.json`.
//!
//! Written as one table of operations next to the router; a test in
//! `tests/tests/e2e/api_contract.rs` checks that the table and the router list
//! the same routes and that no operation answers 500 to generated input.

use serde_json::{json, Map, Value};

/// Who may call an operation.
#[derive(Clone, Copy)]
enum Auth {
    None,
    /// Operator key or admin token.
    Operator,
    /// Operator, or an account key for its own account.
    Account,
    /// An enrolled agent's credential.
    Agent,
}

/// (method, path, summary, auth, request schema, success status)
type Operation = (
    &'static str,
    &'static str,
    &'static str,
    Auth,
    Option<&'static str>,
    u16,
);

const OPERATIONS: &[Operation] = &[
    ("get", "/healthz", "Process is alive", Auth::None, None, 200),
    (
        "get",
        "/readyz",
        "Postgres and Redis answer",
        Auth::None,
        None,
        200,
    ),
    (
        "get",
        "/openapi.json",
        "This document",
        Auth::None,
        None,
        200,
    ),
    (
        "post",
        "/v1/accounts",
        "Create an account",
        Auth::Operator,
        Some("CreateAccount"),
        201,
    ),
    (
        "get",
        "/v1/accounts",
        "List accounts (?limit=&after=, Link rel=next)",
        Auth::Operator,
        None,
        200,
    ),
    (
        "get",
        "/v1/accounts/{id}",
        "Read an account (with its plan and entitlements)",
        Auth::Account,
        None,
        200,
    ),
    (
        "delete",
        "/v1/accounts/{id}",
        "Delete an account: its users disabled and cut, its keys revoked, its ledger kept",
        Auth::Operator,
        None,
        204,
    ),
    (
        "put",
        "/v1/accounts/{id}/entitlements",
        "Replace what the account is granted: totals, restrictions, allow-list bounds",
        Auth::Operator,
        Some("Entitlements"),
        200,
    ),
    (
        "post",
        "/v1/accounts/{id}/users",
        "Create a proxy user",
        Auth::Account,
        Some("CreateUser"),
        201,
    ),
    (
        "get",
        "/v1/accounts/{id}/users",
        "List an account's proxy users (?limit=&after=, Link rel=next)",
        Auth::Account,
        None,
        200,
    ),
    (
        "get",
        "/v1/accounts/{id}/usage",
        "Bytes up/down from the ledger",
        Auth::Account,
        None,
        200,
    ),
    (
        "get",
        "/v1/accounts/{id}/invoices",
        "A month's invoice (JSON or CSV)",
        Auth::Account,
        None,
        200,
    ),
    (
        "put",
        "/v1/accounts/{id}/plan",
        "Set the account's plan",
        Auth::Operator,
        Some("SetPlan"),
        204,
    ),
    (
        "post",
        "/v1/accounts/{id}/api-keys",
        "Create an account API key (records the key that minted it)",
        Auth::Account,
        Some("CreateKey"),
        201,
    ),
    (
        "get",
        "/v1/accounts/{id}/api-keys",
        "List the account's keys: who minted each, last use, revocation; never secrets",
        Auth::Account,
        None,
        200,
    ),
    (
        "post",
        "/v1/api-keys",
        "Create an operator API key",
        Auth::Operator,
        Some("CreateKey"),
        201,
    ),
    (
        "delete",
        "/v1/api-keys/{id}",
        "Revoke an API key",
        Auth::Account,
        None,
        204,
    ),
    (
        "post",
        "/v1/plans",
        "Create a plan with prices per GB",
        Auth::Operator,
        Some("CreatePlan"),
        201,
    ),
    (
        "get",
        "/v1/plans",
        "List plans with their prices (?limit=&after=, Link rel=next)",
        Auth::Operator,
        None,
        200,
    ),
    (
        "get",
        "/v1/users/{id}",
        "Read a proxy user",
        Auth::Account,
        None,
        200,
    ),
    (
        "patch",
        "/v1/users/{id}",
        "Enable/disable, rotate password, set limits",
        Auth::Account,
        Some("UpdateUser"),
        200,
    ),
    (
        "delete",
        "/v1/users/{id}",
        "Delete a proxy user",
        Auth::Account,
        None,
        204,
    ),
    (
        "get",
        "/v1/users/{id}/quota",
        "Current quota period state",
        Auth::Account,
        None,
        200,
    ),
    (
        "get",
        "/v1/users/{id}/sessions",
        "List sticky sessions",
        Auth::Account,
        None,
        200,
    ),
    (
        "get",
        "/v1/users/{id}/sessions/{session}",
        "Read a sticky session",
        Auth::Account,
        None,
        200,
    ),
    (
        "delete",
        "/v1/users/{id}/sessions/{session}",
        "End a sticky session",
        Auth::Account,
        None,
        204,
    ),
    (
        "post",
        "/v1/enrollment-tokens",
        "Create a one-time exit enrollment token",
        Auth::Operator,
        Some("CreateEnrollmentToken"),
        201,
    ),
    (
        "post",
        "/v1/agent/enroll",
        "Exchange an enrollment token for an exit credential",
        Auth::None,
        Some("Enroll"),
        201,
    ),
    (
        "post",
        "/v1/agent/exits/{id}/heartbeat",
        "Agent heartbeat; lists superproxies",
        Auth::Agent,
        Some("Heartbeat"),
        200,
    ),
    (
        "get",
        "/v1/exits",
        "Exits with provenance, liveness and fleet health (?limit=&after=, Link rel=next)",
        Auth::Operator,
        None,
        200,
    ),
    (
        "get",
        "/v1/exits/{id}",
        "One exit",
        Auth::Operator,
        None,
        200,
    ),
    (
        "post",
        "/v1/exits/{id}/drain",
        "No new tunnels; open ones finish",
        Auth::Operator,
        None,
        200,
    ),
    (
        "post",
        "/v1/exits/{id}/undrain",
        "Back into rotation",
        Auth::Operator,
        None,
        200,
    ),
    (
        "post",
        "/v1/exits/{id}/disable",
        "Out of rotation",
        Auth::Operator,
        None,
        200,
    ),
    (
        "post",
        "/v1/exits/{id}/enable",
        "Back into rotation",
        Auth::Operator,
        None,
        200,
    ),
    (
        "post",
        "/v1/sources",
        "Create a provenance source (the four questions)",
        Auth::Operator,
        Some("Source"),
        201,
    ),
    (
        "get",
        "/v1/sources",
        "List sources with their completeness",
        Auth::Operator,
        None,
        200,
    ),
    (
        "get",
        "/v1/sources/{id}",
        "One source",
        Auth::Operator,
        None,
        200,
    ),
    (
        "put",
        "/v1/sources/{id}",
        "Replace a source's answers (its exits follow at once)",
        Auth::Operator,
        Some("Source"),
        200,
    ),
    (
        "post",
        "/v1/consent-notices",
        "Store a consent notice text under a version",
        Auth::Operator,
        Some("Notice"),
        201,
    ),
    (
        "get",
        "/v1/consent-notices/{version}",
        "A consent notice text (public; Proxynet-Notice-Sha256)",
        Auth::None,
        None,
        200,
    ),
    (
        "post",
        "/v1/exits/{id}/consent",
        "Record granted consent (a new version)",
        Auth::Operator,
        Some("GrantConsent"),
        201,
    ),
    (
        "get",
        "/v1/exits/{id}/consent",
        "The exit's consent history (append-only)",
        Auth::Operator,
        None,
        200,
    ),
    (
        "post",
        "/v1/exits/{id}/consent/revoke",
        "Revoke consent (a new version)",
        Auth::Operator,
        Some("RevokeConsent"),
        200,
    ),
    (
        "post",
        "/v1/exits/{id}/reinstate",
        "Bring back an exit its owner withdrew, with a fresh consent record (the owner must also run exit-agent opt-in)",
        Auth::Operator,
        Some("GrantConsent"),
        201,
    ),
    (
        "get",
        "/v1/exits/{id}/provenance",
        "Provenance: full for operators, the customer view for accounts whose traffic the exit carried",
        Auth::Account,
        None,
        200,
    ),
    (
        "post",
        "/v1/agent/exits/{id}/opt-out",
        "The exit's owner withdraws it (idempotent)",
        Auth::Agent,
        Some("OptOut"),
        200,
    ),
    (
        "get",
        "/v1/abuse/lookup",
        "Who used an egress IP for a target around a time (?egress_ip=&at=&target=&window_minutes=)",
        Auth::Operator,
        None,
        200,
    ),
    (
        "get",
        "/v1/audit",
        "The audit log, newest first (?action=&subject=&actor=&from=&to=&limit=&after=)",
        Auth::Operator,
        None,
        200,
    ),
    (
        "get",
        "/dashboard",
        "Dashboard: fleet overview (HTML; session cookie from /dashboard/login)",
        Auth::None,
        None,
        200,
    ),
    (
        "get",
        "/dashboard/login",
        "Dashboard login form (HTML)",
        Auth::None,
        None,
        200,
    ),
    (
        "post",
        "/dashboard/login",
        "Exchange an API key (form field `key`) for an HttpOnly session cookie",
        Auth::None,
        None,
        303,
    ),
    (
        "post",
        "/dashboard/logout",
        "End the dashboard session",
        Auth::None,
        None,
        303,
    ),
    (
        "get",
        "/dashboard/data.json",
        "Dashboard table data (operator session)",
        Auth::None,
        None,
        200,
    ),
    (
        "get",
        "/dashboard/exits/{id}",
        "One exit's last hour (HTML, operator session)",
        Auth::None,
        None,
        200,
    ),
    (
        "get",
        "/dashboard/usage",
        "Usage of the session's account (HTML)",
        Auth::None,
        None,
        200,
    ),
];

/// Method and path of every documented operation.
pub fn operations() -> impl Iterator<Item = (&'static str, &'static str)> {
    OPERATIONS.iter().map(|(m, p, ..)| (*m, *p))
}

fn schemas() -> Value {
    let limits = json!({
        "type": "object", "additionalProperties": false,
        "properties": {
            "max_concurrent_tunnels": {"type": ["integer", "null"], "minimum": 1},
            "max_new_tunnels_per_second": {"type": ["integer", "null"], "minimum": 1},
            "bandwidth_bytes": {"type": ["integer", "null"], "minimum": 1},
            "period": {"type": ["string", "null"], "enum": ["daily", "monthly", null]},
            "warn_percent": {"type": ["integer", "null"], "minimum": 1, "maximum": 100},
            "allowed_source_types": {"type": ["array", "null"], "items": {"enum": ["dc", "isp", "res", "mobile"]}},
            "allowed_countries": {"type": ["array", "null"], "items": {"type": "string", "pattern": "^[A-Z]{2}$"}},
            "allowed_channels": {"type": ["array", "null"], "items": {"enum": ["owned", "leased", "isp", "sdk", "extension", "sharing", "reseller"]}}
        }
    });
    json!({
        "Problem": {"type": "object", "description": "RFC 9457 problem details",
            "properties": {"type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"}}},
        "CreateAccount": {"type": "object", "additionalProperties": false, "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200}}},
        "Limits": limits,
        "Entitlements": {"type": "object", "additionalProperties": false,
            "properties": {"limits": {"$ref": "#/components/schemas/Limits"},
                "allowlist": {"type": "object", "additionalProperties": false,
                    "properties": {"min_prefix_v4": {"type": "integer", "minimum": 0, "maximum": 32},
                        "min_prefix_v6": {"type": "integer", "minimum": 0, "maximum": 128},
                        "special_ranges": {"type": "boolean"}}}}},
        "CreateUser": {"type": "object", "additionalProperties": false, "required": ["username", "password"],
            "properties": {"username": {"type": "string", "pattern": "^[A-Za-z0-9_.]{1,64}$"},
                "password": {"type": "string", "minLength": 8, "maxLength": 255},
                "limits": {"$ref": "#/components/schemas/Limits"},
                "allowed_source_cidrs": {"type": "array", "items": {"type": "string"}, "maxItems": 256},
                "allowlist_options": {"type": "string", "pattern": "^[A-Za-z0-9-]{0,200}$"}}},
        "UpdateUser": {"type": "object", "additionalProperties": false,
            "properties": {"enabled": {"type": "boolean"}, "password": {"type": "string", "minLength": 8, "maxLength": 255},
                "limits": {"$ref": "#/components/schemas/Limits"},
                "allowed_source_cidrs": {"type": "array", "items": {"type": "string"}, "maxItems": 256},
                "allowlist_options": {"type": "string", "pattern": "^[A-Za-z0-9-]{0,200}$"}}},
        "CreateKey": {"type": "object", "additionalProperties": false, "properties": {"name": {"type": "string", "maxLength": 200}}},
        "SetPlan": {"type": "object", "additionalProperties": false, "required": ["plan_id"], "properties": {"plan_id": {"type": "string", "format": "uuid"}}},
        "CreatePlan": {"type": "object", "additionalProperties": false, "required": ["name", "prices"],
            "properties": {"name": {"type": "string"}, "prices": {"type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0}, "propertyNames": {"enum": ["dc", "isp", "res", "mobile"]}}}},
        "CreateEnrollmentToken": {"type": "object", "additionalProperties": false, "required": ["name", "source_id", "country"],
            "properties": {"name": {"type": "string"}, "source_id": {"type": "string", "format": "uuid"},
                "country": {"type": "string", "pattern": "^[A-Z]{2}$"}, "city": {"type": "string"}, "asn": {"type": "integer"},
                "ttl_seconds": {"type": "integer", "minimum": 1, "maximum": 2592000}}},
        "Source": {"type": "object", "additionalProperties": false, "required": ["name", "source_type", "channel"],
            "properties": {"name": {"type": "string"}, "source_type": {"enum": ["dc", "isp", "res", "mobile"]},
                "channel": {"enum": ["owned", "leased", "isp", "sdk", "extension", "sharing", "reseller"]},
                "supplier": {"type": "string"}, "agreement_ref": {"type": "string"}, "notice_description": {"type": "string"},
                "opt_out": {"type": "string"}, "liable_party": {"type": "string"}, "abuse_contact": {"type": "string"},
                "countries": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z]{2}$"}},
                "consent_required": {"type": "boolean"}}},
        "Notice": {"type": "object", "additionalProperties": false, "required": ["version", "body"],
            "properties": {"version": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}, "body": {"type": "string"}}},
        "GrantConsent": {"type": "object", "additionalProperties": false, "required": ["method", "notice_version", "evidence_ref", "opt_out"],
            "properties": {"granted_at": {"type": "string", "format": "date-time"},
                "method": {"enum": ["in_app_opt_in", "click_through_terms", "signed_contract"]},
                "notice_version": {"type": "string"}, "notice_sha256": {"type": "string"},
                "evidence_ref": {"type": "string"}, "opt_out": {"type": "string"},
                "expires_at": {"type": "string", "format": "date-time"}}},
        "RevokeConsent": {"type": "object", "additionalProperties": false, "required": ["reason"],
            "properties": {"reason": {"type": "string"}}},
        "OptOut": {"type": "object", "additionalProperties": false, "properties": {"reason": {"type": "string"}}},
        "Enroll": {"type": "object", "additionalProperties": false, "required": ["token", "egress_ips"],
            "properties": {"token": {"type": "string"}, "egress_ips": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 256},
                "hostname": {"type": "string"}, "agent_version": {"type": "string"}}},
        "Heartbeat": {"type": "object", "additionalProperties": false,
            "properties": {"draining": {"type": "boolean"}, "active_tunnels": {"type": "integer", "minimum": 0},
                "admin_addrs": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
                "internal_targets": {"type": "boolean"}}}
    })
}

pub fn document() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for (method, path, summary, auth, body, status) in OPERATIONS {
        let mut op = json!({
            "summary": summary,
            "responses": {
                status.to_string(): {"description": "success"},
                "default": {"description": "error", "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
            }
        });
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        if !params.is_empty() {
            op["parameters"] = Value::Array(params);
        }
        if let Some(schema) = body {
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
        }
        op["security"] = match auth {
            Auth::None => json!([]),
            Auth::Operator => json!([{"operatorKey": []}]),
            Auth::Account => json!([{"operatorKey": []}, {"accountKey": []}]),
            Auth::Agent => json!([{"agentCredential": []}]),
        };
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "proxynet control API", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "securitySchemes": {
                "operatorKey": {"type": "http", "scheme": "bearer", "description": "admin token or operator API key"},
                "accountKey": {"type": "http", "scheme": "bearer", "description": "account API key: its own account only"},
                "agentCredential": {"type": "http", "scheme": "bearer", "description": "an enrolled exit's credential"}
            }
        }
    })
}
