//! A shard of a sharded kcp (docs/architecture.md, "A sharded kcp"): the files and identities that
//! let a root shard, the shards beside it and kcp-front-proxy reach each other.
//!
//! - One trust anchor: every shard of a sharded kcp serves the root shard's serving key pair (a
//!   non-root shard's first slot is seeded with the root's `apiserver.crt`/`apiserver.key` and
//!   `sa.key`), so one CA file verifies every shard, and service-account tokens of one shard
//!   verify on the others, as kcp's `cmd/sharded-test-server` shares them.
//! - One system identity per sharded kcp, issued by kcpshard before the root's first slot: a
//!   bearer token in `system:masters` that every slot of every shard accepts (a line of its
//!   `--token-auth-file`). kcp's own shard-admin token cannot serve: it is made by the root's
//!   first slot, after the root's flags had to name it, and no other shard knows it.
//! - The kubeconfigs a slot's kcp reads at start, in its own root directory beside the
//!   `apiserver.crt` they name (relative, so the path is the slot's own: kcp writes it before it
//!   loads them, in `Complete`).
//! - A requestheader CA and the front-proxy's client certificate: kcp-front-proxy forwards the
//!   users it authenticated itself (client certificates, OIDC) as `X-Remote-*` headers signed by
//!   that certificate (kcp `cmd/sharded-test-server/shard.go:90-93`); every slot trusts the CA.
//!   Bearer tokens pass the front-proxy unchanged and are checked by the shard.
use std::path::Path;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair};
use serde_json::json;

use super::identity::Identity;

/// The system identity's user and group in every shard's token file.
pub const SYSTEM_USER: &str = "kcpshard-shards";
pub const SYSTEM_GROUP: &str = "system:masters";
/// The headers kcp-front-proxy sets for the users it authenticated (its defaults, and the flags
/// kcp's sharded-test-server gives every shard).
pub const USERNAME_HEADER: &str = "X-Remote-User";
pub const GROUP_HEADER: &str = "X-Remote-Group";
pub const EXTRA_HEADERS_PREFIX: &str = "X-Remote-Extra-";
/// The common name of the front-proxy's requestheader client certificate.
pub const FRONT_PROXY_USER: &str = "kcp-front-proxy";

/// In a slot's root directory: the kubeconfigs of [`SlotFiles`].
pub const SHARDS_KUBECONFIG: &str = "sharded-shards.kubeconfig";
pub const EXTERNAL_KUBECONFIG: &str = "sharded-external.kubeconfig";
pub const ROOT_KUBECONFIG: &str = "sharded-root.kubeconfig";
/// The context kcp reads `--root-shard-kubeconfig-file` with (`pkg/server/config.go:288`).
pub const ROOT_SHARD_CONTEXT: &str = "shard-base";

/// The `--token-auth-file` line of the system identity.
pub fn system_token_line(identity: &Identity) -> String {
    format!("{},{SYSTEM_USER},{},{SYSTEM_GROUP}\n", identity.token(), identity.uid())
}

/// A kubeconfig for `server` as the system identity, verifying the server with the CA file `ca`
/// (relative paths are read from the kubeconfig's own directory), with the current context and a
/// `shard-base` one.
pub fn kubeconfig(server: &str, ca: &Path, identity: &Identity) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "base", "cluster": { "server": server.trim_end_matches('/'), "certificate-authority": ca } }],
        "users": [{ "name": SYSTEM_USER, "user": { "token": identity.token() } }],
        "contexts": [
            { "name": "base", "context": { "cluster": "base", "user": SYSTEM_USER } },
            { "name": ROOT_SHARD_CONTEXT, "context": { "cluster": "base", "user": SYSTEM_USER } },
        ],
        "current-context": "base",
    });
    serde_yaml::to_string(&config).expect("a kubeconfig serialises")
}

/// The kubeconfigs a slot of a sharded shard reads, by file name in its root directory.
pub struct SlotFiles<'a> {
    /// This shard's own front: kcp replaces the server by each shard's base URL.
    pub front_url: &'a str,
    /// The front-proxy.
    pub external_url: &'a str,
    /// A non-root shard: the root shard's front.
    pub root_front_url: Option<&'a str>,
}

