//! `proxynetctl policy`: traffic policy by target domain, and whose it is.

use clap::{Args, Subcommand};

/// Whose policy: the operator's (neither flag), an account's or a user's.
#[derive(Args, Debug)]
#[group(multiple = false)]
pub(crate) struct PolicyOwner {
    /// An account's policy
    #[arg(long, value_name = "ID")]
    pub(crate) account: Option<String>,
    /// A proxy user's policy
    #[arg(long, value_name = "ID")]
    pub(crate) user: Option<String>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Policy {
    /// Print a traffic policy as JSON (the operator's without --account/--user)
    Get {
        #[command(flatten)]
        owner: PolicyOwner,
    },
    /// Replace a traffic policy with a JSON document (`policy get` output is accepted: its version and updated_at are dropped)
    Set {
        #[command(flatten)]
        owner: PolicyOwner,
        /// JSON file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
}
