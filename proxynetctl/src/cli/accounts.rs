//! `proxynetctl accounts`: the customers that own proxy users (operator).

use clap::Subcommand;

use super::common::PageArgs;

#[derive(Subcommand, Debug)]
pub(crate) enum Accounts {
    /// List accounts
    List(PageArgs),
    /// Read an account, with its plan, entitlements and policy
    Get {
        /// Account id
        id: String,
    },
    /// Create an account
    Create {
        /// The account's name (1 to 200 characters)
        name: String,
    },
    /// Delete an account: its users disabled and cut, its keys revoked, its ledger kept
    Delete {
        /// Account id
        id: String,
    },
    /// Replace the account's entitlements with a JSON document (docs/tenancy.md)
    SetEntitlements {
        /// Account id
        id: String,
        /// JSON file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
    /// Replace the account's traffic policy with a JSON document (docs/policy.md)
    SetPolicy {
        /// Account id
        id: String,
        /// JSON file, or - for stdin; {} clears the policy
        #[arg(default_value = "-")]
        file: String,
    },
    /// Set the account's plan
    SetPlan {
        /// Account id
        id: String,
        /// Plan id (see `plans list`)
        plan: String,
    },
}
