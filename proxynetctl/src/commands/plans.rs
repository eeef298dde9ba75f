//! `proxynetctl plans`: plans and their prices per GB (`/v1/plans`).

use reqwest::Method;
use serde_json::{json, Map, Value};

use super::common::{Ctx, Done, View};
use crate::cli::Plans;
use crate::error::Failure;
use crate::output::{col, custom, Col};

const PLANS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    custom("PRICES (CENTS/GB)", |v| {
        match v.get("prices").and_then(Value::as_object) {
            Some(p) if !p.is_empty() => p
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            _ => "-".into(),
        }
    }),
];

pub(super) async fn run(ctx: &Ctx, c: Plans) -> Done {
    match c {
        Plans::List(page) => ctx.list("/v1/plans", &[], page.into(), PLANS).await,
        Plans::Create { name, prices } => {
            let mut map = Map::new();
            for price in &prices {
                let (kind, cents) = price
                    .split_once('=')
                    .and_then(|(k, c)| Some((k.trim(), c.trim().parse::<i64>().ok()?)))
                    .ok_or_else(|| {
                        Failure::usage(format!("--price {price:?}: TYPE=CENTS, e.g. dc=100"))
                    })?;
                map.insert(kind.to_owned(), json!(cents));
            }
            ctx.one(
                Method::POST,
                "/v1/plans",
                Some(json!({ "name": name, "prices": map })),
                View::Fields,
            )
            .await
            .map(drop)
        }
    }
}
