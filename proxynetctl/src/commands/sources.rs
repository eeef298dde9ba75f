//! `proxynetctl sources`: provenance sources (`/v1/sources`), the answers
//! the exits that belong to them inherit.

use reqwest::Method;
use serde_json::{json, Value};

use super::common::{object, Ctx, Done, View};
use crate::cli::{SourceArgs, Sources};
use crate::client::path;
use crate::output::{col, fmt, Col, Fmt};

const SOURCES: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("TYPE", "source_type"),
    col("CHANNEL", "channel"),
    col("COUNTRIES", "countries"),
    fmt("CONSENT", "consent_required", Fmt::YesNo),
    fmt("COMPLETE", "complete", Fmt::YesNo),
    col("MISSING", "missing"),
];

fn source_body(s: SourceArgs) -> Value {
    object(vec![
        ("name", Some(json!(s.name))),
        ("source_type", Some(json!(s.source_type))),
        ("channel", Some(json!(s.channel))),
        ("supplier", Some(json!(s.supplier))),
        ("agreement_ref", Some(json!(s.agreement_ref))),
        ("notice_description", Some(json!(s.notice_description))),
        ("opt_out", Some(json!(s.opt_out))),
        ("liable_party", Some(json!(s.liable_party))),
        ("abuse_contact", Some(json!(s.abuse_contact))),
        ("countries", Some(json!(s.countries))),
        ("consent_required", s.consent_required.map(Value::Bool)),
    ])
}

pub(super) async fn run(ctx: &Ctx, c: Sources) -> Done {
    match c {
        Sources::List => ctx.whole("/v1/sources", &[], SOURCES).await,
        Sources::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "sources", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Sources::Create(s) => ctx
            .one(
                Method::POST,
                "/v1/sources",
                Some(source_body(s)),
                View::Fields,
            )
            .await
            .map(drop),
        Sources::Replace { id, source } => ctx
            .one(
                Method::PUT,
                &path(&["v1", "sources", &id])?,
                Some(source_body(source)),
                View::Fields,
            )
            .await
            .map(drop),
    }
}
