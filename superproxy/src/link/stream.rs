//! A tunnel stream to an exit, whichever link version carries it.

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use proxynet_common::splice::ChunkIo;
use proxynet_wire::mux::MuxStream;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub(crate) enum ExitStream {
    /// v1: an upgraded HTTP/2 CONNECT stream.
    Http2(TokioIo<Upgraded>),
    /// v2: a mux stream.
    Mux(MuxStream),
}

impl ChunkIo for ExitStream {
    fn chunked(&self) -> bool {
        matches!(self, ExitStream::Mux(_))
    }

    fn poll_read_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Bytes>>> {
        match self.get_mut() {
            ExitStream::Http2(_) => Poll::Ready(Err(io::ErrorKind::Unsupported.into())),
            ExitStream::Mux(io) => Pin::new(io).poll_read_chunk(cx),
        }
    }

    fn poll_write_chunk(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ExitStream::Http2(_) => Poll::Ready(Err(io::ErrorKind::Unsupported.into())),
            ExitStream::Mux(io) => Pin::new(io).poll_write_chunk(cx, chunk),
        }
    }
}

impl AsyncRead for ExitStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ExitStream::Http2(io) => Pin::new(io).poll_read(cx, buf),
            ExitStream::Mux(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ExitStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ExitStream::Http2(io) => Pin::new(io).poll_write(cx, buf),
            ExitStream::Mux(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ExitStream::Http2(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            ExitStream::Mux(io) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ExitStream::Http2(io) => io.is_write_vectored(),
            ExitStream::Mux(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ExitStream::Http2(io) => Pin::new(io).poll_flush(cx),
            ExitStream::Mux(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ExitStream::Http2(io) => Pin::new(io).poll_shutdown(cx),
            ExitStream::Mux(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}
