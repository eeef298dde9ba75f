//! Moves bytes both ways between the client and the exit's tunnel stream.

use tokio::io::{AsyncRead, AsyncWrite};

/// Per-direction copy buffer. Small enough to keep idle tunnels cheap, large
/// enough that bulk transfers are not syscall-bound.
pub const COPY_BUFFER: usize = 16 * 1024;

/// Byte counts of one finished tunnel.
#[derive(Debug, Default, Clone, Copy)]
pub struct Transferred {
    /// Client → target.
    pub up: u64,
    /// Target → client.
    pub down: u64,
}

/// Copies until both directions have finished (each half-close is passed on).
pub async fn splice<C, E>(client: &mut C, exit: &mut E) -> std::io::Result<Transferred>
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    E: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let (up, down) =
        tokio::io::copy_bidirectional_with_sizes(client, exit, COPY_BUFFER, COPY_BUFFER).await?;
    Ok(Transferred { up, down })
}
