//! The `KcpShard` type (`kcpshard.io/v1alpha1`), its CRD and the checks its schema cannot express.
//!
//! - [`kcpshard`]: the Rust types; their doc comments become the CRD's descriptions.
//! - [`crd`]: the CustomResourceDefinition built from those types, and the exact YAML checked in at
//!   `crds/kcpshards.kcpshard.io.yaml`.
//! - [`validation`]: server-side checks beyond the schema (settings block matches the store type,
//!   addresses parse, durations are sane, no inline secrets).
//! - [`duration`]: the `30s`-style durations the spec uses.
//! - [`version`]: kcp release tags, their order, and which changes `spec.rollout` allows.
pub mod crd;
pub mod duration;
pub mod kcpshard;
pub mod manifest;
pub mod reference;
pub mod status;
pub mod validation;
pub mod version;

pub use crd::{crd, crd_yaml};
pub use duration::{DurationError, parse_duration};
pub use kcpshard::*;
pub use reference::reference_markdown;
pub use status::*;
pub use validation::{validate, validate_update};
pub use version::KcpVersion;
