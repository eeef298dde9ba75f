//! `proxynetctl health`: whether the control API is ready (`/readyz`).

use reqwest::Method;
use serde_json::{json, Map, Value};

use super::common::{Ctx, Done};
use crate::output;

pub(super) async fn run(ctx: &Ctx) -> Done {
    let answer = ctx.client.send(Method::GET, "/readyz", &[], None).await?;
    if ctx.json() {
        // The API answers text; scripts get its lines as an object.
        let mut map = Map::new();
        for line in answer.text().lines() {
            if let Some((k, v)) = line.split_once(':') {
                map.insert(k.trim().to_owned(), json!(v.trim()));
            }
        }
        return output::print_json(&Value::Object(map));
    }
    output::print_raw(&answer.text())
}
