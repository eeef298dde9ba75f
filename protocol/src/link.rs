//! The agent link: how a superproxy and an exit-agent talk.
//!
//! The agent dials the superproxy's link port (no inbound port on exits) and
//! speaks TLS 1.3 as the client, pinning the superproxy certificate whose SHA-256
//! the control plane handed it. Inside TLS the agent first sends one [`AgentHello`]
//! frame carrying its enrolled credential and waits for a [`HelloReply`]. After an
//! `ok` reply the roles reverse: the superproxy is the HTTP/2 client and opens one
//! `CONNECT` stream per tunnel; the agent is the HTTP/2 server.
//!
//! A tunnel stream is `CONNECT host:port` with the `proxynet-*` headers below. The
//! agent answers `200` with `proxynet-outcome: connected` and then splices, or a
//! non-2xx status with a typed [`Outcome`] so the superproxy can tell exit faults
//! from target faults and knows whether retrying on another exit is safe.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use uuid::Uuid;

use crate::secret::Secret;

/// Version of the stream headers and hello frames. Bumped on any incompatible change.
pub const LINK_VERSION: u16 = 1;

pub const HEADER_VERSION: &str = "proxynet-link-version";
/// The egress IP the agent must bind before connecting.
pub const HEADER_EGRESS_IP: &str = "proxynet-egress-ip";
/// Milliseconds left of the superproxy's connect budget when the stream was opened.
pub const HEADER_CONNECT_BUDGET_MS: &str = "proxynet-connect-budget-ms";
/// The agent's answer, one of [`Outcome::as_str`].
pub const HEADER_OUTCOME: &str = "proxynet-outcome";
/// Path of a health probe: `GET` on a link stream, answered `200` by a live,
/// responsive agent without dialling anything. Probes measure the link and the
/// agent's event loop, which is what a blackholed or stopped exit loses first.
pub const PROBE_PATH: &str = "/proxynet/probe";

/// HTTP/2 frame size both ends of a link advertise: large frames mean fewer
/// frame headers and wake-ups per byte on bulk tunnels.
pub const H2_MAX_FRAME_SIZE: u32 = 256 * 1024;

/// Per-tunnel HTTP/2 receive window on both ends of a link: what one tunnel
/// may have in flight, and so what a tunnel whose client stopped reading can
/// hold in the receiver's memory.
pub const H2_STREAM_WINDOW: u32 = 1 << 20;

/// Link-wide HTTP/2 receive window: the protocol maximum. The connection
/// window is shared by every tunnel on the link; if it were only a multiple
/// of the stream window, that many stalled tunnels (clients not reading,
/// targets still sending) would use it all and freeze every other tunnel on
/// the exit. At the maximum, stalled tunnels are bounded by their own
/// stream windows (memory: stalled tunnels × `H2_STREAM_WINDOW`) and never
/// starve the rest.
pub const H2_CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// The TLS provider for links: ring, TLS 1.3 only, AES-128-GCM preferred.
/// Both ends run on hosts we own with AES-NI, where AES-128-GCM is the
/// cheapest AEAD per byte; the others stay available as fallbacks.
pub fn tls_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::{cipher_suite, default_provider};
    let mut provider = default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    std::sync::Arc::new(provider)
}

/// Largest hello frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 4096;

/// What an agent says after TLS, before HTTP/2 starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentHello {
    pub version: u16,
    pub exit_id: Uuid,
    pub credential: Secret,
}

/// The superproxy's answer to an [`AgentHello`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HelloReply {
    pub ok: bool,
    /// Why the link was refused; never echoes the credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The typed result of asking an agent to open a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The target accepted the TCP connection; the stream now carries its bytes.
    Connected,
    /// The target actively refused (RST).
    Refused,
    /// The target did not answer within the connect budget.
    TimedOut,
    /// The target's network or host was unreachable.
    Unreachable,
    /// The target name did not resolve at the exit.
    DnsError,
    /// The exit's egress policy forbids the resolved address or port.
    PolicyDenied,
    /// The requested egress IP is not one this agent serves or cannot be bound.
    EgressUnavailable,
    /// The agent is draining and takes no new tunnels.
    Draining,
    /// The agent is at its tunnel capacity.
    Capacity,
    /// The stream request was malformed or of an unknown version.
    BadRequest,
}

