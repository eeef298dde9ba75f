//! `proxynetctl sites`: target sites and the exits cooled for each.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum Sites {
    /// Exits cooled per site, worst first (an account key: the sites it used or reported)
    List {
        /// Only this site (a host name, address or block)
        #[arg(long)]
        site: Option<String>,
    },
    /// Lift an exit's cooldown for a site on every superproxy (operator; audited)
    Lift {
        /// The site, as `sites list` shows it
        site: String,
        /// Exit id
        exit_id: String,
    },
}
