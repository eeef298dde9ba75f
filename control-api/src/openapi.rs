//! The OpenAPI 3.1 document served at `/openapi.json`.
//!
//! Rendered from the same table the router is built from
//! ([`crate::routes::operations`]): each entry pairs a handler with its
//! summary, who may call it, its body schema and its success status, so the
//! document cannot list a route the router lacks or miss one it serves.
//! `tests/tests/e2e/api_contract.rs` calls every documented operation on a
//! running stack (routed, never a 500 to generated input).

use axum::handler::Handler;
use axum::routing::MethodRouter;
use serde_json::{json, Map, Value};

use crate::AppState;

/// Who may call an operation.
#[derive(Clone, Copy)]
pub(crate) enum Auth {
    None,
    /// Operator key or admin token.
    Operator,
    /// Operator, or an account key for its own account.
    Account,
    /// An enrolled agent's credential.
    Agent,
}

/// One operation: the handler the router serves and what the document says
/// of it, written once in [`crate::routes::operations`].
pub(crate) struct Op {
    pub(crate) method: &'static str,
    pub(crate) path: &'static str,
    pub(crate) handler: MethodRouter<AppState>,
    summary: &'static str,
    auth: Auth,
    /// The request body's schema in `components.schemas`.
    body: Option<&'static str>,
    status: u16,
}

macro_rules! op_constructors {
    ($($method:ident),*) => {$(
        pub(crate) fn $method<H, T>(
            path: &'static str,
            handler: H,
            summary: &'static str,
            auth: Auth,
        ) -> Self
        where
            H: Handler<T, AppState>,
            T: 'static,
        {
            Self {
                method: stringify!($method),
                path,
                handler: axum::routing::$method(handler),
                summary,
                auth,
                body: None,
                status: 200,
            }
        }
    )*};
}

impl Op {
    op_constructors!(get, post, put, patch, delete);

    pub(crate) fn body(mut self, schema: &'static str) -> Self {
        self.body = Some(schema);
        self
    }

