//! The server name a TLS client asks for (RFC 6066 §3), read from the first
//! record it sends, without terminating TLS: a `CONNECT` to an IP literal
//! carries its real destination there, and the per-domain rules judge that
//! name ([`super::Pipeline::judge_first_bytes`]).
//!
//! Hand-written, bounded and allocation-free until the name is found: the
//! input is whatever a client sent, so every length is checked against what
//! is there, nothing is trusted to be well formed, and anything unexpected
//! is "no name" rather than an error. A ClientHello split over more than
//! one record is read as far as the first record goes (ClientHellos fit in
//! one record in practice; a name beyond it is not found, and the tunnel is
//! counted by its address instead).

/// The longest first record read: the header and the largest payload a TLS
/// record may carry (2^14 bytes, RFC 8446 §5.1).
pub const MAX_RECORD: usize = 5 + 16 * 1024;

/// TLS record content type `handshake`.
const HANDSHAKE: u8 = 22;
/// Handshake message type `client_hello`.
const CLIENT_HELLO: u8 = 1;
/// Extension type `server_name`.
const SERVER_NAME: u16 = 0;
/// `NameType` `host_name`.
const HOST_NAME: u8 = 0;

/// How much of the first record the bytes read so far hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstRecord {
    /// Could be a handshake record; more bytes are needed.
    Partial,
    /// A whole handshake record of this many bytes (header included).
    Complete(usize),
    /// Not a TLS handshake record: no name will be found in these bytes.
    NotTls,
}

/// Where the first record stands, given the client's first bytes.
pub fn first_record(bytes: &[u8]) -> FirstRecord {
    match bytes {
        [] => FirstRecord::Partial,
        [kind, ..] if *kind != HANDSHAKE => FirstRecord::NotTls,
        // The record version's major byte is 3 for every TLS version.
        [_, major, ..] if *major != 3 => FirstRecord::NotTls,
        [_, _, _, hi, lo, ..] => {
            let len = usize::from(u16::from_be_bytes([*hi, *lo]));
            if len == 0 || len > MAX_RECORD - 5 {
                FirstRecord::NotTls
            } else if bytes.len() >= 5 + len {
                FirstRecord::Complete(5 + len)
            } else {
                FirstRecord::Partial
            }
        }
        _ => FirstRecord::Partial,
    }
}

/// The `host_name` of the `server_name` extension of the ClientHello at the
/// start of `bytes` (a client's first bytes, record header included), as
/// sent (ASCII; normalising it is the policy's business). `None` when the
/// bytes are not a ClientHello, it carries no server name, or anything in
/// it does not add up.
pub fn server_name(bytes: &[u8]) -> Option<String> {
    let FirstRecord::Complete(len) = first_record(bytes) else {
        return None;
    };
    let mut record = Reader(&bytes[5..len]);
    if record.u8()? != CLIENT_HELLO {
        return None;
    }
    let declared = record.u24()?;
    // A ClientHello longer than its record continues in the next one: read
    // what this one holds.
    let mut hello = Reader(record.take(declared.min(record.0.len()))?);
    hello.take(2 + 32)?; // legacy_version, random
    let session_id = usize::from(hello.u8()?);
    hello.take(session_id)?;
    let cipher_suites = usize::from(hello.u16()?);
    hello.take(cipher_suites)?;
    let compression = usize::from(hello.u8()?);
    hello.take(compression)?;
    let extensions_len = usize::from(hello.u16()?);
    // Truncated by the record's end: whatever extensions are whole.
    let mut extensions = Reader(hello.take(extensions_len.min(hello.0.len()))?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let len = usize::from(extensions.u16()?);
        let data = extensions.take(len)?;
        if kind == SERVER_NAME {
            return host_name(data);
        }
    }
    None
}

/// The first `host_name` of a `ServerNameList`.
fn host_name(data: &[u8]) -> Option<String> {
    let mut list = Reader(data);
    let list_len = usize::from(list.u16()?);
    let mut names = Reader(list.take(list_len)?);
    while !names.0.is_empty() {
        let kind = names.u8()?;
        let len = usize::from(names.u16()?);
        let name = names.take(len)?;
        if kind == HOST_NAME {
            // A host name is ASCII (RFC 6066 §3); anything else is no name.
            if name.is_empty() || name.len() > 255 || !name.is_ascii() {
                return None;
            }
            return std::str::from_utf8(name).ok().map(str::to_owned);
        }
    }
    None
}

