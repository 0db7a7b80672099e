//! Certificates for the tests of TLS: a CA, a server certificate it signed for the names a test
//! gives, a client certificate it signed (a daemon's, for mTLS), and a second CA that signed
//! nothing the server shows (to be refused). Written as PEM files under a directory.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// The PEM files of a test PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// The server's certificate, for the names given.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA.
    pub client_cert: PathBuf,
    /// The client's key.
    pub client_key: PathBuf,
    /// Another CA, which signed none of the above.
    pub other_ca: PathBuf,
}

/// Writes a test PKI under `directory`, the server certificate naming `names` (host names or IP
/// addresses).
///
/// # Panics
///
/// Panics when a certificate cannot be made or a file cannot be written.
pub fn write(directory: &Path, names: &[&str]) -> Pki {
    let authority = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
    };
    let ca = authority("sluice test CA");
    let other = authority("another CA");
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(names)
            .expect("names")
            .signed_by(&key, &ca)
            .expect("signed");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(names.iter().map(|name| name.to_string()).collect());
    let (client_cert, client_key) = leaf(vec!["sluice-daemon".to_owned()]);
    let file = |name: &str, text: &str| {
        let path = directory.join(name);
        std::fs::write(&path, text).expect("write a PEM file");
        path
    };
    Pki {
        ca: file("ca.pem", &ca.pem()),
        server_cert: file("server.pem", &server_cert),
        server_key: file("server.key", &server_key),
        client_cert: file("client.pem", &client_cert),
        client_key: file("client.key", &client_key),
        other_ca: file("other-ca.pem", &other.pem()),
    }
}
