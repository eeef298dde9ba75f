//! A strict gate in front of hyper for HTTP/1.1 request framing.
//!
//! Forward proxies get smuggled through framing that two parsers read
//! differently, and hyper answers what it refuses with a bare `400`.
//! [`HeadGuard`] wraps the client connection, holds each request head until it
//! is complete, validates it ([`validate`]) and only then lets hyper see it. A
//! bad head is answered here — `400` or `431`, rendered by the one error type,
//! so with `Proxy-Status` — and the connection is closed; hyper never parses it.
//!
//! Between heads the guard follows the body's framing (Content-Length, or
//! chunked validated by [`chunked`]) to find the next head. Body bytes are
//! read straight into hyper's buffer and only counted, never copied. After a
//! CONNECT head it holds whatever the client sent next until the request is
//! answered ([`TunnelSwitch`]): tunnel bytes pipelined behind the head (a TLS
//! ClientHello in the same write) reach the tunnel, and a refused CONNECT's
//! successor is parsed as the next head.

pub(crate) mod chunked;
pub(crate) mod validate;

use futures_util::task::AtomicWaker;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use chunked::Chunked;
pub(crate) use validate::{validate_head, Framing, HeadError};

/// Limits the guard enforces on each head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadLimits {
    pub max_head_bytes: usize,
    pub max_fields: usize,
}

const UNDECIDED: u8 = 0;
const TUNNEL: u8 = 1;
const REFUSED: u8 = 2;

/// How the CONNECT in flight was answered: set by the CONNECT handler, read by
/// the guard, which holds the bytes after the head until it knows.
#[derive(Debug, Clone, Default)]
pub(crate) struct TunnelSwitch(Arc<SwitchState>);

#[derive(Debug, Default)]
struct SwitchState {
    decision: AtomicU8,
    waker: AtomicWaker,
}

impl TunnelSwitch {
    /// A 2xx is about to go out: from now on the connection carries tunnel bytes.
    pub(crate) fn engage(&self) {
        self.decide(TUNNEL);
    }

    /// The CONNECT was refused: what follows is the next request head.
    pub(crate) fn refuse(&self) {
        self.decide(REFUSED);
    }

    fn decide(&self, decision: u8) {
        self.0.decision.store(decision, Ordering::Release);
        self.0.waker.wake();
    }

    fn reset(&self) {
        self.0.decision.store(UNDECIDED, Ordering::Release);
    }

