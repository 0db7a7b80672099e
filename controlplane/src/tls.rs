//! The AM's API across hosts: TLS for the gRPC port (with its JSON calls) and the status page, a
//! client CA that daemons must present a certificate of (mTLS), and the rule that keeps a job's API
//! off the network unless it is private.
//!
//! A listener on a non-loopback address serves the job's data (sources and their storage options)
//! and its controls to whoever reaches it, so it needs both TLS and a token; `--insecure` says the
//! network is trusted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::connections::{ConnectionGuard, ConnectionInfo, Guarded};
use crate::error::AmError;

/// How long a client may take over its TLS handshake with the status page.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The AM's certificate and key, and the CA of the daemons' certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// The AM's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// When set, daemons must present a certificate signed by this CA (PEM); trainers and the CLI
    /// need none.
    pub client_ca: Option<PathBuf>,
}

impl ServerTls {
    /// The gRPC port's TLS settings.
    pub fn grpc(&self) -> Result<ServerTlsConfig, AmError> {
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(
            read("certificate", &self.cert, "--tls-cert")?,
            read("key", &self.key, "--tls-key")?,
        ));
        if let Some(ca) = &self.client_ca {
            config = config
                .client_ca_root(Certificate::from_pem(read(
                    "client CA",
                    ca,
                    "--tls-client-ca",
                )?))
                .client_auth_optional(true);
        }
        Ok(config)
    }

    /// The status page's TLS settings: the same certificate, no client certificates.
    pub fn http(&self) -> Result<Arc<ServerConfig>, AmError> {
        let invalid = |what: &str, path: &Path, error: String| {
            AmError::InvalidRequest(format!(
                "TLS {what} {}: {error}; pass a PEM file",
                path.display()
            ))
        };
        let certs = CertificateDer::pem_slice_iter(&read("certificate", &self.cert, "--tls-cert")?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| invalid("certificate", &self.cert, error.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(&read("key", &self.key, "--tls-key")?)
            .map_err(|error| invalid("key", &self.key, error.to_string()))?;
        let mut config = ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|error| invalid("certificate", &self.cert, error.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|error| invalid("certificate", &self.cert, error.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Refuses to serve `what` on `address` when it is not a loopback address and the API would not
/// be private (TLS and a token), unless the network is trusted (`insecure`).
pub fn check_bind(
    what: &str,
    address: SocketAddr,
    tls: bool,
    token: bool,
    insecure: bool,
) -> Result<(), AmError> {
    if address.ip().is_loopback() || (tls && token) || insecure {
        return Ok(());
    }
    let missing = match (tls, token) {
        (false, false) => "neither TLS nor a token",
        (false, true) => "no TLS",
        _ => "no token",
    };
    Err(AmError::InvalidRequest(format!(
        "{what} on {address} would serve the job to the network with {missing}; pass --tls-cert and --tls-key and a token (--token or SLUICE_TOKEN), bind a loopback address, or pass --insecure on a network you trust"
    )))
}

/// A listener whose connections are TLS streams, handshaken on tasks of their own so that a slow
/// or silent client holds up no other, each admitted by a [`ConnectionGuard`] before its handshake.
#[derive(Debug)]
pub struct TlsListener {
    address: SocketAddr,
    accepted: mpsc::Receiver<(TlsStream<Guarded<TcpStream>>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `listener` under `guard` and completes TLS handshakes with `config`.
    pub fn new(
        listener: TcpListener,
        guard: ConnectionGuard,
        config: Arc<ServerConfig>,
    ) -> std::io::Result<TlsListener> {
        let address = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (sender, accepted) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = guard.accept(&listener).await;
                if sender.is_closed() {
                    return;
                }
                let acceptor = acceptor.clone();
                let handed = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            // The server went away: the connection closes with the stream.
                            let _ = handed.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "status page: TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "status page: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { address, accepted })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Guarded<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accepting task ends only with the runtime.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.address)
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for ConnectionInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> ConnectionInfo {
        stream.io().get_ref().0.info().clone()
    }
}

fn read(what: &str, path: &Path, flag: &str) -> Result<Vec<u8>, AmError> {
    std::fs::read(path).map_err(|error| {
        AmError::InvalidRequest(format!(
            "reading the TLS {what} {}: {error}; check {flag}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_bind_needs_tls_and_a_token_or_insecure() {
        let public: SocketAddr = "0.0.0.0:7070".parse().expect("address");
        let loopback: SocketAddr = "127.0.0.1:7070".parse().expect("address");
        assert!(check_bind("the AM", loopback, false, false, false).is_ok());
        assert!(check_bind("the AM", public, true, true, false).is_ok());
        assert!(check_bind("the AM", public, false, false, true).is_ok());
        for (tls, token, missing) in [
            (false, false, "neither TLS nor a token"),
            (true, false, "no token"),
            (false, true, "no TLS"),
        ] {
            let error = check_bind("the AM", public, tls, token, false)
                .expect_err("refused")
                .to_string();
            assert!(error.contains(missing), "{error}");
            assert!(error.contains("--insecure"), "{error}");
        }
    }
}
