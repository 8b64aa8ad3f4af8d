//! TLS to the providers: rustls (on `ring`) trusting the Mozilla roots
//! compiled in (`webpki-roots`, so no CA bundle is needed on the host or in
//! an image) and, per provider, the certificates of its `ca_file` added to
//! them. Certificates are always verified: there is no way to turn that off.

use std::{fmt, path::Path, sync::Arc};

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, pem::PemObject};

/// Certificates a provider trusts besides the Mozilla roots: its
/// `ca_file` (a private proxy's CA, a test's own). `Debug` shows how many.
#[derive(Clone, Default)]
pub struct ExtraRoots(Vec<CertificateDer<'static>>);

impl fmt::Debug for ExtraRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtraRoots({} certificates)", self.0.len())
    }
}

impl ExtraRoots {
    /// Reads the PEM file at `path`: one certificate or more, each usable
    /// as a trust anchor. The error says what is wrong with the file.
    pub fn read(path: &Path) -> Result<ExtraRoots, String> {
        let shown = path.display();
        let pem = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{shown} is not PEM: {e}"))?;
        if certs.is_empty() {
            return Err(format!(
                "{shown} holds no certificate (PEM \"BEGIN CERTIFICATE\")"
            ));
        }
        let mut check = RootCertStore::empty();
        for (n, cert) in certs.iter().enumerate() {
            check
                .add(cert.clone())
                .map_err(|e| format!("{shown}: certificate {} is not usable: {e}", n + 1))?;
        }
        Ok(ExtraRoots(certs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The TLS client config of a provider's connections: the Mozilla roots
/// and `extra`, TLS 1.2 and 1.3, no client certificate.
pub fn client_config(extra: &ExtraRoots) -> ClientConfig {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    // Each was checked as it was read (`ExtraRoots::read`).
    let (_added, _ignored) = roots.add_parsable_certificates(extra.0.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}
