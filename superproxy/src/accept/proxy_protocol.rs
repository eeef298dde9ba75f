//! The PROXY protocol header (HAProxy's spec, v1 text and v2 binary): what a
//! TCP load balancer in front of us sends first on each connection to say
//! whose connection it is.
//!
//! [`parse`] is pure and incremental: handed the bytes read so far it says
//! how many more may be read without passing the end of the header, so the
//! reader ([`read`]) never takes a byte that belongs to the client's own
//! protocol — the ingress sniffs the first byte after the header as if the
//! connection had started there. Everything is bounded: a v1 line is at most
//! 107 bytes, a v2 header at most 16 + [`V2_MAX_PAYLOAD`] bytes. v2 TLVs are
//! skipped unread (nothing here needs them, and a parser of their contents
//! would be one more thing a peer could feed).
//!
//! Whether a peer may send a header at all is the acceptor's business: only
//! connections from the configured trusted networks are read here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// A v1 line at most, `\r\n` included (the spec's bound).
pub const V1_MAX: usize = 107;
/// The v2 signature: no text protocol's first line starts like this.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The fixed part of a v2 header: signature, version and command, family,
/// length.
pub const V2_FIXED: usize = 16;
/// The most address-and-TLV bytes a v2 header may carry here. The addresses
/// take 36 at most; the rest is TLVs, which a balancer keeps small.
pub const V2_MAX_PAYLOAD: usize = 2048;

const V1_PREFIX: &[u8] = b"PROXY ";

/// What a header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The balancer relays a client's connection: `source` is the client.
    Proxied {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// The connection is the balancer's own (v2 `LOCAL`, e.g. a health
    /// check), or it does not know the client (v1 `UNKNOWN`, v2 `AF_UNSPEC`):
    /// the peer's address stands.
    Local,
}

impl Header {
    /// The client address of a connection from `peer` that sent this header.
    pub fn client(&self, peer: SocketAddr) -> SocketAddr {
        match self {
            Header::Proxied { source, .. } => *source,
            Header::Local => peer,
        }
    }
}

/// Why a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("not a PROXY protocol header")]
    NotAHeader,
    #[error("PROXY protocol v1 line longer than 107 bytes")]
    TooLong,
    #[error("PROXY protocol v1 line does not end in CRLF")]
    BadLineEnd,
    #[error("PROXY protocol v1 line is malformed")]
    BadLine,
    #[error("PROXY protocol v2 version is not 2")]
    BadVersion,
    #[error("PROXY protocol v2 command is neither LOCAL nor PROXY")]
    BadCommand,
    #[error("PROXY protocol v2 header longer than allowed")]
    TooLarge,
    #[error("PROXY protocol v2 family or transport not supported (TCP over IPv4/IPv6 only)")]
    Unsupported,
    #[error("PROXY protocol v2 address block shorter than its family needs")]
    ShortAddresses,
}

/// Where [`parse`] got with the bytes it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A header, and how many of the bytes it took.
    Complete(Header, usize),
    /// Not yet a whole header: this many more bytes (at least one) may be
    /// read without reading past its end.
    Incomplete(usize),
}

/// Parses the header at the start of `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Parsed, Malformed> {
    // The first byte tells the versions apart (`P` or `\r`); a v1 header
    // can be as short as 15 bytes, so nothing more is asked for before it.
    if bytes.is_empty() {
        return Ok(Parsed::Incomplete(1));
    }
    let lead = bytes.len().min(V2_SIGNATURE.len());
    if bytes[..lead] == V2_SIGNATURE[..lead] {
        // Every v2 header has its 16 fixed bytes.
        if bytes.len() < V2_FIXED {
            return Ok(Parsed::Incomplete(V2_FIXED - bytes.len()));
        }
        return parse_v2(bytes);
    }
    let lead = bytes.len().min(V1_PREFIX.len());
    if bytes[..lead] == V1_PREFIX[..lead] {
        return parse_v1(bytes);
    }
    Err(Malformed::NotAHeader)
}

