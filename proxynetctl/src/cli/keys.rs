//! `proxynetctl keys`: API keys, operator keys or an account's own.

use clap::{ArgGroup, Subcommand};

use super::common::PageArgs;

#[derive(Subcommand, Debug)]
pub(crate) enum Keys {
    /// List an account's keys: who minted each, last use, revocation; never secrets
    List {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Create a key for an account, or an operator key; the key is shown once
    #[command(group(ArgGroup::new("owner").required(true).args(["account", "operator"])))]
    Create {
        /// An account key for this account
        #[arg(long, value_name = "ID")]
        account: Option<String>,
        /// An operator key (operators only)
        #[arg(long)]
        operator: bool,
        /// A name to recognise it by
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Revoke a key and every key it minted
    Revoke {
        /// Key id
        id: String,
    },
}
