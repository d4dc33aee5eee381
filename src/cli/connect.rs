//! Finding the API from a kubeconfig, and turning what goes wrong on the way into messages that say
//! what to do.
//!
//! The kubeconfig is, in order: `--kubeconfig`, `$KUBECONFIG` (a list, merged as kubectl does),
//! `$KCPSHARD_STATE_DIR/kubeconfig`, `./.kcpshard/kubeconfig` (what `kcpshard serve` writes by
//! default).
use std::path::PathBuf;

use anyhow::{Context, anyhow};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The group, version and kind of the objects these commands handle.
pub const GROUP: &str = "kcpshard.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "KcpShard";
pub const PLURAL: &str = "kcpshards";
/// How kubectl names the resource in its messages (`kcpshard.kcpshard.io/dev created`).
pub const QUALIFIED: &str = "kcpshard.kcpshard.io";

pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// Kubeconfig of the kcpshard API [default: $KUBECONFIG, else $KCPSHARD_STATE_DIR/kubeconfig,
    /// else ./.kcpshard/kubeconfig]
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

/// A client of one kcpshard API, with what is needed to explain failures.
pub struct Cluster {
    pub client: Client,
    server: String,
    kubeconfig: String,
}

impl Conn {
    fn paths(&self) -> Vec<PathBuf> {
        if let Some(path) = &self.kubeconfig {
            return vec![path.clone()];
        }
        if let Some(list) = std::env::var_os("KUBECONFIG") {
            let paths: Vec<PathBuf> = std::env::split_paths(&list)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            if !paths.is_empty() {
                return paths;
            }
        }
        let state_dir = std::env::var_os("KCPSHARD_STATE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(".kcpshard"));
        vec![state_dir.join("kubeconfig")]
    }

    pub async fn connect(&self) -> anyhow::Result<Cluster> {
        let paths = self.paths();
        let shown = std::env::join_paths(&paths)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{paths:?}"));
        let existing: Vec<&PathBuf> = paths.iter().filter(|p| p.exists()).collect();
        if existing.is_empty() {
            return Err(anyhow!(
                "no kubeconfig at {shown}: start `kcpshard serve --state-dir DIR` (it writes \
                 DIR/kubeconfig), then pass --kubeconfig DIR/kubeconfig or set KCPSHARD_STATE_DIR=DIR"
            ));
        }
        let merged = existing
            .iter()
            .try_fold(Kubeconfig::default(), |merged, path| {
                Kubeconfig::read_from(path).and_then(|next| merged.merge(next))
            })
            .with_context(|| format!("cannot read the kubeconfig {shown}"))?;
        let config = Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("the kubeconfig {shown} is not usable"))?;
        let server = config.cluster_url.to_string();
        let client =
            Client::try_from(config).with_context(|| format!("cannot build a client from the kubeconfig {shown}"))?;
        Ok(Cluster {
            client,
            server,
            kubeconfig: shown,
        })
    }
}

impl Cluster {
    pub fn kcpshards(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &resource())
    }

    /// Turns a client error into what the user should read: the server's own message for API
    /// errors (as kubectl prints it), a hint to start `serve` when nothing answers.
    pub fn explain(&self, err: kube::Error) -> anyhow::Error {
        match err {
            kube::Error::Api(status) => {
                let reason = if status.reason.is_empty() {
                    status.code.to_string()
                } else {
                    status.reason.clone()
                };
                let mut message = format!("Error from server ({reason}): {}", status.message);
                if let Some(details) = &status.details {
                    for cause in &details.causes {
                        if !status.message.contains(&cause.message) {
                            message.push_str(&format!("\n  {}: {}", cause.field, cause.message));
                        }
                    }
                }
                anyhow!(message)
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) => anyhow!(
                "cannot reach the kcpshard API at {}: is `kcpshard serve` running? (kubeconfig: {}): {}",
                self.server,
                self.kubeconfig,
                crate::errors::chain(&err)
            ),
            other => anyhow!(
                "request to the kcpshard API at {} failed: {}",
                self.server,
                crate::errors::chain(&other)
            ),
        }
    }
}

/// True when the error is the server saying the object does not exist.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}
