//! Slots: the kcp processes that serve one shard, at most two at a time (the active one and, in a
//! roll, the next one), all on the shard's store and behind its front.
//!
//! - [`args`]: the kcp command line, with the flags that make two slots safe side by side.
//! - [`material`]: the shared key material every slot root is seeded with before it starts.
//! - [`identity`]: kcpshard's admin identity, the token file every slot accepts it from, and the
//!   kubeconfig through the front that carries it.
//! - [`access`]: readiness on a slot's own port, the controllers lease and the workspace probe.
//! - [`backlog`]: how much work kcp's controllers have queued (a new leader catching up).
//! - [`schemas`]: kcp's own schemas as a kcp serves them, and what changed between two readings.
//! - [`serving`]: whether a slot that answers `/readyz` also serves kcp's own APIs, and whether a
//!   slot that does not is broken (restart it) or slow (wait).
//!
//! Processes themselves are started, recorded and stopped by [`crate::process::Runtime`].
pub mod access;
pub mod args;
pub mod backlog;
pub mod identity;
pub mod material;
pub mod schemas;
pub mod serving;
pub mod sharded;

use std::path::PathBuf;
use std::time::Duration;

pub use access::{
    admin_client, client_for_context, config_for_context, controllers_lease_holder, probe_workspace, readyz,
    release_controllers_lease, shard_admin_client, slot_ready, slot_url,
};
pub use args::{ArgsError, SlotLaunch, kcp_args};
pub use material::{SHARED_FILES, capture_shared, seed_root};
pub use serving::{NotServingKind, serves_kcp_apis};

/// Failures talking to a slot.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("building a client: {0}")]
    Client(String),
    #[error("{method} {path}: no answer: {message}")]
    Unreachable {
        method: String,
        path: String,
        message: String,
    },
    #[error("{method} {path}: HTTP {status}: {body}")]
    Unexpected {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error(
        "probe workspace {workspace} not Ready within {waited:?} (phase {phase:?}): is a slot leading the controllers?"
    )]
    ProbeTimeout {
        workspace: String,
        phase: String,
        waited: Duration,
    },
}

/// A slot that does not serve (yet): the request that failed and what answered it, in words a
/// Warning event can quote (`GET /clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces?limit=1:
/// HTTP 404: 404 page not found`). [`NotServing::kind`] says whether to restart the slot or wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{request}: {answer}")]
pub struct NotServing {
    /// The request that failed.
    pub request: serving::Request,
    pub answer: serving::Answer,
}
