//! A shard's place in a sharded kcp, as the controller resolves it each look (docs/architecture.md,
//! "A sharded kcp"; the files and flags themselves: `slot/sharded.rs`, `slot/args.rs`).
//!
//! - The root shard (spec.shard.name `root`) holds the sharded kcp's trust under
//!   `shards/<root>/sharded/`: the system identity every shard accepts, the requestheader CA, the
//!   front-proxy's client certificate, and the files kcp-front-proxy is run with. Observe finds
//!   what is missing or out of date ([`Trust::stale`]) and the plan's `WriteTrust` step makes it
//!   ([`Trust::write`]) before the root's first slot starts; it never replaces the identity or
//!   the CA (a new one would cut every slot that started with the old one).
//! - Any other shard names its root (spec.shard.rootShard). Its slots start only once that
//!   KcpShard exists, is a root, is Ready and has its trust (else the plan says Blocked,
//!   `RootShardNotReady`, with what to do); running slots keep serving meanwhile.
//! - A non-root slot serves the root's key pair and accepts the root's admin identities beside
//!   its own ([`seed_from_root`], [`token_lines`]).
use std::path::{Path, PathBuf};

use kube::api::Api;
use kube::{Client, ResourceExt};

use super::credentials::IdentityRecord;
use super::plan::ShardedTemplate;
use super::state::{self, ShardDirs};
use crate::api::KcpShard;
use crate::fsutil;
use crate::slot::args::{RootLinks, ShardedLaunch};
use crate::slot::identity::{self, Identity};
use crate::slot::sharded;

/// The directory of a sharded kcp's trust, in the root shard's state.
pub fn trust_dir(root: &ShardDirs) -> PathBuf {
    root.root().join("sharded")
}

/// What the root's trust directory holds.
pub struct Trust {
    pub dir: PathBuf,
}

impl Trust {
    pub fn of(root: &ShardDirs) -> Trust {
        Trust { dir: trust_dir(root) }
    }
    pub fn identity(&self) -> PathBuf {
        self.dir.join("system-identity.json")
    }
    pub fn requestheader_ca(&self) -> PathBuf {
        self.dir.join("requestheader-ca.crt")
    }
    fn requestheader_ca_key(&self) -> PathBuf {
        self.dir.join("requestheader-ca.key")
    }
    pub fn front_proxy_cert(&self) -> PathBuf {
        self.dir.join("front-proxy-client.crt")
    }
    pub fn front_proxy_key(&self) -> PathBuf {
        self.dir.join("front-proxy-client.key")
    }
    /// kcp-front-proxy's `--root-kubeconfig` and `--shards-kubeconfig`.
    pub fn front_proxy_kubeconfig(&self) -> PathBuf {
        self.dir.join("front-proxy.kubeconfig")
    }
    /// kcp-front-proxy's `--mapping-file`.
    pub fn mapping(&self) -> PathBuf {
        self.dir.join("mapping.yaml")
    }

    /// The system identity, if the root has made it.
    pub fn load_identity(&self) -> std::io::Result<Option<Identity>> {
        state::read_json::<Identity>(&self.identity())
    }

