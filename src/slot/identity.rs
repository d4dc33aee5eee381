//! kcpshard's admin identity for a shard: one bearer token that every slot accepts, so that the
//! kubeconfig users reach kcp with through the front keeps working across rolls, restarts and new
//! slots (kcp's own kcp-admin token is new in every process: docs/background.md section 2).
//!
//! - kcp reads a static token file at start, `--token-auth-file` (allowed by kcp's flag filter,
//!   `pkg/server/options/flags.go:83`; read once by `tokenfile.NewCSV`, one line per token:
//!   `token,user,uid,"group1,group2"`). Each slot gets its own file, written before it starts, with
//!   the identities its template accepts; a running slot keeps accepting what it started with.
//! - The identity is kcp-admin as kcp makes it: user `kcp-admin` in group `system:kcp:admin`
//!   (`pkg/server/options/authentication.go:116-122`), which kcp binds to cluster-admin in every
//!   workspace (`pkg/authorization/bootstrap/policy.go:61`). It is not in `system:masters`, so kcp
//!   records it as a workspace's owner (`pkg/admission/workspace/admission.go:96-107`) and its
//!   workspaces reach Ready (docs/background.md section 10).
//! - A bearer token, not a client certificate, because it passes through either front: kcpshard's
//!   TCP front forwards TLS as is, but caddy terminates TLS, so a client certificate would never
//!   reach kcp.
//!
//! The token is a secret: [`Identity`] never prints it (Debug shows the id only); it lives in files
//! that are 0600 (the shard's identity record, each slot's token file, the front kubeconfig) and
//! never in an argument, a status, an event or a log line.
use std::io;
use std::path::Path;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::fsutil;

/// The user kcp's own admin battery calls its kcp admin (`authentication.go:48`).
pub const USER: &str = "kcp-admin";
/// kcp's global admin group (`pkg/authorization/bootstrap/policy.go:35`).
pub const GROUP: &str = "system:kcp:admin";
/// The kubeconfig contexts users reach kcp with as this identity, as kcp names them in its own
/// `admin.kubeconfig` (`authentication.go:207-212`).
pub const CONTEXTS: [&str; 2] = ["root", "base"];

/// One admin identity: a random token and a short id that names it where the token may not go
/// (slot templates, events, conditions).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    pub id: String,
    token: String,
    pub issued_at: DateTime<Utc>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("id", &self.id)
            .field("token", &"<secret>")
            .field("issued_at", &self.issued_at)
            .finish()
    }
}

impl Identity {
    /// A new identity: 32 random bytes as the token, 4 more as its id.
    pub fn issue(now: DateTime<Utc>) -> io::Result<Identity> {
        let random = |n: usize| -> io::Result<Vec<u8>> {
            let mut bytes = vec![0u8; n];
            getrandom::fill(&mut bytes).map_err(io::Error::other)?;
            Ok(bytes)
        };
        let hex = |bytes: Vec<u8>| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        Ok(Identity {
            id: hex(random(4)?),
            token: hex(random(32)?),
            issued_at: now,
        })
    }

    /// The bearer token. Only for the files that must hold it.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// kcp's user id for this identity: a fixed one, so that the same identity is the same user
    /// on every slot (kcp's own kcp-admin gets a random uid per process).
    pub fn uid(&self) -> String {
        format!("kcpshard:{}", self.id)
    }
}

/// The `--token-auth-file` content for a slot that accepts `identities`: one line each.
pub fn token_file(identities: &[&Identity]) -> String {
    identities
        .iter()
        .map(|i| format!("{},{USER},{},{GROUP}\n", i.token, i.uid()))
        .collect()
}

/// Writes [`token_file`] and the lines `also` to `path` (0600, atomically) before the slot that
/// reads it starts.
pub fn write_token_file(path: &Path, identities: &[&Identity], also: &str) -> io::Result<()> {
    if identities.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: a slot must accept at least one admin identity", path.display()),
        ));
    }
    fsutil::write_atomically(path, (token_file(identities) + also).as_bytes())
}

/// What the kubeconfig through the front says.
pub struct FrontKubeconfig<'a> {
    /// `https://<front>`: the shard URL every slot advertises.
    pub front_url: &'a str,
    /// The shard's serving certificate (`shared/apiserver.crt`), which clients pin as their CA.
    pub ca_pem: &'a [u8],
    /// kcpshard's admin identity, for the `root` and `base` contexts.
    pub identity: &'a Identity,
    /// The shard admin's persistent token (kcp's `shard-admin`), for `system:admin` and
    /// `shard-base`.
    pub shard_admin_token: &'a str,
}

