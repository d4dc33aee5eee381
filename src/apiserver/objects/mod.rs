//! What create, update, patch and delete mean: the rules of the real kube-apiserver for custom
//! resources (docs/api.md), applied on top of the [`Store`].
//!
//! - A write that changes nothing persists nothing: no new resourceVersion, no watch event.
//!   Controllers that write the same status twice would otherwise wake themselves forever.
//! - `metadata.generation` starts at 1 and grows when anything outside metadata and status changes
//!   (and when deletion starts); writes to `/status` change only status.
//! - Updates must name the resourceVersion they read; a stale one is a 409 Conflict.
//! - Deleting an object with finalizers only sets `deletionTimestamp`; it goes when the last
//!   finalizer is removed.
use chrono::{SecondsFormat, Utc};
use serde_json::{Value, json};

use super::apply::{self, Managed, Scope, Shape, Writer};
use super::error::{ApiError, ApiResult, FieldCause};
use super::resources::{EVENTS, Resource};
use super::schema::UnknownFields;
use super::store::{Action, Key, Outcome, Store, StoreError, resource_version_of};

mod admission;
mod checks;
mod names;
mod patch;

use admission::*;
pub use checks::*;
pub use names::*;
pub use patch::*;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store write failed");
        if e.is_no_space() {
            return ApiError::InsufficientStorage(e.to_string());
        }
        ApiError::Internal(e.to_string())
    }
}

/// Which part of the object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The main resource: everything but status (when the resource has a status subresource).
    Main,
    /// The `/status` subresource: only status.
    Status,
}

/// A patch body and its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> ApiResult<PatchType> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchType::Apply),
            other => Err(ApiError::UnsupportedMediaType(format!(
                "the body of the request was in an unknown format ({other}) - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml \
                 (strategic merge patch is not supported for custom resources: use kubectl patch --type merge or --type json)"
            ))),
        }
    }
}

/// What every write takes besides its body: the query parameters of create, update, patch and
/// delete that the handler has checked.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: everything but the store write (and so no resourceVersion, no watch event).
    pub dry_run: bool,
    /// Who writes, for `managedFields`: `fieldManager`, else the client's User-Agent product.
    pub manager: String,
    /// `force=true` on an apply: take the fields other managers own.
    pub force: bool,
    pub unknown: UnknownFields,
}

/// What a delete did: the object as it was deleted (or marked for deletion), and whether it is gone.
#[derive(Debug)]
pub struct Deleted {
    pub object: Value,
    /// False when finalizers keep it, marked with a deletionTimestamp.
    pub gone: bool,
}

/// DeleteOptions, from the body or the query.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub dry_run: bool,
    /// `preconditions.uid`: delete only that object, not one that replaced it under its name.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`: delete only the version the client read.
    pub resource_version: Option<String>,
    /// `propagationPolicy: Orphan`: dependents stay, without the reference to this owner.
    pub orphan: bool,
}

/// The result of a write, as the handler answers it.
#[derive(Debug)]
pub struct Written {
    pub object: Value,
    pub created: bool,
    pub warnings: Vec<String>,
}

pub struct Objects {
    pub store: Store,
    /// Held across the check and the write of a KcpShard, so that two writes cannot both take
    /// one front address.
    pub admission: std::sync::Mutex<()>,
}

