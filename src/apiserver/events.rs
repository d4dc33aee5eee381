//! Events are stored once, in the `events.k8s.io/v1` shape that kube-runtime's `Recorder` writes,
//! and served in two views: that one, and `core/v1` (what `kubectl describe` and `kubectl events`
//! read). The field mapping is Kubernetes' own (k8s.io/kubernetes pkg/apis/events/v1/conversion.go).
use serde_json::{Map, Value, json};

/// Renamed fields: (events.k8s.io/v1, core/v1).
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// Fields with the same name in both views.
const SHARED: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "related",
    "action",
    "reason",
    "type",
    "reportingInstance",
];

/// At most this many events are kept; the oldest go first (the real server keeps them for an hour).
pub const RETAINED: usize = 1000;

/// The stored (events.k8s.io/v1) form of a core/v1 event.
pub fn from_core(core: &Value) -> Value {
    let mut out = copy_shared(core);
    for (events_name, core_name) in RENAMED {
        if let Some(v) = core.get(*core_name) {
            out.insert(events_name.to_string(), v.clone());
        }
    }
    // kubectl and client-go's legacy recorder never set eventTime: the real server serves such an
    // event with `eventTime: null` in both views (a zero MicroTime), and so does this one. One
    // that is set is a MicroTime, which clients parse only with its six fractional digits.
    out.entry("eventTime").or_insert(Value::Null);
    normalise_event_time(&mut out);
    if let Some(source) = core.get("source")
        && out.get("reportingController").is_none_or(Value::is_null)
        && let Some(component) = source.get("component")
    {
        out.insert("reportingController".into(), component.clone());
    }
    finish(out, "events.k8s.io/v1")
}

/// The core/v1 view of a stored event.
pub fn to_core(stored: &Value) -> Value {
    let mut out = copy_shared(stored);
    // Events stored before eventTime was normalised on the way in.
    normalise_event_time(&mut out);
    for (events_name, core_name) in RENAMED {
        if let Some(v) = stored.get(*events_name) {
            out.insert(core_name.to_string(), v.clone());
        }
    }
    // Old readers (kubectl describe) show `count` and the timestamps; derive them from the series.
    let series = stored.get("series");
    if out.get("count").is_none_or(Value::is_null) {
        let count = series.and_then(|s| s.get("count")).cloned().unwrap_or(json!(1));
        out.insert("count".into(), count);
    }
    if out.get("firstTimestamp").is_none_or(Value::is_null) {
        out.insert(
            "firstTimestamp".into(),
            stored.get("eventTime").map(truncate_to_seconds).unwrap_or(Value::Null),
        );
    }
    if out.get("lastTimestamp").is_none_or(Value::is_null) {
        let last = series
            .and_then(|s| s.get("lastObservedTime"))
            .or_else(|| stored.get("eventTime"));
        out.insert(
            "lastTimestamp".into(),
            last.map(truncate_to_seconds).unwrap_or(Value::Null),
        );
    }
    if out.get("source").is_none_or(Value::is_null) {
        let mut source = Map::new();
        if let Some(c) = stored.get("reportingController") {
            source.insert("component".into(), c.clone());
        }
        out.insert("source".into(), Value::Object(source));
    }
    finish(out, "v1")
}

fn copy_shared(from: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for name in SHARED {
        if let Some(v) = from.get(*name) {
            out.insert(name.to_string(), v.clone());
        }
    }
    out
}

fn finish(mut out: Map<String, Value>, api_version: &str) -> Value {
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}

fn normalise_event_time(event: &mut Map<String, Value>) {
    if let Some(time) = event.get("eventTime").filter(|t| t.is_string()).map(to_micro) {
        event.insert("eventTime".into(), time);
    }
}

/// `2026-11-29T10:00:00Z` -> `2026-11-29T10:00:00.000000Z`: a metav1.Time as a MicroTime. Anything
/// that is not an RFC 3339 time is kept as it is (the client sent it).
fn to_micro(time: &Value) -> Value {
    match time.as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok()) {
        Some(t) => json!(
            t.with_timezone(&chrono::Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        ),
        None => time.clone(),
    }
}