/// A v1 line, read one byte at a time up to its `\n`.
fn parse_v1(bytes: &[u8]) -> Result<Parsed, Malformed> {
    let Some(end) = bytes.iter().position(|b| *b == b'\n') else {
        return if bytes.len() >= V1_MAX {
            Err(Malformed::TooLong)
        } else {
            Ok(Parsed::Incomplete(1))
        };
    };
    let used = end + 1;
    if used > V1_MAX {
        return Err(Malformed::TooLong);
    }
    let Some(line) = bytes[..end].strip_suffix(b"\r") else {
        return Err(Malformed::BadLineEnd);
    };
    let line = std::str::from_utf8(line).map_err(|_| Malformed::BadLine)?;
    let mut fields = line.split(' ');
    if fields.next() != Some("PROXY") {
        return Err(Malformed::NotAHeader);
    }
    let family = fields.next().ok_or(Malformed::BadLine)?;
    if family == "UNKNOWN" {
        // The spec has the receiver ignore whatever follows UNKNOWN.
        return Ok(Parsed::Complete(Header::Local, used));
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => return Err(Malformed::BadLine),
    };
    let (Some(source), Some(destination), Some(source_port), Some(destination_port), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(Malformed::BadLine);
    };
    let address = |text: &str| -> Result<IpAddr, Malformed> {
        if v6 {
            text.parse::<Ipv6Addr>()
                .map(IpAddr::V6)
                .map_err(|_| Malformed::BadLine)
        } else {
            text.parse::<Ipv4Addr>()
                .map(IpAddr::V4)
                .map_err(|_| Malformed::BadLine)
        }
    };
    Ok(Parsed::Complete(
        Header::Proxied {
            source: SocketAddr::new(address(source)?, port(source_port)?),
            destination: SocketAddr::new(address(destination)?, port(destination_port)?),
        },
        used,
    ))
}

/// A decimal port: digits only (`u16::from_str` would take a `+`), 0–65535.
fn port(text: &str) -> Result<u16, Malformed> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Malformed::BadLine);
    }
    text.parse().map_err(|_| Malformed::BadLine)
}

