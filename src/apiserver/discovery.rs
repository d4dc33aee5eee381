//! Discovery documents (`/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`) and `/version`.
//! Plain (unaggregated) JSON: kubectl falls back to it when the response is not an
//! APIGroupDiscoveryList.
use serde_json::{Value, json};

use super::resources::Resource;

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
}

pub fn groups(resources: &[Resource]) -> Value {
    let mut names: Vec<&str> = resources.iter().map(|r| r.group).filter(|g| !g.is_empty()).collect();
    names.dedup();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": names.iter().filter_map(|g| group(resources, g)).collect::<Vec<_>>()})
}

pub fn group(resources: &[Resource], name: &str) -> Option<Value> {
    let r = resources.iter().find(|r| r.group == name && !name.is_empty())?;
    let version = json!({"groupVersion": r.api_version(), "version": r.version});
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": [version], "preferredVersion": version}),
    )
}

pub fn resource_list(resources: &[Resource], group: &str, version: &str) -> Option<Value> {
    let mut entries = Vec::new();
    for r in resources.iter().filter(|r| r.group == group && r.version == version) {
        entries.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": VERBS, "shortNames": r.short_names,
        }));
        if r.status_subresource {
            entries.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if entries.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}))
}

/// The Kubernetes version this API behaves like (the k8s-openapi feature the crate builds with).
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "35",
        "gitVersion": format!("v1.35.0+kcpshard-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "",
        "goVersion": "", "compiler": "rustc", "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}
