//! `proxynetctl abuse`: the abuse desk, who used an egress address
//! (operator).

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum Abuse {
    /// Who used an egress address (bound, or the public one observed) around a time
    Lookup {
        /// The address, or a network (e.g. an exit's /64)
        #[arg(long, value_name = "IP|CIDR")]
        egress_ip: String,
        /// When the complaint says the traffic arrived (RFC 3339)
        #[arg(long, value_name = "TIME")]
        at: String,
        /// host or host:port the complaint names
        #[arg(long)]
        target: Option<String>,
        /// Minutes either side of --at (0 to 60) [default: 2]
        #[arg(long, value_name = "N")]
        window_minutes: Option<u32>,
    },
    /// The abuse record of a time range (at most 31 days)
    Export {
        /// Start, inclusive (RFC 3339)
        #[arg(long, value_name = "TIME")]
        from: String,
        /// End, exclusive (RFC 3339)
        #[arg(long, value_name = "TIME")]
        to: String,
        /// Only rows of this address or network
        #[arg(long, value_name = "IP|CIDR")]
        egress_ip: Option<String>,
        /// Only rows to host or host:port
        #[arg(long)]
        target: Option<String>,
        /// Print the API's CSV rendering instead
        #[arg(long)]
        csv: bool,
    },
}
