//! Arbitrary bytes through the API's request decoding and validation, the way `kcpshard serve`
//! handles a request once its token is accepted: body decoding (JSON or YAML), then a create
//! (POST), an update (PUT), or a merge, JSON or apply patch of a KcpShard or an event (schema
//! pruning, defaulting and validation, the KcpShard checks of src/api/validation.rs), media-type
//! parsing, and label and field selectors. What is accepted is then served back the way a reader
//! gets it: both event views and a `kubectl get` table.
//!
//! Input: byte 0 picks the operation, byte 1 the resource, the media type, the subresource and
//! `fieldValidation`; the rest is the body (for selectors and media types, split at the first
//! newline). Besides "no panic", it checks the API's no-op rule: an accepted object written again
//! unchanged is a no-op (no new resourceVersion, no watch event), or controllers wake themselves.
#![no_main]

use std::sync::OnceLock;

use kcpshard::apiserver::handler::decode_body;
use kcpshard::apiserver::objects::{self, Part, PatchType};
use kcpshard::apiserver::resources::{self, Resource, View};
use kcpshard::apiserver::schema::UnknownFields;
use kcpshard::apiserver::selectors::Selector;
use kcpshard::apiserver::store::Action;
use kcpshard::apiserver::table::{self, IncludeObject};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// The served resources and, for each, a stored object that updates and patches apply to.
struct Fixture {
    resources: Vec<Resource>,
    existing: Vec<Value>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let resources = resources::all();
        let existing = resources
            .iter()
            .map(|resource| {
                let (namespace, body) = if resource.storage == resources::KCPSHARDS {
                    (None, shard())
                } else {
                    (Some("default"), event(resource))
                };
                let created = objects::new_object(resource, namespace, body, UnknownFields::Strict)
                    .unwrap_or_else(|e| panic!("the fixture for {} is valid: {e}", resource.plural));
                let mut stored = created.object;
                stored["metadata"]["resourceVersion"] = json!("7");
                if resource.status_subresource {
                    stored["status"] = json!({
                        "observedGeneration": 1, "phase": "Ready", "activeSlot": "a",
                        "slots": [{"name": "a", "version": "v0.31.2", "pid": 4242, "port": 40001, "ready": true,
                                   "startedAt": "2026-01-02T03:04:05Z"}],
                        "front": {"listen": "127.0.0.1:6443", "backend": "127.0.0.1:40001"},
                        "conditions": [{"type": "Ready", "status": "True", "reason": "SlotReady", "message": "slot a serves",
                                        "lastTransitionTime": "2026-01-02T03:04:05Z"}],
                    });
                }
                stored
            })
            .collect();
        Fixture { resources, existing }
    })
}

fn shard() -> Value {
    json!({
        "apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard",
        "metadata": {"name": "dev", "labels": {"team": "a"}, "finalizers": ["kcpshard.io/cleanup"]},
        "spec": {"version": "v0.31.2", "store": {"type": "KineSqlite"}, "front": {"type": "Tcp", "listen": "127.0.0.1:6443"}},
    })
}

fn event(resource: &Resource) -> Value {
    match resource.view {
        View::Plain => json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "dev.1", "namespace": "default"},
            "eventTime": "2026-01-02T03:04:05.123456Z",
            "regarding": {"kind": "KcpShard", "name": "dev", "apiVersion": "kcpshard.io/v1alpha1"},
            "note": "Started slot a", "reason": "SlotStarting", "type": "Normal", "action": "Reconcile",
            "reportingController": "kcpshard", "reportingInstance": "kcpshard-host",
        }),
        View::CoreEvents => json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "dev.2", "namespace": "default"},
            "involvedObject": {"kind": "KcpShard", "name": "dev"},
            "message": "Started slot a", "reason": "SlotStarting", "type": "Normal",
            "firstTimestamp": "2026-01-02T03:04:05Z", "lastTimestamp": "2026-01-02T03:04:05Z", "count": 1,
            "source": {"component": "kcpshard"},
        }),
    }
}

