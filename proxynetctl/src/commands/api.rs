//! `proxynetctl api METHOD PATH`: any request, its raw answer printed.

use reqwest::Method;

use super::common::{Ctx, Done};
use crate::cli::ApiArgs;
use crate::error::Failure;
use crate::output;

pub(super) async fn run(ctx: &Ctx, a: ApiArgs) -> Done {
    let method = Method::from_bytes(a.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| Failure::usage(format!("{:?} is not an HTTP method", a.method)))?;
    if !a.path.starts_with('/') {
        return Err(Failure::usage(format!(
            "{:?}: a path under the API, starting with / (e.g. /v1/exits)",
            a.path
        )));
    }
    let body = a.data.map(|d| ctx.json_arg("--data", &d)).transpose()?;
    let answer = ctx
        .client
        .send(method, &a.path, &[], body.map(crate::client::Body::Json))
        .await?;
    if answer.is_json() && answer.json().is_ok() {
        output::print_json_text(&answer.text())
    } else {
        output::print_raw(&answer.text())
    }
    .map(|()| {
        if answer.status == reqwest::StatusCode::NO_CONTENT && !ctx.json() {
            eprintln!("204 No Content");
        }
    })
}
