//! `kcpshard describe NAME`: what `kubectl describe kcpshard NAME` prints: the header fields, the
//! object's content in kubectl's generic layout (sorted keys, "Smart Labels"), the status
//! conditions as a table, and the events about this object.
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Map, Value};

use super::connect::{Cluster, Conn};
use super::table::{self, tabwrite};

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The KcpShard to describe.
    name: String,
    #[command(flatten)]
    conn: Conn,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let cluster = args.conn.connect().await?;
    let object = cluster
        .kcpshards()
        .get(&args.name)
        .await
        .map_err(|e| cluster.explain(e))?;
    let object = serde_json::to_value(&object)?;
    let events = events_about(&cluster, &object).await?;
    print!("{}", tabwrite(&render(&object, &events), 2));
    Ok(())
}

/// The events kubectl shows for an object: core/v1 events selected by the involved object.
pub async fn events_about(cluster: &Cluster, object: &Value) -> anyhow::Result<Vec<Event>> {
    let metadata = &object["metadata"];
    let mut selector = format!(
        "involvedObject.name={},involvedObject.namespace={},involvedObject.kind={}",
        metadata["name"].as_str().unwrap_or_default(),
        metadata["namespace"].as_str().unwrap_or_default(),
        object["kind"].as_str().unwrap_or("KcpShard"),
    );
    if let Some(uid) = metadata["uid"].as_str() {
        selector.push_str(&format!(",involvedObject.uid={uid}"));
    }
    let api: Api<Event> = Api::all(cluster.client.clone());
    let mut events = api
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(|e| cluster.explain(e))?
        .items;
    events.sort_by_key(last_seen);
    Ok(events)
}

/// When an event was last seen: its series, its last timestamp, or its event time.
pub fn last_seen(event: &Event) -> Option<String> {
    let series = event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0.to_string()));
    let last = event.last_timestamp.as_ref().map(|t| t.0.to_string());
    let at = event.event_time.as_ref().map(|t| t.0.to_string());
    let created = event.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string());
    series.or(last).or(at).or(created)
}

fn render(object: &Value, events: &[Event]) -> String {
    let metadata = object["metadata"].as_object().cloned().unwrap_or_default();
    let mut out = String::new();
    let text = |key: &str| metadata.get(key).and_then(Value::as_str).unwrap_or("");
    let _ = writeln!(out, "Name:\t{}", text("name"));
    // kubectl prints the line, empty, for cluster-scoped objects too.
    let _ = writeln!(out, "Namespace:\t{}", text("namespace"));
    write_pairs(&mut out, "Labels", metadata.get("labels"), "=");
    write_pairs(&mut out, "Annotations", metadata.get("annotations"), ": ");
    let _ = writeln!(out, "API Version:\t{}", object["apiVersion"].as_str().unwrap_or(""));
    let _ = writeln!(out, "Kind:\t{}", object["kind"].as_str().unwrap_or(""));

    let mut rest = metadata.clone();
    for key in ["name", "namespace", "labels", "annotations", "managedFields"] {
        rest.remove(key);
    }
    let _ = writeln!(out, "Metadata:");
    generic(&mut out, 1, &rest);
    if let Some(spec) = object["spec"].as_object() {
        let _ = writeln!(out, "Spec:");
        generic(&mut out, 1, spec);
    }
    if let Some(status) = object["status"].as_object() {
        let _ = writeln!(out, "Status:");
        let mut status = status.clone();
        let conditions = status.remove("conditions");
        generic(&mut out, 1, &status);
        if let Some(Value::Array(conditions)) = conditions {
            conditions_table(&mut out, &conditions);
        }
    }
    events_table(&mut out, events);
    out
}

fn write_pairs(out: &mut String, label: &str, map: Option<&Value>, separator: &str) {
    let pairs: Vec<(String, String)> = map
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != LAST_APPLIED)
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    if pairs.is_empty() {
        let _ = writeln!(out, "{label}:\t<none>");
        return;
    }
    for (i, (key, value)) in pairs.iter().enumerate() {
        let head = if i == 0 { format!("{label}:") } else { String::new() };
        let _ = writeln!(out, "{head}\t{key}{separator}{value}");
    }
}

