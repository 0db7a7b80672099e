//! Reaching an AM: the one way every client of the API (node daemons, the CLI, the benchmarks)
//! turns an address and its TLS settings into a channel, and explains a failure.
//!
//! An address is `host:port`, `http://host:port` (plain TCP) or `https://host:port` (TLS). A bare
//! `host:port` means TLS when a CA is given (`--tls-ca`, `SLUICE_TLS_CA`), plain TCP otherwise.
//! Under TLS the AM's certificate is checked against that CA, or against the system's roots when
//! none is given, for the address's host name; a client certificate and key
//! ([`ClientTls::identity`]) are presented to an AM that asks daemons for one (mTLS).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How long a connection attempt may take, TCP and TLS handshakes included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a connection is probed with an HTTP/2 ping, and how long the answer may take: an AM
/// frozen or cut off is noticed within their sum (well within a lease, so that a daemon whose AM's
/// host died looks for the AM's new address in time) rather than when the kernel gives up.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The deadline of every call: a frozen AM (stopped, or its host black-holed) fails a call with
/// `DeadlineExceeded` in this time instead of holding it for ever. Calls are small and the AM
/// answers each once its changes are durable, well within it.
const CALL_DEADLINE: Duration = Duration::from_secs(20);

/// The TLS settings of a client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA that signed the AM's certificate (PEM); `None` trusts the system's roots.
    pub ca: Option<PathBuf>,
    /// The client's certificate and key (PEM), for an AM that asks daemons for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// Why an AM's address cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address does not parse.
    #[error(
        "AM address {address:?} is not an address: {reason}; pass host:port, http://host:port or https://host:port (--am or SLUICE_AM)"
    )]
    Address {
        /// The address given.
        address: String,
        /// Why.
        reason: String,
    },
    /// A CA was given for an address that says plain TCP.
    #[error(
        "AM address {address:?} says plain TCP (http://) but a CA was given (--tls-ca or SLUICE_TLS_CA); use https://{rest} or drop the CA"
    )]
    PlainWithCa {
        /// The address given.
        address: String,
        /// The address without its scheme.
        rest: String,
    },
    /// A TLS file could not be read.
    #[error("reading {what} {}: {error}; check the path ({flag})", .path.display())]
    Read {
        /// What the file is.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The flag or variable that names it.
        flag: &'static str,
        /// Why.
        error: std::io::Error,
    },
    /// tonic refused the TLS settings.
    #[error(
        "TLS settings for the AM at {address}: {reason}; check --tls-ca, --tls-cert and --tls-key"
    )]
    Tls {
        /// The address given.
        address: String,
        /// Why.
        reason: String,
    },
    /// The connection failed.
    #[error("cannot reach the AM at {address}: {cause}")]
    Unreachable {
        /// The address given.
        address: String,
        /// What failed and the fix.
        cause: String,
    },
}

impl ClientTls {
    /// The settings from the command line or the environment: `ca` (`--tls-ca`,
    /// `SLUICE_TLS_CA`), and a certificate and key together.
    pub fn new(ca: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>) -> ClientTls {
        ClientTls {
            ca,
            identity: cert.zip(key),
        }
    }
}

/// The endpoint of the AM at `address` with `tls`, not yet connected.
pub fn endpoint(address: &str, tls: &ClientTls) -> Result<Endpoint, ConnectError> {
    let (secure, rest) = if let Some(rest) = address.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = address.strip_prefix("http://") {
        if tls.ca.is_some() {
            return Err(ConnectError::PlainWithCa {
                address: address.to_owned(),
                rest: rest.to_owned(),
            });
        }
        (false, rest)
    } else if address.contains("://") {
        return Err(ConnectError::Address {
            address: address.to_owned(),
            reason: "the scheme is neither http nor https".to_owned(),
        });
    } else {
        (tls.ca.is_some(), address)
    };
    let scheme = if secure { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{rest}"))
        .map_err(|error| ConnectError::Address {
            address: address.to_owned(),
            reason: error.to_string(),
        })?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_DEADLINE)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if !secure {
        return Ok(endpoint);
    }
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read(
            "the CA certificate",
            ca,
            "--tls-ca or SLUICE_TLS_CA",
        )?)),
        None => config.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(
            read(
                "the client certificate",
                cert,
                "--tls-cert or SLUICE_TLS_CERT",
            )?,
            read("the client key", key, "--tls-key or SLUICE_TLS_KEY")?,
        ));
    }
    endpoint
        .tls_config(config)
        .map_err(|error| ConnectError::Tls {
            address: address.to_owned(),
            reason: error_chain(&error),
        })
}

