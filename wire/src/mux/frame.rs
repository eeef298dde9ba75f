//! The mux wire format: a 14-byte header, then `len` bytes of payload.
//!
//! ```text
//! stream: u64 BE | kind: u8 | flags: u8 | len: u32 BE | payload
//! ```
//!
//! Stream 0 is the connection itself (PING, PONG, GOAWAY).

use bytes::{BufMut, Bytes};

pub const HEADER_LEN: usize = 14;

/// Largest DATA payload a sender may put in one frame (and a receiver accepts).
pub const MAX_DATA_PAYLOAD: usize = 256 * 1024;

/// Largest payload of any other frame: OPEN and REPLY carry a small JSON
/// request and an outcome name.
pub const MAX_CONTROL_PAYLOAD: usize = 4096;

/// What each stream may have in flight in each direction before the receiver
/// returns credit. Fixed by the wire version: both ends know it without
/// negotiating, and it bounds what one stalled stream can make its receiver
/// hold.
pub const STREAM_WINDOW: u32 = 512 * 1024;

/// `DATA` flag: the sender's last frame on this stream (its half-close).
pub const FLAG_FIN: u8 = 0x1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Stream bytes; consumes the receiver's credit.
    Data = 0,
    /// Opens a stream; the payload is the application's request.
    Open = 1,
    /// The acceptor's answer to an OPEN; the payload is the application's outcome.
    Reply = 2,
    /// Returns credit: payload is a u32 BE byte count.
    Credit = 3,
    /// Abandons a stream in both directions.
    Reset = 4,
    /// Liveness check (stream 0); payload is echoed in the PONG.
    Ping = 5,
    Pong = 6,
    /// The sender opens no new streams and accepts none; open ones finish.
    GoAway = 7,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Kind::Data,
            1 => Kind::Open,
            2 => Kind::Reply,
            3 => Kind::Credit,
            4 => Kind::Reset,
            5 => Kind::Ping,
            6 => Kind::Pong,
            7 => Kind::GoAway,
            _ => return None,
        })
    }

    fn max_payload(self) -> usize {
        match self {
            Kind::Data => MAX_DATA_PAYLOAD,
            Kind::Open | Kind::Reply => MAX_CONTROL_PAYLOAD,
            Kind::Credit => 4,
            Kind::Ping | Kind::Pong => 8,
            Kind::Reset | Kind::GoAway => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub stream: u64,
    pub kind: Kind,
    pub flags: u8,
    pub len: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("{kind:?} frame of {len} bytes exceeds its limit")]
    TooLarge { kind: Kind, len: u32 },
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        let mut cursor = &mut out[..];
        cursor.put_u64(self.stream);
        cursor.put_u8(self.kind as u8);
        cursor.put_u8(self.flags);
        cursor.put_u32(self.len);
        out
    }

    /// Parses a header and checks its length against the kind's limit, so a
    /// peer can never make us buffer more than one maximal frame.
    pub fn decode(raw: &[u8; HEADER_LEN]) -> Result<Self, FrameError> {
        let mut stream = [0u8; 8];
        stream.copy_from_slice(&raw[..8]);
        let stream = u64::from_be_bytes(stream);
        let kind = Kind::from_u8(raw[8]).ok_or(FrameError::UnknownKind(raw[8]))?;
        let flags = raw[9];
        let len = u32::from_be_bytes([raw[10], raw[11], raw[12], raw[13]]);
        if len as usize > kind.max_payload() {
            return Err(FrameError::TooLarge { kind, len });
        }
        Ok(Self {
            stream,
            kind,
            flags,
            len,
        })
    }
}

/// A frame queued for sending.
#[derive(Debug)]
pub struct Frame {
    pub header: [u8; HEADER_LEN],
    pub payload: Bytes,
}

impl Frame {
    pub fn new(stream: u64, kind: Kind, flags: u8, payload: Bytes) -> Self {
        let header = Header {
            stream,
            kind,
            flags,
            len: payload.len() as u32,
        }
        .encode();
        Self { header, payload }
    }

    pub fn wire_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Whether this frame is of `kind` (read back from the encoded header).
    pub fn is(&self, kind: Kind) -> bool {
        self.header[8] == kind as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let h = Header {
            stream: 0xdead_beef_0000_0001,
            kind: Kind::Data,
            flags: FLAG_FIN,
            len: 1234,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn oversized_and_unknown_frames_are_refused() {
        let mut raw = Header {
            stream: 1,
            kind: Kind::Data,
            flags: 0,
            len: MAX_DATA_PAYLOAD as u32 + 1,
        }
        .encode();
        assert!(matches!(
            Header::decode(&raw),
            Err(FrameError::TooLarge { .. })
        ));
        raw[8] = 99;
        assert_eq!(Header::decode(&raw), Err(FrameError::UnknownKind(99)));
        let credit_too_long = Header {
            stream: 1,
            kind: Kind::Credit,
            flags: 0,
            len: 5,
        };
        assert!(Header::decode(&credit_too_long.encode()).is_err());
    }
}
