//! `proxynetctl api METHOD PATH`: any request to the API.

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct ApiArgs {
    /// HTTP method (GET, POST, PUT, PATCH, DELETE)
    pub(crate) method: String,
    /// Path under the API, with any query (e.g. '/v1/audit?action=exit.drain')
    pub(crate) path: String,
    /// Request body: JSON, @FILE or - (stdin)
    #[arg(long, short = 'd', value_name = "JSON")]
    pub(crate) data: Option<String>,
}
