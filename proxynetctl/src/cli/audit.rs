//! `proxynetctl audit`: the audit log (operator).

use clap::Args;

use super::common::PageArgs;

#[derive(Args, Debug)]
pub(crate) struct AuditArgs {
    /// Only this action (e.g. exit.drain)
    #[arg(long)]
    pub(crate) action: Option<String>,
    /// Only this subject (e.g. an exit id)
    #[arg(long)]
    pub(crate) subject: Option<String>,
    /// Only this actor (e.g. operator)
    #[arg(long)]
    pub(crate) actor: Option<String>,
    /// From (RFC 3339)
    #[arg(long, value_name = "TIME")]
    pub(crate) from: Option<String>,
    /// To, exclusive (RFC 3339)
    #[arg(long, value_name = "TIME")]
    pub(crate) to: Option<String>,
    #[command(flatten)]
    pub(crate) page: PageArgs,
}