    fn poll_decision(&self, cx: &mut Context<'_>) -> Poll<u8> {
        let decided = self.0.decision.load(Ordering::Acquire);
        if decided != UNDECIDED {
            return Poll::Ready(decided);
        }
        self.0.waker.register(cx.waker());
        match self.0.decision.load(Ordering::Acquire) {
            UNDECIDED => Poll::Pending,
            decided => Poll::Ready(decided),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Head,
    Body {
        remaining: u64,
    },
    ChunkedBody(Chunked),
    /// A CONNECT head went to hyper; its answer decides what follows.
    AwaitingAnswer,
    /// A tunnel is up: bytes pass untouched.
    Passthrough,
}

pub(crate) struct HeadGuard<IO> {
    io: IO,
    limits: HeadLimits,
    phase: Phase,
    /// Bytes of the head being collected.
    head: Vec<u8>,
    /// Validated bytes not yet handed to the reader.
    ready: Vec<u8>,
    ready_pos: usize,
    /// Bytes read but not yet scanned (they followed a head or a body's end).
    unscanned: Vec<u8>,
    /// An error answer being written before the connection closes.
    rejecting: Option<(Vec<u8>, usize)>,
    switch: TunnelSwitch,
}

impl<IO> HeadGuard<IO> {
    pub(crate) fn new(io: IO, limits: HeadLimits, switch: TunnelSwitch) -> Self {
        Self {
            io,
            limits,
            phase: Phase::Head,
            head: Vec::new(),
            ready: Vec::new(),
            ready_pos: 0,
            unscanned: Vec::new(),
            rejecting: None,
            switch,
        }
    }

    /// Gives back bytes a reader took from this guard, to be read again
    /// first. They were validated and accounted for when they went out, so
    /// they are not scanned a second time.
    pub(crate) fn put_back(&mut self, mut bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        bytes.extend_from_slice(&self.ready[self.ready_pos..]);
        self.ready = bytes;
        self.ready_pos = 0;
    }

    /// Runs `data` through the head/body state machine: validated bytes go to
    /// `ready`, anything past a boundary the phase cannot yet judge (bytes
    /// after a CONNECT head) to `unscanned`.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), HeadError> {
        while !data.is_empty() {
            match self.phase {
                Phase::Passthrough => {
                    self.ready.extend_from_slice(data);
                    return Ok(());
                }
                Phase::AwaitingAnswer => {
                    self.unscanned.extend_from_slice(data);
                    return Ok(());
                }
                Phase::Body { remaining } => {
                    let take = clamp(remaining, data.len());
                    self.ready.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    self.body_consumed(remaining, take);
                }
                Phase::ChunkedBody(mut chunked) => {
                    let used = chunked.feed(data)?;
                    self.ready.extend_from_slice(&data[..used]);
                    data = &data[used..];
                    self.phase = if chunked == Chunked::Done {
                        Phase::Head
                    } else {
                        Phase::ChunkedBody(chunked)
                    };
                }
                Phase::Head => {
                    let Some(rest) = self.collect_head(data)? else {
                        return Ok(());
                    };
                    data = rest;
                }
            }
        }
        Ok(())
    }

    /// Adds `data` to the head being collected. Once the head is complete and
    /// valid it moves to `ready` and the rest of `data` is returned.
    fn collect_head<'d>(&mut self, data: &'d [u8]) -> Result<Option<&'d [u8]>, HeadError> {
        let start = self.head.len();
        self.head.extend_from_slice(data);
        let search_from = start.saturating_sub(3);
        let end = self.head[search_from..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| search_from + p + 4);
        // Bare LF is caught as it arrives, not only once a head ends.
        let scanned_to = end.unwrap_or(self.head.len());
        if (start.max(1)..scanned_to).any(|i| self.head[i] == b'\n' && self.head[i - 1] != b'\r')
            || (start == 0 && self.head.first() == Some(&b'\n'))
        {
            return Err(HeadError::Malformed("bare LF"));
        }
        let Some(end) = end else {
            if self.head.len() > self.limits.max_head_bytes {
                return Err(HeadError::TooLarge);
            }
            return Ok(None);
        };
        if end > self.limits.max_head_bytes {
            return Err(HeadError::TooLarge);
        }
        let framing = validate_head(&self.head[..end], self.limits.max_fields)?;
        let consumed_from_data = end - start;
        self.head.truncate(end);
        self.ready.append(&mut self.head);
        self.phase = match framing {
            Framing::NoBody => Phase::Head,
            Framing::ContentLength(n) => Phase::Body { remaining: n },
            Framing::Chunked => Phase::ChunkedBody(Chunked::START),
            Framing::Connect | Framing::Upgrade => {
                self.switch.reset();
                Phase::AwaitingAnswer
            }
        };
        Ok(Some(&data[consumed_from_data..]))
    }

    fn body_consumed(&mut self, remaining: u64, taken: usize) {
        let left = remaining - taken as u64;
        self.phase = if left == 0 {
            Phase::Head
        } else {
            Phase::Body { remaining: left }
        };
    }

    /// Body bytes that hyper read straight into `buf[start..]`: counted, or
    /// for chunked validated; whatever lies past the body's end is taken back
    /// out of `buf` and kept for the next head.
    fn account_body_read(&mut self, buf: &mut ReadBuf<'_>, start: usize) -> Result<(), HeadError> {
        let filled = buf.filled().len();
        let read = &buf.filled()[start..];
        let used = match self.phase {
            Phase::Body { remaining } => {
                let take = clamp(remaining, read.len());
                self.body_consumed(remaining, take);
                take
            }
            Phase::ChunkedBody(mut chunked) => {
                let used = chunked.feed(read)?;
                self.phase = if chunked == Chunked::Done {
                    Phase::Head
                } else {
                    Phase::ChunkedBody(chunked)
                };
                used
            }
            _ => read.len(),
        };
        if start + used < filled {
            self.unscanned
                .extend_from_slice(&buf.filled()[start + used..filled]);
            buf.set_filled(start + used);
        }
        Ok(())
    }
}

fn clamp(remaining: u64, available: usize) -> usize {
    usize::try_from(remaining)
        .unwrap_or(usize::MAX)
        .min(available)
}