/// Connects to the AM at `address`, explaining a failure.
pub async fn connect(address: &str, tls: &ClientTls) -> Result<Channel, ConnectError> {
    endpoint(address, tls)?
        .connect()
        .await
        .map_err(|error| ConnectError::Unreachable {
            address: address.to_owned(),
            cause: explain(&error_chain(&error), tls),
        })
}

/// What a failed call or connection means, and the fix, from its error text: the TLS mistakes
/// (a certificate signed by another CA, TLS against a plain port, plain TCP against a TLS port)
/// are named as such.
pub fn explain(error: &str, tls: &ClientTls) -> String {
    let lower = error.to_ascii_lowercase();
    let fix = if lower.contains("invalid peer certificate") || lower.contains("unknownissuer") {
        "the AM's certificate is not signed by the CA given (or, with none, by a system root); pass the CA that signed it with --tls-ca (SLUICE_TLS_CA)"
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        "the AM's certificate does not name the host of the address; address the AM by a name its certificate lists"
    } else if lower.contains("invalidcontenttype")
        || lower.contains("corrupt message")
        || lower.contains("wrong version number")
    {
        "the AM does not speak TLS on this port; address it as http://host:port and drop --tls-ca, or start the AM with --tls-cert and --tls-key"
    } else if tls.ca.is_none()
        && (lower.contains("connection reset")
            || lower.contains("broken pipe")
            || lower.contains("h2 protocol error")
            || lower.contains("connection closed"))
    {
        "the AM closed the connection; if it serves TLS, address it as https://host:port with --tls-ca (SLUICE_TLS_CA)"
    } else if lower.contains("certificate required") || lower.contains("certificaterequired") {
        "the AM asks daemons for a client certificate; pass --tls-cert and --tls-key (SLUICE_TLS_CERT, SLUICE_TLS_KEY) signed by its client CA"
    } else if lower.contains("connection refused") {
        "nothing listens there; check the address (--am or SLUICE_AM) and that the AM runs"
    } else if lower.contains("timed out")
        || lower.contains("timeout expired")
        || lower.contains("deadline")
    {
        "no answer in time; check the address (--am or SLUICE_AM), that the AM runs and that the network reaches it"
    } else {
        "check the address (--am or SLUICE_AM) and that the AM runs"
    };
    format!("{error}; {fix}")
}

/// An error and its sources, as one line.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

fn read(what: &'static str, path: &Path, flag: &'static str) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|error| ConnectError::Read {
        what,
        path: path.to_owned(),
        flag,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_chooses_tls_by_its_scheme_or_by_a_ca() {
        let plain = ClientTls::default();
        let with_ca = ClientTls::new(Some("/nonexistent/ca.pem".into()), None, None);
        assert_eq!(
            endpoint("127.0.0.1:7070", &plain)
                .expect("plain")
                .uri()
                .scheme_str(),
            Some("http")
        );
        assert_eq!(
            endpoint("http://127.0.0.1:7070", &plain)
                .expect("plain")
                .uri()
                .scheme_str(),
            Some("http")
        );
        let error = endpoint("127.0.0.1:7070", &with_ca).expect_err("the CA is read");
        assert!(error.to_string().contains("--tls-ca"), "{error}");
        let error = endpoint("http://127.0.0.1:7070", &with_ca).expect_err("plain with a CA");
        assert!(
            error.to_string().contains("https://127.0.0.1:7070"),
            "{error}"
        );
        let error = endpoint("ftp://host:1", &plain).expect_err("another scheme");
        assert!(
            error.to_string().contains("neither http nor https"),
            "{error}"
        );
    }

    #[test]
    fn tls_mistakes_are_named_with_their_fix() {
        let plain = ClientTls::default();
        let with_ca = ClientTls::new(Some("ca.pem".into()), None, None);
        assert!(explain("invalid peer certificate: UnknownIssuer", &with_ca).contains("--tls-ca"));
        assert!(
            explain(
                "received corrupt message of type InvalidContentType",
                &with_ca
            )
            .contains("does not speak TLS")
        );
        assert!(explain("connection reset by peer", &plain).contains("https://"));
        assert!(explain("tcp connect error: Connection refused", &plain).contains("AM runs"));
        assert!(explain("Timeout expired", &plain).contains("no answer in time"));
    }
}