/// kubectl's `printUnstructuredContent`: sorted keys, nested maps indented, list items in turn.
fn generic(out: &mut String, level: usize, map: &Map<String, Value>) {
    let indent = "  ".repeat(level);
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    for key in keys {
        let label = smart_label(key);
        match &map[key] {
            Value::Object(child) => {
                let _ = writeln!(out, "{indent}{label}:");
                generic(out, level + 1, child);
            }
            Value::Array(items) => {
                let _ = writeln!(out, "{indent}{label}:");
                for item in items {
                    match item {
                        Value::Object(child) => generic(out, level + 1, child),
                        other => {
                            let _ = writeln!(out, "{indent}  {}", scalar(other));
                        }
                    }
                }
            }
            other => {
                let _ = writeln!(out, "{indent}{label}:\t{}", scalar(other));
            }
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "<nil>".into(),
        other => other.to_string(),
    }
}

fn conditions_table(out: &mut String, conditions: &[Value]) {
    let _ = writeln!(out, "  Conditions:");
    if conditions.is_empty() {
        let _ = writeln!(out, "    <none>");
        return;
    }
    let _ = writeln!(out, "    Type\tStatus\tReason\tAge\tMessage");
    let _ = writeln!(out, "    ----\t------\t------\t----\t-------");
    for c in conditions {
        let field = |k: &str| c[k].as_str().unwrap_or("").to_string();
        let _ = writeln!(
            out,
            "    {}\t{}\t{}\t{}\t{}",
            field("type"),
            field("status"),
            field("reason"),
            table::age(c["lastTransitionTime"].as_str()),
            field("message")
        );
    }
}

fn events_table(out: &mut String, events: &[Event]) {
    if events.is_empty() {
        let _ = writeln!(out, "Events:\t<none>");
        return;
    }
    let _ = writeln!(out, "Events:");
    let _ = writeln!(out, "  Type\tReason\tAge\tFrom\tMessage");
    let _ = writeln!(out, "  ----\t------\t----\t----\t-------");
    for event in events {
        let _ = writeln!(
            out,
            "  {}\t{}\t{}\t{}\t{}",
            event.type_.as_deref().unwrap_or(""),
            event.reason.as_deref().unwrap_or(""),
            event_age(event),
            reporter(event),
            event.message.as_deref().unwrap_or("").trim()
        );
    }
}

/// kubectl's describe age: `5s`, or `5s (x3 over 2m)` for a repeated event.
fn event_age(event: &Event) -> String {
    let count = event.series.as_ref().and_then(|s| s.count).or(event.count).unwrap_or(1);
    let last = table::age(last_seen(event).as_deref());
    if count > 1 {
        let first = event
            .first_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .or_else(|| event.event_time.as_ref().map(|t| t.0.to_string()));
        format!("{last} (x{count} over {})", table::age(first.as_deref()))
    } else {
        last
    }
}

/// Who reported an event: the legacy source component, else the reporting controller.
pub fn reporter(event: &Event) -> String {
    let component = event.source.as_ref().and_then(|s| s.component.clone());
    component
        .filter(|c| !c.is_empty())
        .or_else(|| event.reporting_component.clone())
        .unwrap_or_default()
}

/// kubectl's `smartLabelFor`: `creationTimestamp` -> `Creation Timestamp`, `uid` -> `UID`.
fn smart_label(field: &str) -> String {
    if field.chars().any(|c| !c.is_alphabetic() && c != '-') {
        return field.to_string();
    }
    let mut parts: Vec<String> = Vec::new();
    let chars: Vec<char> = field.chars().collect();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let prev_lower = i > 0 && chars[i - 1].is_lowercase();
        let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
        let prev_upper = i > 0 && chars[i - 1].is_uppercase();
        if c == '-' {
            if !current.is_empty() {
                parts.push(std::mem::take(&mut current));
            }
            continue;
        }
        if c.is_uppercase() && (prev_lower || (prev_upper && next_lower)) && !current.is_empty() {
            parts.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
        .into_iter()
        .map(|part| {
            let upper = part.to_uppercase();
            if ["API", "URL", "UID", "OSB", "GUID"].contains(&upper.as_str()) {
                upper
            } else {
                let mut chars = part.chars();
                match chars.next() {
                    Some(first) => first.to_uppercase().chain(chars).collect(),
                    None => String::new(),
                }
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_labels_match_kubectl() {
        assert_eq!(smart_label("creationTimestamp"), "Creation Timestamp");
        assert_eq!(smart_label("uid"), "UID");
        assert_eq!(smart_label("apiVersion"), "API Version");
        assert_eq!(smart_label("shardBaseURL"), "Shard Base URL");
        assert_eq!(smart_label("extraArgs"), "Extra Args");
        assert_eq!(smart_label("kine2"), "kine2");
    }
}
