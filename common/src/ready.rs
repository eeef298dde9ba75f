//! How a proxynet process tells whoever started it that it is ready.
//!
//! Every binary binds its listeners (port 0 is fine), then prints exactly one
//! line `PROXYNET_READY {json}` to standard output naming the addresses it bound.
//! Scripts and tests wait for that line instead of sleeping or guessing ports;
//! logs go to standard error so the line is never interleaved with them.

use serde::{de::DeserializeOwned, Serialize};
use std::io::Write;

pub const READY_PREFIX: &str = "PROXYNET_READY ";

/// Prints the ready line and flushes standard output.
pub fn announce<T: Serialize>(addresses: &T) -> std::io::Result<()> {
    let json = serde_json::to_string(addresses).map_err(std::io::Error::other)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{READY_PREFIX}{json}")?;
    out.flush()
}

/// Parses a line printed by [`announce`]; `None` for any other line.
pub fn parse<T: DeserializeOwned>(line: &str) -> Option<T> {
    let json = line.trim_end().strip_prefix(READY_PREFIX)?;
    serde_json::from_str(json).ok()
}