impl Objects {
    pub fn key(&self, resource: &Resource, namespace: Option<&str>, name: &str) -> Key {
        Key {
            resource: resource.storage,
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    pub fn get(&self, resource: &Resource, namespace: Option<&str>, name: &str) -> ApiResult<Value> {
        self.store
            .get(&self.key(resource, namespace, name))
            .map(|o| resource.to_view(&o))
            .ok_or_else(|| not_found(resource, name))
    }

    /// Runs `decide` against the stored object and stores what it says, or (a dry run) only
    /// says what would be stored. A KcpShard it would store must pass [`Admission`] first.
    fn write(
        &self,
        resource: &Resource,
        key: &Key,
        dry_run: bool,
        decide: impl FnOnce(Option<&Value>) -> ApiResult<Action>,
    ) -> ApiResult<Outcome> {
        let admission = Admission::new(self, resource);
        let decide = |existing: Option<&Value>| {
            let action = decide(existing)?;
            // Only a new address is checked: a shard that shares one from before (an older
            // kcpshard allowed it) must still take its status writes.
            if let (Some(admission), Action::Put(next)) = (&admission, &action)
                && existing.map(front_listen) != Some(front_listen(next))
            {
                admission.check(resource, next)?;
            }
            Ok(action)
        };
        if dry_run {
            self.store.preview(key, decide)
        } else {
            self.store.modify(key, decide)
        }
    }

    pub fn create(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        body: Value,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        self.create_as(resource, namespace, body, options, apply::Operation::Update)
    }

    fn create_as(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        body: Value,
        options: &WriteOptions,
        operation: apply::Operation,
    ) -> ApiResult<Written> {
        let config = body.clone();
        let NewObject {
            namespace,
            name,
            mut object,
            warnings,
        } = new_object(resource, namespace, body, options.unknown)?;
        if tracks_managed_fields(resource) {
            let mut managed = Managed::read(&object);
            let writer = writer(resource, &options.manager, Part::Main);
            let scope = ownership_scope(resource, Part::Main);
            match operation {
                apply::Operation::Update => managed.update(&json!({}), &object, shape(resource), scope, &writer),
                apply::Operation::Apply => {
                    let config = resource.from_view(&config);
                    managed
                        .apply(&json!({}), &config, shape(resource), scope, &writer, true)
                        .expect("nothing conflicts with a new object");
                }
            }
            managed.write(&mut object);
        }
        let key = self.key(resource, namespace.as_deref(), &name);
        let outcome = self.write(resource, &key, options.dry_run, |existing| match existing {
            Some(_) => Err(ApiError::AlreadyExists {
                resource: resource.qualified_name(),
                name: name.clone(),
            }),
            None => Ok(Action::Put(object)),
        })?;
        if resource.storage == EVENTS && !options.dry_run {
            self.trim_events();
        }
        Ok(Written {
            object: resource.to_view(&written(outcome)),
            created: true,
            warnings,
        })
    }

    /// PUT: replaces the object (or its status), which must carry the resourceVersion it read.
    pub fn update(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        part: Part,
        body: Value,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        let (body, expected) = update_body(resource, name, body)?;
        let key = self.key(resource, namespace, name);
        let mut warnings = Vec::new();
        let outcome = self.write(resource, &key, options.dry_run, |existing| {
            let existing = existing.ok_or_else(|| not_found(resource, name))?;
            if existing["metadata"]["resourceVersion"].as_str() != Some(expected.as_str()) {
                return Err(conflict(resource, name));
            }
            let next = next_state(resource, existing, body, part, options.unknown, &mut warnings)?;
            Ok(track_update(resource, existing, next, part, &options.manager))
        })?;
        Ok(Written {
            object: resource.to_view(&written(outcome)),
            created: false,
            warnings,
        })
    }

    /// PATCH: applies a JSON, merge or apply patch to the object (or its status). An apply patch
    /// creates the object when it does not exist.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        part: Part,
        patch_type: PatchType,
        patch: Value,
        options: &WriteOptions,
    ) -> ApiResult<Written> {
        let key = self.key(resource, namespace, name);
        if self.store.get(&key).is_none() && patch_type == PatchType::Apply && part == Part::Main {
            let body = applied_to_nothing(name, patch)?;
            return self.create_as(resource, namespace, body, options, apply::Operation::Apply);
        }
        let mut warnings = Vec::new();
        let outcome = self.write(resource, &key, options.dry_run, |existing| {
            let existing = existing.ok_or_else(|| not_found(resource, name))?;
            patched_state(
                resource,
                name,
                existing,
                part,
                patch_type,
                &patch,
                options,
                &mut warnings,
            )
        })?;
        Ok(Written {
            object: resource.to_view(&written(outcome)),
            created: false,
            warnings,
        })
    }

    /// DELETE: removes the object, or with finalizers marks it for deletion. Once it is gone, its
    /// dependents (objects whose ownerReferences name its uid) are deleted too, or with
    /// `propagationPolicy: Orphan` lose that reference.
    pub fn delete(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        options: &DeleteOptions,
    ) -> ApiResult<Deleted> {
        let key = self.key(resource, namespace, name);
        let outcome = self.write(resource, &key, options.dry_run, |existing| -> ApiResult<Action> {
            let existing = existing.ok_or_else(|| not_found(resource, name))?;
            check_preconditions(resource, name, existing, options)?;
            if !has_finalizers(existing) {
                return Ok(Action::Delete);
            }
            if !existing["metadata"]["deletionTimestamp"].is_null() {
                return Ok(Action::Nothing);
            }
            let mut marked = existing.clone();
            marked["metadata"]["deletionTimestamp"] = json!(now());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            bump_generation(&mut marked);
            Ok(Action::Put(marked))
        })?;
        let (object, gone) = match outcome {
            Outcome::Deleted(o) => {
                if !options.dry_run {
                    self.collect_dependents(&o, options.orphan);
                }
                (o, true)
            }
            Outcome::Written(o) | Outcome::Unchanged(Some(o)) => (o, false),
            Outcome::Unchanged(None) => return Err(not_found(resource, name)),
        };
        Ok(Deleted {
            object: resource.to_view(&object),
            gone,
        })
    }

    /// DELETE on a collection (deletecollection): deletes every object `selected` says yes to (in
    /// the served view), as single deletes would; answers the list of what it deleted.
    pub fn delete_collection(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        selected: impl Fn(&Value) -> bool,
        options: &DeleteOptions,
    ) -> ApiResult<Vec<Value>> {
        let (items, _) = self.store.list(resource.storage, namespace);
        let mut deleted = Vec::new();
        for item in items.iter().map(|o| resource.to_view(o)).filter(|o| selected(o)) {
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            let namespace = item["metadata"]["namespace"].as_str();
            match self.delete(resource, namespace, name, options) {
                Ok(done) => deleted.push(done.object),
                // Gone meanwhile: nothing left to delete.
                Err(ApiError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// Garbage collection of the objects that name `owner` in their ownerReferences.
    fn collect_dependents(&self, owner: &Value, orphan: bool) {
        let Some(uid) = owner["metadata"]["uid"].as_str() else {
            return;
        };
        for &storage in super::resources::STORAGE {
            let (items, _) = self.store.list(storage, None);
            for item in items {
                let references = item["metadata"]["ownerReferences"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if !references.iter().any(|r| r["uid"] == uid) {
                    continue;
                }
                let key = Key {
                    resource: storage,
                    namespace: item["metadata"]["namespace"].as_str().map(str::to_string),
                    name: item["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                };
                let result = if orphan {
                    self.store.modify::<StoreError>(&key, |current| {
                        let Some(current) = current else {
                            return Ok(Action::Nothing);
                        };
                        let mut next = current.clone();
                        let kept: Vec<Value> = references.iter().filter(|r| r["uid"] != uid).cloned().collect();
                        next["metadata"]["ownerReferences"] = Value::Array(kept);
                        if next["metadata"]["ownerReferences"] == json!([]) {
                            remove(&mut next["metadata"], "ownerReferences");
                        }
                        Ok(Action::Put(next))
                    })
                } else {
                    self.store.modify::<StoreError>(&key, |current| {
                        Ok(match current {
                            Some(current) if !has_finalizers(current) => Action::Delete,
                            Some(current) if current["metadata"]["deletionTimestamp"].is_null() => {
                                let mut marked = current.clone();
                                marked["metadata"]["deletionTimestamp"] = json!(now());
                                marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                                Action::Put(marked)
                            }
                            _ => Action::Nothing,
                        })
                    })
                };
                match result {
                    Ok(Outcome::Deleted(dependent)) => self.collect_dependents(&dependent, false),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, dependent = %key.name, "cannot collect a dependent of a deleted object")
                    }
                }
            }
        }
    }

    /// Keeps the newest [`super::events::RETAINED`] events.
    fn trim_events(&self) {
        let (mut events, _) = self.store.list(EVENTS, None);
        if events.len() <= super::events::RETAINED {
            return;
        }
        events.sort_by_key(resource_version_of);
        for event in &events[..events.len() - super::events::RETAINED] {
            let key = Key {
                resource: EVENTS,
                namespace: event["metadata"]["namespace"].as_str().map(str::to_string),
                name: event["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            };
            if let Err(e) = self.store.modify::<StoreError>(&key, |_| Ok(Action::Delete)) {
                tracing::warn!(error = %e, "cannot drop an old event");
            }
        }
    }
}

fn written(outcome: Outcome) -> Value {
    match outcome {
        Outcome::Written(o) | Outcome::Deleted(o) | Outcome::Unchanged(Some(o)) => o,
        Outcome::Unchanged(None) => Value::Null,
    }
}

fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn has_finalizers(object: &Value) -> bool {
    !finalizers(object).is_empty()
}

fn bump_generation(object: &mut Value) {
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
    object["metadata"]["generation"] = json!(generation + 1);
}

fn without_metadata_and_status(object: &Value) -> Value {
    let mut rest = object.clone();
    remove(&mut rest, "metadata");
    remove(&mut rest, "status");
    rest
}

fn remove(object: &mut Value, field: &str) {
    if let Some(map) = object.as_object_mut() {
        map.remove(field);
    }
}

pub fn not_found(resource: &Resource, name: &str) -> ApiError {
    ApiError::NotFound {
        resource: resource.qualified_name(),
        name: name.to_string(),
    }
}

fn conflict(resource: &Resource, name: &str) -> ApiError {
    ApiError::Conflict {
        resource: resource.qualified_name(),
        name: name.to_string(),
        message: "the object has been modified; please apply your changes to the latest version and try again".into(),
    }
}

fn invalid(resource: &Resource, name: &str, causes: Vec<FieldCause>) -> ApiError {
    ApiError::Invalid {
        kind: resource.kind.clone(),
        group: resource.group.to_string(),
        name: name.to_string(),
        causes,
    }
}

pub fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_labels() {
        assert!(dns1123_label_problem("default").is_none());
        for bad in [".", "..", "_cluster", "a.b", "A", "-a", &"a".repeat(64)] {
            assert!(dns1123_label_problem(bad).is_some(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn names_that_are_not_subdomains_or_try_a_path_are_refused() {
        assert!(dns1123_subdomain_problem("dev").is_none());
        assert!(dns1123_subdomain_problem("dev.17f3a").is_none());
        for bad in ["", "../x", "a/b", "Dev", "-dev", "dev-", "a..b", ".", &"a".repeat(254)] {
            assert!(dns1123_subdomain_problem(bad).is_some(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn a_null_test_of_a_missing_path_passes_as_in_go() {
        let target = json!({"metadata": {}});
        let patch = json!([{"op": "test", "path": "/metadata/finalizers", "value": null}, {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]);
        let filtered = lenient_null_tests(&target, patch);
        assert_eq!(filtered.as_array().unwrap().len(), 1);
        let present = json!({"metadata": {"finalizers": ["y"]}});
        let kept = lenient_null_tests(
            &present,
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null}]),
        );
        assert_eq!(
            kept.as_array().unwrap().len(),
            1,
            "a null test of a present value still fails"
        );
    }

    /// Found by the fuzz target (fuzz/seeds/api_request/regression-apply-scalar): an apply patch
    /// that is not an object, to a name that does not exist yet, panicked while being named.
    #[test]
    fn an_apply_patch_that_creates_must_be_an_object() {
        let resource = &super::super::resources::all()[0];
        for body in [
            &b"metaaadt\":null}}"[..],
            b"[]",
            b"3",
            b"null",
            b"{metadata: x}",
            b"{metadata: [1]}",
        ] {
            let patch = super::super::handler::decode_body("application/apply-patch+yaml", body).unwrap();
            let refused = applied_to_nothing("new", patch)
                .and_then(|body| new_object(resource, None, body, UnknownFields::Warn).map(|_| Value::Null));
            assert!(
                matches!(refused, Err(ApiError::BadRequest(_))),
                "{}: {refused:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// Found by the fuzz target (fuzz/seeds/api_request/regression-json-patch-move): a JSON patch
    /// whose `move` fails after an earlier operation applied panicked in json-patch's undo.
    #[test]
    fn a_json_patch_that_fails_half_way_is_a_422_not_a_panic() {
        let resource = &super::super::resources::all()[0];
        let served = json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "dev"},
            "status": {"phase": "Ready", "slots": [{"name": "a"}]}});
        let patch = json!([
            {"op": "remove", "path": "/status/slots/0"},
            {"op": "move", "from": "/status", "path": "/nowhere/phase"},
        ]);
        let result = apply_patch(resource, "dev", &served, PatchType::Json, &patch);
        assert!(matches!(result, Err(ApiError::Invalid { .. })), "{result:?}");
    }
}