impl FrontKubeconfig<'_> {
    /// The kubeconfig as YAML, the same bytes for the same inputs (so an unchanged identity never
    /// rewrites the file). Users, clusters and contexts as kcp's own `admin.kubeconfig` names them
    /// (`authentication.go:183-220`).
    pub fn render(&self) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem);
        let base = self.front_url.trim_end_matches('/');
        let cluster = |name: &str, server: String| json!({ "name": name, "cluster": { "server": server, "certificate-authority-data": ca } });
        let context = |name: &str, cluster: &str, user: &str| json!({ "name": name, "context": { "cluster": cluster, "user": user } });
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                cluster("root", format!("{base}/clusters/root")),
                cluster("base", base.to_string()),
                cluster("system:admin", format!("{base}/clusters/system:admin")),
            ],
            "users": [
                { "name": USER, "user": { "token": self.identity.token } },
                { "name": super::access::SHARD_ADMIN_USER, "user": { "token": self.shard_admin_token } },
            ],
            "contexts": [
                context("root", "root", USER),
                context("base", "base", USER),
                context("system:admin", "system:admin", super::access::SHARD_ADMIN_USER),
                context(super::access::SHARD_ADMIN_CONTEXT, "base", super::access::SHARD_ADMIN_USER),
            ],
            "current-context": "root",
        });
        serde_yaml::to_string(&config).expect("a kubeconfig serialises")
    }
}

/// The shard admin's token from a kcp `admin.kubeconfig` (the shard's `shared/` copy), if it has
/// one.
pub fn shard_admin_token(kubeconfig_yaml: &[u8]) -> Option<String> {
    user_token(kubeconfig_yaml, super::access::SHARD_ADMIN_USER)
}

/// The token of `user` in a kubeconfig, if it has one.
pub fn user_token(kubeconfig_yaml: &[u8], user: &str) -> Option<String> {
    let config: serde_yaml::Value = serde_yaml::from_slice(kubeconfig_yaml).ok()?;
    config["users"]
        .as_sequence()?
        .iter()
        .find(|u| u["name"].as_str() == Some(user))?["user"]["token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn identity() -> Identity {
        Identity::issue(Utc::now()).unwrap()
    }

    #[test]
    fn identities_are_random_and_never_print_their_token() {
        let (a, b) = (identity(), identity());
        assert_ne!(a.token(), b.token());
        assert_ne!(a.id, b.id);
        assert_eq!(a.token().len(), 64);
        assert_eq!(a.id.len(), 8);
        let shown = format!("{a:?} {:#?}", vec![&a]);
        assert!(shown.contains(&a.id), "{shown}");
        assert!(!shown.contains(a.token()), "{shown}");
        assert!(!shown.contains(&a.token()[..16]), "{shown}");
    }

    #[test]
    fn the_token_file_has_one_kcp_admin_line_per_accepted_identity() {
        let (old, new) = (identity(), identity());
        let text = token_file(&[&old, &new]);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        for (line, identity) in lines.iter().zip([&old, &new]) {
            // token, user name, uid, groups: what tokenfile.NewCSV reads.
            assert_eq!(line, &vec![identity.token(), USER, identity.uid().as_str(), GROUP]);
        }
    }

    #[test]
    fn the_token_file_is_private_and_never_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("slots/a/admin-tokens.csv");
        let id = identity();
        write_token_file(&path, &[&id], "").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), token_file(&[&id]));
        assert!(write_token_file(&path, &[], "").is_err());
    }

    #[test]
    fn the_front_kubeconfig_has_the_identity_in_root_and_base_and_the_shard_admin_beside_it() {
        let id = identity();
        let yaml = FrontKubeconfig {
            front_url: "https://127.0.0.1:6443",
            ca_pem: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            identity: &id,
            shard_admin_token: "shard-admin-token",
        }
        .render();
        let config: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        let find = |list: &str, name: &str| -> serde_yaml::Value {
            config[list]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|e| e["name"].as_str() == Some(name))
                .unwrap_or_else(|| panic!("no {list} {name} in\n{yaml}"))
                .clone()
        };
        assert_eq!(config["current-context"].as_str(), Some("root"));
        for (context, server) in [
            ("root", "https://127.0.0.1:6443/clusters/root"),
            ("base", "https://127.0.0.1:6443"),
        ] {
            let ctx = find("contexts", context);
            assert_eq!(ctx["context"]["user"].as_str(), Some(USER));
            let cluster = find("clusters", ctx["context"]["cluster"].as_str().unwrap());
            assert_eq!(cluster["cluster"]["server"].as_str(), Some(server));
            let ca = cluster["cluster"]["certificate-authority-data"].as_str().unwrap();
            let ca = base64::engine::general_purpose::STANDARD.decode(ca).unwrap();
            assert!(String::from_utf8(ca).unwrap().contains("BEGIN CERTIFICATE"));
        }
        assert_eq!(find("users", USER)["user"]["token"].as_str(), Some(id.token()));
        assert_eq!(
            find("contexts", "system:admin")["context"]["user"].as_str(),
            Some("shard-admin")
        );
        assert_eq!(
            find("contexts", "shard-base")["context"]["cluster"].as_str(),
            Some("base")
        );
        assert_eq!(shard_admin_token(yaml.as_bytes()).as_deref(), Some("shard-admin-token"));
    }

    #[test]
    fn the_same_identity_renders_the_same_bytes() {
        let id = identity();
        let render = || {
            FrontKubeconfig {
                front_url: "https://127.0.0.1:6443",
                ca_pem: b"ca",
                identity: &id,
                shard_admin_token: "t",
            }
            .render()
        };
        assert_eq!(render(), render());
    }

    #[test]
    fn a_kubeconfig_without_the_shard_admin_has_no_shard_admin_token() {
        assert_eq!(shard_admin_token(b"users: [{name: kcp-admin, user: {token: x}}]"), None);
        assert_eq!(shard_admin_token(b"not: [yaml"), None);
    }
}
