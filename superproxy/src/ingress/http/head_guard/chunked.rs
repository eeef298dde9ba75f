//! Chunked transfer coding (RFC 9112 §7.1), validated byte by byte so the
//! guard knows exactly where a chunked body ends and the next head begins.

use super::validate::HeadError;

/// Validates chunked framing byte by byte and finds where the body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunked {
    Size {
        digits: u8,
        value: u64,
        in_ext: bool,
    },
    SizeLf {
        value: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf {
        empty: bool,
    },
    Done,
}

impl Chunked {
    pub const START: Chunked = Chunked::Size {
        digits: 0,
        value: 0,
        in_ext: false,
    };

    /// Consumes bytes from `data`; returns how many were consumed (fewer than
    /// `data.len()` only when the body ended).
    pub fn feed(&mut self, data: &[u8]) -> Result<usize, HeadError> {
        let bad = HeadError::Malformed("invalid chunked framing");
        let mut i = 0;
        while i < data.len() {
            if let Chunked::Data { remaining } = *self {
                let take = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len() - i);
                i += take;
                let left = remaining - take as u64;
                *self = if left == 0 {
                    Chunked::DataCr
                } else {
                    Chunked::Data { remaining: left }
                };
                continue;
            }
            let b = data[i];
            i += 1;
            *self = match *self {
                Chunked::Size {
                    digits,
                    value,
                    in_ext,
                } => match b {
                    b'\r' if digits > 0 => Chunked::SizeLf { value },
                    _ if in_ext => {
                        if b == b'\n' || (b < 0x20 && b != b'\t') {
                            return Err(bad);
                        }
                        Chunked::Size {
                            digits,
                            value,
                            in_ext,
                        }
                    }
                    b';' if digits > 0 => Chunked::Size {
                        digits,
                        value,
                        in_ext: true,
                    },
                    _ => {
                        let d = (b as char).to_digit(16).ok_or(bad.clone())?;
                        if digits >= 15 {
                            return Err(bad);
                        }
                        Chunked::Size {
                            digits: digits + 1,
                            value: value * 16 + u64::from(d),
                            in_ext,
                        }
                    }
                },
                Chunked::SizeLf { value } => match b {
                    b'\n' if value == 0 => Chunked::TrailerStart,
                    b'\n' => Chunked::Data { remaining: value },
                    _ => return Err(bad),
                },
                Chunked::DataCr => match b {
                    b'\r' => Chunked::DataLf,
                    _ => return Err(bad),
                },
                Chunked::DataLf => match b {
                    b'\n' => Chunked::START,
                    _ => return Err(bad),
                },
                Chunked::TrailerStart => match b {
                    b'\r' => Chunked::TrailerLf { empty: true },
                    b'\n' | b' ' | b'\t' => return Err(bad),
                    _ => Chunked::TrailerLine,
                },
                Chunked::TrailerLine => match b {
                    b'\r' => Chunked::TrailerLf { empty: false },
                    b'\n' => return Err(bad),
                    _ => Chunked::TrailerLine,
                },
                Chunked::TrailerLf { empty } => match b {
                    b'\n' if empty => Chunked::Done,
                    b'\n' => Chunked::TrailerStart,
                    _ => return Err(bad),
                },
                Chunked::Data { .. } | Chunked::Done => return Err(bad),
            };
            if *self == Chunked::Done {
                return Ok(i);
            }
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_end_and_rejects_bare_lf() {
        let mut c = Chunked::START;
        let body = b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let used = c.feed(body).unwrap();
        assert_eq!(&body[used..], b"NEXT");
        assert_eq!(c, Chunked::Done);
        let mut c = Chunked::START;
        assert!(c.feed(b"5\nhello").is_err());
        let mut c = Chunked::START;
        assert!(c.feed(b"zz\r\n").is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunked_tracker_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut c = Chunked::START;
            let _ = c.feed(&bytes);
        }
    }
}
