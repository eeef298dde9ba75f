//! A local certificate authority for the HTTPS proxy tests: a CA and server
//! certificates for `localhost` / `127.0.0.1`, written as PEM files.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};

pub struct LocalCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub ca_pem: PathBuf,
}

impl LocalCa {
    /// A new CA whose certificate is written to `dir/ca.pem`.
    pub fn create(dir: &Path) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "proxynet test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, issuer.pem()).unwrap();
        Self { issuer, ca_pem }
    }

    /// A server certificate for localhost and 127.0.0.1 signed by this CA,
    /// written to `cert` and `key`; `name` goes into its common name.
    pub fn issue(&self, name: &str, cert: &Path, key: &Path) {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key_pair = KeyPair::generate().unwrap();
        let issued = params.signed_by(&key_pair, &self.issuer).unwrap();
        // Written whole, then renamed: a reload never sees half a file.
        let (tmp_cert, tmp_key) = (cert.with_extension("tmp"), key.with_extension("tmp"));
        std::fs::write(&tmp_cert, issued.pem()).unwrap();
        std::fs::write(&tmp_key, key_pair.serialize_pem()).unwrap();
        std::fs::rename(tmp_key, key).unwrap();
        std::fs::rename(tmp_cert, cert).unwrap();
    }
}
