//! `proxynetctl enrollment-tokens`: one-time exit enrollment tokens
//! (operator).

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum EnrollmentTokens {
    /// Create a one-time enrollment token; the token is shown once
    Create {
        /// The exit's name
        #[arg(long)]
        name: String,
        /// The source its addresses belong to
        #[arg(long = "source", value_name = "ID")]
        source_id: String,
        /// Its country (ISO 3166-1 alpha-2)
        #[arg(long, value_name = "CC")]
        country: String,
        /// ISO 3166-2 subdivision (e.g. DE-BY)
        #[arg(long)]
        region: Option<String>,
        /// Lower-case city
        #[arg(long)]
        city: Option<String>,
        /// Autonomous system number of its egress IPs
        #[arg(long)]
        asn: Option<u32>,
        /// Token lifetime [default: the server's]
        #[arg(long, value_name = "SECS")]
        ttl_seconds: Option<u64>,
        /// The exit sits behind NAT (the world sees another address than it binds)
        #[arg(long)]
        behind_nat: bool,
    },
}
