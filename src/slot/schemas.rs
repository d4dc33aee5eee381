//! kcp's own schemas as one kcp serves them, and what changed between two such readings: what a
//! preflight compares between the serving slots and the new version on a copy of the data
//! (docs/how-to/upgrade.md, "The preflight").
//!
//! Read as the shard admin, on a kcp's own port:
//! - the CRDs of kcp's system CRD logical cluster (`system:system-crds`: the bootstrap CRDs kcp
//!   serves in every workspace, e.g. `apibindings.apis.kcp.io` in v0.30), with their
//!   `status.storedVersions`, storage version and served versions;
//! - the APIResourceSchemas and APIExports of every logical cluster (the `*` wildcard, which the
//!   shard admin may list on a shard), or of `root` when the wildcard is refused: their versions
//!   and the schemas an export serves. An APIResourceSchema's name carries its schema's date and
//!   hash, so a rewritten schema shows as one removed and one added.
//!
//! Each object is one line of text keyed by kind, logical cluster and name; two readings are
//! compared line by line.
use std::collections::BTreeMap;

use http::{Method, StatusCode};
use serde_json::Value;

use super::SlotError;
use super::access::{call, unexpected};

pub const SYSTEM_CRDS: &str = "/clusters/system:system-crds/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const RESOURCE_SCHEMAS: &str = "/apis/apis.kcp.io/v1alpha1/apiresourceschemas";
const EXPORTS: &str = "/apis/apis.kcp.io/v1alpha2/apiexports";
/// The annotation kcp puts on every object with its logical cluster.
const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";

/// One reading: `"<Kind> <cluster>|<name>"` -> what matters of it.
pub type Schemas = BTreeMap<String, String>;

/// Reads kcp's own schemas through `client` (the shard admin of one kcp, on its own port).
pub async fn read(client: &kube::Client) -> Result<Schemas, SlotError> {
    let mut schemas = Schemas::new();
    for item in list(client, SYSTEM_CRDS).await? {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        };
        let versions = item["spec"]["versions"].as_array().cloned().unwrap_or_default();
        let storage: Vec<String> = versions
            .iter()
            .filter(|v| v["storage"] == true)
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        let served: Vec<String> = versions
            .iter()
            .filter(|v| v["served"] == true)
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        schemas.insert(
            key("CRD", &item),
            format!(
                "storedVersions [{}], storage {}, served [{}]",
                strings(&item["status"]["storedVersions"]).join(" "),
                storage.join(" "),
                served.join(" ")
            ),
        );
    }
    for item in list_everywhere(client, RESOURCE_SCHEMAS).await? {
        let versions: Vec<String> = item["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                let name = v["name"].as_str().unwrap_or_default();
                if v["storage"] == true {
                    format!("{name} (storage)")
                } else {
                    name.to_string()
                }
            })
            .collect();
        schemas.insert(
            key("APIResourceSchema", &item),
            format!("versions [{}]", versions.join(" ")),
        );
    }
    for item in list_everywhere(client, EXPORTS).await? {
        let mut resources: Vec<String> = item["spec"]["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{}.{}={}",
                    r["name"].as_str().unwrap_or_default(),
                    r["group"].as_str().unwrap_or_default(),
                    r["schema"].as_str().unwrap_or_default()
                )
            })
            .collect();
        resources.sort();
        schemas.insert(key("APIExport", &item), format!("resources [{}]", resources.join(" ")));
    }
    Ok(schemas)
}

fn key(kind: &str, item: &Value) -> String {
    let cluster = item["metadata"]["annotations"][CLUSTER_ANNOTATION]
        .as_str()
        .unwrap_or("system:system-crds");
    format!(
        "{kind} {cluster}|{}",
        item["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// The objects at `/clusters/*<path>`, or at `/clusters/root<path>` if the wildcard is refused.
async fn list_everywhere(client: &kube::Client, path: &str) -> Result<Vec<Value>, SlotError> {
    match list(client, &format!("/clusters/*{path}")).await {
        Ok(items) => Ok(items),
        Err(SlotError::Unexpected { status: 403 | 404, .. }) => list(client, &format!("/clusters/root{path}")).await,
        Err(e) => Err(e),
    }
}

async fn list(client: &kube::Client, path: &str) -> Result<Vec<Value>, SlotError> {
    let (status, body) = call(client, Method::GET, path, None).await?;
    if status != StatusCode::OK {
        return Err(unexpected("GET", path, status, &body));
    }
    let list: Value = serde_json::from_slice(&body).map_err(|e| SlotError::Client(format!("GET {path}: {e}")))?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// What changed from `before` to `after`, one line each: added, removed, changed.
pub fn changes(before: &Schemas, after: &Schemas) -> Vec<String> {
    let mut lines = Vec::new();
    for (key, now) in after {
        match before.get(key) {
            None => lines.push(format!("added {key}: {now}")),
            Some(was) if was != now => lines.push(format!("changed {key}: {was} -> {now}")),
            Some(_) => {}
        }
    }
    for (key, was) in before {
        if !after.contains_key(key) {
            lines.push(format!("removed {key}: {was}"));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_name_what_was_added_removed_and_changed() {
        let before: Schemas = [
            ("CRD system:system-crds|shards.core.kcp.io", "storedVersions [v1alpha1]"),
            (
                "APIResourceSchema root|v1.workspaces.tenancy.kcp.io",
                "versions [v1alpha1 (storage)]",
            ),
            ("APIExport root|tenancy.kcp.io", "resources [a]"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut after = before.clone();
        assert!(changes(&before, &after).is_empty(), "the same reading changes nothing");
        after.insert(
            "CRD system:system-crds|shards.core.kcp.io".into(),
            "storedVersions [v1alpha1 v1alpha2]".into(),
        );
        after.remove("APIResourceSchema root|v1.workspaces.tenancy.kcp.io");
        after.insert(
            "APIResourceSchema root|v2.workspaces.tenancy.kcp.io".into(),
            "versions [v1alpha1 (storage)]".into(),
        );
        assert_eq!(
            changes(&before, &after),
            [
                "added APIResourceSchema root|v2.workspaces.tenancy.kcp.io: versions [v1alpha1 (storage)]",
                "changed CRD system:system-crds|shards.core.kcp.io: storedVersions [v1alpha1] -> storedVersions [v1alpha1 v1alpha2]",
                "removed APIResourceSchema root|v1.workspaces.tenancy.kcp.io: versions [v1alpha1 (storage)]",
            ]
        );
    }
}
