//! `meta.k8s.io/v1` Tables, which `kubectl get` asks for (`Accept: ...;as=Table`). Cells follow the
//! CRD table convertor (k8s.io/apiextensions-apiserver .../tableconvertor): Name first, then the
//! printer columns, `date` columns humanised as an age, a missing value as null (`<none>`).
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use serde_json_path::JsonPath;

use super::resources::{EVENTS, Resource};

/// What each row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(value: Option<&str>) -> IncludeObject {
        match value {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

pub fn table(resource: &Resource, objects: &[Value], resource_version: Option<u64>, include: IncludeObject) -> Value {
    let now = Utc::now();
    let (columns, cells) = if resource.storage == EVENTS {
        event_table(objects, now)
    } else {
        crd_table(resource, objects, now)
    };
    let rows: Vec<Value> = objects
        .iter()
        .zip(cells)
        .map(|(object, cells)| {
            let mut row = json!({"cells": cells});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
                }
                IncludeObject::Object => row["object"] = object.clone(),
            }
            row
        })
        .collect();
    let mut metadata = json!({});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv.to_string());
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns, "rows": rows})
}

/// The column definitions and each object's cells.
type Cells = (Vec<Value>, Vec<Vec<Value>>);

/// A CRD's table: Name, then its printer columns (or Age).
fn crd_table(resource: &Resource, objects: &[Value], now: DateTime<Utc>) -> Cells {
    let mut columns = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    })];
    let printer_columns = if resource.columns.is_empty() {
        default_columns()
    } else {
        resource.columns.clone()
    };
    columns.extend(printer_columns.iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority})
    }));
    let paths: Vec<Option<JsonPath>> = printer_columns
        .iter()
        .map(|c| JsonPath::parse(&format!("${}", c.json_path)).ok())
        .collect();
    let cells = objects
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            for (column, path) in printer_columns.iter().zip(&paths) {
                let value = path.as_ref().and_then(|p| p.query(object).first().cloned());
                cells.push(match (value, column.type_.as_str()) {
                    (None, _) => Value::Null,
                    (Some(Value::String(s)), "date") => json!(age(&s, now)),
                    (Some(v), _) => v,
                });
            }
            cells
        })
        .collect();
    (columns, cells)
}

/// The columns of events (name, priority, format), as the real server prints them in both groups
/// (k8s.io/kubernetes pkg/printers/internalversion/printers.go, eventColumnDefinitions): kubectl
/// shows those of priority 0 (`LAST SEEN TYPE REASON OBJECT MESSAGE`), `-o wide` all of them.
const EVENT_COLUMNS: [(&str, i64, &str); 10] = [
    ("Last Seen", 0, ""),
    ("Type", 0, ""),
    ("Reason", 0, ""),
    ("Object", 0, ""),
    ("Subobject", 1, ""),
    ("Source", 1, ""),
    ("Message", 0, ""),
    ("First Seen", 1, ""),
    ("Count", 1, ""),
    ("Name", 1, "name"),
];

/// Events as printers.go's printEvent shows them, read from their core/v1 view.
fn event_table(objects: &[Value], now: DateTime<Utc>) -> Cells {
    let columns = EVENT_COLUMNS
        .iter()
        .map(|(name, priority, format)| {
            json!({"name": name, "type": "string", "format": format, "description": "", "priority": priority})
        })
        .collect();
    let cells = objects
        .iter()
        .map(|object| {
            let core = if object["apiVersion"] == "v1" {
                object.clone()
            } else {
                super::events::to_core(object)
            };
            event_cells(&core, now)
        })
        .collect();
    (columns, cells)
}