fuzz_target!(|data: &[u8]| {
    let [op, flags, body @ ..] = data else { return };
    let fixture = fixture();
    let index = usize::from(flags & 0b11) % fixture.resources.len();
    let resource = &fixture.resources[index];
    let existing = &fixture.existing[index];
    let yaml = flags & 0b100 != 0;
    let part = if flags & 0b1000 != 0 && resource.status_subresource {
        Part::Status
    } else {
        Part::Main
    };
    let unknown = match (flags >> 4) & 0b11 {
        1 => UnknownFields::Ignore,
        2 => UnknownFields::Strict,
        _ => UnknownFields::Warn,
    };
    let namespace = resource.namespaced.then_some("default");
    let name = existing["metadata"]["name"].as_str().expect("fixtures are named");
    let plain = if yaml { "application/yaml" } else { "application/json" };
    match op % 8 {
        0 => create(resource, namespace, plain, body, unknown),
        1 => {
            // PUT: the update's own checks, then the stored object's resourceVersion must match.
            let Ok(decoded) = decode_body(plain, body) else { return };
            let Ok((proposed, expected)) = objects::update_body(resource, name, decoded) else {
                return;
            };
            if Some(expected.as_str()) != existing["metadata"]["resourceVersion"].as_str() {
                return;
            }
            let mut warnings = Vec::new();
            if let Ok(action) = objects::next_state(resource, existing, proposed, part, unknown, &mut warnings) {
                accepted(resource, existing, action);
            }
        }
        2 => patch(
            resource,
            existing,
            name,
            part,
            "application/merge-patch+json",
            body,
            unknown,
        ),
        3 => patch(
            resource,
            existing,
            name,
            part,
            "application/json-patch+json",
            body,
            unknown,
        ),
        4 | 5 => {
            let media = if yaml {
                "application/apply-patch+yaml"
            } else {
                "application/apply-patch+json"
            };
            if op % 8 == 4 {
                patch(resource, existing, name, part, media, body, unknown);
            } else {
                // An apply patch to a name that does not exist yet creates the object.
                let Ok(decoded) = decode_body(media, body) else { return };
                if let Ok(created) = objects::applied_to_nothing("new", decoded) {
                    create_decoded(resource, namespace, created, unknown);
                }
            }
        }
        6 => {
            // Any media type: the patch type it names, then the body decoded as that type says.
            let (media, body) = split_line(body);
            let Ok(media) = std::str::from_utf8(media) else { return };
            patch(resource, existing, name, part, media, body, unknown);
        }
        _ => {
            let (labels, fields) = split_line(body);
            let (labels, fields) = (String::from_utf8_lossy(labels), String::from_utf8_lossy(fields));
            if let Ok(selector) = Selector::parse(Some(&labels), Some(&fields)) {
                let _ = selector.matches(&resource.to_view(existing));
                let _ = selector.is_empty();
            }
        }
    }
});

fn split_line(bytes: &[u8]) -> (&[u8], &[u8]) {
    match bytes.iter().position(|&b| b == b'\n') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &[]),
    }
}

fn create(resource: &Resource, namespace: Option<&str>, media: &str, body: &[u8], unknown: UnknownFields) {
    if let Ok(decoded) = decode_body(media, body) {
        create_decoded(resource, namespace, decoded, unknown);
    }
}

fn create_decoded(resource: &Resource, namespace: Option<&str>, decoded: Value, unknown: UnknownFields) {
    let Ok(created) = objects::new_object(resource, namespace, decoded, unknown) else {
        return;
    };
    let mut stored = created.object;
    stored["metadata"]["resourceVersion"] = json!("1");
    served(resource, &stored);
    // The no-op rule: the created object, PUT back as served, changes nothing.
    if resource.view == View::Plain {
        let mut warnings = Vec::new();
        let again = objects::next_state(resource, &stored, stored.clone(), Part::Main, unknown, &mut warnings);
        match again {
            Ok(Action::Nothing) => {}
            other => panic!("writing an accepted object back unchanged is not a no-op: {other:?}\nobject: {stored}"),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn patch(
    resource: &Resource,
    existing: &Value,
    name: &str,
    part: Part,
    media: &str,
    body: &[u8],
    unknown: UnknownFields,
) {
    let Ok(patch_type) = PatchType::from_content_type(media) else {
        return;
    };
    let Ok(decoded) = decode_body(media, body) else { return };
    let mut warnings = Vec::new();
    // Apply patches run the structured merge and conflict checks against the fixture's managers.
    let options = objects::WriteOptions {
        dry_run: false,
        manager: "fuzz".into(),
        force: body.first().is_some_and(|b| b & 1 == 1),
        unknown,
    };
    if let Ok(action) = objects::patched_state(
        resource,
        name,
        existing,
        part,
        patch_type,
        &decoded,
        &options,
        &mut warnings,
    ) {
        accepted(resource, existing, action);
    }
}

/// An update or patch went through: serve the result, and check that writing it again is a no-op.
fn accepted(resource: &Resource, existing: &Value, action: Action) {
    let Action::Put(mut next) = action else { return };
    next["metadata"]["resourceVersion"] = json!("8");
    served(resource, &next);
    if resource.view == View::Plain {
        let mut warnings = Vec::new();
        let again = objects::next_state(
            resource,
            &next,
            next.clone(),
            Part::Main,
            UnknownFields::Warn,
            &mut warnings,
        );
        match again {
            Ok(Action::Nothing) => {}
            other => panic!(
                "writing an accepted object back unchanged is not a no-op: {other:?}\nbefore: {existing}\nobject: {next}"
            ),
        }
    }
}

/// What GET, LIST and `kubectl get` make of a stored object, in every view of its storage.
fn served(resource: &Resource, stored: &Value) {
    for view in fixture().resources.iter().filter(|r| r.storage == resource.storage) {
        let object = view.to_view(stored);
        let _ = table::table(view, std::slice::from_ref(&object), Some(1), IncludeObject::Metadata);
        let _ = serde_json::to_vec(&object).expect("values serialise");
    }
}
