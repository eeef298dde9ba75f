//! The agent link: how a superproxy and an exit-agent talk.
//!
//! The agent dials the superproxy's link port (no inbound port on exits) and
//! speaks TLS 1.3 as the client, pinning the superproxy certificate whose SHA-256
//! the control plane handed it. Inside TLS the agent first sends one [`AgentHello`]
//! frame carrying its enrolled credential and the link versions it speaks, and
//! waits for a [`HelloReply`] naming the version chosen (the newest both speak).
//! After an `ok` reply the roles reverse: the superproxy opens one stream per
//! tunnel and the agent serves them, in the chosen version's framing:
//!
//! - **v1** ([`LINK_V1_HTTP2`]): HTTP/2; a tunnel stream is `CONNECT host:port`
//!   with the `proxynet-*` headers below.
//! - **v2** ([`LINK_V2_MUX`]): the [`crate::mux`] framing; a stream opens with a
//!   JSON [`StreamRequest`] and is answered with an [`Outcome`] name.
//!
//! Either way the agent answers with a typed [`Outcome`] (`connected`, then
//! bytes) so the superproxy can tell exit faults from target faults and knows
//! whether retrying on another exit is safe.
//!
//! Compatibility: a v1-only peer never sends or reads the version fields
//! (unknown JSON fields are ignored), so it is answered in v1; a peer that
//! shares no version with us is refused with a reason naming both sets.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use uuid::Uuid;

use proxynet_common::secret::Secret;

/// Version of the hello frames themselves; never changes (new fields are
/// optional), so peers of any link version can always read each other's
/// hello and refuse clearly.
pub const HELLO_VERSION: u16 = 1;

/// Link version 1: HTTP/2 inside TLS.
pub const LINK_V1_HTTP2: u16 = 1;
/// Link version 2: the lean mux inside TLS.
pub const LINK_V2_MUX: u16 = 2;
/// Every link version this build speaks.
pub const LINK_VERSIONS: [u16; 2] = [LINK_V1_HTTP2, LINK_V2_MUX];

/// The newest version both sides speak.
pub fn choose_version(offered: &[u16], ours: &[u16]) -> Option<u16> {
    offered.iter().copied().filter(|v| ours.contains(v)).max()
}

/// Parses a `--link-versions` value such as `1,2`.
pub fn parse_versions(value: &str) -> Result<Vec<u16>, String> {
    let mut versions = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v: u16 = part
            .parse()
            .map_err(|_| format!("`{part}` is not a link version"))?;
        if !LINK_VERSIONS.contains(&v) {
            return Err(format!(
                "link version {v} is not one this build speaks ({LINK_VERSIONS:?})"
            ));
        }
        versions.push(v);
    }
    if versions.is_empty() {
        return Err("at least one link version is needed".into());
    }
    Ok(versions)
}

/// The link versions one side is configured to speak (`--link-versions`).
/// Restricting an up-to-date binary to `1` makes it behave on the wire
/// exactly like a v1-only release: no version fields in its hello or reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkVersions(pub Vec<u16>);

impl Default for LinkVersions {
    fn default() -> Self {
        Self(LINK_VERSIONS.to_vec())
    }
}

impl std::str::FromStr for LinkVersions {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_versions(s).map(Self)
    }
}

impl std::fmt::Display for LinkVersions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u16::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

impl LinkVersions {
    /// True when only v1 is spoken: version fields are then left out entirely.
    pub fn is_v1_only(&self) -> bool {
        self.0 == [LINK_V1_HTTP2]
    }
}

/// What opens a v2 stream (JSON in the OPEN frame).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StreamRequest {
    /// Connect to `target` (`host:port`) from `egress_ip` within `budget_ms`.
    Tunnel {
        target: String,
        egress_ip: std::net::IpAddr,
        budget_ms: u64,
        /// The credit the agent starts the stream with, when the agent said
        /// in its hello that it reads this (`open_window`); absent: the full
        /// mux window. The superproxy grants less under memory pressure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u32>,
        /// For an upstream exit (a partner's gateway behind the agent): what
        /// the partner's username is built from. Never a credential.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upstream: Option<UpstreamAsk>,
    },
    /// A health probe: answered `connected` by a live agent that is not
    /// draining, without dialling anything.
    Probe,
    /// Opens a UDP association: the stream then carries datagram capsules
    /// (`crate::datagram`) both ways. The agent binds one UDP socket per
    /// egress IP given (at most one per family) and sends each datagram from
    /// the one of its target's family.
    Udp {
        egress_ips: Vec<std::net::IpAddr>,
        budget_ms: u64,
        /// As for `Tunnel`: the credit the agent starts the stream with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u32>,
    },
}

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
    /// Always [`HELLO_VERSION`].
    pub version: u16,
    pub exit_id: Uuid,
    pub credential: Secret,
    /// Link versions the agent speaks; absent means v1 only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_versions: Vec<u16>,
    /// The agent starts a v2 tunnel stream with the credit its OPEN names
    /// (`StreamRequest::Tunnel::window`). Older agents say nothing and get
    /// full windows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open_window: bool,
    /// The agent serves `StreamRequest::Udp`; superproxies send UDP
    /// associations only to agents that say so (older agents and v1 links
    /// never get one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub udp: bool,
}

