//! Large reads under TLS.
//!
//! rustls asks its transport for 4 KiB at a time, so a link carrying bulk
//! data would make one `read` syscall per 4 KiB. [`ReadAhead`] reads up to
//! 256 KiB per syscall into a pooled buffer and serves rustls from memory.
//! The buffer is held only while it has unread bytes: an idle link (and a
//! superproxy may hold one per exit, 100,000 of them) costs nothing.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use proxynet_common::buffers::{self, Class};

pub struct ReadAhead<T> {
    inner: T,
    buf: Option<Box<[u8]>>,
    pos: usize,
    cap: usize,
}

impl<T> ReadAhead<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            buf: None,
            pos: 0,
            cap: 0,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    fn release(&mut self) {
        if let Some(buf) = self.buf.take() {
            buffers::give_back(Class::ReadAhead, buf);
        }
        self.pos = 0;
        self.cap = 0;
    }
}

impl<T> Drop for ReadAhead<T> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos == this.cap {
            if out.remaining() >= Class::ReadAhead.size() {
                // The caller's buffer is as large as ours: read straight into it.
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let buf = this
                .buf
                .get_or_insert_with(|| buffers::take(Class::ReadAhead));
            let mut read = ReadBuf::new(buf);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => {
                    this.release();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    this.release();
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 {
                        this.release();
                        return Poll::Ready(Ok(()));
                    }
                    this.pos = 0;
                    this.cap = n;
                }
            }
        }
        if let Some(buf) = this.buf.as_ref() {
            let n = (this.cap - this.pos).min(out.remaining());
            out.put_slice(&buf[this.pos..this.pos + n]);
            this.pos += n;
        }
        if this.pos == this.cap {
            this.release();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn small_reads_see_every_byte_in_order() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let payload: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        let expected = payload.clone();
        tokio::spawn(async move {
            b.write_all(&payload).await.unwrap();
            b.shutdown().await.unwrap();
        });
        let mut reader = ReadAhead::new(a);
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = reader.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, expected);
        assert!(reader.buf.is_none(), "buffer kept after the stream ended");
    }
}
