//! Accepts agent links: TLS, the agent's hello, then HTTP/2 with us as client.

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use proxynet_protocol::link::{read_frame, write_frame, AgentHello, HelloReply, LINK_VERSION};
use proxynet_protocol::secret::{constant_time_eq, sha256_hex};
use proxynet_protocol::store::{AuditEvent, ExitRecord, Keys};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::registry::LinkRegistry;

/// Time an agent has for TLS plus its hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct LinkListener {
    pub listener: TcpListener,
    pub acceptor: TlsAcceptor,
    pub registry: Arc<LinkRegistry>,
    pub redis: ConnectionManager,
    pub keys: Keys,
    /// This superproxy, for audit events.
    pub superproxy_id: uuid::Uuid,
}

impl LinkListener {
    pub async fn run(self) {
        let this = Arc::new(self);
        loop {
            let (tcp, peer) = match this.listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "link accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let this = this.clone();
            tokio::spawn(async move {
                if let Err(reason) = this.admit(tcp, peer).await {
                    tracing::warn!(%peer, %reason, "agent link refused");
                }
            });
        }
    }

    async fn admit(&self, tcp: TcpStream, peer: std::net::SocketAddr) -> Result<(), String> {
        let _ = tcp.set_nodelay(true);
        let (mut tls, hello) = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            let mut tls = self
                .acceptor
                .accept(tcp)
                .await
                .map_err(|e| format!("tls: {e}"))?;
            let hello: AgentHello = read_frame(&mut tls).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((tls, hello))
        })
        .await
        .map_err(|_| "handshake timed out".to_owned())??;

        let verdict = self.verify(&hello).await;
        let reply = HelloReply {
            ok: verdict.is_ok(),
            error: verdict.as_ref().err().cloned(),
        };
        write_frame(&mut tls, &reply)
            .await
            .map_err(|e| e.to_string())?;
        verdict?;

        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            // Windows are credit, not buffers: memory grows only while a
            // peer does not read (see the constants for the isolation rule).
            .initial_stream_window_size(proxynet_protocol::link::H2_STREAM_WINDOW)
            .initial_connection_window_size(proxynet_protocol::link::H2_CONNECTION_WINDOW)
            .max_frame_size(proxynet_protocol::link::H2_MAX_FRAME_SIZE)
            .keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("http/2 handshake: {e}"))?;
        let exit_id = hello.exit_id;
        let (link_id, replaced) = self.registry.insert(exit_id, peer, sender);
        tracing::info!(exit = %exit_id, link = link_id, %peer, "agent link up");
        crate::metrics::link_event("up");
        if let Some(old) = replaced {
            self.report_replacement(exit_id, &old, peer).await;
        }
        if let Err(e) = connection.await {
            tracing::info!(exit = %exit_id, link = link_id, error = %e, "agent link ended");
        } else {
            tracing::info!(exit = %exit_id, link = link_id, "agent link closed");
        }
        self.registry.remove(exit_id, link_id);
        crate::metrics::link_event("down");
        Ok(())
    }

    /// A second link with the same exit credential replaced the first: fine
    /// for an agent that reconnected, alarming for two hosts sharing one
    /// credential. Logged and sent to the audit log either way.
    async fn report_replacement(
        &self,
        exit_id: uuid::Uuid,
        old: &super::registry::Link,
        peer: std::net::SocketAddr,
    ) {
        crate::metrics::link_event("replaced");
        tracing::warn!(
            exit = %exit_id,
            old_link = old.id,
            old_peer = %old.peer,
            new_peer = %peer,
            "a second link presented this exit's credential; the newest link takes new tunnels"
        );
        let event = AuditEvent {
            id: uuid::Uuid::new_v4(),
            actor: format!("superproxy:{}", self.superproxy_id),
            action: "exit.link_replaced".into(),
            subject: exit_id.to_string(),
            detail: serde_json::json!({"old_peer": old.peer, "new_peer": peer}),
        };
        let Ok(json) = serde_json::to_string(&event) else {
            return;
        };
        let mut redis = self.redis.clone();
        let sent: Result<String, _> = redis::cmd("XADD")
            .arg(self.keys.usage_stream())
            .arg("*")
            .arg("audit")
            .arg(json)
            .query_async(&mut redis)
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, "could not send the link replacement to the audit log");
        }
    }

    /// Checks the hello against the exit's record; unknown exit and wrong
    /// credential give the same answer.
    async fn verify(&self, hello: &AgentHello) -> Result<(), String> {
        if hello.version != LINK_VERSION {
            return Err(format!(
                "link version {} not supported (this superproxy speaks {LINK_VERSION})",
                hello.version
            ));
        }
        let mut redis = self.redis.clone();
        let json: Option<String> = redis
            .get(self.keys.exit(hello.exit_id))
            .await
            .map_err(|_| "cannot verify credentials right now".to_owned())?;
        let record: Option<ExitRecord> = json.and_then(|j| serde_json::from_str(&j).ok());
        let presented = sha256_hex(hello.credential.expose());
        match record {
            Some(r) if constant_time_eq(presented.as_bytes(), r.credential_sha256.as_bytes()) => {
                Ok(())
            }
            _ => Err("unknown exit or wrong credential".to_owned()),
        }
    }
}
