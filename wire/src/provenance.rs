//! An exit's provenance as clients target it: its source type
//! ([`SourceType`], `type-…` in the username grammar) and how its address
//! was obtained ([`Channel`], `channel-…`). Part of the contract, so defined
//! here; `proxynet-store` re-exports both for the records that carry them.

use serde::{Deserialize, Serialize};

/// Where an exit's traffic comes from: the provenance the customer targets by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SourceType {
    Dc,
    Isp,
    Res,
    Mobile,
}

impl SourceType {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceType::Dc => "dc",
            SourceType::Isp => "isp",
            SourceType::Res => "res",
            SourceType::Mobile => "mobile",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "dc" => Some(SourceType::Dc),
            "isp" => Some(SourceType::Isp),
            "res" => Some(SourceType::Res),
            "mobile" => Some(SourceType::Mobile),
            _ => None,
        }
    }
}

/// How an exit's IP address was obtained (the provenance's acquisition channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// Hardware we own, in our racks.
    Owned,
    /// A server leased from a hosting provider.
    Leased,
    /// Addresses under a contract with an ISP.
    Isp,
    /// An SDK in a partner's app on someone's device.
    Sdk,
    /// A browser extension on someone's computer.
    Extension,
    /// A bandwidth-sharing app its owner installed.
    Sharing,
    /// Bought from a reseller.
    Reseller,
}

impl Channel {
    pub const ALL: [Channel; 7] = [
        Channel::Owned,
        Channel::Leased,
        Channel::Isp,
        Channel::Sdk,
        Channel::Extension,
        Channel::Sharing,
        Channel::Reseller,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Owned => "owned",
            Channel::Leased => "leased",
            Channel::Isp => "isp",
            Channel::Sdk => "sdk",
            Channel::Extension => "extension",
            Channel::Sharing => "sharing",
            Channel::Reseller => "reseller",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == value)
    }

    /// The address belongs to someone else, whose consent routing needs.
    pub fn borrows_someone_elses_line(self) -> bool {
        matches!(self, Channel::Sdk | Channel::Extension | Channel::Sharing)
    }
}