fn event_cells(event: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let since = |v: &Value| v.as_str().map_or_else(|| "<unknown>".to_string(), |t| age(t, now));
    let first_seen = if event["firstTimestamp"].is_string() {
        since(&event["firstTimestamp"])
    } else {
        since(&event["eventTime"])
    };
    let mut last_seen = if event["lastTimestamp"].is_string() {
        since(&event["lastTimestamp"])
    } else {
        first_seen.clone()
    };
    let mut count = event["count"].as_i64().unwrap_or(0);
    if event["series"].is_object() {
        last_seen = since(&event["series"]["lastObservedTime"]);
        count = event["series"]["count"].as_i64().unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let involved = &event["involvedObject"];
    let kind = text(&involved["kind"]).to_lowercase();
    let target = match text(&involved["name"]) {
        name if name.is_empty() => kind,
        name => format!("{kind}/{name}"),
    };
    let first_set = |a: &Value, b: &Value| Some(text(a)).filter(|s| !s.is_empty()).unwrap_or_else(|| text(b));
    let component = first_set(&event["source"]["component"], &event["reportingComponent"]);
    let instance = first_set(&event["source"]["host"], &event["reportingInstance"]);
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last_seen),
        json!(text(&event["type"])),
        json!(text(&event["reason"])),
        json!(target),
        json!(text(&involved["fieldPath"])),
        json!(source),
        json!(text(&event["message"]).trim()),
        json!(first_seen),
        json!(count),
        event["metadata"]["name"].clone(),
    ]
}

fn default_columns() -> Vec<super::resources::Column> {
    vec![super::resources::Column {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: "CreationTimestamp is a timestamp representing the server time when this object was created."
            .into(),
        json_path: ".metadata.creationTimestamp".into(),
        priority: 0,
    }]
}

/// The age of an RFC 3339 timestamp at `now`, as kubectl prints it.
pub fn age(timestamp: &str, now: DateTime<Utc>) -> String {
    match DateTime::parse_from_rfc3339(timestamp) {
        Ok(t) => human_duration((now - t.with_timezone(&Utc)).num_seconds()),
        Err(_) => "<unknown>".into(),
    }
}

/// k8s.io/apimachinery/pkg/util/duration.HumanDuration.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let seconds = seconds.max(0);
    let (minutes, hours) = (seconds / 60, seconds / 3600);
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        }
    } else if hours < 24 * 365 * 2 {
        format!("{}d", hours / 24)
    } else if hours < 24 * 365 * 8 {
        match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        }
    } else {
        format!("{}y", hours / 24 / 365)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kubectl get events` prints `LAST SEEN TYPE REASON OBJECT MESSAGE` with `kcpshard/<name>`,
    /// as from a real server, whichever group the events are read through.
    #[test]
    fn events_print_as_the_real_servers_printer_prints_them() {
        let now = DateTime::parse_from_rfc3339("2026-11-29T10:05:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let recorded = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "dev.1", "namespace": "default"},
            "eventTime": "2026-11-29T10:00:00.123456Z",
            "regarding": {"kind": "KcpShard", "name": "dev", "apiVersion": "kcpshard.io/v1alpha1"},
            "note": "Started slot a\n", "reason": "SlotStarting", "type": "Normal",
            "reportingController": "kcpshard", "reportingInstance": "kcpshard-host",
            "series": {"count": 3, "lastObservedTime": "2026-11-29T10:04:00.000000Z"},
        });
        let (columns, cells) = event_table(std::slice::from_ref(&recorded), now);
        let shown: Vec<&str> = columns
            .iter()
            .filter(|c| c["priority"] == 0)
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(shown, ["Last Seen", "Type", "Reason", "Object", "Message"]);
        assert_eq!(
            cells[0],
            [
                json!("60s"),
                json!("Normal"),
                json!("SlotStarting"),
                json!("kcpshard/dev"),
                json!(""),
                json!("kcpshard, kcpshard-host"),
                json!("Started slot a"),
                json!("5m"),
                json!(3),
                json!("dev.1"),
            ]
        );
        let legacy = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "x"},
            "involvedObject": {"kind": "KcpShard"}, "reason": "R", "message": "m", "type": "Warning",
            "firstTimestamp": "2026-11-29T10:00:00Z", "source": {"component": "kubectl"}, "eventTime": null});
        let (_, cells) = event_table(&[legacy], now);
        assert_eq!(cells[0][0], "5m", "no lastTimestamp: the first one");
        assert_eq!(cells[0][3], "kcpshard", "no name: the kind alone");
        assert_eq!(cells[0][5], "kubectl");
        assert_eq!(cells[0][8], 1, "a count of 0 is one event");
    }

    #[test]
    fn human_duration_matches_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (49 * 3600, "2d1h"),
            (8 * 24 * 3600, "8d"),
            (2 * 365 * 24 * 3600, "2y"),
            (2 * 365 * 24 * 3600 + 24 * 3600, "2y1d"),
            (9 * 365 * 24 * 3600, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}s");
        }
    }
}
