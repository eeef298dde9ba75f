//! `proxynetctl consent`: exits' consent records and the notices people saw
//! (operator); a grant's arguments are also `exits reinstate`'s.

use clap::{Args, Subcommand};

/// A consent grant (also what reinstating an exit records).
#[derive(Args, Debug)]
pub(crate) struct GrantArgs {
    /// How the person agreed
    #[arg(long, value_parser = ["in_app_opt_in", "click_through_terms", "signed_contract"])]
    pub(crate) method: String,
    /// The notice version they saw (`consent notice create`)
    #[arg(long, value_name = "VERSION")]
    pub(crate) notice_version: String,
    /// The SHA-256 of the notice text the device showed (checked)
    #[arg(long, value_name = "HEX")]
    pub(crate) notice_sha256: Option<String>,
    /// Where the evidence is kept
    #[arg(long, value_name = "REF")]
    pub(crate) evidence_ref: String,
    /// How this person opts out (URL or instruction)
    #[arg(long, value_name = "HOW")]
    pub(crate) opt_out: String,
    /// When they agreed (RFC 3339) [default: now]
    #[arg(long, value_name = "TIME")]
    pub(crate) granted_at: Option<String>,
    /// When the consent ends (RFC 3339)
    #[arg(long, value_name = "TIME")]
    pub(crate) expires_at: Option<String>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Consent {
    /// An exit's consent history (append-only)
    History {
        /// Exit id
        exit: String,
    },
    /// Record granted consent for an exit (a new version)
    Grant {
        /// Exit id
        exit: String,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Revoke an exit's consent (a new version)
    Revoke {
        /// Exit id
        exit: String,
        /// Why
        #[arg(long)]
        reason: String,
    },
    /// Consent notices: the texts people saw, by version
    #[command(subcommand)]
    Notice(Notice),
}

#[derive(Subcommand, Debug)]
pub(crate) enum Notice {
    /// Store a notice text under a version
    Create {
        /// Version: letters, digits, `.`, `_` and `-`
        version: String,
        /// Text file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
    /// Print a notice text (public; its SHA-256 goes to stderr)
    Get {
        /// Version
        version: String,
    },
}
