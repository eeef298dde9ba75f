//! Accepts agent links: TLS, the agent's hello (credential and link versions),
//! then the agreed version's framing with us opening streams: HTTP/2 as the
//! client (v1) or the mux as its client role (v2).

use proxynet_common::secret::{constant_time_eq, sha256_hex};
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{AuditEvent, ExitRecord, Keys};
use proxynet_wire::link::{
    choose_version, read_frame, write_frame, AgentHello, HelloReply, LinkVersions, HELLO_VERSION,
    LINK_V2_MUX,
};
use proxynet_wire::mux::ReadAhead;
use redis::AsyncCommands;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::registry::{LinkRegistry, LinkSender};
use super::version::AgentTls;
use super::{v1_http2, v2_mux};

/// Time an agent has for TLS plus its hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct LinkListener {
    pub listener: TcpListener,
    pub acceptor: TlsAcceptor,
    pub registry: Arc<LinkRegistry>,
    pub redis: RedisConnection,
    pub keys: Keys,
    /// This superproxy, for audit events.
    pub superproxy_id: uuid::Uuid,
    /// Link versions we accept; the newest one the agent also offers is used.
    pub versions: LinkVersions,
    /// What every v2 link's streams may hold between them (stalled readers).
    pub recv_budget: Arc<proxynet_wire::mux::RecvBudget>,
}

impl LinkListener {
    pub(crate) async fn run(self, stop: Stop) {
        let this = Arc::new(self);
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => return,
                accepted = this.listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
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
        let (mut tls, hello): (AgentTls, AgentHello) =
            tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
                let mut tls = self
                    .acceptor
                    .accept(ReadAhead::new(tcp))
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
            // v1 is left implicit, so a v1 agent reads exactly what it expects.
            link_version: verdict.as_ref().ok().copied().filter(|v| *v != 1),
        };
        write_frame(&mut tls, &reply)
            .await
            .map_err(|e| e.to_string())?;
        let version = verdict?;
        let exit_id = hello.exit_id;
        let (sender, driver) = if version == LINK_V2_MUX {
            v2_mux::start(tls, self.recv_budget.clone(), hello.open_window, hello.udp)
        } else {
            v1_http2::start(tls).await?
        };
        let link_id = self.link_up(exit_id, peer, sender).await;
        let ended = driver.await;
        self.link_down(exit_id, link_id, ended);
        Ok(())
    }

    async fn link_up(
        &self,
        exit_id: uuid::Uuid,
        peer: std::net::SocketAddr,
        sender: LinkSender,
    ) -> u64 {
        let version = sender.version();
        let (link_id, replaced) = self.registry.insert(exit_id, peer, sender);
        tracing::info!(exit = %exit_id, link = link_id, %peer, link_version = version, "agent link up");
        crate::metrics::link_event("up");
        if let Some(old) = replaced {
            self.report_replacement(exit_id, &old, peer).await;
        }
        link_id
    }

    fn link_down(&self, exit_id: uuid::Uuid, link_id: u64, error: Option<String>) {
        match error {
            Some(error) => {
                tracing::info!(exit = %exit_id, link = link_id, %error, "agent link ended")
            }
            None => tracing::info!(exit = %exit_id, link = link_id, "agent link closed"),
        }
        self.registry.remove(exit_id, link_id);
        crate::metrics::link_event("down");
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

    /// Checks the hello against the exit's record (unknown exit and wrong
    /// credential give the same answer) and picks the link version.
    async fn verify(&self, hello: &AgentHello) -> Result<u16, String> {
        if hello.version != HELLO_VERSION {
            return Err(format!(
                "hello version {} not supported (this superproxy reads {HELLO_VERSION})",
                hello.version
            ));
        }
        let offered = hello.offered_versions();
        let Some(version) = choose_version(&offered, &self.versions.0) else {
            return Err(format!(
                "no common link version: the agent speaks {offered:?}, this superproxy speaks [{}]",
                self.versions
            ));
        };
        let mut redis = self.redis.clone();
        let json: Option<String> = redis
            .get(self.keys.exit(hello.exit_id))
            .await
            .map_err(|_| "cannot verify credentials right now".to_owned())?;
        let record: Option<ExitRecord> = json.and_then(|j| serde_json::from_str(&j).ok());
        let presented = sha256_hex(hello.credential.expose());
        match record {
            Some(r) if constant_time_eq(presented.as_bytes(), r.credential_sha256.as_bytes()) => {
                Ok(version)
            }
            _ => Err("unknown exit or wrong credential".to_owned()),
        }
    }
}
