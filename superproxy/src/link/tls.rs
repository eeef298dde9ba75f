//! The link listener's TLS identity.
//!
//! Either an operator-supplied certificate or a self-signed one made at start.
//! Agents do not use the Web PKI for links: they pin the SHA-256 of the
//! certificate that this superproxy announces through Redis and the control-api.

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;

pub(crate) struct LinkIdentity {
    pub server_config: Arc<ServerConfig>,
    /// Lower-case hex SHA-256 of the end-entity certificate (DER).
    pub cert_sha256: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl LinkIdentity {
    pub(crate) fn self_signed() -> Result<Self, TlsSetupError> {
        let generated = rcgen::generate_simple_self_signed(vec!["proxynet-superproxy".to_owned()])
            .map_err(|e| TlsSetupError::Invalid(format!("generating a certificate: {e}")))?;
        let cert = generated.cert.der().clone();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            generated.signing_key.serialize_der(),
        ));
        Self::from_parts(vec![cert], key)
    }

    pub(crate) fn from_pem_files(cert_path: &Path, key_path: &Path) -> Result<Self, TlsSetupError> {
        use rustls::pki_types::pem::PemObject;
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| TlsSetupError::Read {
                path: p.display().to_string(),
                source,
            })
        };
        let cert_pem = read(cert_path)?;
        let key_pem = read(key_path)?;
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsSetupError::Invalid(format!("link certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| TlsSetupError::Invalid(format!("link key: {e}")))?;
        Self::from_parts(certs, key)
    }

    fn from_parts(
        certs: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, TlsSetupError> {
        let end_entity = certs.first().ok_or_else(|| {
            TlsSetupError::Invalid("link certificate file holds no certificate".into())
        })?;
        let cert_sha256 = hex::encode(Sha256::digest(end_entity.as_ref()));
        let provider = proxynet_wire::link::tls_provider();
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsSetupError::Invalid(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsSetupError::Invalid(format!("link certificate/key: {e}")))?;
        // Our cipher order, not the client's: both ends are ours.
        config.ignore_client_order = true;
        config.alpn_protocols = vec![super::LINK_ALPN.to_vec()];
        Ok(Self {
            server_config: Arc::new(config),
            cert_sha256,
        })
    }
}
