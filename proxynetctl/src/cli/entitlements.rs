//! `proxynetctl entitlements`: what an account is granted.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum Entitlements {
    /// Print an account's entitlements (from the account)
    Get {
        /// Account id
        account: String,
    },
    /// Replace an account's entitlements with a JSON document
    Set {
        /// Account id
        account: String,
        /// JSON file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
}