/// A v2 header: `bytes` holds at least the fixed part, whose signature
/// matched.
fn parse_v2(bytes: &[u8]) -> Result<Parsed, Malformed> {
    let version_command = bytes[12];
    if version_command >> 4 != 2 {
        return Err(Malformed::BadVersion);
    }
    let local = match version_command & 0x0f {
        0 => true,
        1 => false,
        _ => return Err(Malformed::BadCommand),
    };
    let family_transport = bytes[13];
    let length = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    if length > V2_MAX_PAYLOAD {
        return Err(Malformed::TooLarge);
    }
    let total = V2_FIXED + length;
    if bytes.len() < total {
        return Ok(Parsed::Incomplete(total - bytes.len()));
    }
    // A LOCAL header's address block, if any, is to be ignored.
    if local {
        return Ok(Parsed::Complete(Header::Local, total));
    }
    let block = &bytes[V2_FIXED..total];
    let header = match family_transport {
        // AF_UNSPEC: the spec has the receiver use the real endpoints.
        0x00 => Header::Local,
        // AF_INET, STREAM: 4 + 4 address bytes, 2 + 2 port bytes.
        0x11 => {
            let Some(block) = block.get(..12) else {
                return Err(Malformed::ShortAddresses);
            };
            let ip = |at: usize| {
                IpAddr::V4(Ipv4Addr::new(
                    block[at],
                    block[at + 1],
                    block[at + 2],
                    block[at + 3],
                ))
            };
            Header::Proxied {
                source: SocketAddr::new(ip(0), be16(block, 8)),
                destination: SocketAddr::new(ip(4), be16(block, 10)),
            }
        }
        // AF_INET6, STREAM: 16 + 16 address bytes, 2 + 2 port bytes.
        0x21 => {
            let Some(block) = block.get(..36) else {
                return Err(Malformed::ShortAddresses);
            };
            let ip = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&block[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            Header::Proxied {
                source: SocketAddr::new(ip(0), be16(block, 32)),
                destination: SocketAddr::new(ip(16), be16(block, 34)),
            }
        }
        _ => return Err(Malformed::Unsupported),
    };
    // Whatever follows the addresses (TLVs) is skipped with the header.
    Ok(Parsed::Complete(header, total))
}

fn be16(block: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([block[at], block[at + 1]])
}

/// Why [`read`] got no header.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Malformed(#[from] Malformed),
    #[error("no complete PROXY protocol header within {0:?}")]
    Timeout(Duration),
    #[error("connection ended before its PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one header off `stream` within `timeout`, and not one byte more.
pub async fn read<R: AsyncRead + Unpin>(
    stream: &mut R,
    timeout: Duration,
) -> Result<Header, ReadError> {
    tokio::time::timeout(timeout, read_header(stream))
        .await
        .map_err(|_| ReadError::Timeout(timeout))?
}

async fn read_header<R: AsyncRead + Unpin>(stream: &mut R) -> Result<Header, ReadError> {
    let mut bytes = Vec::with_capacity(V1_MAX);
    loop {
        match parse(&bytes)? {
            Parsed::Complete(header, _) => return Ok(header),
            Parsed::Incomplete(more) => {
                let at = bytes.len();
                bytes.resize(at + more, 0);
                stream.read_exact(&mut bytes[at..]).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(bytes: &[u8]) -> (Header, usize) {
        match parse(bytes) {
            Ok(Parsed::Complete(header, used)) => (header, used),
            other => panic!("expected a header, got {other:?}"),
        }
    }

    fn proxied(source: &str, destination: &str) -> Header {
        Header::Proxied {
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
        }
    }

    fn v2(command: u8, family: u8, block: &[u8]) -> Vec<u8> {
        let mut bytes = V2_SIGNATURE.to_vec();
        bytes.push(0x20 | command);
        bytes.push(family);
        bytes.extend_from_slice(&(block.len() as u16).to_be_bytes());
        bytes.extend_from_slice(block);
        bytes
    }

    #[test]
    fn v1_tcp4_and_tcp6_lines_give_the_client_address() {
        let line = b"PROXY TCP4 127.0.77.1 10.0.0.1 40000 8080\r\nGET";
        assert_eq!(
            complete(line),
            (proxied("127.0.77.1:40000", "10.0.0.1:8080"), line.len() - 3)
        );
        let line = b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n";
        assert_eq!(
            complete(line),
            (proxied("[2001:db8::1]:65535", "[::1]:0"), line.len())
        );
    }

    #[test]
    fn v1_unknown_keeps_the_peer() {
        let (header, used) = complete(b"PROXY UNKNOWN\r\n");
        assert_eq!((header, used), (Header::Local, 15));
        let peer: SocketAddr = "127.0.0.88:1000".parse().unwrap();
        assert_eq!(header.client(peer), peer);
        let (header, _) = complete(b"PROXY UNKNOWN ::1 ::2 1 2\r\n");
        assert_eq!(header, Header::Local);
    }

    #[test]
    fn v1_lines_that_break_the_grammar_are_refused() {
        for line in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 70000 80\r\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 +80 80\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 80\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8  80\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80 80 80\r\n",
            b"PROXY TCP4 ::1 ::1 80 80\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 80 80\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 80 80\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 80 80\n",
            b"PROXY\r\n",
        ] {
            assert!(
                parse(line).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(Malformed::NotAHeader));
        assert_eq!(parse(&[0x05, 0x01, 0x02]), Err(Malformed::NotAHeader));
    }

    #[test]
    fn a_v1_line_without_its_end_is_bounded() {
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX - 1, b'x');
        assert_eq!(parse(&line), Ok(Parsed::Incomplete(1)));
        line.push(b'x');
        assert_eq!(parse(&line), Err(Malformed::TooLong));
        line.extend_from_slice(b"\r\n");
        assert_eq!(parse(&line), Err(Malformed::TooLong));
    }

    #[test]
    fn a_short_prefix_asks_for_no_more_than_the_header() {
        assert_eq!(parse(b""), Ok(Parsed::Incomplete(1)));
        assert_eq!(parse(b"\r"), Ok(Parsed::Incomplete(V2_FIXED - 1)));
        assert_eq!(parse(b"PRO"), Ok(Parsed::Incomplete(1)));
        assert_eq!(parse(b"\r\n\r\n\0"), Ok(Parsed::Incomplete(11)));
        let header = v2(1, 0x11, &[0; 12]);
        assert_eq!(parse(&header[..16]), Ok(Parsed::Incomplete(12)));
        assert_eq!(parse(&header[..20]), Ok(Parsed::Incomplete(8)));
    }

    #[test]
    fn v2_ipv4_and_ipv6_with_tlvs_skipped() {
        let mut block = vec![127, 0, 77, 1, 10, 0, 0, 1];
        block.extend_from_slice(&40000u16.to_be_bytes());
        block.extend_from_slice(&8080u16.to_be_bytes());
        // A PP2_TYPE_ALPN TLV and a NOOP one: skipped.
        block.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2', 0x04, 0x00, 0x00]);
        let mut bytes = v2(1, 0x11, &block);
        let total = bytes.len();
        bytes.extend_from_slice(b"CONNECT");
        assert_eq!(
            complete(&bytes),
            (proxied("127.0.77.1:40000", "10.0.0.1:8080"), total)
        );

        let mut block = Vec::new();
        block.extend_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets());
        block.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        block.extend_from_slice(&1u16.to_be_bytes());
        block.extend_from_slice(&2u16.to_be_bytes());
        // A TLV claiming more than there is: not read, so no harm.
        block.extend_from_slice(&[0xee, 0xff, 0xff, 0x00]);
        let bytes = v2(1, 0x21, &block);
        assert_eq!(
            complete(&bytes),
            (proxied("[2001:db8::7]:1", "[::1]:2"), bytes.len())
        );
    }

    #[test]
    fn v2_local_and_unspec_keep_the_peer() {
        assert_eq!(complete(&v2(0, 0x00, &[])), (Header::Local, 16));
        // LOCAL ignores whatever address block it carries.
        assert_eq!(complete(&v2(0, 0x11, &[1, 2, 3])).0, Header::Local);
        assert_eq!(complete(&v2(1, 0x00, &[9; 4])).0, Header::Local);
    }

    #[test]
    fn v2_headers_that_break_the_rules_are_refused() {
        let mut bad_version = v2(1, 0x11, &[0; 12]);
        bad_version[12] = 0x11;
        assert_eq!(parse(&bad_version), Err(Malformed::BadVersion));
        assert_eq!(parse(&v2(2, 0x11, &[0; 12])), Err(Malformed::BadCommand));
        assert_eq!(
            parse(&v2(1, 0x11, &[0; 11])),
            Err(Malformed::ShortAddresses)
        );
        assert_eq!(
            parse(&v2(1, 0x21, &[0; 35])),
            Err(Malformed::ShortAddresses)
        );
        assert_eq!(parse(&v2(1, 0x12, &[0; 12])), Err(Malformed::Unsupported));
        assert_eq!(parse(&v2(1, 0x31, &[0; 216])), Err(Malformed::Unsupported));
        let mut too_large = v2(1, 0x11, &[]);
        too_large[14..16].copy_from_slice(&((V2_MAX_PAYLOAD + 1) as u16).to_be_bytes());
        assert_eq!(parse(&too_large), Err(Malformed::TooLarge));
        let mut wrong_signature = v2(1, 0x11, &[0; 12]);
        wrong_signature[11] = b'X';
        assert_eq!(parse(&wrong_signature), Err(Malformed::NotAHeader));
    }

    #[tokio::test]
    async fn read_takes_the_header_and_leaves_the_rest() {
        let mut input: &[u8] = b"PROXY TCP4 127.0.77.1 127.0.0.1 5 6\r\nCONNECT x";
        let header = read(&mut input, Duration::from_secs(1)).await.unwrap();
        assert_eq!(header, proxied("127.0.77.1:5", "127.0.0.1:6"));
        assert_eq!(input, b"CONNECT x");

        let mut bytes = v2(0, 0x00, &[]);
        bytes.push(0x05);
        let mut input: &[u8] = &bytes;
        let header = read(&mut input, Duration::from_secs(1)).await.unwrap();
        assert_eq!(header, Header::Local);
        assert_eq!(input, &[0x05u8][..]);
    }

    #[tokio::test]
    async fn read_refuses_a_truncated_or_missing_header() {
        let bytes = v2(1, 0x11, &[0; 12]);
        let mut input: &[u8] = &bytes[..20];
        assert!(matches!(
            read(&mut input, Duration::from_secs(1)).await,
            Err(ReadError::Io(_))
        ));
        let mut input: &[u8] = b"CONNECT example.com:443 HTTP/1.1\r\n";
        assert!(matches!(
            read(&mut input, Duration::from_secs(1)).await,
            Err(ReadError::Malformed(Malformed::NotAHeader))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn read_gives_up_at_its_timeout() {
        let (mut client, mut server) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"PROXY TCP4")
            .await
            .unwrap();
        assert!(matches!(
            read(&mut server, Duration::from_secs(3)).await,
            Err(ReadError::Timeout(_))
        ));
    }
}
