//! The kubeconfig `serve` writes to `<state>/kubeconfig` (0600): the server URL, the CA and the
//! bearer token, so that `kubectl --kubeconfig <state>/kubeconfig get kcpshards` works as is.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use serde_json::json;

use super::pki::Pki;

pub fn write(state_dir: &Path, address: SocketAddr, pki: &Pki) -> anyhow::Result<PathBuf> {
    let host = if address.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        address.ip().to_string()
    };
    let server = match address {
        SocketAddr::V4(_) => format!("https://{host}:{}", address.port()),
        SocketAddr::V6(_) => format!("https://[{host}]:{}", address.port()),
    };
    let ca = base64::engine::general_purpose::STANDARD.encode(&pki.ca_pem);
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kcpshard", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "kcpshard", "user": {"token": pki.token}}],
        "contexts": [{"name": "kcpshard", "context": {"cluster": "kcpshard", "user": "kcpshard"}}],
        "current-context": "kcpshard",
    });
    let path = state_dir.join("kubeconfig");
    let yaml = serde_yaml::to_string(&config)?;
    crate::fsutil::write_atomically(&path, yaml.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}
