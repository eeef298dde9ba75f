//! `proxynetctl exits`: the fleet's exits; drain, disable, reinstate
//! (operator).

use clap::Subcommand;

use super::common::PageArgs;
use super::consent::GrantArgs;

#[derive(Subcommand, Debug)]
pub(crate) enum Exits {
    /// List exits: state, egress and fleet score
    List(PageArgs),
    /// One exit, with its declared, bound and observed egress
    Get {
        /// Exit id
        id: String,
    },
    /// No new tunnels; open ones finish
    Drain {
        /// Exit id
        id: String,
    },
    /// Back into rotation after a drain
    Undrain {
        /// Exit id
        id: String,
    },
    /// Out of rotation
    Disable {
        /// Exit id
        id: String,
    },
    /// Back into rotation after a disable
    Enable {
        /// Exit id
        id: String,
    },
    /// Bring back an exit its owner withdrew, with a fresh consent record (the owner must also run exit-agent opt-in)
    Reinstate {
        /// Exit id
        id: String,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// The exit's provenance: its source's answers and consent state
    Provenance {
        /// Exit id
        id: String,
    },
}
