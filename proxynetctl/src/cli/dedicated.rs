//! `proxynetctl dedicated`: dedicated IPs, egress addresses (or IPv6 /64s)
//! held by one account.

use clap::{ArgGroup, Subcommand};

#[derive(Subcommand, Debug)]
pub(crate) enum Dedicated {
    /// An account's dedicated addresses, and its replacements this month
    List {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
    },
    /// Allocate addresses to an account: N free ones that match, or (operators) the ones named
    #[command(group(ArgGroup::new("which").required(true).args(["count", "ips"])))]
    Allocate {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// How many free addresses
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// With --count: on exits in this country (ISO 3166-1 alpha-2)
        #[arg(long, value_name = "CC", conflicts_with = "ips")]
        country: Option<String>,
        /// With --count: on exits in this city
        #[arg(long, conflicts_with = "ips")]
        city: Option<String>,
        /// With --count: on exits of this source type
        #[arg(
            long = "type",
            value_name = "TYPE",
            value_parser = ["dc", "isp", "res", "mobile"],
            conflicts_with = "ips"
        )]
        source_type: Option<String>,
        /// Or these: egress addresses, or /64s of an exit's egress prefix (operators; comma-separated or repeated)
        #[arg(long = "ip", value_name = "ADDR", value_delimiter = ',')]
        ips: Vec<String>,
        /// Only these proxy users may leave from them (comma-separated or repeated) [default: every user of the account]
        #[arg(long = "user", value_name = "UUID", value_delimiter = ',')]
        users: Vec<String>,
    },
    /// Release a dedicated address back to the shared pool
    Release {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
    },
    /// Swap a dedicated address for a free one of the same country, city and type (a monthly allowance)
    Replace {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
    },
    /// Set which of the account's proxy users may leave from an address (no --user: all of them)
    Assign {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
        /// A proxy user id (comma-separated or repeated)
        #[arg(long = "user", value_name = "UUID", value_delimiter = ',')]
        users: Vec<String>,
    },
    /// Every dedicated address held, of every account (operator)
    Map {
        /// Only this account's
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Move a dedicated address to another account (operator)
    Move {
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
        /// The account it goes to
        #[arg(long, value_name = "ID")]
        to: String,
    },
}
