//! `proxynetctl invoices`: an account's invoice for a month.

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct InvoiceArgs {
    /// Account id
    pub(crate) account: String,
    /// The month (YYYY-MM) [default: this month]
    #[arg(long, value_name = "YYYY-MM")]
    pub(crate) month: Option<String>,
    /// Print the API's CSV rendering instead
    #[arg(long)]
    pub(crate) csv: bool,
}
