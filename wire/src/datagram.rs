//! UDP datagrams carried on a link stream.
//!
//! A UDP association (`StreamRequest::Udp`) is an ordinary mux stream whose
//! bytes are a sequence of *capsules*, one per datagram, much as RFC 9297
//! carries datagrams on an HTTP stream:
//!
//! ```text
//! len: u32 BE (bytes after this field) | atyp | addr | port: u16 BE | payload
//! ```
//!
//! `atyp|addr|port` is exactly SOCKS5's address encoding (RFC 1928 §5:
//! 1 = IPv4, 3 = domain name with a length byte, 4 = IPv6), so the
//! superproxy parses and writes the SOCKS UDP request header with
//! [`decode_addr`] and [`encode_addr`] too. Towards the agent the address is
//! the datagram's destination; towards the superproxy, its source.
//!
//! Everything here reads bytes from a peer: lengths are bounded before any
//! allocation and every malformed input is an error, never a panic.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Largest UDP payload over IPv4 (65 535 − 20 IP − 8 UDP header bytes); an
/// IPv6 datagram larger than this could not be relayed to every client.
pub const MAX_PAYLOAD: usize = 65_507;
/// Largest whole capsule: length field, the longest address (a 255-byte
/// name) and the largest payload.
pub const MAX_CAPSULE: usize = 4 + 1 + 1 + 255 + 2 + MAX_PAYLOAD;

const ATYP_V4: u8 = 1;
const ATYP_NAME: u8 = 3;
const ATYP_V6: u8 = 4;

/// A datagram's destination (agent-bound) or source (superproxy-bound).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DatagramAddr {
    Ip(SocketAddr),
    /// A host name the agent resolves, and a port.
    Name(String, u16),
}

/// One datagram: where it goes (or came from) and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub addr: DatagramAddr,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DatagramError {
    #[error("datagram address or capsule is truncated")]
    Truncated,
    #[error("unknown datagram address type {0}")]
    UnknownAddressType(u8),
    #[error("datagram host name is empty, longer than 255 bytes or not a host name")]
    BadName,
    #[error("datagram of {0} bytes exceeds the size limit")]
    TooLarge(usize),
}

/// Whether `name` may travel as a host name: 1..=255 bytes of letters,
/// digits, `-`, `.` and `_`. Anything else (control characters, spaces,
/// `/`, `@`, non-ASCII) is no DNS name a resolver should be handed, and
/// would only end up in logs or lookups as an injection vector.
fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// Appends atyp|addr|port. Names longer than 255 bytes or empty -> BadName.
/// Writes nothing when it fails.
pub fn encode_addr(addr: &DatagramAddr, out: &mut BytesMut) -> Result<(), DatagramError> {
    match addr {
        DatagramAddr::Ip(SocketAddr::V4(a)) => {
            out.reserve(1 + 4 + 2);
            out.put_u8(ATYP_V4);
            out.put_slice(&a.ip().octets());
            out.put_u16(a.port());
        }
        DatagramAddr::Ip(SocketAddr::V6(a)) => {
            out.reserve(1 + 16 + 2);
            out.put_u8(ATYP_V6);
            out.put_slice(&a.ip().octets());
            out.put_u16(a.port());
        }
        DatagramAddr::Name(name, port) => {
            if !valid_name(name.as_bytes()) {
                return Err(DatagramError::BadName);
            }
            let len = u8::try_from(name.len()).map_err(|_| DatagramError::BadName)?;
            out.reserve(1 + 1 + name.len() + 2);
            out.put_u8(ATYP_NAME);
            out.put_u8(len);
            out.put_slice(name.as_bytes());
            out.put_u16(*port);
        }
    }
    Ok(())
}

/// `N` bytes of `buf` starting at `at`, or Truncated.
fn bytes_at<const N: usize>(buf: &[u8], at: usize) -> Result<[u8; N], DatagramError> {
    buf.get(at..at.saturating_add(N))
        .and_then(|b| b.try_into().ok())
        .ok_or(DatagramError::Truncated)
}

