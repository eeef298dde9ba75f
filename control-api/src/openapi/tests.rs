//! The document's schemas are those of the types the handlers read: every
//! body is a component named for its type, with its properties at the top
//! (what clients and `api_contract.rs` read); every `$ref` resolves inside
//! the document; and each body's schema says what its type accepts: the
//! fields it requires are exactly those serde requires, every other property
//! is a field the type reads (as the schema types it), and unknown fields are
//! refused where, and only where, the schema says so.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::document;
use crate::routes::operations;

const SCHEMAS: &str = "#/components/schemas/";

/// The schema a `$ref` names, or the schema itself when it is none.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
        return schema;
    };
    let name = reference
        .strip_prefix(SCHEMAS)
        .unwrap_or_else(|| panic!("{reference} is not under {SCHEMAS}"));
    let target = &doc["components"]["schemas"][name];
    assert!(!target.is_null(), "{reference} names no schema");
    target
}

/// The request body schema of an operation, as the document has it (a
/// reference).
fn body_schema<'a>(doc: &'a Value, method: &str, path: &str) -> &'a Value {
    &doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
}

fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The simplest value of a schema's type: an object of its required
/// properties only, an empty array, the first of an enumeration, the
/// minimum of an integer, a string of its format.
fn sample(doc: &Value, schema: &Value) -> Value {
    let schema = resolve(doc, schema);
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(value) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|values| values.iter().find(|v| !v.is_null()))
    {
        return value.clone();
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(options) = schema.get(combinator).and_then(Value::as_array) {
            let option = options
                .iter()
                .find(|o| o.get("type").and_then(Value::as_str) != Some("null"))
                .unwrap_or_else(|| panic!("{schema}: null only"));
            return sample(doc, option);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|k| *k != "null")
            .unwrap_or("null"),
        _ => panic!("{schema} has no type: a field the document does not describe"),
    };
    match kind {
        "object" => {
            let mut object = Map::new();
            for name in required(schema) {
                let property = &schema["properties"][name];
                assert!(
                    !property.is_null(),
                    "{name} is required but no property of {schema}"
                );
                object.insert(name.to_owned(), sample(doc, property));
            }
            Value::Object(object)
        }
        "array" => json!([]),
        "string" => {
            let text = match schema.get("format").and_then(Value::as_str) {
                Some("uuid") => "00000000-0000-0000-0000-000000000000",
                Some("date-time") => "2026-01-01T00:00:00Z",
                Some("ip" | "ipv4") => "192.0.2.1",
                Some("ipv6") => "2001:db8::1",
                _ => "x",
            };
            json!(text)
        }
        "integer" => {
            let least = schema.get("minimum").and_then(Value::as_i64).unwrap_or(0);
            json!(least)
        }
        "number" => json!(0.0),
        "boolean" => json!(false),
        "null" => Value::Null,
        other => panic!("{schema}: type {other}"),
    }
}

fn references<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
    match value {
        Value::Object(object) => {
            for (key, value) in object {
                match (key.as_str(), value.as_str()) {
                    ("$ref", Some(reference)) => found.push(reference),
                    _ => references(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| references(item, found)),
        _ => {}
    }
}

fn has_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(object) => {
            object.contains_key(key) || object.values().any(|v| has_key(v, key))
        }
        Value::Array(items) => items.iter().any(|v| has_key(v, key)),
        _ => false,
    }
}

#[test]
fn every_body_is_a_component_named_for_its_type_with_its_properties_at_the_top() {
    let doc = document(operations());
    let mut bodies = 0;
    for op in operations() {
        let Some(body) = op.body else { continue };
        let what = format!("{} {}", op.method, op.path);
        let schema = body_schema(&doc, op.method, op.path);
        let reference = schema["$ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: the body is no reference: {schema}"));
        // Two types of one name would be told apart as `Name2`: each body's
        // component carries its own type's name.
        assert_eq!(reference, format!("{SCHEMAS}{}", (body.name)()), "{what}");
        let component = resolve(&doc, schema);
        assert_eq!(component["type"], "object", "{what}: {component}");
        assert!(
            component["properties"]
                .as_object()
                .is_some_and(|p| !p.is_empty()),
            "{what}: no properties at the top of {component}"
        );
        bodies += 1;
    }
    assert!(bodies >= 25, "only {bodies} operations with a body");
    let problem = &doc["components"]["schemas"]["Problem"];
    for field in ["type", "title", "status", "detail"] {
        assert!(
            problem["properties"][field].is_object(),
            "Problem lacks {field}: {problem}"
        );
    }
}