impl SlotFiles<'_> {
    /// `(file name, content)` of each file, CA `apiserver.crt` beside them.
    pub fn render(&self, identity: &Identity) -> Vec<(&'static str, String)> {
        let ca = Path::new("apiserver.crt");
        let mut files = vec![
            (SHARDS_KUBECONFIG, kubeconfig(self.front_url, ca, identity)),
            (EXTERNAL_KUBECONFIG, kubeconfig(self.external_url, ca, identity)),
        ];
        if let Some(root) = self.root_front_url {
            files.push((ROOT_KUBECONFIG, kubeconfig(root, ca, identity)));
        }
        files
    }
}

/// A CA (for requestheader client certificates) and its key, in PEM.
pub struct Ca {
    pub cert_pem: String,
    pub key_pem: String,
}

fn ca_params() -> CertificateParams {
    crate::apiserver::pki::ca_params_named("kcpshard-front-proxy-requestheader-ca")
}

/// A new requestheader CA.
pub fn new_requestheader_ca() -> Result<Ca, rcgen::Error> {
    let key = KeyPair::generate()?;
    Ok(Ca {
        cert_pem: ca_params().self_signed(&key)?.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The front-proxy's client certificate `(cert, key)`, signed by `ca`'s key.
pub fn front_proxy_client_cert(ca: &Ca) -> Result<(String, String), rcgen::Error> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, FRONT_PROXY_USER);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    let cert = params.signed_by(&key, &Issuer::new(ca_params(), &ca_key))?.pem();
    Ok((cert, key.serialize_pem()))
}

/// kcp-front-proxy's `--mapping-file`: every `/clusters/` request to the shard that holds the
/// workspace (the backend is a placeholder: kcp-front-proxy takes each Shard's base URL,
/// `cmd/sharded-test-server/frontproxy.go:80-87`), over TLS verified with `ca`, with the client
/// certificate whose `X-Remote-*` headers every shard trusts.
pub fn front_proxy_mapping(root_front_url: &str, ca: &Path, client_cert: &Path, client_key: &Path) -> String {
    let mapping = json!([{
        "path": "/clusters/",
        "backend": root_front_url,
        "backend_server_ca": ca,
        "proxy_client_cert": client_cert,
        "proxy_client_key": client_key,
        "user_header": USERNAME_HEADER,
        "group_header": GROUP_HEADER,
        "extra_header_prefix": EXTRA_HEADERS_PREFIX,
    }]);
    serde_yaml::to_string(&mapping).expect("a mapping serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    #[test]
    fn the_system_identity_is_a_system_masters_line_of_the_token_file() {
        let id = Identity::issue(Utc::now()).unwrap();
        let line = system_token_line(&id);
        assert_eq!(
            line,
            format!("{},kcpshard-shards,kcpshard:{},system:masters\n", id.token(), id.id)
        );
    }

    #[test]
    fn slot_kubeconfigs_name_the_ca_beside_them_and_the_root_only_for_a_non_root() {
        let id = Identity::issue(Utc::now()).unwrap();
        let files = SlotFiles {
            front_url: "https://127.0.0.1:7443",
            external_url: "https://127.0.0.1:6443/",
            root_front_url: None,
        }
        .render(&id);
        assert_eq!(
            files.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [SHARDS_KUBECONFIG, EXTERNAL_KUBECONFIG]
        );
        let external: serde_yaml::Value = serde_yaml::from_str(&files[1].1).unwrap();
        assert_eq!(external["clusters"][0]["cluster"]["server"], "https://127.0.0.1:6443");
        assert_eq!(
            external["clusters"][0]["cluster"]["certificate-authority"],
            "apiserver.crt"
        );
        assert_eq!(external["users"][0]["user"]["token"], id.token());
        let files = SlotFiles {
            front_url: "https://127.0.0.1:7444",
            external_url: "https://127.0.0.1:6443",
            root_front_url: Some("https://127.0.0.1:7443"),
        }
        .render(&id);
        let (name, root) = &files[2];
        assert_eq!(*name, ROOT_KUBECONFIG);
        let root: serde_yaml::Value = serde_yaml::from_str(root).unwrap();
        let contexts: Vec<_> = root["contexts"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|c| c["name"].clone())
            .collect();
        assert!(contexts.contains(&ROOT_SHARD_CONTEXT.into()), "{contexts:?}");
    }

    #[test]
    fn the_front_proxy_client_certificate_is_signed_by_the_requestheader_ca() {
        let ca = new_requestheader_ca().unwrap();
        let (cert, key) = front_proxy_client_cert(&ca).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        assert!(key.contains("PRIVATE KEY"));
        assert_ne!(cert, ca.cert_pem);
    }
}