/// metav1.Time has second precision; MicroTime has microseconds. `2026-11-29T10:00:00.123456Z` ->
/// `2026-11-29T10:00:00Z`.
fn truncate_to_seconds(time: &Value) -> Value {
    // `get` rather than indexing: a time that is not ASCII (no schema checks events) must not panic
    // every read of the core view.
    match time.as_str().filter(|s| s.len() > 19).and_then(|s| s.get(..19)) {
        Some(seconds) => json!(format!("{seconds}Z")),
        None => time.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder_event() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "dev.1", "namespace": "default"},
            "eventTime": "2026-11-29T10:00:00.123456Z",
            "regarding": {"kind": "KcpShard", "name": "dev", "uid": "u1", "apiVersion": "kcpshard.io/v1alpha1"},
            "note": "Started slot a", "reason": "SlotStarting", "type": "Normal", "action": "Reconcile",
            "reportingController": "kcpshard", "reportingInstance": "kcpshard-host",
        })
    }

    #[test]
    fn the_core_view_carries_what_kubectl_describe_reads() {
        let core = to_core(&recorder_event());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "dev");
        assert_eq!(core["message"], "Started slot a");
        assert_eq!(core["count"], 1);
        assert_eq!(core["firstTimestamp"], "2026-11-29T10:00:00Z");
        assert_eq!(core["lastTimestamp"], "2026-11-29T10:00:00Z");
        assert_eq!(core["source"]["component"], "kcpshard");
    }

    #[test]
    fn a_series_shows_as_a_count_and_a_last_timestamp() {
        let mut event = recorder_event();
        event["series"] = json!({"count": 3, "lastObservedTime": "2026-11-29T10:05:00.000001Z"});
        let core = to_core(&event);
        assert_eq!(core["count"], 3);
        assert_eq!(core["lastTimestamp"], "2026-11-29T10:05:00Z");
    }

    /// Found by the fuzz target (fuzz/seeds/api_request/regression-event-time): an eventTime with
    /// a multi-byte character across its 19th byte panicked every read of /api/v1/events.
    #[test]
    fn a_time_that_is_not_ascii_is_shown_as_it_is() {
        let mut event = recorder_event();
        event["eventTime"] = json!("2026-01-02T03:04:0\u{e9}5.1Z"); // é is bytes 18 and 19
        let core = to_core(&event);
        assert_eq!(core["firstTimestamp"], event["eventTime"]);
        assert_eq!(core["lastTimestamp"], event["eventTime"]);
        event["eventTime"] = json!("2026-01-02T03:04:05.123456Z");
        assert_eq!(to_core(&event)["firstTimestamp"], "2026-01-02T03:04:05Z");
    }

    /// client-go's legacy recorder posts core/v1 events with first/lastTimestamp and no eventTime:
    /// served with a null one, as the real server does, and its timestamps as they were.
    #[test]
    fn a_core_event_without_event_time_is_served_with_a_null_one() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "x", "namespace": "default"},
            "involvedObject": {"kind": "KcpShard", "name": "dev"}, "reason": "R", "message": "m",
            "firstTimestamp": "2026-11-29T10:00:00Z", "lastTimestamp": "2026-11-29T10:00:05Z", "count": 2});
        let stored = from_core(&core);
        assert_eq!(stored.get("eventTime"), Some(&Value::Null));
        let served = to_core(&stored);
        assert_eq!(served.get("eventTime"), Some(&Value::Null));
        assert_eq!(served["firstTimestamp"], "2026-11-29T10:00:00Z");
        assert_eq!(served["lastTimestamp"], "2026-11-29T10:00:05Z");
    }

    #[test]
    fn both_views_round_trip_to_the_same_stored_event() {
        let stored = recorder_event();
        let back = from_core(&to_core(&stored));
        for field in [
            "regarding",
            "note",
            "reason",
            "type",
            "eventTime",
            "reportingController",
            "reportingInstance",
        ] {
            assert_eq!(back[field], stored[field], "{field}");
        }
    }
}
