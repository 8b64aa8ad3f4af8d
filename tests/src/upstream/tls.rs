//! The scripted upstream over TLS: a CA made when it starts (rcgen), a
//! server certificate that CA signs for the names asked, and a listener
//! that hands each connection to the HTTP server once its handshake is
//! done. A handshake that fails (a client that does not trust the
//! certificate) is recorded, and reaches no handler.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::{
    ServerConfig,
    pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

/// What a test needs of a TLS upstream: the CA to trust, and the
/// handshakes that failed.
#[derive(Clone)]
pub struct Tls {
    /// The CA's certificate (PEM), for a client's `ca_file`.
    pub ca_pem: String,
    failures: Arc<Mutex<Vec<String>>>,
}

impl Tls {
    /// The errors of the handshakes that failed so far, in order.
    pub fn handshake_failures(&self) -> Vec<String> {
        self.failures.lock().unwrap().clone()
    }

    /// Waits until at least `n` handshakes have failed (panics after
    /// `limit`): a client gives up on a certificate before the server
    /// reads its alert.
    pub async fn wait_for_handshake_failures(&self, n: usize, limit: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let failed = self.handshake_failures();
            if failed.len() >= n {
                return failed;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} handshakes failed, not {n}: {failed:?}",
                failed.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Connections whose handshake is done, for `axum::serve`.
pub(super) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The acceptor stopped: no connection ever again.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// A CA, and a server certificate it signs for `names` (DNS names or IP
/// addresses).
fn certificates(names: &[&str]) -> (String, ServerConfig) {
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "scripted upstream test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).expect("the CA's certificate");
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().expect("a server key");
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut server = CertificateParams::new(names).expect("server params");
    server
        .distinguished_name
        .push(DnType::CommonName, "scripted upstream");
    let cert = server
        .signed_by(&key, &issuer)
        .expect("the server's certificate");

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("the server's TLS config");
    (ca_cert.pem(), config)
}

/// Wraps `tcp` in TLS with a certificate for `names`; each handshake runs
/// on its own task, so a client that stalls holds up no other.
pub(super) fn listen(tcp: TcpListener, names: &[&str]) -> (TlsListener, Tls) {
    let addr = tcp.local_addr().expect("its address");
    let (ca_pem, config) = certificates(names);
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let (tx, ready) = mpsc::channel(16);
    let failed = failures.clone();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = tcp.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: a pause, as axum's own
                    // server does, rather than a busy loop.
                    failed.lock().unwrap().push(format!("accept: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (acceptor, tx, failed) = (acceptor.clone(), tx.clone(), failed.clone());
            tokio::spawn(async move {
                match acceptor.accept(stream).await {
                    Ok(tls) => {
                        let _ = tx.send((tls, peer)).await;
                    }
                    Err(e) => failed.lock().unwrap().push(e.to_string()),
                }
            });
        }
    });
    (TlsListener { ready, addr }, Tls { ca_pem, failures })
}