impl Outcome {
    pub const ALL: [Outcome; 10] = [
        Outcome::Connected,
        Outcome::Refused,
        Outcome::TimedOut,
        Outcome::Unreachable,
        Outcome::DnsError,
        Outcome::PolicyDenied,
        Outcome::EgressUnavailable,
        Outcome::Draining,
        Outcome::Capacity,
        Outcome::BadRequest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Connected => "connected",
            Outcome::Refused => "refused",
            Outcome::TimedOut => "timed_out",
            Outcome::Unreachable => "unreachable",
            Outcome::DnsError => "dns_error",
            Outcome::PolicyDenied => "policy_denied",
            Outcome::EgressUnavailable => "egress_unavailable",
            Outcome::Draining => "draining",
            Outcome::Capacity => "capacity",
            Outcome::BadRequest => "bad_request",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == value)
    }

    /// The HTTP/2 status the agent answers the stream with.
    pub fn status(self) -> u16 {
        match self {
            Outcome::Connected => 200,
            Outcome::Refused | Outcome::Unreachable | Outcome::DnsError => 502,
            Outcome::TimedOut => 504,
            Outcome::PolicyDenied => 403,
            Outcome::EgressUnavailable | Outcome::Draining | Outcome::Capacity => 503,
            Outcome::BadRequest => 400,
        }
    }

    /// True when the agent never tried to reach the target, so the same tunnel
    /// may safely be opened through another exit.
    pub fn target_untouched(self) -> bool {
        matches!(
            self,
            Outcome::EgressUnavailable
                | Outcome::Draining
                | Outcome::Capacity
                | Outcome::BadRequest
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("link frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("link frame is not valid JSON: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("link i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes one length-prefixed (u16, big-endian) JSON frame.
pub async fn write_frame<W, T>(io: &mut W, value: &T) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let body = serde_json::to_vec(value)?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(body.len()));
    }
    let len = u16::try_from(body.len()).map_err(|_| FrameError::TooLarge(body.len()))?;
    io.write_all(&len.to_be_bytes()).await?;
    io.write_all(&body).await?;
    io.flush().await?;
    Ok(())
}

/// Reads exactly one frame written by [`write_frame`], never a byte more, so the
/// HTTP/2 preface that follows stays in the stream.
pub async fn read_frame<R, T>(io: &mut R) -> Result<T, FrameError>
where
    R: AsyncRead + Unpin,
    T: for<'de> Deserialize<'de>,
{
    let mut len = [0u8; 2];
    io.read_exact(&mut len).await?;
    let len = usize::from(u16::from_be_bytes(len));
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    io.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names_round_trip() {
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(Outcome::parse("nope"), None);
    }

    #[tokio::test]
    async fn frames_round_trip_and_stop_at_their_end() {
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let hello = AgentHello {
            version: LINK_VERSION,
            exit_id: Uuid::new_v4(),
            credential: Secret::new("c"),
        };
        write_frame(&mut a, &hello).await.unwrap();
        a.write_all(b"PRI * HTTP/2.0").await.unwrap();
        let got: AgentHello = read_frame(&mut b).await.unwrap();
        assert_eq!(got.exit_id, hello.exit_id);
        let mut rest = [0u8; 14];
        b.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"PRI * HTTP/2.0");
    }

    #[tokio::test]
    async fn oversized_frames_are_refused() {
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        a.write_all(&u16::MAX.to_be_bytes()).await.unwrap();
        let err = read_frame::<_, HelloReply>(&mut b).await.unwrap_err();
        assert!(matches!(err, FrameError::TooLarge(_)));
    }
}