    pub(crate) fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Who the document says may call it.
    #[cfg(test)]
    pub(crate) fn auth(&self) -> Auth {
        self.auth
    }
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
    // Its own value: one more nested object in the document below would
    // pass the `json!` macro's recursion limit.
    let egress_report = json!({"type": "object", "additionalProperties": false,
            "properties": {
                "observed": {"type": "array", "maxItems": 320, "items": {"type": "object", "additionalProperties": false,
                    "required": ["egress", "bound", "reflection"],
                    "properties": {"egress": {"type": "string"}, "bound": {"type": "string"},
                        "reflection": {"type": "object", "required": ["address", "at"],
                            "description": "the reflector's GET /whoami answer, unchanged",
                            "properties": {"address": {"type": "string"}, "at": {"type": "integer"},
                                "exit": {"type": "string", "format": "uuid"}, "proof": {"type": "string"}}}}}},
                "unobserved": {"type": "array", "maxItems": 320, "items": {"type": "object", "additionalProperties": false,
                    "required": ["egress", "bound", "reason"],
                    "properties": {"egress": {"type": "string"}, "bound": {"type": "string"}, "reason": {"type": "string"}}}}}});
    // Inserted below, not in the document's literal: one more entry there
    // would pass the `json!` macro's recursion limit.
    let retry_rules = json!({"type": "array", "maxItems": 20,
        "description": "Ban rules (docs/policy.md): the first whose sites cover the target decides, the user's before the account's before the operator's",
        "items": {"type": "object", "additionalProperties": false, "required": ["statuses"],
            "properties": {
                "sites": {"type": "array", "maxItems": 100, "items": {"type": "string"},
                    "description": "domain entries as in the policies; empty: every site"},
                "statuses": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 400, "maximum": 599}},
                "header": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$",
                    "description": "a response header whose presence means a ban (stored lower case)"},
                "retry": {"type": "integer", "minimum": 0, "maximum": 3},
                "cool": {"type": "boolean"}}}});
    // Its own value too, added after: the macro below is at its limit.
    let feedback = json!({"type": "object", "additionalProperties": false, "required": ["site", "verdict"],
        "description": "Name the exit by exit_id or by session (its pinned exit; user_id narrows the search to one user, required of operators), not both (docs/health.md)",
        "properties": {"exit_id": {"type": "string", "format": "uuid"},
            "session": {"type": "string", "pattern": "^[A-Za-z0-9]{1,64}$"},
            "user_id": {"type": "string", "format": "uuid"},
            "site": {"type": "string", "description": "a host name, URL, address or block; counted as its registrable domain, IPv4 /24 or IPv6 /64"},
            "verdict": {"enum": ["blocked", "slow", "ok"]}}});
    let mut schemas = json!({
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
                "allowlist_options": {"type": "string", "pattern": "^[A-Za-z0-9_-]{0,200}$"}}},
        "UpdateUser": {"type": "object", "additionalProperties": false,
            "properties": {"enabled": {"type": "boolean"}, "password": {"type": "string", "minLength": 8, "maxLength": 255},
                "limits": {"$ref": "#/components/schemas/Limits"},
                "allowed_source_cidrs": {"type": "array", "items": {"type": "string"}, "maxItems": 256},
                "allowlist_options": {"type": "string", "pattern": "^[A-Za-z0-9_-]{0,200}$"},
                "policy": {"$ref": "#/components/schemas/TrafficPolicy"},
                "retry_rules": {"$ref": "#/components/schemas/RetryRules"},
                "dedicated_only": {"type": "boolean", "description": "always route through the account's dedicated addresses"}}},
        "TrafficPolicy": {"type": "object", "additionalProperties": false,
            "description": "A customer's rules by target (docs/policy.md): entries are host names (covering their subdomains) or IP networks",
            "properties": {"allowed_domains": {"type": "array", "items": {"type": "string"}, "maxItems": 1000},
                "denied_domains": {"type": "array", "items": {"type": "string"}, "maxItems": 1000},
                "domain_new_tunnels_per_second": {"type": "integer", "minimum": 1, "maximum": 1000000},
                "domain_max_concurrent_tunnels": {"type": "integer", "minimum": 1, "maximum": 1000000}}},
        "UpdateAccount": {"type": "object", "additionalProperties": false,
            "properties": {"policy": {"$ref": "#/components/schemas/TrafficPolicy"},
                "retry_rules": {"$ref": "#/components/schemas/RetryRules"},
                "dedicated_fallback": {"type": "boolean", "description": "operators: fall back to shared addresses when no dedicated one is usable"}}},
        "AllocateDedicated": {"type": "object", "additionalProperties": false,
            "description": "count (with optional targeting) or, for operators, ips (docs/dedicated.md)",
            "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 256},
                "country": {"type": "string", "pattern": "^[A-Za-z]{2}$"}, "city": {"type": "string"},
                "source_type": {"enum": ["dc", "isp", "res", "mobile"]},
                "ips": {"type": "array", "minItems": 1, "maxItems": 256, "items": {"type": "string"}},
                "users": {"type": "array", "items": {"type": "string", "format": "uuid"}}}},
        "AssignDedicated": {"type": "object", "additionalProperties": false, "required": ["user_ids"],
            "properties": {"user_ids": {"type": "array", "items": {"type": "string", "format": "uuid"}}}},
        "MoveDedicated": {"type": "object", "additionalProperties": false, "required": ["account_id"],
            "properties": {"account_id": {"type": "string", "format": "uuid"}}},
        "DomainLimitValues": {"type": "object", "additionalProperties": false,
            "properties": {"new_tunnels_per_second": {"type": "integer", "minimum": 1, "maximum": 1000000},
                "max_concurrent_tunnels": {"type": "integer", "minimum": 1, "maximum": 1000000}}},
        "OperatorPolicy": {"type": "object", "additionalProperties": false,
            "description": "Rules for every account (docs/policy.md); domain limits count all accounts together",
            "properties": {"denied_domains": {"type": "array", "items": {"type": "string"}, "maxItems": 1000},
                "denied_ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}, "maxItems": 1000},
                "domain_limits": {"type": "array", "maxItems": 1000, "items": {"type": "object", "additionalProperties": false,
                    "required": ["domain"], "properties": {"domain": {"type": "string"},
                        "new_tunnels_per_second": {"type": "integer", "minimum": 1, "maximum": 1000000},
                        "max_concurrent_tunnels": {"type": "integer", "minimum": 1, "maximum": 1000000}}}},
                "default_domain_limit": {"$ref": "#/components/schemas/DomainLimitValues"},
                "retry_rules": {"$ref": "#/components/schemas/RetryRules"}}},
        "SetSessionTime": {"type": "object", "additionalProperties": false, "required": ["sesstime_minutes"],
            "properties": {"sesstime_minutes": {"type": "integer", "minimum": 1, "maximum": 1440, "description": "the pin's remaining life, from now"}}},
        "CreateKey": {"type": "object", "additionalProperties": false, "properties": {"name": {"type": "string", "maxLength": 200}}},
        "SetPlan": {"type": "object", "additionalProperties": false, "required": ["plan_id"], "properties": {"plan_id": {"type": "string", "format": "uuid"}}},
        "CreatePlan": {"type": "object", "additionalProperties": false, "required": ["name", "prices"],
            "properties": {"name": {"type": "string"}, "prices": {"type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0}, "propertyNames": {"enum": ["dc", "isp", "res", "mobile"]}}}},
        "CreateEnrollmentToken": {"type": "object", "additionalProperties": false, "required": ["name", "source_id", "country"],
            "properties": {"name": {"type": "string"}, "source_id": {"type": "string", "format": "uuid"},
                "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
                "region": {"type": "string", "pattern": "^[A-Za-z]{2}-[A-Za-z0-9]{1,3}$", "description": "ISO 3166-2 subdivision of country, e.g. DE-BY"},
                "city": {"type": "string"}, "asn": {"type": "integer"},
                "ttl_seconds": {"type": "integer", "minimum": 1, "maximum": 2592000},
                "behind_nat": {"type": "boolean"}}},
        "Source": {"type": "object", "additionalProperties": false, "required": ["name", "source_type", "channel"],
            "properties": {"name": {"type": "string"}, "source_type": {"enum": ["dc", "isp", "res", "mobile"]},
                "channel": {"enum": ["owned", "leased", "isp", "sdk", "extension", "sharing", "reseller"]},
                "supplier": {"type": "string"}, "agreement_ref": {"type": "string"}, "notice_description": {"type": "string"},
                "opt_out": {"type": "string"}, "liable_party": {"type": "string"}, "abuse_contact": {"type": "string"}, "cost_cents_per_gb": {"type": "integer", "minimum": 0},
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
        "CreateWebhook": {"type": "object", "additionalProperties": false, "required": ["url", "events"],
            "description": "docs/webhooks.md; exit.withdrawn on operator webhooks (/v1/webhooks) only",
            "properties": {"url": {"type": "string", "format": "uri", "maxLength": 2048, "description": "http(s), no credentials; a public address unless --webhook-allow-internal"},
                "events": {"type": "array", "minItems": 1, "items": {"enum": ["quota.warning", "quota.exhausted", "key.revoked", "exit.withdrawn", "webhook.disabled", "dedicated_ip.allocated", "dedicated_ip.released", "dedicated_ip.replaced", "dedicated_ip.moved"]}}}},
        "UpdateWebhook": {"type": "object", "additionalProperties": false, "required": ["enabled"],
            "description": "true: enable (its run of failures starts again; one the operator paused, operators only: 403 to the account's key); false: pause (its pending deliveries are given up)",
            "properties": {"enabled": {"type": "boolean"}}},
        "Enroll": {"type": "object", "additionalProperties": false, "required": ["token"],
            "description": "An exit needs at least one egress IP or egress prefix.",
            "properties": {"token": {"type": "string"}, "egress_ips": {"type": "array", "items": {"type": "string"}, "maxItems": 256},
                "egress_prefixes": {"type": "array", "items": {"type": "string", "description": "CIDR: IPv6 /48 to /128, IPv4 /24 to /32"}, "maxItems": 64},
                "hostname": {"type": "string"}, "agent_version": {"type": "string"},
                "behind_nat": {"type": "boolean", "description": "the host sits behind NAT: the public address the reflector sees may differ from the declared egress"}}},
        "EgressReport": egress_report,
        "Heartbeat": {"type": "object", "additionalProperties": false,
            "properties": {"draining": {"type": "boolean"}, "active_tunnels": {"type": "integer", "minimum": 0},
                "admin_addrs": {"type": "array", "items": {"type": "string"}, "maxItems": 16,
                    "description": "the agent's admin listener; every exit is told to deny only those on addresses the reflector verified the exit holds (at most 8), the rest are ignored and shown on GET /v1/exits/{id}"},
                "internal_targets": {"type": "boolean"}}}
    });
    schemas["RetryRules"] = retry_rules;
    schemas["Feedback"] = feedback;
    // Added after too: more entries in the literal would pass its limit.
    let plan = &mut schemas["CreatePlan"]["properties"];
    plan["dedicated_ip_price_cents"] = json!({"type": "integer", "minimum": 0,
        "description": "cents per dedicated address per calendar month (default 0)"});
    plan["dedicated_prefix_price_cents"] = json!({"type": "integer", "minimum": 0,
        "description": "cents per dedicated IPv6 /64 per calendar month (default 0)"});
    plan["dedicated_replacements_per_month"] = json!({"type": "integer", "minimum": 0, "maximum": 2147483647,
        "description": "replacements of a dedicated address an account may make per calendar month (default 2)"});
    plan["dedicated_max_addresses"] = json!({"type": "integer", "minimum": 0, "maximum": 2147483647,
        "description": "dedicated addresses an account on the plan may hold at once by its own key (default 0: only an operator allocates)"});
    schemas
}

/// The document of `operations` (the router's own table).
pub(crate) fn document(operations: Vec<Op>) -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for Op {
        method,
        path,
        summary,
        auth,
        body,
        status,
        ..
    } in operations
    {
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
        entry[method] = op;
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
