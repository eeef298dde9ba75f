//! The agent's side of the link: dial a superproxy, prove who we are, then
//! serve its tunnel streams: as the HTTP/2 server on a v1 link, as the mux
//! acceptor on a v2 link (whichever version the hello settled on; one file
//! each: [`v1_http2`], [`v2_mux`]).
//!
//! The superproxy's certificate is pinned by the SHA-256 the control-api handed
//! us, so the link needs no public CA. One supervisor task per superproxy keeps
//! its link up, reconnecting with jittered exponential back-off.

use proxynet_store::SuperproxyRecord;
use proxynet_wire::link::{
    read_frame, write_frame, AgentHello, HelloReply, HELLO_VERSION, LINK_V1_HTTP2, LINK_V2_MUX,
};
use proxynet_wire::mux::ReadAhead;
use rand::Rng;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

use crate::tunnel::TunnelContext;

mod v1_http2;
mod v2_mux;

pub(crate) const LINK_ALPN: &[u8] = b"proxynet-link/1";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Keeps one link to `superproxy` up until `stop`; then lets the open
/// tunnels on it finish (GOAWAY: no new streams) and returns.
pub(crate) async fn supervise(
    superproxy: SuperproxyRecord,
    ctx: Arc<TunnelContext>,
    stop: CancellationToken,
) {
    let mut backoff = MIN_BACKOFF;
    let mut connected_before = false;
    while !stop.is_cancelled() {
        let connected = tokio::select! {
            connected = connect(&superproxy, &ctx) => connected,
            () = stop.cancelled() => return,
        };
        match connected {
            Ok((tls, version)) => {
                backoff = MIN_BACKOFF;
                ctx.links_up.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("proxynet_agent_link_connects_total").increment(1);
                tracing::info!(superproxy = %superproxy.id, addr = %superproxy.link_addr, link_version = version, "link up");
                // A link that came back may have come back over a re-dialled
                // line with another public address: look again.
                if std::mem::replace(&mut connected_before, true) {
                    ctx.egress_watch.link_reconnected();
                }
                let result = match version {
                    LINK_V2_MUX => v2_mux::serve(tls, ctx.clone(), &stop).await,
                    _ => v1_http2::serve(tls, ctx.clone(), &stop)
                        .await
                        .map_err(|e| e.to_string()),
                };
                ctx.links_up.fetch_sub(1, Ordering::Relaxed);
                match result {
                    Ok(()) => tracing::info!(superproxy = %superproxy.id, "link closed"),
                    Err(e) => tracing::warn!(superproxy = %superproxy.id, error = %e, "link lost"),
                }
            }
            Err(e) => {
                metrics::counter!("proxynet_agent_link_failures_total").increment(1);
                tracing::warn!(superproxy = %superproxy.id, addr = %superproxy.link_addr, error = %e, "link attempt failed")
            }
        }
        // Full jitter, so agents that lost the same superproxy do not return in step.
        let wait = rand::thread_rng().gen_range(Duration::ZERO..=backoff);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

type LinkStream = tokio_rustls::client::TlsStream<ReadAhead<TcpStream>>;

/// Plaintext rustls may hold for sending before the socket takes it: large
/// enough that one bulk write becomes one vectored syscall of many records.
const TLS_SEND_BUFFER: usize = 512 * 1024;

async fn connect(
    superproxy: &SuperproxyRecord,
    ctx: &TunnelContext,
) -> Result<(LinkStream, u16), String> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(superproxy.link_addr))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let connector = TlsConnector::from(pinned_client_config(&superproxy.cert_sha256)?);
    let name = ServerName::try_from("proxynet-superproxy").map_err(|e| e.to_string())?;
    let mut tls = tokio::time::timeout(
        CONNECT_TIMEOUT,
        connector.connect(name, ReadAhead::new(tcp)),
    )
    .await
    .map_err(|_| "TLS handshake timed out".to_owned())?
    .map_err(|e| format!("TLS: {e}"))?;
    let offered = &ctx.config.link_versions;
    let hello = AgentHello {
        // A v1-only agent sends exactly what v1 releases sent.
        open_window: !offered.is_v1_only(),
        // UDP associations ride the mux only (`udp.rs`), and never an
        // upstream exit: its datagrams would leave from our own address, not
        // the partner's.
        udp: !offered.is_v1_only() && ctx.upstream.is_none(),
        version: HELLO_VERSION,
        exit_id: ctx.identity.exit_id,
        credential: ctx.identity.credential.clone(),
        // A v1-only agent says nothing about versions, as v1 releases did.
        link_versions: if offered.is_v1_only() {
            Vec::new()
        } else {
            offered.0.clone()
        },
    };
    write_frame(&mut tls, &hello)
        .await
        .map_err(|e| e.to_string())?;
    let reply: HelloReply = tokio::time::timeout(CONNECT_TIMEOUT, read_frame(&mut tls))
        .await
        .map_err(|_| "no hello reply".to_owned())?
        .map_err(|e| e.to_string())?;
    if !reply.ok {
        return Err(format!(
            "superproxy refused the link: {}",
            reply.error.unwrap_or_else(|| "no reason given".into())
        ));
    }
    let version = reply.link_version.unwrap_or(LINK_V1_HTTP2);
    if !offered.0.contains(&version) {
        return Err(format!(
            "superproxy chose link version {version}, which this agent did not offer ({offered})"
        ));
    }
    tls.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER));
    Ok((tls, version))
}

fn pinned_client_config(cert_sha256: &str) -> Result<Arc<ClientConfig>, String> {
    let provider = proxynet_wire::link::tls_provider();
    let verifier = Arc::new(PinnedCert {
        sha256: cert_sha256.to_ascii_lowercase(),
        provider: provider.clone(),
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![LINK_ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// Accepts exactly the certificate whose SHA-256 the control plane announced;
/// handshake signatures are still verified against that certificate's key.
#[derive(Debug)]
struct PinnedCert {
    sha256: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = hex::encode(Sha256::digest(end_entity.as_ref()));
        if proxynet_common::secret::constant_time_eq(presented.as_bytes(), self.sha256.as_bytes()) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verify(pin: &str, cert: &[u8]) -> Result<ServerCertVerified, rustls::Error> {
        let verifier = PinnedCert {
            sha256: pin.to_owned(),
            provider: proxynet_wire::link::tls_provider(),
        };
        let name = ServerName::try_from("proxynet-superproxy").unwrap();
        verifier.verify_server_cert(
            &CertificateDer::from(cert.to_vec()),
            &[],
            &name,
            &[],
            UnixTime::now(),
        )
    }

    #[test]
    fn only_the_certificate_with_the_pinned_digest_is_accepted() {
        let cert = b"the superproxy's certificate".as_slice();
        let pin = hex::encode(Sha256::digest(cert));
        assert!(verify(&pin, cert).is_ok());
        assert!(verify(&pin, b"another certificate").is_err());
        assert!(verify("", cert).is_err());
    }

    #[test]
    fn a_pinned_client_config_offers_only_the_link_alpn() {
        let pin = hex::encode(Sha256::digest(b"cert"));
        let config = pinned_client_config(&pin).unwrap();
        assert_eq!(config.alpn_protocols, vec![LINK_ALPN.to_vec()]);
    }
}
