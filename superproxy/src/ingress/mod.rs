//! Client-facing listeners: accept a connection and speak its protocol.

pub mod http;
