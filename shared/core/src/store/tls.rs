//! TLS to Postgres as libpq's `sslmode` and `sslrootcert` define it, with rustls.
//!
//! tokio-postgres knows only `disable`/`prefer`/`require` and no `sslrootcert`, so both are
//! read here from `DATABASE_URL` (URL query or `key=value` form), removed, and turned into a
//! rustls connector:
//! - `disable`: no TLS.
//! - `prefer` (the default, as in libpq) and `require`: encrypted, the certificate not checked;
//!   `require` with an `sslrootcert` file checks the chain (libpq's rule).
//! - `verify-ca`: the chain must lead to a root in `sslrootcert`; any host name.
//! - `verify-full`: the chain and the host name.
//!
//! `sslrootcert` is a PEM file (e.g. the RDS CA bundle, for direct RDS connections), or
//! `system` / absent for the system's roots (RDS Proxy's certificates come from ACM, which the
//! system roots cover).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Result<Self, TlsError> {
        Ok(match v {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => return Err(TlsError::Mode(other.to_owned())),
        })
    }
}

/// A `DATABASE_URL` that cannot be used. Never echoes the URL (it may hold a password).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("sslmode {0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    Mode(String),
    #[error("sslrootcert {path}: {why}")]
    RootCert { path: String, why: String },
    #[error("no system root certificates could be loaded ({0}); set sslrootcert to a CA file")]
    NoSystemRoots(String),
    #[error("DATABASE_URL is not a valid Postgres URL: {0}")]
    Url(String),
    #[error("TLS setup: {0}")]
    Rustls(String),
}

/// A parsed `DATABASE_URL`: the tokio-postgres config and its TLS settings.
#[derive(Debug, Clone)]
pub struct DbUrl {
    pub config: tokio_postgres::Config,
    pub mode: SslMode,
    /// `None`: the system's roots.
    pub root_cert: Option<PathBuf>,
}

impl DbUrl {
    pub fn parse(url: &str) -> Result<Self, TlsError> {
        let (rest, mode, root) = split_tls_params(url);
        let mode = mode.as_deref().map(SslMode::parse).transpose()?.unwrap_or(SslMode::Prefer);
        let mut config: tokio_postgres::Config =
            rest.parse().map_err(|e: tokio_postgres::Error| TlsError::Url(e.to_string()))?;
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let root_cert = root.filter(|r| r != "system").map(PathBuf::from);
        Ok(Self { config, mode, root_cert })
    }

    /// The connector for this URL's mode (loads `sslrootcert` now: a bad file fails here).
    pub fn connector(&self) -> Result<MakeRustlsConnect, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let verifier: Arc<dyn ServerCertVerifier> = match (self.mode, &self.root_cert) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => {
                Arc::new(Unverified(provider.signature_verification_algorithms))
            }
            (SslMode::Require | SslMode::VerifyCa, _) => Arc::new(ChainOnly(self.webpki(&provider)?)),
            (SslMode::VerifyFull, _) => self.webpki(&provider)?,
        };
        let config = builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth();
        Ok(MakeRustlsConnect::new(config))
    }

    fn webpki(&self, provider: &Arc<CryptoProvider>) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
        let roots = Arc::new(self.roots()?);
        WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| TlsError::Rustls(e.to_string()))
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut store = RootCertStore::empty();
        match &self.root_cert {
            Some(path) => {
                let bad = |why: String| TlsError::RootCert { path: path.display().to_string(), why };
                let certs = CertificateDer::pem_file_iter(path)
                    .map_err(|e| bad(e.to_string()))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(e.to_string()))?;
                let (added, _) = store.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(bad("holds no usable PEM certificate".into()));
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                store.add_parsable_certificates(found.certs);
                if store.is_empty() {
                    return Err(TlsError::NoSystemRoots(format!("{:?}", found.errors)));
                }
            }
        }
        Ok(store)
    }
}

/// The URL without `sslmode` and `sslrootcert`, and their values.
fn split_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut take = |k: &str, v: &str| match k {
        "sslmode" => {
            mode = Some(percent_decode(v));
            true
        }
        "sslrootcert" => {
            root = Some(percent_decode(v));
            true
        }
        _ => false,
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else { return (url.to_owned(), None, None) };
        let kept: Vec<&str> =
            query.split('&').filter(|p| !p.split_once('=').is_some_and(|(k, v)| take(k, v))).collect();
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        (rest, mode, root)
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|p| !p.split_once('=').is_some_and(|(k, v)| take(k.trim(), v.trim())))
            .collect();
        (kept.join(" "), mode, root)
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `prefer` and `require` without a CA: encryption without authentication, as libpq does. The
/// handshake's signatures are still checked (the peer holds the certificate's key).
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the full check, except that a certificate for another host name is accepted
/// (webpki checks the chain before the name, so a name error means the chain held).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_read_and_removed_in_both_url_forms() {
        let u = DbUrl::parse(
            "postgres://u:p@db:5432/relay?sslmode=verify-full&sslrootcert=%2Fopt%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(u.mode, SslMode::VerifyFull);
        assert_eq!(u.root_cert, Some(PathBuf::from("/opt/ca.pem")));
        assert_eq!(u.config.get_application_name(), Some("x"));
        assert_eq!(u.config.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        let u = DbUrl::parse("host=db user=u sslmode=verify-ca sslrootcert=system").unwrap();
        assert_eq!((u.mode, u.root_cert), (SslMode::VerifyCa, None));
        let u = DbUrl::parse("postgres://u@db/relay").unwrap();
        assert_eq!(u.mode, SslMode::Prefer, "libpq's default");
        let u = DbUrl::parse("postgres://u@db/relay?sslmode=disable").unwrap();
        assert_eq!(u.config.get_ssl_mode(), tokio_postgres::config::SslMode::Disable);
        let e = DbUrl::parse("postgres://u:s3cret@db/relay?sslmode=verify").unwrap_err().to_string();
        assert!(e.contains("\"verify\"") && !e.contains("s3cret"), "{e}");
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let u = DbUrl::parse("postgres://u@db/relay?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").unwrap();
        let e = u.connector().err().expect("no such file").to_string();
        assert!(e.starts_with("sslrootcert /nonexistent/ca.pem:"), "{e}");
        let empty = std::env::temp_dir().join(format!("relay-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let u =
            DbUrl::parse(&format!("postgres://u@db/relay?sslmode=verify-ca&sslrootcert={}", empty.display())).unwrap();
        let e = u.connector().err().expect("no certificate").to_string();
        let _ = std::fs::remove_file(&empty);
        assert!(e.contains("no usable PEM certificate"), "{e}");
    }
}
