//! The OpenAPI 3.1 document served at `/openapi.json`.
//!
//! Rendered from the same table the router is built from
//! ([`crate::routes::operations`]): each entry pairs a handler with its
//! summary, who may call it, the type of its request body and its success
//! status, so the document cannot list a route the router lacks or miss one
//! it serves. Body schemas are derived from those types (`schemars`, JSON
//! Schema 2020-12, the dialect of OpenAPI 3.1): the very types the handlers
//! deserialize, so a field, a bound or an enum value cannot be documented
//! otherwise than it is read. `components.schemas` holds exactly the schemas
//! the bodies (and the error body, [`Problem`]) use.
//! `tests/tests/e2e/api_contract.rs` calls every documented operation on a
//! running stack (routed, never a 500 to generated input).

use axum::handler::Handler;
use axum::routing::MethodRouter;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use crate::error::Problem;
use crate::AppState;

#[cfg(test)]
mod tests;

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
    /// The request body, when the handler reads one.
    body: Option<Body>,
    status: u16,
}

/// A request body: the type the handler's `Json` extractor reads.
struct Body {
    /// The type's schema, as a `$ref` into `components.schemas`
    /// ([`SchemaGenerator::subschema_for`], which adds it there).
    schema: fn(&mut SchemaGenerator) -> Schema,
    /// The type's name in `components.schemas`.
    #[cfg(test)]
    name: fn() -> std::borrow::Cow<'static, str>,
    /// Reads a JSON value as the type (as the extractor does).
    #[cfg(test)]
    read: fn(Value) -> Result<(), serde_json::Error>,
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

    /// The handler reads a `T` body; the document shows `T`'s schema.
    pub(crate) fn body<T: JsonSchema + DeserializeOwned>(mut self) -> Self {
        self.body = Some(Body {
            schema: SchemaGenerator::subschema_for::<T>,
            #[cfg(test)]
            name: T::schema_name,
            #[cfg(test)]
            read: |value| serde_json::from_value::<T>(value).map(drop),
        });
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

/// What generates the schemas: JSON Schema 2020-12 (OpenAPI 3.1's own
/// dialect), every named type under `#/components/schemas`.
fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.definitions_path = "/components/schemas".into();
            // Components are schemas of the document, not documents.
            settings.meta_schema = None;
        })
        .into_generator()
}

/// The document of `operations` (the router's own table).
pub(crate) fn document(operations: Vec<Op>) -> Value {
    let mut schemas = generator();
    let problem = schemas.subschema_for::<Problem>();
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
                "default": {"description": "error", "content": {"application/problem+json": {"schema": problem}}}
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
        if let Some(body) = body {
            let schema = (body.schema)(&mut schemas);
            op["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": schema}}});
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
            "schemas": schemas.take_definitions(true),
            "securitySchemes": {
                "operatorKey": {"type": "http", "scheme": "bearer", "description": "admin token or operator API key"},
                "accountKey": {"type": "http", "scheme": "bearer", "description": "account API key: its own account only"},
                "agentCredential": {"type": "http", "scheme": "bearer", "description": "an enrolled exit's credential"}
            }
        }
    })
}
