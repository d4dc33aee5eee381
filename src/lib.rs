//! kcpshard runs a kcp shard as blue/green *slots* behind a *front*, on a shared *store*, and rolls it
//! to a new version or a restart without a failed request.
//!
//! How the pieces fit:
//! - [`adopt`] reads a kcp that runs now from its root directory: what taking it over would take.
//! - [`api`] holds the `KcpShard` type (`kcpshard.io/v1alpha1`), its CRD and the checks its schema
//!   cannot express.
//! - [`apiserver`] serves a small, real Kubernetes API from files under the state dir, so that the
//!   unmodified `kubectl`, kube-runtime and GitOps tools can read and write `KcpShard` objects on a
//!   single host with no cluster.
//! - [`cli`] is the `kcpshard` command: `serve`, `crd`, and thin kubectl-like clients.
//! - [`gitops`] keeps a directory of KcpShard manifests (a git checkout) applied to the API, for
//!   `serve --manifests DIR`.
//! - [`readiness`] is what serve's `/readyz` says, and the probe endpoint of a serve without a
//!   local API (`serve --kubeconfig`).
pub mod adopt;
pub mod api;
pub mod apiserver;
pub mod cli;
pub mod controller;
pub mod errors;
pub mod front;
pub mod fsutil;
pub mod gitops;
pub mod process;
pub mod readiness;
pub mod slot;
pub mod store;
