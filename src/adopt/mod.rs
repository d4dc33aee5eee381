//! Taking over a kcp that runs now, from its root directory (docs/how-to/adopt.md, "Adopt a running
//! kcp"): what it has that an adoption takes, and what would make an adoption unsafe.
//!
//! - [`inspect`] reads a kcp root directory and the process that serves from it: its flags, its
//!   version, its key material, the tokens its clients hold and its store, which it reads (a key
//!   count) to prove it can. It writes nothing, there or anywhere.
//! - [`Found::refusals`] says what kcpshard cannot adopt and why: a kcp of another version than the
//!   shard's, a shard of a sharded kcp, a process kcpshard cannot signal.
//! - [`report`] prints both for `kcpshard adopt --dry-run`.
//!
//! An adoption takes the files as they are (every slot serves the same certificate and accepts the
//! same tokens: docs/background.md section 2) and leaves the old root directory as it was, so that
//! starting the old kcp again is the way back.
pub mod flags;
mod inspect;
pub mod report;

use std::path::PathBuf;

pub use inspect::{inspect, token_lines};

use crate::store::etcd::EtcdCluster;
use flags::Flag;

/// A kcp found serving from a root directory, and what an adoption would take from it.
#[derive(Debug, Clone)]
pub struct Found {
    /// The root directory, absolute.
    pub root_dir: PathBuf,
    pub process: RunningKcp,
    /// Its flags, in the order it was given them.
    pub flags: Vec<Flag>,
    pub store: OldStore,
    /// What the store held when it was read.
    pub store_size: StoreSize,
    /// The key material every slot will share, by the name kcpshard gives it (slot/material.rs),
    /// and where the old process has it.
    pub material: Vec<(&'static str, PathBuf)>,
    /// The contexts of the old admin kubeconfig, each with its user.
    pub contexts: Vec<(String, String)>,
    /// The static token file the old process accepted (`--token-auth-file`), absolute.
    pub token_file: Option<PathBuf>,
    /// Its lines.
    pub static_tokens: usize,
}

/// The kcp process that serves from the root directory.
#[derive(Debug, Clone)]
pub struct RunningKcp {
    pub pid: u32,
    pub uid: u32,
    /// Its binary (the one it runs, even if the file was replaced since).
    pub exe: PathBuf,
    /// Its release, e.g. "v0.31.2", as its binary says (`kcp --version`).
    pub version: String,
    /// Where clients reach it: `https://<bind-address>:<secure-port>`.
    pub url: String,
}

/// The store the old process keeps its data in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldStore {
    /// Its embedded etcd: data in `directory`, clients with the certificates it made there.
    Embedded { directory: PathBuf, cluster: EtcdCluster },
    /// The etcd (or kine) of its `--etcd-servers`.
    Servers(EtcdCluster),
}

impl OldStore {
    pub fn cluster(&self) -> &EtcdCluster {
        match self {
            OldStore::Embedded { cluster, .. } | OldStore::Servers(cluster) => cluster,
        }
    }
}

impl std::fmt::Display for OldStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OldStore::Embedded { directory, cluster } => write!(
                f,
                "its embedded etcd ({}, data in {})",
                cluster.endpoints.join(", "),
                directory.display()
            ),
            OldStore::Servers(cluster) => write!(f, "the etcd API at {}", cluster.endpoints.join(", ")),
        }
    }
}

/// Keys under kcp's prefix, and the store's revision then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreSize {
    pub keys: i64,
    pub revision: i64,
}

/// Why a root directory cannot be adopted. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("{dir}: {source}")]
    Io { dir: PathBuf, source: std::io::Error },
    #[error(
        "{dir} is not a kcp root directory: it has no {missing} (kcp writes it at its first start); name the directory kcp runs with (its --root-directory)"
    )]
    NotAKcpRoot { dir: PathBuf, missing: String },
    #[error(
        "no kcp runs with the root directory {dir}: start it as it ran before (kcp start --root-directory={dir} ...), so that its data can be read while it serves"
    )]
    NotRunning { dir: PathBuf },
    #[error(
        "{} kcp processes run with the root directory {dir} (pids {pids:?}): stop all but the one that serves",
        pids.len()
    )]
    ManyProcesses { dir: PathBuf, pids: Vec<u32> },
    #[error(
        "cannot tell the release of kcp pid {pid} ({exe} --version: {cause}); kcpshard adopts only a kcp whose release it knows"
    )]
    VersionUnknown { pid: u32, exe: PathBuf, cause: String },
    #[error("{dir}: {problem}")]
    Unreadable { dir: PathBuf, problem: String },
    #[error("cannot read kcp's store, {store}: {cause}")]
    StoreUnreadable { store: String, cause: String },
    #[error(
        "kcp {found} runs on {dir}, and the shard is to run {wanted}: adopt it at the release it runs (--version {found}), then roll to {wanted} by changing spec.version"
    )]
    OtherVersion {
        dir: PathBuf,
        found: String,
        wanted: String,
    },
    #[error("kcp on {dir} is a shard of a sharded kcp ({flag}): kcpshard adopts a kcp that is its own root shard only")]
    NotARootShard { dir: PathBuf, flag: String },
    #[error(
        "kcpshard cannot signal kcp pid {pid} (uid {uid}): {cause}; run kcpshard as root or as the user that runs kcp, which must stop it at the switch"
    )]
    CannotSignal { pid: u32, uid: u32, cause: String },
}

