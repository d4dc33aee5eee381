//! Server-side apply, as kube-apiserver does it for custom resources: a structured merge keyed by
//! the CRD's `x-kubernetes-list-type` / `x-kubernetes-list-map-keys` markers, and field ownership
//! recorded in `metadata.managedFields` for every write (docs/api.md says which parts of
//! Kubernetes' structured-merge-diff this implements, and which not).
//!
//! - [`fieldset`]: field paths, sets of them, and their `fieldsV1` wire form.
//! - [`structure`]: the fields a value sets, and the merge of an applied configuration into the
//!   live object, following the schema.
//! - [`managers`]: who owns what; Update and Apply operations; conflicts.
pub mod fieldset;
pub mod managers;
pub mod structure;

pub use managers::{Conflicts, Managed, Operation, Scope, Writer};
pub use structure::Shape;

/// The annotation `kubectl apply` (client-side) keeps its last configuration in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
