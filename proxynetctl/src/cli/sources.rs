//! `proxynetctl sources`: provenance sources and their answers (operator).

use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub(crate) struct SourceArgs {
    /// The source's name
    #[arg(long)]
    pub(crate) name: String,
    /// What kind of addresses
    #[arg(long, value_parser = ["dc", "isp", "res", "mobile"])]
    pub(crate) source_type: String,
    /// How they were acquired
    #[arg(long, value_parser = ["owned", "leased", "isp", "sdk", "extension", "sharing", "reseller"])]
    pub(crate) channel: String,
    /// Who supplies them
    #[arg(long, default_value = "")]
    pub(crate) supplier: String,
    /// The agreement they come under
    #[arg(long, default_value = "")]
    pub(crate) agreement_ref: String,
    /// How the people behind them are informed
    #[arg(long, default_value = "")]
    pub(crate) notice_description: String,
    /// How they opt out
    #[arg(long, default_value = "")]
    pub(crate) opt_out: String,
    /// Who answers for them
    #[arg(long, default_value = "")]
    pub(crate) liable_party: String,
    /// Where abuse reports go
    #[arg(long, default_value = "")]
    pub(crate) abuse_contact: String,
    /// Countries (ISO 3166-1 alpha-2, comma-separated or repeated)
    #[arg(long = "country", value_name = "CC", value_delimiter = ',')]
    pub(crate) countries: Vec<String>,
    /// Whether each exit needs a consent record [default: by type and channel]
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub(crate) consent_required: Option<bool>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Sources {
    /// List sources with their completeness
    List,
    /// Read a source
    Get {
        /// Source id
        id: String,
    },
    /// Create a source
    Create(SourceArgs),
    /// Replace a source's answers (its exits follow at once)
    Replace {
        /// Source id
        id: String,
        #[command(flatten)]
        source: SourceArgs,
    },
}
