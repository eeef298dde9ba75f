//! `proxynetctl plans`: plans and their prices per GB (operator).

use clap::Subcommand;

use super::common::PageArgs;

#[derive(Subcommand, Debug)]
pub(crate) enum Plans {
    /// List plans with their prices
    List(PageArgs),
    /// Create a plan
    Create {
        /// The plan's name
        name: String,
        /// A price in cents per GB for a source type, e.g. dc=100 (repeatable)
        #[arg(long = "price", value_name = "TYPE=CENTS", required = true)]
        prices: Vec<String>,
    },
}
