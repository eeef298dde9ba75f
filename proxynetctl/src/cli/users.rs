//! `proxynetctl users`: proxy users, the credentials customers put in
//! `curl -x`.

use clap::Subcommand;

use super::common::PageArgs;

#[derive(Subcommand, Debug)]
pub(crate) enum Users {
    /// List an account's proxy users
    List {
        /// Account id
        account: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Read a proxy user
    Get {
        /// User id
        id: String,
    },
    /// Create a proxy user (its password read from stdin: --password-stdin)
    Create {
        /// Account id
        account: String,
        /// Username: letters, digits, `_` and `.`, at most 64
        username: String,
        /// Read the password from stdin, its first line (8 to 255 characters; required)
        #[arg(long)]
        password_stdin: bool,
        /// Limits as JSON, @FILE or - (stdin), e.g. '{"max_concurrent_tunnels": 50, "bandwidth_bytes": 10000000000}'
        #[arg(long, value_name = "JSON")]
        limits: Option<String>,
        /// A source network whose requests without credentials are this user (repeatable)
        #[arg(long = "allowed-source-cidr", value_name = "CIDR")]
        allowed_source_cidrs: Vec<String>,
        /// Username options for allow-listed traffic (e.g. country-de-type-dc)
        #[arg(long, value_name = "OPTIONS")]
        allowlist_options: Option<String>,
    },
    /// Change a proxy user: enable/disable, rotate its password, set limits or policy
    Update {
        /// User id
        id: String,
        /// Enable (true) or disable (false) the user
        #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
        enabled: Option<bool>,
        /// Read a new password from stdin (its first line)
        #[arg(long)]
        password_stdin: bool,
        /// Replace all limits: JSON, @FILE or - (stdin)
        #[arg(long, value_name = "JSON")]
        limits: Option<String>,
        /// Replace the user's traffic policy: JSON, @FILE or - (stdin); {} clears it
        #[arg(long, value_name = "JSON")]
        policy: Option<String>,
        /// Replace the allow-listed source networks (repeatable)
        #[arg(
            long = "allowed-source-cidr",
            value_name = "CIDR",
            conflicts_with = "no_allowed_source_cidrs"
        )]
        allowed_source_cidrs: Vec<String>,
        /// Remove every allow-listed source network
        #[arg(long)]
        no_allowed_source_cidrs: bool,
        /// Username options for allow-listed traffic
        #[arg(long, value_name = "OPTIONS")]
        allowlist_options: Option<String>,
    },
    /// Delete a proxy user
    Delete {
        /// User id
        id: String,
    },
    /// The user's current quota period: used, remaining, warning, exhausted
    Quota {
        /// User id
        id: String,
    },
}