/// Parses atyp|addr|port at the start of `buf`; returns the address and how
/// many bytes it took. Names must be non-empty and made of host name
/// characters (letters, digits, `-`, `.`, `_`), else BadName.
pub fn decode_addr(buf: &[u8]) -> Result<(DatagramAddr, usize), DatagramError> {
    let atyp = *buf.first().ok_or(DatagramError::Truncated)?;
    match atyp {
        ATYP_V4 => {
            let ip: [u8; 4] = bytes_at(buf, 1)?;
            let port = u16::from_be_bytes(bytes_at(buf, 5)?);
            let addr = SocketAddrV4::new(Ipv4Addr::from(ip), port);
            Ok((DatagramAddr::Ip(SocketAddr::V4(addr)), 1 + 4 + 2))
        }
        ATYP_V6 => {
            let ip: [u8; 16] = bytes_at(buf, 1)?;
            let port = u16::from_be_bytes(bytes_at(buf, 17)?);
            let addr = SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, 0);
            Ok((DatagramAddr::Ip(SocketAddr::V6(addr)), 1 + 16 + 2))
        }
        ATYP_NAME => {
            let [len] = bytes_at::<1>(buf, 1)?;
            let len = usize::from(len);
            let name = buf.get(2..2 + len).ok_or(DatagramError::Truncated)?;
            let port = u16::from_be_bytes(bytes_at(buf, 2 + len)?);
            // Checked before the (then infallible) UTF-8 conversion, so a
            // truncated name is Truncated and a hostile one BadName.
            if !valid_name(name) {
                return Err(DatagramError::BadName);
            }
            let name = std::str::from_utf8(name).map_err(|_| DatagramError::BadName)?;
            Ok((DatagramAddr::Name(name.to_owned(), port), 2 + len + 2))
        }
        other => Err(DatagramError::UnknownAddressType(other)),
    }
}

/// Appends one capsule carrying `payload` for `addr`, from borrowed parts
/// (an agent encodes straight from its receive buffer). payload >
/// MAX_PAYLOAD -> TooLarge. Writes nothing when it fails.
pub fn encode_capsule(
    addr: &DatagramAddr,
    payload: &[u8],
    out: &mut BytesMut,
) -> Result<(), DatagramError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(DatagramError::TooLarge(payload.len()));
    }
    let start = out.len();
    out.put_u32(0);
    if let Err(e) = encode_addr(addr, out) {
        out.truncate(start);
        return Err(e);
    }
    out.put_slice(payload);
    // The length is known only once the address is written; both are
    // bounded, so it always fits (checked anyway rather than cast).
    let len = out.len() - start - 4;
    let Ok(len) = u32::try_from(len) else {
        out.truncate(start);
        return Err(DatagramError::TooLarge(len));
    };
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