impl<IO: AsyncRead + AsyncWrite + Unpin> HeadGuard<IO> {
    fn reject(&mut self, error: &HeadError) {
        tracing::debug!(error = ?error, "request head rejected");
        self.rejecting = Some((error.to_proxy_error().to_wire(), 0));
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for HeadGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some((response, written)) = &mut this.rejecting {
                while *written < response.len() {
                    let n = ready!(Pin::new(&mut this.io).poll_write(cx, &response[*written..]))?;
                    if n == 0 {
                        break;
                    }
                    *written += n;
                }
                let _ = ready!(Pin::new(&mut this.io).poll_shutdown(cx));
                return Poll::Ready(Ok(()));
            }
            if this.ready_pos < this.ready.len() {
                let n = (this.ready.len() - this.ready_pos).min(buf.remaining());
                buf.put_slice(&this.ready[this.ready_pos..this.ready_pos + n]);
                this.ready_pos += n;
                if this.ready_pos == this.ready.len() {
                    this.ready.clear();
                    this.ready_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            match this.phase {
                Phase::AwaitingAnswer => match ready!(this.switch.poll_decision(cx)) {
                    TUNNEL => {
                        this.phase = Phase::Passthrough;
                        // A tunnel may idle for hours: keep no head buffers for it.
                        this.head = Vec::new();
                        this.ready = Vec::new();
                    }
                    _ => this.phase = Phase::Head,
                },
                Phase::Passthrough if this.unscanned.is_empty() => {
                    return Pin::new(&mut this.io).poll_read(cx, buf);
                }
                Phase::Body { .. } | Phase::ChunkedBody(_) if this.unscanned.is_empty() => {
                    // Straight into the reader's buffer; only counted here.
                    let start = buf.filled().len();
                    let in_body = ready!(Pin::new(&mut this.io).poll_read(cx, buf));
                    in_body?;
                    if buf.filled().len() == start {
                        return Poll::Ready(Ok(())); // EOF
                    }
                    if this.account_body_read(buf, start).is_err() {
                        // hyper is mid-body; it cannot take a new answer now.
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "invalid request body framing",
                        )));
                    }
                    if buf.filled().len() > start {
                        return Poll::Ready(Ok(()));
                    }
                }
                _ => {
                    let data = if this.unscanned.is_empty() {
                        let mut chunk = [0u8; 8192];
                        let mut read_buf = ReadBuf::new(&mut chunk);
                        ready!(Pin::new(&mut this.io).poll_read(cx, &mut read_buf))?;
                        if read_buf.filled().is_empty() {
                            return Poll::Ready(Ok(())); // EOF
                        }
                        read_buf.filled().to_vec()
                    } else {
                        std::mem::take(&mut this.unscanned)
                    };
                    let in_body = matches!(this.phase, Phase::Body { .. } | Phase::ChunkedBody(_));
                    if let Err(e) = this.scan(&data) {
                        if in_body {
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "invalid request body framing",
                            )));
                        }
                        this.reject(&e);
                    }
                }
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for HeadGuard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const MAX: usize = 100;

    /// Answers every CONNECT the way `decision` says, a little after the
    /// guard saw it, as a real CONNECT handler would.
    pub(super) fn decider(
        switch: TunnelSwitch,
        decision: Option<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                match decision {
                    Some(true) => switch.engage(),
                    Some(false) => switch.refuse(),
                    None => {}
                }
            }
        })
    }

    async fn through_guard(input: &[u8], decision: Option<bool>) -> (Vec<u8>, Vec<u8>) {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client.write_all(input).await.unwrap();
        client.shutdown().await.unwrap();
        let switch = TunnelSwitch::default();
        let mut guard = HeadGuard::new(
            server,
            HeadLimits {
                max_head_bytes: 1024,
                max_fields: MAX,
            },
            switch.clone(),
        );
        let decide = decider(switch, decision);
        let mut passed = Vec::new();
        guard.read_to_end(&mut passed).await.unwrap();
        decide.abort();
        drop(guard);
        let mut answered = Vec::new();
        client.read_to_end(&mut answered).await.unwrap();
        (passed, answered)
    }

    #[tokio::test]
    async fn bytes_put_back_are_read_again_first_and_not_rescanned() {
        let input = b"POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET http://b/ HTTP/1.1\r\n\r\n";
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client.write_all(input).await.unwrap();
        client.shutdown().await.unwrap();
        let mut guard = HeadGuard::new(
            server,
            HeadLimits {
                max_head_bytes: 1024,
                max_fields: MAX,
            },
            TunnelSwitch::default(),
        );
        let mut first = vec![0u8; 10];
        guard.read_exact(&mut first).await.unwrap();
        guard.put_back(first);
        let mut passed = Vec::new();
        guard.read_to_end(&mut passed).await.unwrap();
        // Everything once, in order: the body's framing was not disturbed.
        assert_eq!(passed, input);
    }

    #[tokio::test]
    async fn guard_passes_pipelined_requests_and_bodies() {
        let input = b"POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nGET http://b/ HTTP/1.1\r\n\r\n";
        let (passed, answered) = through_guard(input, None).await;
        assert_eq!(passed, input.to_vec());
        assert!(answered.is_empty());
    }

    #[tokio::test]
    async fn guard_answers_bad_heads_itself() {
        let (passed, answered) = through_guard(b"GET http://a/ HTTP/1.1\nHost: a\n\n", None).await;
        assert!(passed.is_empty());
        let answered = String::from_utf8(answered).unwrap();
        assert!(answered.starts_with("HTTP/1.1 400 "), "{answered}");
        assert!(
            answered.contains("proxy-status: proxynet; error=http_request_error"),
            "{answered}"
        );

        let big = format!("GET http://a/ HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(2000));
        let (passed, answered) = through_guard(big.as_bytes(), None).await;
        assert!(passed.is_empty());
        assert!(String::from_utf8(answered)
            .unwrap()
            .starts_with("HTTP/1.1 431 "));
    }

    #[tokio::test]
    async fn bytes_pipelined_after_connect_reach_the_tunnel() {
        let input = b"CONNECT a:1 HTTP/1.1\r\n\r\n\x16\x03\x01binary\n\n";
        let (passed, answered) = through_guard(input, Some(true)).await;
        assert_eq!(passed, input.to_vec());
        assert!(answered.is_empty());
    }

    #[tokio::test]
    async fn after_a_refused_connect_the_next_head_is_parsed() {
        let input = b"CONNECT a:1 HTTP/1.1\r\n\r\nGET http://a/ HTTP/1.1\r\n\r\n";
        let (passed, answered) = through_guard(input, Some(false)).await;
        assert_eq!(passed, input.to_vec());
        assert!(answered.is_empty());
        let input = b"CONNECT a:1 HTTP/1.1\r\n\r\n\x16\x03\x01binary\n\n";
        let (passed, answered) = through_guard(input, Some(false)).await;
        assert_eq!(passed, b"CONNECT a:1 HTTP/1.1\r\n\r\n".to_vec());
        assert!(String::from_utf8(answered)
            .unwrap()
            .starts_with("HTTP/1.1 400 "));
    }

    #[tokio::test]
    async fn large_bodies_pass_in_reads_of_any_size() {
        let body = vec![b'z'; 300_000];
        let mut input = format!(
            "POST http://a/ HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        input.extend_from_slice(&body);
        input.extend_from_slice(b"GET http://a/ HTTP/1.1\r\n\r\n");
        let (passed, answered) = through_guard(&input, None).await;
        assert_eq!(passed.len(), input.len());
        assert_eq!(passed, input);
        assert!(answered.is_empty());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn http_ish() -> impl Strategy<Value = Vec<u8>> {
        // Mostly plausible heads, mutated: more interesting than uniform noise.
        let pieces = prop::sample::select(vec![
            &b"GET http://a/ HTTP/1.1"[..],
            b"CONNECT a:1 HTTP/1.1",
            b"POST http://a/ HTTP/1.1",
            b"\r\n",
            b"\n",
            b"\r",
            b"Host: a",
            b"Content-Length: 3",
            b"Content-Length: 99999999999999999999",
            b"Transfer-Encoding: chunked",
            b" folded",
            b": x",
            b"abc",
            b"0\r\n\r\n",
            b"5\r\nhello\r\n",
            b"\x00",
            b"\xff",
        ]);
        prop::collection::vec(pieces, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        /// Whatever arrives, the guard passes on an unmodified prefix of it or
        /// answers with an error itself; it never invents or reorders bytes.
        #[test]
        fn guard_output_is_a_prefix_of_its_input(bytes in http_ish(), split in 0usize..64, tunnel in any::<bool>()) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (mut client, server) = tokio::io::duplex(1 << 16);
                let cut = split.min(bytes.len());
                client.write_all(&bytes[..cut]).await.unwrap();
                client.write_all(&bytes[cut..]).await.unwrap();
                client.shutdown().await.unwrap();
                let switch = TunnelSwitch::default();
                let decide = super::tests::decider(switch.clone(), Some(tunnel));
                let mut guard = HeadGuard::new(server, HeadLimits { max_head_bytes: 4096, max_fields: 100 }, switch);
                let mut passed = Vec::new();
                let _ = guard.read_to_end(&mut passed).await;
                decide.abort();
                prop_assert!(bytes.starts_with(&passed));
                Ok(())
            })?;
        }
    }
}
