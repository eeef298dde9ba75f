//! `proxynetctl usage`: an account's bytes up and down.

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct UsageArgs {
    /// Account id
    pub(crate) account: String,
    /// Start (RFC 3339) [default: 24 hours before --to]
    #[arg(long, value_name = "TIME")]
    pub(crate) from: Option<String>,
    /// End, exclusive (RFC 3339) [default: now]
    #[arg(long, value_name = "TIME")]
    pub(crate) to: Option<String>,
    /// Up to three of user, exit, source_type, minute, day, domain, country (comma-separated); or account
    #[arg(long, value_name = "DIMS")]
    pub(crate) group_by: Option<String>,
}
