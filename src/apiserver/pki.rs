//! The API's key material under `<state>/pki/` (0700, files 0600): a CA and a serving certificate made
//! with rcgen on first start and reused after, and the bearer token that the kubeconfig carries.
//!
//! The serving certificate is re-issued only when the hosts it must name change (a new
//! `--api-listen`). The CA's certificate parameters are rebuilt from constants, so re-issuing needs
//! only the CA's key: the issuer name and key identifier come out the same, and old kubeconfigs
//! stay valid.
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::fsutil;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

const CA_COMMON_NAME: &str = "kcpshard-api-ca";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make a certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error(
        "{path} is not a valid key; move it away and restart to make a new CA (every kubeconfig must then be re-read): {source}"
    )]
    BadKey { path: PathBuf, source: rcgen::Error },
    #[error("cannot read random bytes for the API token: {0}")]
    Random(#[from] getrandom::Error),
}

/// The material the server and its kubeconfig need, in PEM.
pub struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub token: String,
}

/// Loads the PKI under `state_dir/pki`, making what is missing. `host` is the address the API
/// listens on; the serving certificate names it along with the loopback names.
pub fn load_or_create(state_dir: &Path, host: IpAddr) -> Result<Pki, PkiError> {
    let dir = state_dir.join("pki");
    create_private_dir(&dir)?;
    let ca_key_path = dir.join("ca.key");
    let ca_key = match read_optional(&ca_key_path)? {
        Some(pem) => KeyPair::from_pem(&pem).map_err(|source| PkiError::BadKey {
            path: ca_key_path.clone(),
            source,
        })?,
        None => {
            let key = KeyPair::generate()?;
            write_private(&ca_key_path, &key.serialize_pem())?;
            let _ = fs::remove_file(dir.join("ca.crt"));
            key
        }
    };
    let ca_pem = match read_optional(&dir.join("ca.crt"))? {
        Some(pem) => pem,
        None => {
            let pem = ca_params().self_signed(&ca_key)?.pem();
            write_private(&dir.join("ca.crt"), &pem)?;
            pem
        }
    };

    let hosts = serving_hosts(host);
    let hosts_path = dir.join("serving.hosts");
    let (cert_path, key_path) = (dir.join("serving.crt"), dir.join("serving.key"));
    let reuse = read_optional(&hosts_path)?.is_some_and(|h| h == hosts.join("\n"));
    let (serving_cert_pem, serving_key_pem) = match (reuse, read_optional(&cert_path)?, read_optional(&key_path)?) {
        (true, Some(cert), Some(key)) => (cert, key),
        _ => {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(hosts.clone())?;
            params.distinguished_name.push(DnType::CommonName, "kcpshard-api");
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let issuer = Issuer::new(ca_params(), &ca_key);
            let cert = params.signed_by(&key, &issuer)?.pem();
            write_private(&key_path, &key.serialize_pem())?;
            write_private(&cert_path, &cert)?;
            write_private(&hosts_path, &hosts.join("\n"))?;
            (cert, key.serialize_pem())
        }
    };

    let token_path = state_dir.join("token");
    let token = match read_optional(&token_path)? {
        Some(token) if !token.trim().is_empty() => token.trim().to_string(),
        _ => {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes)?;
            let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_private(&token_path, &token)?;
            token
        }
    };
    Ok(Pki {
        ca_pem,
        serving_cert_pem,
        serving_key_pem,
        token,
    })
}

fn ca_params() -> CertificateParams {
    ca_params_named(CA_COMMON_NAME)
}

/// The parameters of a local CA named `common_name`, valid from 2025 to 2035, rebuilt the same
/// from constants (so re-issuing under it needs only its key).
pub fn ca_params_named(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Ten years: a local CA that expiring would lock the user out of their own state dir.
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    params
}

fn serving_hosts(host: IpAddr) -> Vec<String> {
    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if !host.is_unspecified() && !hosts.contains(&host.to_string()) {
        hosts.push(host.to_string());
    }
    hosts
}

fn read_optional(path: &Path) -> Result<Option<String>, PkiError> {
    let bytes = fsutil::read_optional(path).map_err(|source| PkiError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

fn write_private(path: &Path, contents: &str) -> Result<(), PkiError> {
    fsutil::write_atomically(path, contents.as_bytes()).map_err(|source| PkiError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    })
}

fn create_private_dir(dir: &Path) -> Result<(), PkiError> {
    fsutil::create_private_dir(dir).map_err(|source| PkiError::Io {
        action: "create directory",
        path: dir.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn material_is_made_once_and_reused_with_private_modes() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), "127.0.0.1".parse().unwrap()).unwrap();
        let second = load_or_create(dir.path(), "127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(first.ca_pem, second.ca_pem);
        assert_eq!(first.serving_cert_pem, second.serving_cert_pem);
        assert_eq!(first.token, second.token);
        assert_eq!(first.token.len(), 64);
        assert_eq!(mode(&dir.path().join("pki")), 0o700);
        for file in [
            "pki/ca.key",
            "pki/ca.crt",
            "pki/serving.key",
            "pki/serving.crt",
            "token",
        ] {
            assert_eq!(mode(&dir.path().join(file)), 0o600, "{file}");
        }
    }

    #[test]
    fn a_new_listen_address_gets_a_new_serving_certificate_from_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), "127.0.0.1".parse().unwrap()).unwrap();
        let second = load_or_create(dir.path(), "127.0.0.2".parse().unwrap()).unwrap();
        assert_eq!(first.ca_pem, second.ca_pem);
        assert_ne!(first.serving_cert_pem, second.serving_cert_pem);
    }
}
