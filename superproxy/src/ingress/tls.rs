//! The HTTPS proxy listener: TLS in front of the same HTTP ingress, so
//! proxy credentials never cross the network in clear text (curl
//! `--proxy https://…`, Chromium `--proxy-server=https://…`).
//!
//! TLS 1.2 and 1.3 only, ALPN `h2` preferred and `http/1.1` still offered
//! (an `h2` connection is served by [`super::http::h2`]), the certificate chain and key read
//! from PEM files. SIGHUP re-reads them: new handshakes get the new
//! certificate, connections and tunnels already open keep theirs (the
//! resolver is consulted per handshake). A certificate that fails to load is
//! reported and the old one stays in service.

use proxynet_common::tasks::Stop;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The certificate currently served, swappable while the listener runs.
#[derive(Debug)]
pub(crate) struct ReloadableCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<CertifiedKey>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| format!("{}: {e}", cert_path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate", cert_path.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("{}: {e}", key_path.display()))?;
    let signing_key = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("{}: {e}", key_path.display()))?;
    let certified = CertifiedKey::new(certs, signing_key);
    certified
        .keys_match()
        .map_err(|e| format!("certificate and key do not match: {e}"))?;
    Ok(Arc::new(certified))
}

impl ReloadableCert {
    pub(crate) fn new(cert_path: PathBuf, key_path: PathBuf) -> Result<Self, String> {
        let current = RwLock::new(load(&cert_path, &key_path)?);
        Ok(Self {
            cert_path,
            key_path,
            current,
        })
    }

    /// Re-reads the files; on failure the certificate in service stays.
    pub(crate) fn reload(&self) -> Result<(), String> {
        let fresh = load(&self.cert_path, &self.key_path)?;
        if let Ok(mut current) = self.current.write() {
            *current = fresh;
        }
        Ok(())
    }

    /// The rustls configuration for the HTTPS proxy listener.
    pub(crate) fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, String> {
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_cert_resolver(self.clone());
        // Our preference wins (rustls picks the first of ours the client
        // offers): multiplexed tunnels for clients that speak HTTP/2.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Reloads on every SIGHUP until `stop`.
    pub(crate) async fn reload_on_sighup(self: Arc<Self>, stop: Stop) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hangups) = signal(SignalKind::hangup()) else {
                tracing::warn!("cannot listen for SIGHUP; the TLS certificate will not reload");
                return;
            };
            while let Some(Some(())) = stop.run_until_cancelled(hangups.recv()).await {
                match self.reload() {
                    Ok(()) => {
                        tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded")
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "TLS certificate reload failed; keeping the old one")
                    }
                }
            }
        }
    }
}
