//! The resources this API serves, described once and read by discovery, OpenAPI, tables, validation
//! and storage: `kcpshards` (from the generated CRD) and events, in two views of one store.
use serde_json::{Value, json};

use super::error::FieldCause;
use super::events;
use super::schema::StructuralSchema;

/// How a served resource maps to what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Stored as served.
    Plain,
    /// core/v1 events, stored as events.k8s.io/v1.
    CoreEvents,
}

/// One printer column (`additionalPrinterColumns`).
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    /// A JSONPath as Kubernetes writes it (`.status.phase`); evaluated with `$` in front.
    pub json_path: String,
    pub priority: i64,
}

#[derive(Debug)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub status_subresource: bool,
    /// The storage directory; both event views share one.
    pub storage: &'static str,
    pub view: View,
    pub schema: Option<StructuralSchema>,
    /// The schema as OpenAPI v3 serves it (`kubectl explain` reads its descriptions).
    pub openapi_schema: Value,
    pub columns: Vec<Column>,
    /// The fields a field selector may name (the real server's selectable fields).
    pub field_selectors: &'static [&'static str],
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `kcpshards.kcpshard.io`, as errors name a resource.
    pub fn qualified_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The object as this view serves it.
    pub fn to_view(&self, stored: &Value) -> Value {
        match self.view {
            View::Plain => stored.clone(),
            View::CoreEvents => events::to_core(stored),
        }
    }

    /// The object as it is stored, from this view.
    pub fn from_view(&self, served: &Value) -> Value {
        match self.view {
            View::Plain => served.clone(),
            View::CoreEvents => events::from_core(served),
        }
    }

    /// Checks the schema cannot express, on the object as stored.
    pub fn semantic_check(&self, stored: &Value) -> Vec<FieldCause> {
        match self.storage {
            KCPSHARDS => match serde_json::from_value::<crate::api::KcpShard>(stored.clone()) {
                Ok(shard) => crate::api::validate(&shard),
                Err(e) => vec![FieldCause::invalid("spec", e.to_string())],
            },
            _ => Vec::new(),
        }
    }

    /// Checks of an update that compare the stored object with the next one (as stored).
    pub fn update_check(&self, existing: &Value, next: &Value) -> Vec<FieldCause> {
        use crate::api::KcpShard;
        match self.storage {
            KCPSHARDS => match (
                serde_json::from_value::<KcpShard>(existing.clone()),
                serde_json::from_value::<KcpShard>(next.clone()),
            ) {
                (Ok(old), Ok(new)) => crate::api::validate_update(&old, &new),
                // One that does not parse was refused by semantic_check already (or predates it).
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }
}

pub const KCPSHARDS: &str = "kcpshards";
pub const EVENTS: &str = "events";

/// Every storage directory, for [`super::store::Store::open`].
pub const STORAGE: &[&str] = &[KCPSHARDS, EVENTS];

/// Every resource served, built once at start.
pub fn all() -> Vec<Resource> {
    vec![
        kcpshards(),
        events("", View::CoreEvents),
        events("events.k8s.io", View::Plain),
    ]
}

fn kcpshards() -> Resource {
    let crd = serde_json::to_value(crate::api::crd()).expect("the CRD serialises");
    let spec = &crd["spec"];
    let version = &spec["versions"][0];
    let props = serde_json::from_value(version["schema"]["openAPIV3Schema"].clone()).expect("the CRD carries a schema");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let columns = version["additionalPrinterColumns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .map(|c| Column {
                    name: c["name"].as_str().unwrap_or_default().to_string(),
                    type_: c["type"].as_str().unwrap_or("string").to_string(),
                    format: c["format"].as_str().unwrap_or_default().to_string(),
                    description: c["description"].as_str().unwrap_or_default().to_string(),
                    json_path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default();
    Resource {
        group: crate::api::GROUP,
        version: crate::api::VERSION,
        kind: spec["names"]["kind"].as_str().unwrap_or_default().to_string(),
        plural: spec["names"]["plural"].as_str().unwrap_or_default().to_string(),
        singular: spec["names"]["singular"].as_str().unwrap_or_default().to_string(),
        short_names: strings(&spec["names"]["shortNames"]),
        namespaced: spec["scope"] == json!("Namespaced"),
        status_subresource: !version["subresources"]["status"].is_null(),
        storage: KCPSHARDS,
        view: View::Plain,
        schema: Some(StructuralSchema::new(&props)),
        openapi_schema: version["schema"]["openAPIV3Schema"].clone(),
        columns,
        field_selectors: &["metadata.name", "metadata.namespace"],
    }
}

/// What core/v1 events can be selected by (k8s.io/kubernetes pkg/registry/core/event/strategy.go).
const CORE_EVENT_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The same fields under their events.k8s.io/v1 names.
const EVENT_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

/// Events in one of their two views: core/v1 (what kubectl describe and kubectl events read) and
/// events.k8s.io/v1 (what kube-runtime's Recorder writes), over one storage directory.
fn events(group: &'static str, view: View) -> Resource {
    Resource {
        group,
        version: "v1",
        kind: "Event".into(),
        plural: "events".into(),
        singular: "event".into(),
        short_names: vec!["ev".into()],
        namespaced: true,
        status_subresource: false,
        storage: EVENTS,
        view,
        schema: None,
        openapi_schema: json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        // Printed by the events printer (table.rs), not by columns.
        columns: Vec::new(),
        field_selectors: match view {
            View::CoreEvents => CORE_EVENT_FIELDS,
            View::Plain => EVENT_FIELDS,
        },
    }
}
