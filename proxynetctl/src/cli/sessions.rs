//! `proxynetctl sessions`: a proxy user's sticky sessions.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub(crate) enum Sessions {
    /// List a user's sticky sessions
    List {
        /// User id
        user: String,
    },
    /// Read one sticky session
    Get {
        /// User id
        user: String,
        /// Session id
        session: String,
    },
    /// End a sticky session: its next tunnel picks an exit afresh
    End {
        /// User id
        user: String,
        /// Session id
        session: String,
    },
    /// Set a session's remaining life to N minutes from now (extend or shorten)
    #[command(visible_alias = "extend")]
    SetTime {
        /// User id
        user: String,
        /// Session id
        session: String,
        /// Minutes from now (1 to 1440)
        #[arg(long, value_name = "N")]
        minutes: u32,
    },
}