    /// For observe: some of the root's trust is missing, or kcp-front-proxy's kubeconfig or
    /// mapping would change (the root's front moved); `root` is the root's state,
    /// `root_front_url` its front.
    pub fn stale(&self, root: &ShardDirs, root_front_url: &str) -> std::io::Result<bool> {
        let Some(identity) = self.load_identity()? else {
            return Ok(true);
        };
        if !self.requestheader_ca().exists() || !self.front_proxy_cert().exists() {
            return Ok(true);
        }
        for (path, content) in self.front_proxy_files(root, root_front_url, &identity)? {
            if fsutil::read_optional(&path)?.as_deref() != Some(content.as_bytes()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// WriteTrust: makes what is missing of the root's trust and rewrites kcp-front-proxy's files
    /// that would change. The front-proxy's kubeconfig names the root's serving certificate,
    /// which its first slot makes (and kcp-front-proxy is started after the root is Ready).
    pub fn write(&self, root: &ShardDirs, root_front_url: &str) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(&self.dir)?;
        let mut written = Vec::new();
        let identity = match self.load_identity()? {
            Some(identity) => identity,
            None => {
                let identity = Identity::issue(chrono::Utc::now())?;
                state::write_json(&self.identity(), &identity)?;
                written.push(self.identity());
                identity
            }
        };
        if !self.requestheader_ca().exists() || !self.front_proxy_cert().exists() {
            let ca = sharded::new_requestheader_ca().map_err(std::io::Error::other)?;
            let (cert, key) = sharded::front_proxy_client_cert(&ca).map_err(std::io::Error::other)?;
            for (path, pem) in [
                (self.requestheader_ca_key(), &ca.key_pem),
                (self.front_proxy_key(), &key),
                (self.front_proxy_cert(), &cert),
                (self.requestheader_ca(), &ca.cert_pem),
            ] {
                fsutil::write_atomically(&path, pem.as_bytes())?;
                written.push(path);
            }
        }
        for (path, content) in self.front_proxy_files(root, root_front_url, &identity)? {
            if fsutil::read_optional(&path)?.as_deref() != Some(content.as_bytes()) {
                fsutil::write_atomically(&path, content.as_bytes())?;
                written.push(path);
            }
        }
        Ok(written)
    }

    /// kcp-front-proxy's kubeconfig and mapping file, with what they must hold.
    fn front_proxy_files(
        &self,
        root: &ShardDirs,
        root_front_url: &str,
        identity: &Identity,
    ) -> std::io::Result<[(PathBuf, String); 2]> {
        let ca = std::path::absolute(root.shared().join("apiserver.crt"))?;
        let kubeconfig = sharded::kubeconfig(root_front_url, &ca, identity);
        let mapping = sharded::front_proxy_mapping(
            root_front_url,
            &ca,
            &std::path::absolute(self.front_proxy_cert())?,
            &std::path::absolute(self.front_proxy_key())?,
        );
        Ok([(self.front_proxy_kubeconfig(), kubeconfig), (self.mapping(), mapping)])
    }
}

/// The result of [`resolve`].
pub enum Resolved {
    /// Not part of a sharded kcp.
    Alone,
    /// The sharded part of the slot template.
    Sharded(ShardedTemplate),
    /// A non-root shard whose root cannot take it yet, and why.
    RootNotReady(String),
}

/// Resolves `shard`'s spec.shard against its root. Reads only: the root's trust is written by the
/// WriteTrust step.
pub async fn resolve(client: &Client, state_dir: &Path, shard: &KcpShard) -> Result<Resolved, super::Error> {
    let Some(spec) = &shard.spec.shard else {
        return Ok(Resolved::Alone);
    };
    let name = shard.name_any();
    if spec.is_root() {
        return Ok(Resolved::Sharded(ShardedTemplate {
            shard_name: spec.name.clone(),
            external_url: spec.external_url.clone().unwrap_or_default(),
            root_kcp_shard: name,
            root_front_url: None,
            cache_kubeconfig: None,
            root_identities: vec![],
        }));
    }
    let root_name = spec.root_shard.clone().unwrap_or_default();
    let api: Api<KcpShard> = Api::all(client.clone());
    let root = api.get_opt(&root_name).await.map_err(|cause| super::Error::Api {
        what: "read the root shard",
        name: root_name.clone(),
        cause,
    })?;
    let Some(root) = root else {
        return Ok(Resolved::RootNotReady(format!(
            "spec.shard.rootShard names KcpShard {root_name}, which does not exist: apply it (spec.shard.name: root), or fix rootShard; no slot starts until then"
        )));
    };
    let Some(root_spec) = root.spec.shard.as_ref().filter(|s| s.is_root()) else {
        return Ok(Resolved::RootNotReady(format!(
            "spec.shard.rootShard names KcpShard {root_name}, which is not a root shard (its spec.shard.name must be root): name the root shard's KcpShard; no slot starts until then"
        )));
    };
    let ready = root
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let root_dirs = ShardDirs::new(state_dir, &root_name);
    let trust = Trust::of(&root_dirs);
    let root_ids = state::read_json::<IdentityRecord>(&root_dirs.identities())?
        .map(|r| r.identities.iter().map(|i| i.id.clone()).collect::<Vec<_>>())
        .unwrap_or_default();
    if !ready || trust.load_identity()?.is_none() || root_ids.is_empty() {
        return Ok(Resolved::RootNotReady(format!(
            "the root shard, KcpShard {root_name}, is not Ready yet: this shard's slots start once it is"
        )));
    }
    Ok(Resolved::Sharded(ShardedTemplate {
        shard_name: spec.name.clone(),
        external_url: root_spec.external_url.clone().unwrap_or_default(),
        root_kcp_shard: root_name,
        root_front_url: Some(format!("https://{}", root.spec.front.listen)),
        cache_kubeconfig: spec.cache_kubeconfig.clone(),
        root_identities: root_ids,
    }))
}

/// Before a slot of a sharded shard starts in `slot_root`: the root's key pair and service-account
/// key when this shard has none of its own yet (a non-root shard's first slot), and the
/// kubeconfigs it reads; returns the flags that name them.
pub fn prepare_slot(
    state_dir: &Path,
    own: &ShardDirs,
    template: &ShardedTemplate,
    front_url: &str,
    slot_root: &Path,
) -> Result<ShardedLaunch, super::Error> {
    let root_dirs = ShardDirs::new(state_dir, &template.root_kcp_shard);
    let trust = Trust::of(&root_dirs);
    let identity = trust
        .load_identity()?
        .ok_or_else(|| super::Error::NoSystemIdentity { path: trust.identity() })?;
    if template.root_front_url.is_some() {
        seed_from_root(&root_dirs.shared(), &own.shared(), slot_root)?;
    }
    let files = sharded::SlotFiles {
        front_url,
        external_url: &template.external_url,
        root_front_url: template.root_front_url.as_deref(),
    };
    for (name, content) in files.render(&identity) {
        fsutil::write_atomically(&slot_root.join(name), content.as_bytes())?;
    }
    let slot_root = std::path::absolute(slot_root)?;
    let root = template.root_front_url.as_ref().map(|_| {
        let root_kubeconfig = slot_root.join(sharded::ROOT_KUBECONFIG);
        RootLinks {
            cache_kubeconfig: template
                .cache_kubeconfig
                .as_ref()
                .map_or_else(|| root_kubeconfig.clone(), PathBuf::from),
            root_kubeconfig,
        }
    });
    Ok(ShardedLaunch {
        shard_name: template.shard_name.clone(),
        external_url: template.external_url.clone(),
        shards_kubeconfig: slot_root.join(sharded::SHARDS_KUBECONFIG),
        external_kubeconfig: slot_root.join(sharded::EXTERNAL_KUBECONFIG),
        requestheader_ca: std::path::absolute(trust.requestheader_ca())?,
        root,
    })
}

/// The files of the root's material a non-root shard serves with until it has its own copy
/// (which its first ready slot captures): one CA verifies every shard, and service-account tokens
/// verify on every shard.
const FROM_ROOT: [&str; 3] = ["apiserver.crt", "apiserver.key", "sa.key"];

fn seed_from_root(root_shared: &Path, own_shared: &Path, slot_root: &Path) -> std::io::Result<()> {
    if own_shared.join("apiserver.crt").exists() {
        return Ok(());
    }
    for name in FROM_ROOT {
        let Some(bytes) = fsutil::read_optional(&root_shared.join(name))? else {
            return Err(std::io::Error::other(format!(
                "{} is missing: the root shard has not captured its material yet",
                root_shared.join(name).display()
            )));
        };
        fsutil::write_atomically(&slot_root.join(name), &bytes)?;
    }
    Ok(())
}

/// The token-file lines a slot of a sharded shard accepts beside its own admin identities: the
/// system identity, and for a non-root shard the root's admin identities in `template`.
pub fn token_lines(state_dir: &Path, template: &ShardedTemplate) -> Result<String, super::Error> {
    let root_dirs = ShardDirs::new(state_dir, &template.root_kcp_shard);
    let trust = Trust::of(&root_dirs);
    let system = trust
        .load_identity()?
        .ok_or_else(|| super::Error::NoSystemIdentity { path: trust.identity() })?;
    let mut lines = sharded::system_token_line(&system);
    if !template.root_identities.is_empty() {
        let record = state::read_json::<IdentityRecord>(&root_dirs.identities())?.unwrap_or_default();
        let root: Vec<&Identity> = record
            .identities
            .iter()
            .filter(|i| template.root_identities.contains(&i.id))
            .collect();
        lines.push_str(&identity::token_file(&root));
    }
    Ok(lines)
}
