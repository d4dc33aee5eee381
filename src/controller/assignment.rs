//! Which KcpShards this `kcpshard serve` runs: the ones assigned to its host.
//!
//! `spec.host` names the host whose serve starts a shard's slots, store and front; `serve
//! --host-name` says which host a serve is (default: the machine's host name). A shard that
//! names no host belongs to the host of the local API that holds it: a local API is seen by its
//! own host only. On a shared API (`serve --kubeconfig`) every host sees every shard, so a shard
//! without a host is nobody's: no serve takes it, and each says so once in its log, naming the
//! field to set. A shard that names another host is left to that host's serve (logged once too).
//! A shard that is not ours gets no finalizer, no status and no event from this serve.
use std::collections::HashSet;
use std::sync::Mutex;

use crate::api::{HOST_MAX_LENGTH, KcpShard};

/// Where the KcpShards live, as far as assignment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    /// serve's own file-backed API: only this host sees it.
    Local,
    /// An API other hosts' serves read too (`--kubeconfig`).
    Shared,
}

/// Why a shard is not ours.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NotOurs {
    /// `spec.host` names another host.
    OtherHost(String),
    /// A shared API, and the shard names no host.
    NoHost,
}

/// The host this serve is and the kind of API it reads; remembers what it has logged.
#[derive(Debug)]
pub struct Assignment {
    pub host: String,
    pub api: ApiKind,
    /// (uid, why) pairs already logged, so that each is logged once.
    told: Mutex<HashSet<(String, NotOurs)>>,
}

impl Assignment {
    pub fn new(host: String, api: ApiKind) -> Assignment {
        Assignment {
            host,
            api,
            told: Default::default(),
        }
    }

    /// Whether this serve runs a shard with this `spec.host` (pure).
    pub fn judge(&self, spec_host: Option<&str>) -> Result<(), NotOurs> {
        match (spec_host, self.api) {
            (Some(host), _) if host == self.host => Ok(()),
            (Some(host), _) => Err(NotOurs::OtherHost(host.to_string())),
            (None, ApiKind::Local) => Ok(()),
            (None, ApiKind::Shared) => Err(NotOurs::NoHost),
        }
    }

    pub fn takes(&self, shard: &KcpShard) -> bool {
        self.judge(shard.spec.host.as_deref()).is_ok()
    }

    /// Whether `shard` is ours; when it is not, logs why, once per shard and reason.
    /// `runs_here` says whether this host holds state of the shard (it ran here before its host
    /// changed): its processes are left running, and the log says so.
    pub fn check(&self, shard: &KcpShard, runs_here: bool) -> bool {
        let Err(why) = self.judge(shard.spec.host.as_deref()) else {
            return true;
        };
        let name = kube::ResourceExt::name_any(shard);
        let uid = shard.metadata.uid.clone().unwrap_or_else(|| name.clone());
        let new = self
            .told
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((uid, why.clone()));
        if new {
            let host = &self.host;
            match &why {
                NotOurs::OtherHost(other) if runs_here => tracing::warn!(
                    "KcpShard {name} names spec.host {other:?}, not this host ({host:?}), yet its state dir is here: its processes here keep running and are no longer managed. To move a shard, delete it and create it again with the new host"
                ),
                NotOurs::OtherHost(other) => tracing::info!(
                    "KcpShard {name} is for host {other:?}; this serve is {host:?} and leaves it to that host's serve"
                ),
                NotOurs::NoHost => tracing::warn!(
                    "KcpShard {name} names no spec.host: on a shared API no serve runs it. Set spec.host to the --host-name of the serve that should run it (this one is {host:?})"
                ),
            }
        }
        false
    }
}

/// The machine's host name (the kernel's, as `hostname` prints it), lowercased.
pub fn machine_host_name() -> std::io::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    Ok(name.trim().to_ascii_lowercase())
}

/// Checks a `--host-name` against what `spec.host` may hold (the CRD's pattern), with what to do.
pub fn check_host_name(name: &str) -> Result<(), String> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let fits = !name.is_empty()
        && name.len() <= HOST_MAX_LENGTH as usize
        && name.chars().all(|c| alnum(c) || c == '-' || c == '.')
        && name.starts_with(alnum)
        && name.ends_with(alnum);
    if fits {
        Ok(())
    } else {
        Err(format!(
            "host name {name:?} cannot be a spec.host (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most {HOST_MAX_LENGTH} characters): pass --host-name with one that is"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_api_runs_shards_without_a_host_and_those_naming_its_own() {
        let local = Assignment::new("alpha".into(), ApiKind::Local);
        assert_eq!(local.judge(None), Ok(()));
        assert_eq!(local.judge(Some("alpha")), Ok(()));
        assert_eq!(local.judge(Some("beta")), Err(NotOurs::OtherHost("beta".into())));
    }

    #[test]
    fn a_shared_api_runs_only_the_shards_that_name_this_host() {
        let shared = Assignment::new("alpha".into(), ApiKind::Shared);
        assert_eq!(shared.judge(Some("alpha")), Ok(()));
        assert_eq!(shared.judge(None), Err(NotOurs::NoHost));
        assert_eq!(shared.judge(Some("beta")), Err(NotOurs::OtherHost("beta".into())));
    }

    #[test]
    fn a_host_name_must_be_one_that_spec_host_accepts() {
        assert!(check_host_name("build-7.example.org").is_ok());
        for bad in ["", "Alpha", "-a", "a-", "a_b", &"a".repeat(201)] {
            let refused = check_host_name(bad).unwrap_err();
            assert!(refused.contains("--host-name"), "{refused}");
        }
    }
}
