//! `proxynetctl webhooks`: signed webhooks, an account's or the operator's.

use clap::Subcommand;

use super::common::PageArgs;

#[derive(Subcommand, Debug)]
pub(crate) enum Webhooks {
    /// List webhooks (never their secrets)
    List {
        /// The account's webhooks [default: the operator's]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Create a signed webhook; its secret is shown once (docs/webhooks.md)
    Create {
        /// For this account's events [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
        /// Where to deliver (http or https)
        #[arg(long)]
        url: String,
        /// Events: quota.warning, quota.exhausted, key.revoked, webhook.disabled, dedicated_ip.allocated, dedicated_ip.released, dedicated_ip.replaced, dedicated_ip.moved, exit.withdrawn (operator only); comma-separated or repeated
        #[arg(
            long = "event",
            value_name = "EVENT",
            value_delimiter = ',',
            required = true
        )]
        events: Vec<String>,
    },
    /// Enable a webhook its failures disabled (or that was paused)
    Enable {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Pause a webhook: its pending deliveries are given up, no events queue
    Disable {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Delete a webhook (its pending deliveries go with it)
    Delete {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// A webhook's delivery history, newest first
    Deliveries {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}
