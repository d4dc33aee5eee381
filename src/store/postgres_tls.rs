//! TLS for kcpshard's own PostgreSQL connections, with libpq's sslmode meaning what it means to kine
//! (pgx, `pgconn/config.go` configTLS), so that kcpshard never calls a store down that kine reaches:
//! - `require` without a CA file: encrypted, the certificate not checked (a managed cloud database
//!   whose CA is not among the system's roots works, as it does with psql);
//! - `require` with a CA file, and `verify-ca`: the chain is checked against the CA, not the name;
//! - `verify-full`: the chain and the host name.
//!
//! The CA is `spec.store.kinePostgres.caFile` (libpq's sslrootcert, which kine gets in its
//! endpoint), else the system's roots.
use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::StoreError;
use crate::api::SslMode;

/// What of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

impl Check {
    fn for_mode(mode: SslMode, ca_file: Option<&Path>) -> Check {
        match (mode, ca_file) {
            (SslMode::Disable | SslMode::Require, None) => Check::Nothing,
            // libpq: "if a root CA file exists, require behaves like verify-ca".
            (SslMode::Disable | SslMode::Require, Some(_)) | (SslMode::VerifyCa, _) => Check::Chain,
            (SslMode::VerifyFull, _) => Check::ChainAndName,
        }
    }
}

/// The connector for `mode` (anything but disable), trusting `ca_file` or the system's roots.
pub fn connector(
    mode: SslMode,
    ca_file: Option<&Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let check = Check::for_mode(mode, ca_file);
    let chain = match check {
        Check::Nothing => None,
        Check::Chain | Check::ChainAndName => {
            let roots = Arc::new(roots(ca_file)?);
            let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| StoreError::Invalid(format!("TLS for PostgreSQL: {e}")))?;
            Some(verifier)
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Invalid(format!("TLS for PostgreSQL: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SslModeVerifier { check, chain, provider }))
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// The CA certificates in `ca_file`, or the system's roots.
fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    let Some(path) = ca_file else {
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            return Err(StoreError::Invalid(
                "no CA certificates on this system to verify PostgreSQL's certificate with: set spec.store.kinePostgres.caFile to the CA that signed it".into(),
            ));
        }
        return Ok(roots);
    };
    let unusable = |why: String| {
        StoreError::Invalid(format!(
            "spec.store.kinePostgres.caFile {}: {why}; write there the PEM certificate of the CA that signed PostgreSQL's certificate",
            path.display()
        ))
    };
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| unusable(e.to_string()))? {
        let cert = cert.map_err(|e| unusable(e.to_string()))?;
        roots.add(cert).map_err(|e| unusable(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(unusable("it holds no certificate".into()));
    }
    Ok(roots)
}

#[derive(Debug)]
struct SslModeVerifier {
    check: Check,
    /// The chain (and name) verifier, for every check but Nothing.
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SslModeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        let verified = chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        match (self.check, verified) {
            // webpki checks the name only once the chain verified.
            (
                Check::Chain,
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
                )),
            ) => Ok(ServerCertVerified::assertion()),
            (_, verified) => verified,
        }
    }

    // The handshake's signatures are checked in every mode: even unverified, the connection is
    // encrypted to whoever holds the certificate's key.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            signature,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            signature,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sslmode_checks_what_libpq_and_kine_check() {
        let ca = Some(Path::new("/etc/ca.pem"));
        assert_eq!(Check::for_mode(SslMode::Require, None), Check::Nothing);
        assert_eq!(Check::for_mode(SslMode::Require, ca), Check::Chain);
        assert_eq!(Check::for_mode(SslMode::VerifyCa, None), Check::Chain);
        assert_eq!(Check::for_mode(SslMode::VerifyCa, ca), Check::Chain);
        assert_eq!(Check::for_mode(SslMode::VerifyFull, None), Check::ChainAndName);
        assert_eq!(Check::for_mode(SslMode::VerifyFull, ca), Check::ChainAndName);
    }

    #[test]
    fn a_ca_file_that_holds_no_certificate_says_what_to_write_there() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = roots(Some(&empty)).unwrap_err().to_string();
        assert!(
            error.contains("caFile") && error.contains("holds no certificate"),
            "{error}"
        );
        let missing = roots(Some(&dir.path().join("nope.pem"))).unwrap_err().to_string();
        assert!(
            missing.contains("nope.pem") && missing.contains("PEM certificate of the CA"),
            "{missing}"
        );
    }
}
