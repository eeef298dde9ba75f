//! The control API's published contract: `/openapi.json` lists exactly the
//! routes the router serves (the two are built from one table; here every
//! documented operation is shown routed, and every other method of a
//! documented path refused with 405), and no operation answers 500 to
//! generated input (a schemathesis-style run, seeded, bounded, against a
//! real stack).

use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::BTreeSet;

fn random_string(rng: &mut StdRng) -> String {
    match rng.gen_range(0..8) {
        0 => String::new(),
        1 => "x".repeat(rng.gen_range(150..400)),
        2 => "\u{0}nul".into(),
        3 => "DE".into(),
        4 => "dc".into(),
        5 => "not a uuid ☃".into(),
        6 => uuid::Uuid::new_v4().to_string(),
        _ => (0..rng.gen_range(1..12))
            .map(|_| rng.gen_range(b'a'..=b'z') as char)
            .collect(),
    }
}

fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.gen_range(0..if depth > 1 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.gen::<bool>()),
        2 => json!(rng.gen_range(-5i64..5)),
        3 => json!(i64::MAX),
        4 => json!(rng.gen::<f64>() * 1e12),
        5 => json!(random_string(rng)),
        6 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.gen_range(0..4))
                .map(|_| (random_string(rng), random_value(rng, depth + 1)))
                .collect(),
        ),
    }
}

/// A body built from the schema's own property names with random values.
fn random_body(rng: &mut StdRng, schema: Option<&Value>) -> Value {
    let Some(schema) = schema else {
        return random_value(rng, 0);
    };
    let mut body = serde_json::Map::new();
    if let Some(props) = schema["properties"].as_object() {
        for (name, prop) in props {
            if rng.gen_bool(0.8) {
                let plausible = match prop["type"].as_str() {
                    Some("string") => json!(random_string(rng)),
                    Some("integer") => json!(rng.gen_range(-3i64..10_000)),
                    Some("boolean") => json!(rng.gen::<bool>()),
                    _ => random_value(rng, 1),
                };
                body.insert(
                    name.clone(),
                    if rng.gen_bool(0.7) {
                        plausible
                    } else {
                        random_value(rng, 1)
                    },
                );
            }
        }
    }
    if rng.gen_bool(0.1) {
        body.insert("unexpected".into(), json!(1));
    }
    Value::Object(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_matches_the_router_and_nothing_answers_500() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec![],
        ..Default::default()
    })
    .await;
    let doc: Value = stack
        .http
        .get(stack.api("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");

    let mut documented = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            assert!(
                op["responses"].is_object(),
                "{method} {path} has no responses"
            );
            documented.insert((method.clone(), path.clone()));
        }
    }
    for core in [
        ("post", "/v1/accounts"),
        ("patch", "/v1/users/{id}"),
        ("post", "/v1/agent/exits/{id}/heartbeat"),
        ("get", "/dashboard"),
    ] {
        assert!(
            documented.contains(&(core.0.to_owned(), core.1.to_owned())),
            "openapi.json lacks {core:?}"
        );
    }
    // A method the document does not list for a path is one the router does
    // not serve there.
    let paths: BTreeSet<&String> = documented.iter().map(|(_, p)| p).collect();
    for path in paths {
        let concrete = path
            .split('/')
            .map(|seg| {
                if seg.starts_with('{') {
                    "00000000-0000-0000-0000-000000000000"
                } else {
                    seg
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        for method in ["get", "post", "put", "patch", "delete"] {
            if documented.contains(&(method.to_owned(), path.clone())) {
                continue;
            }
            let verb = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let status = stack
                .http
                .request(verb, stack.api(&concrete))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            assert_eq!(status, 405, "{method} {path} is served but not documented");
        }
    }

    // Some real ids so generated requests also reach existing rows.
    let account = stack.create_account("fuzz").await;
    let user = stack
        .create_user(account, "fuzzuser", "fuzz-password")
        .await;
    let ids = [
        account.to_string(),
        user.to_string(),
        uuid::Uuid::new_v4().to_string(),
        "nope".into(),
        "%00".into(),
    ];

    let mut rng = StdRng::seed_from_u64(0x70726f78);
    let schemas = doc["components"]["schemas"].clone();
    let mut sent = 0;
    for (method, path) in &documented {
        let op = &doc["paths"][path][method];
        let schema = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            .as_str()
            .and_then(|r| r.rsplit('/').next())
            .map(|name| &schemas[name]);
        for _ in 0..12 {
            let concrete = path
                .split('/')
                .map(|seg| {
                    if seg.starts_with('{') {
                        ids[rng.gen_range(0..ids.len())].clone()
                    } else {
                        seg.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("/");
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut request = stack
                .http
                .request(method.clone(), stack.api(&concrete))
                .bearer_auth(ADMIN_TOKEN);
            if op.get("requestBody").is_some() || rng.gen_bool(0.2) {
                request = request.json(&random_body(&mut rng, schema));
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let routed_404 = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.to_str().unwrap_or_default().contains("problem+json"));
            let body = response.text().await.unwrap_or_default();
            assert!(
                status < 500 || status == 503,
                "{method} {concrete} answered {status}: {body}"
            );
            // Documented means routed: the router's own answers to an
            // unknown route or method are a bare 404 and a 405.
            assert_ne!(status, 405, "{method} {path} is documented but not routed");
            assert!(
                status != 404 || routed_404,
                "{method} {concrete} is documented but not routed (bare 404)"
            );
            sent += 1;
        }
    }
    assert!(sent >= 300, "only {sent} requests generated");
}
