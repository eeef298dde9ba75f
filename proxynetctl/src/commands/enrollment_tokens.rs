//! `proxynetctl enrollment-tokens`: one-time tokens an exit's agent
//! enrolls with (`/v1/enrollment-tokens`); a token is shown once.

use reqwest::Method;
use serde_json::{json, Value};

use super::common::{object, Ctx, Done, View};
use crate::cli::EnrollmentTokens;

pub(super) async fn run(ctx: &Ctx, c: EnrollmentTokens) -> Done {
    let EnrollmentTokens::Create {
        name,
        source_id,
        country,
        region,
        city,
        asn,
        ttl_seconds,
        behind_nat,
    } = c;
    let body = object(vec![
        ("name", Some(json!(name))),
        ("source_id", Some(json!(source_id))),
        ("country", Some(json!(country))),
        ("region", region.map(Value::String)),
        ("city", city.map(Value::String)),
        ("asn", asn.map(|a| json!(a))),
        ("ttl_seconds", ttl_seconds.map(|t| json!(t))),
        ("behind_nat", behind_nat.then_some(Value::Bool(true))),
    ]);
    ctx.one(
        Method::POST,
        "/v1/enrollment-tokens",
        Some(body),
        View::Fields,
    )
    .await?;
    if !ctx.json() {
        eprintln!("the token is shown once: hand it to the exit's agent (PROXYNET_ENROLL_TOKEN)");
    }
    Ok(())
}