impl AgentHello {
    pub fn offered_versions(&self) -> Vec<u16> {
        if self.link_versions.is_empty() {
            vec![LINK_V1_HTTP2]
        } else {
            self.link_versions.clone()
        }
    }
}

/// The superproxy's answer to an [`AgentHello`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HelloReply {
    pub ok: bool,
    /// Why the link was refused; never echoes the credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The link version chosen; absent means v1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_version: Option<u16>,
}

/// What an upstream exit's agent fills its partner username template with:
/// the tunnel's targeting, as far as the exit declared the partner honours
/// it, and a session key. The key is derived from the customer's session
/// (the same for every tunnel of that session, on every superproxy) or
/// fresh per tunnel for a rotating login; it never carries the customer's
/// username or password.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpstreamAsk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub city: Option<String>,
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
    /// The partner gateway an upstream exit tunnels through refused or failed
    /// the tunnel itself (its authentication, its capacity, its own errors, no
    /// answer in time): the exit's fault, and nothing reached the target.
    UpstreamRefused,
}

impl Outcome {
    pub const ALL: [Outcome; 11] = [
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
        Outcome::UpstreamRefused,
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
            Outcome::UpstreamRefused => "upstream_refused",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == value)
    }

    /// The HTTP/2 status the agent answers the stream with.
    pub fn status(self) -> u16 {
        match self {
            Outcome::Connected => 200,
            Outcome::Refused
            | Outcome::Unreachable
            | Outcome::DnsError
            | Outcome::UpstreamRefused => 502,
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
                | Outcome::UpstreamRefused
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
    fn version_choice_is_the_newest_shared_one() {
        assert_eq!(choose_version(&[1, 2], &[1, 2]), Some(2));
        assert_eq!(choose_version(&[1], &[1, 2]), Some(1));
        assert_eq!(choose_version(&[1, 2], &[1]), Some(1));
        assert_eq!(choose_version(&[3], &[1, 2]), None);
        assert_eq!(parse_versions("1, 2"), Ok(vec![1, 2]));
        assert!(parse_versions("7").is_err());
        assert!(parse_versions("").is_err());
    }

    #[test]
    fn a_v1_hello_and_reply_read_as_v1() {
        // What a v1 agent and superproxy put on the wire, byte for byte.
        let hello: AgentHello = serde_json::from_str(
            r#"{"version":1,"exit_id":"6f1c1a9e-2f57-4e0a-9a39-5e3f3d2b8c11","credential":"c"}"#,
        )
        .unwrap();
        assert_eq!(hello.offered_versions(), vec![LINK_V1_HTTP2]);
        assert!(!hello.udp, "a v1 agent serves no UDP associations");
        let reply: HelloReply = serde_json::from_str(r#"{"ok":true}"#).unwrap();
        assert_eq!(reply.link_version, None);
        // A v1 reply is exactly what we send when v1 is chosen.
        let ours = HelloReply {
            ok: true,
            error: None,
            link_version: None,
        };
        assert_eq!(serde_json::to_string(&ours).unwrap(), r#"{"ok":true}"#);
    }

    #[test]
    fn udp_requests_are_tagged_udp_and_their_window_is_optional() {
        let request: StreamRequest = serde_json::from_str(
            r#"{"kind":"udp","egress_ips":["192.0.2.1","2001:db8::1"],"budget_ms":900}"#,
        )
        .unwrap();
        let expected = StreamRequest::Udp {
            egress_ips: vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()],
            budget_ms: 900,
            window: None,
        };
        assert_eq!(request, expected);
        assert_eq!(
            serde_json::to_string(&expected).unwrap(),
            r#"{"kind":"udp","egress_ips":["192.0.2.1","2001:db8::1"],"budget_ms":900}"#
        );
    }

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
            version: HELLO_VERSION,
            exit_id: Uuid::new_v4(),
            credential: Secret::new("c"),
            link_versions: LINK_VERSIONS.to_vec(),
            open_window: true,
            udp: true,
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
