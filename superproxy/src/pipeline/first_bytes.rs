//! The one stage after the answer: a `CONNECT` to an IP literal, while
//! some domain rule could apply, has its per-domain rules judged by the
//! server name in its client's first TLS record ([`sni`]), read after the
//! `200` and before any client byte reaches the exit
//! ([`Pipeline::judge_first_bytes`]).

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{sni, Pipeline, Tunnel};

/// How long a client's first bytes are waited for when a tunnel is judged
/// by them ([`Pipeline::judge_first_bytes`]); then it is judged without.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(5);

impl Pipeline {
    /// For a tunnel opened to an IP literal while some domain rule could
    /// apply ([`Tunnel::judges_first_bytes`]; for any other tunnel this
    /// returns at once): its per-domain rules, judged by what its client
    /// sends first, after the `200` and before any of it reaches the exit.
    ///
    /// The client's first TLS record is read (at most
    /// [`sni::MAX_RECORD`] bytes, for at most [`FIRST_BYTES_TIMEOUT`]; less
    /// when it is not a handshake record, or when the exit speaks first —
    /// a protocol whose server talks first has no ClientHello to wait for).
    /// With a server name in it, the denied domains apply to that name and
    /// the per-domain limits count the tunnel under its registrable domain;
    /// without, the limits count it under the address's /24 or /64
    /// ([`super::TargetPolicy`]). Admitted: the leases join the tunnel's, what the
    /// exit sent goes to the client and what the client sent to the exit,
    /// and `true` (splice on). Refused: the access log says so, the error
    /// is counted, and `false`: the caller drops the tunnel, which closes
    /// the connection (the `200` is already sent; nothing of the client's
    /// reached the target). `false` too when either side failed meanwhile.
    pub(crate) async fn judge_first_bytes<C>(&self, tunnel: &mut Tunnel, client: &mut C) -> bool
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        if tunnel.first_bytes.is_none() {
            return true;
        }
        // Boxed: every tunnel's task awaits this, and inline its buffers and
        // Redis futures would enlarge each idle tunnel's task for good.
        Box::pin(self.judge_first_bytes_now(tunnel, client)).await
    }

    async fn judge_first_bytes_now<C>(&self, tunnel: &mut Tunnel, client: &mut C) -> bool
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let Some(target) = tunnel.first_bytes.take() else {
            return true;
        };
        let (from_client, from_exit) = read_first_bytes(client, &mut tunnel.io).await;
        let server_name = sni::server_name(&from_client);
        let holds = &mut tunnel.holds;
        // The tunnel's outcome stays recorded under the address's block,
        // the site its exit was chosen for: a server name is the client's
        // word, and a forged one must not charge another site's record.
        let judged = self
            .target_policy
            .judge_server_name(
                holds.log.account_id,
                holds.log.user_id,
                &holds.record,
                target.1,
                server_name.as_deref(),
            )
            .await;
        match judged {
            Ok(leases) => holds._lease.add_domain(leases),
            Err(e) => {
                tracing::debug!(error = %e, server_name = ?server_name, "tunnel refused by its first bytes");
                self.stats.tunnel_failed(holds.log.ingress, e.kind);
                holds.refused(&e);
                return false;
            }
        }
        if !from_exit.is_empty() {
            let written = async {
                client.write_all(&from_exit).await?;
                client.flush().await
            };
            if let Err(e) = written.await {
                tunnel
                    .holds
                    .ended(proxynet_common::splice::End::Error(e.kind()));
                return false;
            }
        }
        if !from_client.is_empty() {
            if let Err(e) = tunnel.io.write_all(&from_client).await {
                tunnel
                    .holds
                    .ended(proxynet_common::splice::End::Error(e.kind()));
                return false;
            }
        }
        true
    }
}

/// Reads what a client sends first through a tunnel judged by it: its first
/// TLS record, whole, or what it sent before that proved not to be one, or
/// before the exit spoke first (whose bytes come back too), or before
/// [`FIRST_BYTES_TIMEOUT`]. Never more than [`sni::MAX_RECORD`] bytes of
/// the client's (a read may take some of what follows the record; it is
/// all forwarded); the rest stays in its connection for the splice.
async fn read_first_bytes<C, E>(client: &mut C, exit: &mut E) -> (Vec<u8>, Vec<u8>)
where
    C: AsyncRead + Unpin,
    E: AsyncRead + Unpin,
{
    let deadline = tokio::time::Instant::now() + FIRST_BYTES_TIMEOUT;
    let mut from_client = Vec::new();
    let mut from_exit = Vec::new();
    let mut chunk = [0u8; 2048];
    while sni::first_record(&from_client) == sni::FirstRecord::Partial {
        // Partial: fewer than MAX_RECORD bytes so far.
        let room = (sni::MAX_RECORD - from_client.len()).min(chunk.len());
        tokio::select! {
            read = client.read(&mut chunk[..room]) => match read {
                Ok(n) if n > 0 => from_client.extend_from_slice(&chunk[..n]),
                // The client closed or failed: judged by what came.
                _ => break,
            },
            // The server spoke first (or closed): no ClientHello comes
            // before the client has read it.
            _ = exit.read_buf(&mut from_exit) => break,
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    (from_client, from_exit)
}

#[cfg(test)]
mod tests;
