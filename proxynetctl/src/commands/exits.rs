//! `proxynetctl exits`: the fleet's exits (`/v1/exits`), their state, egress
//! and health; drain, disable, reinstate, provenance.

use reqwest::Method;
use serde_json::Value;

use super::common::{Ctx, Done, View};
use super::consent::grant_body;
use crate::cli::Exits;
use crate::client::path;
use crate::error::Failure;
use crate::output::{self, col, custom, fmt, Col, Fmt};

/// An exit's state as an operator reads it: what keeps it out of rotation
/// first, else whether it is live (and not ejected by a superproxy).
pub(super) fn exit_state(v: &Value) -> String {
    let yes = |k: &str| output::lookup(v, k).as_bool() == Some(true);
    let state = if yes("disabled") {
        "disabled"
    } else if yes("admin_draining") {
        "draining"
    } else if yes("draining") {
        "draining (agent)"
    } else if !yes("live") {
        "down"
    } else if output::lookup(v, "health.superproxies_ejecting_it").as_u64() > Some(0) {
        "ejected"
    } else {
        "live"
    };
    state.to_owned()
}

fn exit_egress(v: &Value) -> String {
    let mut all: Vec<String> = Vec::new();
    for key in ["egress_ips", "egress_prefixes"] {
        if let Some(items) = v.get(key).and_then(Value::as_array) {
            all.extend(items.iter().filter_map(Value::as_str).map(str::to_owned));
        }
    }
    if all.is_empty() {
        "-".into()
    } else {
        all.join(",")
    }
}

pub(crate) const EXITS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("COUNTRY", "country"),
    col("TYPE", "source_type"),
    custom("STATE", exit_state),
    custom("EGRESS", exit_egress),
    fmt("SCORE", "health.score", Fmt::Num2),
];

pub(super) async fn run(ctx: &Ctx, c: Exits) -> Done {
    let action =
        |id: &str, verb: &str| -> Result<String, Failure> { path(&["v1", "exits", id, verb]) };
    match c {
        Exits::List(page) => ctx.list("/v1/exits", &[], page.into(), EXITS).await,
        Exits::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "exits", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Exits::Drain { id } => ctx
            .one(Method::POST, &action(&id, "drain")?, None, View::Row(EXITS))
            .await
            .map(drop),
        Exits::Undrain { id } => ctx
            .one(
                Method::POST,
                &action(&id, "undrain")?,
                None,
                View::Row(EXITS),
            )
            .await
            .map(drop),
        Exits::Disable { id } => ctx
            .one(
                Method::POST,
                &action(&id, "disable")?,
                None,
                View::Row(EXITS),
            )
            .await
            .map(drop),
        Exits::Enable { id } => ctx
            .one(
                Method::POST,
                &action(&id, "enable")?,
                None,
                View::Row(EXITS),
            )
            .await
            .map(drop),
        Exits::Reinstate { id, grant } => ctx
            .one(
                Method::POST,
                &action(&id, "reinstate")?,
                Some(grant_body(grant)),
                View::Fields,
            )
            .await
            .map(drop),
        Exits::Provenance { id } => ctx
            .one(Method::GET, &action(&id, "provenance")?, None, View::Fields)
            .await
            .map(drop),
    }
}