#[test]
fn the_document_is_openapi_3_1_and_every_reference_resolves_within_it() {
    let doc = document(operations());
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let schemas = doc["components"]["schemas"]
        .as_object()
        .expect("components.schemas");
    let mut found = Vec::new();
    references(&doc, &mut found);
    assert!(!found.is_empty());
    for reference in &found {
        let name = reference
            .strip_prefix(SCHEMAS)
            .unwrap_or_else(|| panic!("{reference} points outside components.schemas"));
        assert!(schemas.contains_key(name), "{reference} names no schema");
    }
    // Exactly the schemas something uses.
    for name in schemas.keys() {
        assert!(
            found.contains(&format!("{SCHEMAS}{name}").as_str()),
            "components.schemas.{name} is used by nothing"
        );
    }
    for (name, schema) in schemas {
        assert!(
            schema.is_object() || schema.is_boolean(),
            "{name} is no schema"
        );
    }
    // Definitions only where OpenAPI has them, and no meta-schema per
    // component (3.1's dialect is the document's).
    for key in ["$defs", "definitions", "$schema"] {
        assert!(!has_key(&doc, key), "the document has a {key}");
    }
    let methods = ["get", "put", "post", "delete", "patch"];
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        assert!(path.starts_with('/'), "{path}");
        for (method, op) in ops.as_object().expect("operations") {
            assert!(methods.contains(&method.as_str()), "{method} {path}");
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path} has no responses"
            );
            if let Some(body) = op.get("requestBody") {
                assert!(
                    body["content"]["application/json"]["schema"].is_object(),
                    "{method} {path}: {body}"
                );
            }
        }
    }
}

#[test]
fn each_body_schema_says_what_its_type_reads() {
    let doc = document(operations());
    let mut open_yet_refused_by_hand = BTreeSet::new();
    for op in operations() {
        let Some(body) = op.body else { continue };
        let what = format!("{} {}", op.method, op.path);
        let schema = resolve(&doc, body_schema(&doc, op.method, op.path));
        let minimal = sample(&doc, schema);
        if let Err(e) = (body.read)(minimal.clone()) {
            panic!("{what}: {minimal} (its required fields) is not read: {e}");
        }
        // Each field the schema requires is one the type cannot do without...
        for name in required(schema) {
            let mut without = minimal.clone();
            without.as_object_mut().unwrap().remove(name);
            assert!(
                (body.read)(without).is_err(),
                "{what}: the schema requires {name}, the type does not"
            );
        }
        // ...and every other property one it reads, typed as the schema says.
        for (name, property) in schema["properties"].as_object().unwrap() {
            if required(schema).contains(&name.as_str()) {
                continue;
            }
            let mut with = minimal.clone();
            with[name.as_str()] = sample(&doc, property);
            if let Err(e) = (body.read)(with.clone()) {
                panic!("{what}: {with} is not read: {e}");
            }
        }
        // A type that refuses unknown fields says so in its schema.
        let mut unknown = minimal.clone();
        unknown["surely_not_a_field"] = json!(1);
        let refused = (body.read)(unknown).is_err();
        let closed = schema["additionalProperties"] == json!(false);
        assert!(
            closed || !refused,
            "{what}: the type refuses unknown fields, its schema does not say so"
        );
        if closed && !refused {
            open_yet_refused_by_hand.insert((body.name)().into_owned());
        }
    }
    // Only the operator's policy is read as JSON and its unknown fields
    // refused by hand (`routes::policy`); the next test holds its schema
    // to the fields that refusal knows.
    assert_eq!(
        open_yet_refused_by_hand,
        BTreeSet::from(["OperatorPolicy".to_owned()])
    );
}

#[test]
fn the_policies_checked_by_hand_are_described_by_the_fields_they_accept() {
    use proxynet_store::policy::{OperatorPolicy, RetryRule, TrafficPolicy};

    let doc = document(operations());
    for (name, fields) in [
        ("TrafficPolicy", TrafficPolicy::FIELDS.to_vec()),
        ("OperatorPolicy", OperatorPolicy::FIELDS.to_vec()),
        ("RetryRule", RetryRule::FIELDS.to_vec()),
        // `routes::policy::operator_policy`'s lists.
        (
            "DomainLimit",
            vec!["domain", "new_tunnels_per_second", "max_concurrent_tunnels"],
        ),
        (
            "DomainLimitValues",
            vec!["new_tunnels_per_second", "max_concurrent_tunnels"],
        ),
    ] {
        let schema = &doc["components"]["schemas"][name];
        let properties: BTreeSet<&str> = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{name}: {schema}"))
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            properties,
            fields.into_iter().collect::<BTreeSet<_>>(),
            "{name}"
        );
        assert_eq!(
            schema["additionalProperties"],
            json!(false),
            "{name}: its unknown fields are refused"
        );
    }
}