/// Reads big-endian fields off the front of a slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A real client's first flight: rustls' ClientHello for `name`.
    fn rustls_hello(name: &'static str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut bytes = Vec::new();
        client.write_tls(&mut bytes).unwrap();
        bytes
    }

    /// A ClientHello record built by hand with `extensions` (each its type
    /// and data).
    fn hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend_from_slice(&kind.to_be_bytes());
            ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
            ext.extend_from_slice(data);
        }
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut handshake = vec![CLIENT_HELLO];
        handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        handshake.extend_from_slice(&body);
        let mut record = vec![HANDSHAKE, 3, 1];
        record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
        record.extend_from_slice(&handshake);
        record
    }

    fn sni(name: &[u8]) -> (u16, Vec<u8>) {
        let mut entry = vec![HOST_NAME];
        entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
        entry.extend_from_slice(name);
        let mut list = (entry.len() as u16).to_be_bytes().to_vec();
        list.extend_from_slice(&entry);
        (SERVER_NAME, list)
    }

    #[test]
    fn the_name_of_a_real_client_hello_is_found() {
        let bytes = rustls_hello("www.example.test");
        assert!(matches!(first_record(&bytes), FirstRecord::Complete(_)));
        assert_eq!(server_name(&bytes).as_deref(), Some("www.example.test"));
        // Every shorter prefix is a partial record with no name yet.
        for cut in [0, 1, 4, 5, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(first_record(&bytes[..cut]), FirstRecord::Partial, "{cut}");
            assert_eq!(server_name(&bytes[..cut]), None);
        }
    }

    #[test]
    fn the_name_is_found_among_other_extensions_in_any_order() {
        let name = b"Api.Example.TEST".to_vec();
        let other = (10u16, vec![0, 2, 0, 29]);
        for extensions in [
            vec![sni(&name)],
            vec![other.clone(), sni(&name)],
            vec![sni(&name), other.clone()],
        ] {
            let bytes = hello(&extensions);
            assert_eq!(
                server_name(&bytes).as_deref(),
                Some("Api.Example.TEST"),
                "as sent: normalising is the policy's"
            );
        }
        assert_eq!(server_name(&hello(&[other])), None, "no server_name");
        assert_eq!(server_name(&hello(&[])), None);
    }

    #[test]
    fn what_is_not_a_client_hello_has_no_name() {
        let cases: [&[u8]; 5] = [
            b"GET / HTTP/1.1\r\n\r\n",
            b"SSH-2.0-OpenSSH_9.6\r\n",
            &[HANDSHAKE, 2, 0, 0, 5, 1, 0, 0, 1, 0],
            &[HANDSHAKE, 3, 1, 0, 0],
            &[HANDSHAKE, 3, 1, 0x40, 0x01],
        ];
        for bytes in cases {
            assert_eq!(first_record(bytes), FirstRecord::NotTls, "{bytes:?}");
            assert_eq!(server_name(bytes), None);
        }
        // A handshake record holding another message.
        let mut server_hello = hello(&[sni(b"x.test")]);
        server_hello[5] = 2;
        assert_eq!(server_name(&server_hello), None);
        // Names that are not host names.
        assert_eq!(server_name(&hello(&[sni(b"")])), None);
        assert_eq!(server_name(&hello(&[sni("é.test".as_bytes())])), None);
    }

    #[test]
    fn lengths_that_do_not_add_up_are_no_name_never_a_panic() {
        let bytes = hello(&[sni(b"example.test")]);
        // Every byte after the record header set to every troublesome value.
        for i in 5..bytes.len() {
            for value in [0u8, 1, 0x7f, 0xff] {
                let mut broken = bytes.clone();
                broken[i] = value;
                let _ = server_name(&broken);
            }
        }
        // A ClientHello that says it is longer than its record: the
        // record's part is read.
        let mut long = bytes.clone();
        long[7] = 0x10;
        assert_eq!(server_name(&long).as_deref(), Some("example.test"));
    }
}
