//! What a stream has received and its reader not yet taken.
//!
//! Long payloads are queued as the buffers they arrived in (the reader takes
//! them whole, without a copy). Short ones are appended to one growing tail
//! buffer instead of queued one by one: a peer (or a target behind it)
//! sending one-byte frames to a stream nobody reads would otherwise make the
//! stream hold an allocation and a queue entry per byte, tens of times its
//! credit. Either way the bytes held stay close to the bytes received.

use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use tokio::io::ReadBuf;

/// Payloads shorter than this are appended to the tail.
pub(crate) const SHORT: usize = 32 * 1024;

#[derive(Default)]
pub(crate) struct RecvQueue {
    /// Whole buffers, in order, all received before `tail`.
    chunks: VecDeque<Bytes>,
    /// Short payloads received after every chunk, coalesced.
    tail: BytesMut,
    /// Bytes held (chunks and tail).
    len: usize,
}

impl RecvQueue {
    /// Bytes received and not yet taken.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.tail.is_empty()
    }

    pub(crate) fn push(&mut self, payload: Bytes) {
        self.len += payload.len();
        if payload.len() < SHORT {
            self.tail.extend_from_slice(&payload);
            if self.tail.len() >= SHORT {
                self.seal_tail();
            }
        } else {
            self.seal_tail();
            self.chunks.push_back(payload);
        }
    }

    /// The tail becomes a chunk of its own (keeping the order).
    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            self.chunks
                .push_back(std::mem::take(&mut self.tail).freeze());
        }
    }

    /// The next received buffer, whole.
    pub(crate) fn pop_chunk(&mut self) -> Option<Bytes> {
        let chunk = match self.chunks.pop_front() {
            Some(chunk) => chunk,
            None if !self.tail.is_empty() => std::mem::take(&mut self.tail).freeze(),
            None => return None,
        };
        self.len -= chunk.len();
        Some(chunk)
    }

    /// Copies as much as fits into `buf`; how much.
    pub(crate) fn read_into(&mut self, buf: &mut ReadBuf<'_>) -> usize {
        let mut copied = 0;
        while buf.remaining() > 0 {
            if let Some(front) = self.chunks.front_mut() {
                let n = front.len().min(buf.remaining());
                buf.put_slice(&front[..n]);
                front.advance(n);
                if front.is_empty() {
                    self.chunks.pop_front();
                }
                copied += n;
            } else if !self.tail.is_empty() {
                let n = self.tail.len().min(buf.remaining());
                buf.put_slice(&self.tail[..n]);
                self.tail.advance(n);
                copied += n;
            } else {
                break;
            }
        }
        self.len -= copied;
        copied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_kept_and_short_payloads_coalesce() {
        let mut q = RecvQueue::default();
        let mut sent = Vec::new();
        for (i, len) in [1usize, 1, 40_000, 3, 5, 100_000, 7]
            .into_iter()
            .enumerate()
        {
            let payload = vec![i as u8; len];
            sent.extend_from_slice(&payload);
            q.push(Bytes::from(payload));
        }
        let mut got = Vec::new();
        let mut chunks = 0;
        // Mix whole-chunk takes and copies.
        let mut scratch = [0u8; 3];
        let mut rb = ReadBuf::new(&mut scratch);
        q.read_into(&mut rb);
        got.extend_from_slice(rb.filled());
        while let Some(chunk) = q.pop_chunk() {
            chunks += 1;
            got.extend_from_slice(&chunk);
        }
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
        assert_eq!(got, sent);
        // 1+1 (sealed by the 40,000) went to the 3-byte read with the first
        // byte of the 40,000; then the rest of it, 3+5 (sealed), 100,000, 7.
        assert_eq!(chunks, 4);
    }

    #[test]
    fn a_flood_of_one_byte_payloads_is_held_as_one_buffer() {
        let mut q = RecvQueue::default();
        for _ in 0..100_000 {
            q.push(Bytes::from_static(b"x"));
        }
        // 100,000 bytes in four sealed 32 KiB chunks and a tail, not
        // 100,000 queue entries.
        assert!(q.chunks.len() <= 4, "{}", q.chunks.len());
        let held: usize = q.chunks.iter().map(|c| c.len()).sum::<usize>() + q.tail.len();
        assert_eq!(held, 100_000);
        assert_eq!(q.len(), 100_000);
    }
}