impl Datagram {
    /// Appends one capsule. payload > MAX_PAYLOAD -> TooLarge. Writes
    /// nothing when it fails.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), DatagramError> {
        encode_capsule(&self.addr, &self.payload, out)
    }

    /// Takes one whole capsule off the front of `buf` if one is there
    /// (Ok(None): need more bytes; `buf` is then untouched). A length field
    /// above `MAX_CAPSULE - 4` -> TooLarge, with nothing taken: the stream is
    /// then broken and the caller closes it. Any other error is about a complete
    /// capsule, which has been taken off, so the framing stays intact.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Datagram>, DatagramError> {
        let Ok(len) = bytes_at::<4>(buf, 0) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(len);
        let len = usize::try_from(len).map_err(|_| DatagramError::TooLarge(usize::MAX))?;
        if len > MAX_CAPSULE - 4 {
            return Err(DatagramError::TooLarge(len));
        }
        if buf.len() - 4 < len {
            return Ok(None);
        }
        buf.advance(4);
        let mut capsule = buf.split_to(len);
        let (addr, used) = decode_addr(&capsule)?;
        capsule.advance(used);
        if capsule.len() > MAX_PAYLOAD {
            return Err(DatagramError::TooLarge(capsule.len()));
        }
        Ok(Some(Datagram {
            addr,
            payload: capsule.freeze(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> DatagramAddr {
        DatagramAddr::Ip("192.0.2.7:5353".parse().unwrap())
    }
    fn v6() -> DatagramAddr {
        DatagramAddr::Ip("[2001:db8::7]:443".parse().unwrap())
    }
    fn name() -> DatagramAddr {
        DatagramAddr::Name("game-1.example_net.".into(), 27015)
    }

    fn capsule(addr: DatagramAddr, payload: &'static [u8]) -> (Datagram, BytesMut) {
        let datagram = Datagram {
            addr,
            payload: Bytes::from_static(payload),
        };
        let mut out = BytesMut::new();
        datagram.encode(&mut out).unwrap();
        (datagram, out)
    }

    #[test]
    fn addresses_use_the_socks5_encoding() {
        let mut out = BytesMut::new();
        encode_addr(&v4(), &mut out).unwrap();
        assert_eq!(&out[..], &[1, 192, 0, 2, 7, 0x14, 0xe9]);
        out.clear();
        encode_addr(&DatagramAddr::Name("a.io".into(), 80), &mut out).unwrap();
        assert_eq!(&out[..], b"\x03\x04a.io\x00\x50");
        out.clear();
        encode_addr(&v6(), &mut out).unwrap();
        assert_eq!(out.len(), 19);
        assert_eq!(out[0], 4);
    }

    #[test]
    fn capsules_round_trip_for_every_address_type() {
        for addr in [v4(), v6(), name()] {
            let (datagram, mut buf) = capsule(addr.clone(), b"hello");
            let (_, used) = decode_addr(&buf[4..]).unwrap();
            assert_eq!(buf.len(), 4 + used + 5);
            assert_eq!(&buf[..4], &((used + 5) as u32).to_be_bytes());
            buf.extend_from_slice(b"\x00\x00"); // the start of the next capsule
            assert_eq!(Datagram::decode(&mut buf), Ok(Some(datagram)));
            assert_eq!(&buf[..], b"\x00\x00");
            let mut addr_only = BytesMut::new();
            encode_addr(&addr, &mut addr_only).unwrap();
            assert_eq!(decode_addr(&addr_only), Ok((addr, addr_only.len())));
        }
    }

    #[test]
    fn empty_and_largest_payloads_round_trip() {
        let (datagram, mut buf) = capsule(v4(), b"");
        assert_eq!(Datagram::decode(&mut buf), Ok(Some(datagram)));
        let big = Datagram {
            addr: DatagramAddr::Name("n".repeat(255), 1),
            payload: Bytes::from(vec![7u8; MAX_PAYLOAD]),
        };
        let mut buf = BytesMut::new();
        big.encode(&mut buf).unwrap();
        assert_eq!(buf.len(), MAX_CAPSULE);
        assert_eq!(Datagram::decode(&mut buf), Ok(Some(big)));
        assert!(buf.is_empty());
    }

    #[test]
    fn a_partial_capsule_waits_for_more_bytes_at_every_split_point() {
        for addr in [v4(), v6(), name()] {
            let (datagram, whole) = capsule(addr, b"payload");
            for split in 0..whole.len() {
                let mut buf = BytesMut::from(&whole[..split]);
                assert_eq!(Datagram::decode(&mut buf), Ok(None), "split at {split}");
                assert_eq!(&buf[..], &whole[..split]);
                // The rest arriving completes it.
                buf.extend_from_slice(&whole[split..]);
                assert_eq!(Datagram::decode(&mut buf), Ok(Some(datagram.clone())));
            }
        }
    }

    #[test]
    fn a_truncated_address_is_truncated_at_every_split_point() {
        for addr in [v4(), v6(), name()] {
            let mut whole = BytesMut::new();
            encode_addr(&addr, &mut whole).unwrap();
            for split in 0..whole.len() {
                assert_eq!(
                    decode_addr(&whole[..split]),
                    Err(DatagramError::Truncated),
                    "split at {split}"
                );
            }
        }
        // A capsule whose length is too short for its own address.
        let mut buf = BytesMut::from(&[0, 0, 0, 3, 1, 10, 0][..]);
        assert_eq!(Datagram::decode(&mut buf), Err(DatagramError::Truncated));
        assert!(buf.is_empty(), "the complete capsule was taken off");
        let mut buf = BytesMut::from(&[0, 0, 0, 0][..]);
        assert_eq!(Datagram::decode(&mut buf), Err(DatagramError::Truncated));
    }

    #[test]
    fn unknown_address_types_are_refused() {
        for atyp in [0u8, 2, 5, 255] {
            assert_eq!(
                decode_addr(&[atyp, 1, 2, 3, 4, 5, 6]),
                Err(DatagramError::UnknownAddressType(atyp))
            );
        }
        let mut buf = BytesMut::from(&[0, 0, 0, 7, 2, 1, 2, 3, 4, 0, 80, 9][..]);
        assert_eq!(
            Datagram::decode(&mut buf),
            Err(DatagramError::UnknownAddressType(2))
        );
        assert_eq!(&buf[..], &[9], "framing survives a bad capsule");
    }

    #[test]
    fn oversized_lengths_and_payloads_are_too_large() {
        let len = (MAX_CAPSULE - 3) as u32;
        let mut buf = BytesMut::from(&len.to_be_bytes()[..]);
        assert_eq!(
            Datagram::decode(&mut buf),
            Err(DatagramError::TooLarge(MAX_CAPSULE - 3))
        );
        assert_eq!(buf.len(), 4, "nothing taken: the stream is broken");
        let mut buf = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        assert!(matches!(
            Datagram::decode(&mut buf),
            Err(DatagramError::TooLarge(_))
        ));
        // The largest length with a short address leaves too big a payload.
        let len = MAX_CAPSULE - 4;
        let mut buf = BytesMut::new();
        buf.put_u32(len as u32);
        encode_addr(&v4(), &mut buf).unwrap();
        buf.resize(4 + len, 0);
        assert_eq!(
            Datagram::decode(&mut buf),
            Err(DatagramError::TooLarge(len - 7))
        );
        let too_big = Datagram {
            addr: v4(),
            payload: Bytes::from(vec![0u8; MAX_PAYLOAD + 1]),
        };
        let mut out = BytesMut::from(&b"kept"[..]);
        assert_eq!(
            too_big.encode(&mut out),
            Err(DatagramError::TooLarge(MAX_PAYLOAD + 1))
        );
        assert_eq!(&out[..], b"kept");
    }

    #[test]
    fn bad_names_are_refused_both_ways() {
        let long = "a".repeat(256);
        for bad in [
            "",
            "a b",
            "a/b",
            "a\nb",
            "a\0",
            "user@host",
            "é.example",
            &long,
        ] {
            let mut out = BytesMut::from(&b"kept"[..]);
            assert_eq!(
                encode_addr(&DatagramAddr::Name(bad.into(), 53), &mut out),
                Err(DatagramError::BadName),
                "{bad:?}"
            );
            let datagram = Datagram {
                addr: DatagramAddr::Name(bad.into(), 53),
                payload: Bytes::from_static(b"x"),
            };
            assert_eq!(datagram.encode(&mut out), Err(DatagramError::BadName));
            assert_eq!(&out[..], b"kept", "{bad:?}");
            if bad.len() <= 255 {
                let mut wire = vec![3u8, bad.len() as u8];
                wire.extend_from_slice(bad.as_bytes());
                wire.extend_from_slice(&[0, 53]);
                assert_eq!(decode_addr(&wire), Err(DatagramError::BadName), "{bad:?}");
            }
        }
        // Invalid UTF-8 is no name either.
        assert_eq!(
            decode_addr(&[3, 2, 0xc3, 0x28, 0, 53]),
            Err(DatagramError::BadName)
        );
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
                let _ = decode_addr(&bytes);
                let mut buf = BytesMut::from(&bytes[..]);
                // Keep taking capsules as a reader would, until it must stop.
                while let Ok(Some(_)) = Datagram::decode(&mut buf) {}
            }

            #[test]
            fn what_is_encoded_decodes(
                ip in any::<std::net::IpAddr>(),
                port in any::<u16>(),
                name in "[a-zA-Z0-9._-]{1,255}",
                use_name in any::<bool>(),
                payload in proptest::collection::vec(any::<u8>(), 0..300),
            ) {
                let addr = if use_name {
                    DatagramAddr::Name(name, port)
                } else {
                    DatagramAddr::Ip(SocketAddr::new(ip, port))
                };
                let datagram = Datagram { addr, payload: Bytes::from(payload) };
                let mut buf = BytesMut::new();
                datagram.encode(&mut buf).unwrap();
                prop_assert_eq!(Datagram::decode(&mut buf), Ok(Some(datagram)));
                prop_assert!(buf.is_empty());
            }
        }
    }
}