impl Found {
    /// What forbids adopting this kcp into a shard of kcp `version`. Empty when it can be adopted.
    pub fn refusals(&self, version: &str) -> Vec<AdoptError> {
        let mut refusals = Vec::new();
        if self.process.version != version {
            refusals.push(AdoptError::OtherVersion {
                dir: self.root_dir.clone(),
                found: self.process.version.clone(),
                wanted: version.to_string(),
            });
        }
        let not_root = match flags::value(&self.flags, "shard-name") {
            Some(name) if name != "root" => Some(format!("--shard-name={name}")),
            _ => flags::value(&self.flags, "root-shard-kubeconfig-file")
                .map(|file| format!("--root-shard-kubeconfig-file={file}")),
        };
        if let Some(flag) = not_root {
            refusals.push(AdoptError::NotARootShard {
                dir: self.root_dir.clone(),
                flag,
            });
        }
        // Signal 0 checks the permission to signal without sending one.
        let pid = nix::unistd::Pid::from_raw(self.process.pid as i32);
        if let Err(errno) = nix::sys::signal::kill(pid, None) {
            refusals.push(AdoptError::CannotSignal {
                pid: self.process.pid,
                uid: self.process.uid,
                cause: errno.desc().to_string(),
            });
        }
        refusals
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::store::etcd::EtcdTls;

    /// A kcp v0.31.2 as inspect would find it, serving as this test process (which it can signal).
    pub fn found() -> Found {
        let argv: Vec<String> = "kcp start --root-directory=/r --secure-port=6443 --feature-gates=A=true"
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Found {
            root_dir: "/r".into(),
            process: RunningKcp {
                pid: std::process::id(),
                uid: 0,
                exe: "/usr/bin/kcp".into(),
                version: "v0.31.2".into(),
                url: "https://127.0.0.1:6443".into(),
            },
            flags: flags::parse(&argv),
            store: OldStore::Embedded {
                directory: "/r/etcd-server".into(),
                cluster: EtcdCluster {
                    endpoints: vec!["https://localhost:2379".into()],
                    tls: EtcdTls::default(),
                },
            },
            store_size: StoreSize {
                keys: 812,
                revision: 1234,
            },
            material: vec![("sa.key", PathBuf::from("/r/sa.key"))],
            contexts: vec![("root".into(), "kcp-admin".into())],
            token_file: None,
            static_tokens: 0,
        }
    }

    #[test]
    fn a_kcp_of_the_shards_release_that_is_its_own_root_and_can_be_signalled_is_adoptable() {
        assert!(found().refusals("v0.31.2").is_empty());
    }

    #[test]
    fn another_release_a_shard_of_a_sharded_kcp_and_a_process_out_of_reach_are_refused() {
        let mut kcp = found();
        kcp.flags = flags::parse(&["kcp".into(), "start".into(), "--shard-name=beta".into()]);
        kcp.process.pid = u32::MAX / 2;
        let refusals: Vec<String> = kcp.refusals("v0.31.0").iter().map(ToString::to_string).collect();
        assert_eq!(refusals.len(), 3, "{refusals:#?}");
        assert!(refusals[0].starts_with("kcp v0.31.2 runs on /r, and the shard is to run v0.31.0"));
        assert!(refusals[1].contains("(--shard-name=beta): kcpshard adopts a kcp that is its own root shard only"));
        assert!(refusals[2].starts_with(&format!(
            "kcpshard cannot signal kcp pid {} (uid 0): No such process",
            u32::MAX / 2
        )));

        let mut kcp = found();
        kcp.flags.push(flags::Flag {
            name: "root-shard-kubeconfig-file".into(),
            value: Some("/etc/kcp/root.kubeconfig".into()),
        });
        let refusals = kcp.refusals("v0.31.2");
        assert!(
            matches!(&refusals[..], [AdoptError::NotARootShard { flag, .. }] if flag == "--root-shard-kubeconfig-file=/etc/kcp/root.kubeconfig")
        );
    }
}
