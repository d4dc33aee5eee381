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

/// The checks of a KcpShard against the others (an admission step of the real server's kind): two
/// shards cannot share a front address, since the second front could never listen. Holds
/// [`Objects::admission`] from the read of the others to the write.
struct Admission<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
    others: Vec<Value>,
}

impl<'a> Admission<'a> {
    fn new(objects: &'a Objects, resource: &Resource) -> Option<Admission<'a>> {
        if resource.storage != super::resources::KCPSHARDS {
            return None;
        }
        let guard = objects.admission.lock().unwrap_or_else(|p| p.into_inner());
        let (others, _) = objects.store.list(resource.storage, None);
        Some(Admission { _guard: guard, others })
    }

    fn check(&self, resource: &Resource, next: &Value) -> ApiResult<()> {
        let name = next["metadata"]["name"].as_str().unwrap_or_default();
        let Some(listen) = front_listen(next) else {
            return Ok(());
        };
        let taken = self.others.iter().find(|other| {
            other["metadata"]["name"].as_str() != Some(name)
                && front_listen(other).is_some_and(|theirs| {
                    theirs.port() == listen.port()
                        && (theirs.ip() == listen.ip() || theirs.ip().is_unspecified() || listen.ip().is_unspecified())
                })
        });
        match taken {
            None => Ok(()),
            Some(other) => Err(invalid(
                resource,
                name,
                vec![FieldCause::invalid(
                    "spec.front.listen",
                    format!(
                        "Invalid value: {:?}: KcpShard {} already uses {} for its front; pick another address",
                        listen.to_string(),
                        other["metadata"]["name"].as_str().unwrap_or_default(),
                        other["spec"]["front"]["listen"].as_str().unwrap_or_default()
                    ),
                )],
            )),
        }
    }
}

fn front_listen(shard: &Value) -> Option<std::net::SocketAddr> {
    shard["spec"]["front"]["listen"].as_str()?.parse().ok()
}

/// A create's object, checked and filled in, before the store gives it a resourceVersion.
#[derive(Debug)]
pub struct NewObject {
    pub namespace: Option<String>,
    pub name: String,
    /// In stored form.
    pub object: Value,
    pub warnings: Vec<String>,
}

/// What a create does before it stores: type, name and scope checks, server-set metadata,
/// pruning, defaulting and validation. Pure (no store), so the fuzz target (fuzz/) can drive it.
pub fn new_object(
    resource: &Resource,
    namespace: Option<&str>,
    body: Value,
    unknown: UnknownFields,
) -> ApiResult<NewObject> {
    let mut object = resource.from_view(&check_type(resource, body)?);
    let name = match object["metadata"]["name"].as_str() {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => match object["metadata"]["generateName"].as_str() {
            Some(prefix) => format!("{prefix}{}", random_suffix()),
            None => return Err(invalid(resource, "", vec![FieldCause::required("metadata.name")])),
        },
    };
    check_name(resource, &name)?;
    let namespace = scope(resource, namespace, &object)?;
    if let Some(ns) = &namespace
        && let Some(problem) = dns1123_label_problem(ns)
    {
        return Err(invalid(
            resource,
            &name,
            vec![FieldCause::invalid(
                "metadata.namespace",
                format!("Invalid value: {ns:?}: {problem}"),
            )],
        ));
    }
    let now = now();
    let metadata = &mut object["metadata"];
    metadata["name"] = json!(name);
    match &namespace {
        Some(ns) => metadata["namespace"] = json!(ns),
        // The real server drops a namespace sent for a cluster-scoped object.
        None => remove(metadata, "namespace"),
    }
    metadata["uid"] = json!(uuid());
    metadata["creationTimestamp"] = json!(now);
    metadata["generation"] = json!(1);
    for system in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        remove(metadata, system);
    }
    if resource.status_subresource {
        remove(&mut object, "status");
    }
    let warnings = validate(resource, &mut object, unknown)?;
    Ok(NewObject {
        namespace,
        name,
        object,
        warnings,
    })
}

/// The body an apply patch creates when `name` does not exist yet: the patch itself, named.
pub fn applied_to_nothing(name: &str, patch: Value) -> ApiResult<Value> {
    // As for a patch of an existing object: a body that is not an object is a 400 (naming it below
    // would panic on anything else).
    if !patch.is_object() {
        return Err(ApiError::BadRequest(
            "a merge or apply patch must be a JSON object".into(),
        ));
    }
    check_body_name(&patch, name)?;
    let mut body = patch;
    // metadata that is not an object is refused by the create's type check, with its own message.
    if body["metadata"].is_object() || body["metadata"].is_null() {
        body["metadata"]["name"] = json!(name);
    }
    Ok(body)
}

/// The checks an update (PUT) makes on its body before it reads the stored object: the body in
/// stored form, and the resourceVersion it must match. Pure, for the fuzz target too.
pub fn update_body(resource: &Resource, name: &str, body: Value) -> ApiResult<(Value, String)> {
    let body = resource.from_view(&check_type(resource, body)?);
    check_body_name(&body, name)?;
    let Some(expected) = body["metadata"]["resourceVersion"].as_str().map(str::to_string) else {
        return Err(invalid(
            resource,
            name,
            vec![FieldCause::invalid(
                "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )],
        ));
    };
    Ok((body, expected))
}

/// What a patch of the stored `existing` leads to: the patch applied to the served view, the
/// type, name and pinned-version checks, then [`next_state`]. Pure, for the fuzz target too.
#[allow(clippy::too_many_arguments)]
pub fn patched_state(
    resource: &Resource,
    name: &str,
    existing: &Value,
    part: Part,
    patch_type: PatchType,
    patch: &Value,
    options: &WriteOptions,
    warnings: &mut Vec<String>,
) -> ApiResult<Action> {
    let served = resource.to_view(existing);
    let patched = match patch_type {
        PatchType::Apply => server_side_apply(resource, name, existing, part, patch, options)?,
        _ => apply_patch(resource, name, &served, patch_type, patch)?,
    };
    let patched = resource.from_view(&check_type(resource, patched)?);
    check_body_name(&patched, name)?;
    // A patch may pin the version it was computed from (kubectl apply does); if it does, it
    // must still be current.
    if let Some(pinned) = patched["metadata"]["resourceVersion"].as_str()
        && pinned != existing["metadata"]["resourceVersion"].as_str().unwrap_or_default()
    {
        return Err(conflict(resource, name));
    }
    let next = next_state(resource, existing, patched, part, options.unknown, warnings)?;
    Ok(match patch_type {
        PatchType::Apply => next,
        _ => track_update(resource, existing, next, part, &options.manager),
    })
}

/// The served object after an apply of `patch` by `options.manager`, its `managedFields` updated;
/// a 409 when it would change fields other managers own (and `force` is not set). An object that
/// kept kubectl's last-applied annotation gets kubectl's applied configuration in it, so that a
/// later client-side apply computes its patch from what was applied.
fn server_side_apply(
    resource: &Resource,
    name: &str,
    existing: &Value,
    part: Part,
    patch: &Value,
    options: &WriteOptions,
) -> ApiResult<Value> {
    let config = check_type(resource, patch.clone())?;
    check_body_name(&config, name)?;
    if !tracks_managed_fields(resource) {
        // Events: a merge into the view the client applies to.
        let mut merged = resource.to_view(existing);
        json_patch::merge(&mut merged, &config);
        return Ok(merged);
    }
    let mut config = resource.from_view(&config);
    if let Some(metadata) = config["metadata"].as_object_mut() {
        metadata.remove("managedFields");
    }
    let mut managed = Managed::read(existing);
    let writer = writer(resource, &options.manager, part);
    let mut merged = managed
        .apply(
            existing,
            &config,
            shape(resource),
            ownership_scope(resource, part),
            &writer,
            options.force,
        )
        .map_err(|conflicts| ApiError::ApplyConflict {
            message: conflicts.message(),
            causes: conflicts.causes(),
        })?;
    managed.write(&mut merged);
    // As the real server: only kubectl's own apply, and only where the annotation is kept.
    if part == Part::Main
        && options.manager == "kubectl"
        && let Some(annotations) = merged["metadata"]["annotations"].as_object_mut()
        && annotations.contains_key(apply::LAST_APPLIED)
    {
        let mut applied = patch.clone();
        if let Some(theirs) = applied["metadata"]["annotations"].as_object_mut() {
            theirs.remove(apply::LAST_APPLIED);
        }
        annotations.insert(apply::LAST_APPLIED.into(), json!(applied.to_string()));
    }
    Ok(resource.to_view(&merged))
}

/// Whether writes to `resource` record `managedFields` (only resources with a schema: events are
/// served in two versions, and their field paths would need converting between them).
fn tracks_managed_fields(resource: &Resource) -> bool {
    resource.schema.is_some()
}

fn shape(resource: &Resource) -> Shape<'_> {
    Shape::root(resource.schema.as_ref().map(|s| s.root()))
}

fn ownership_scope(resource: &Resource, part: Part) -> Scope {
    match part {
        Part::Main => Scope::Main {
            status_subresource: resource.status_subresource,
        },
        Part::Status => Scope::Status,
    }
}

fn writer(resource: &Resource, manager: &str, part: Part) -> Writer {
    Writer {
        manager: manager.to_string(),
        subresource: (part == Part::Status).then_some("status"),
        api_version: resource.api_version(),
        now: now(),
    }
}

/// Records an Update by `manager` from `existing` to the object `next` stores. The managed fields
/// the client sent (kubectl's upgrade from client-side apply rewrites them) replace the stored
/// ones, as on the real server; `[{}]` clears them.
fn track_update(resource: &Resource, existing: &Value, next: Action, part: Part, manager: &str) -> Action {
    let Action::Put(mut next) = next else {
        return next;
    };
    if !tracks_managed_fields(resource) {
        return Action::Put(next);
    }
    if next["metadata"]["managedFields"] == json!([{}]) {
        Managed::default().write(&mut next);
        return Action::Put(next);
    }
    let sent = Managed::read(&next);
    let mut managed = if part == Part::Main && !sent.0.is_empty() {
        sent
    } else {
        Managed::read(existing)
    };
    managed.update(
        existing,
        &next,
        shape(resource),
        ownership_scope(resource, part),
        &writer(resource, manager, part),
    );
    managed.write(&mut next);
    Action::Put(next)
}

/// The object an update or patch leads to, from the stored `existing` and the client's `proposed`
/// (both in stored form).
pub fn next_state(
    resource: &Resource,
    existing: &Value,
    proposed: Value,
    part: Part,
    unknown: UnknownFields,
    warnings: &mut Vec<String>,
) -> ApiResult<Action> {
    let mut next = match (part, resource.status_subresource) {
        (Part::Status, _) => {
            let mut next = existing.clone();
            next["status"] = proposed.get("status").cloned().unwrap_or(Value::Null);
            if next["status"].is_null() {
                remove(&mut next, "status");
            }
            next
        }
        (Part::Main, true) => {
            let mut next = proposed;
            match existing.get("status") {
                Some(status) => next["status"] = status.clone(),
                None => remove(&mut next, "status"),
            }
            next
        }
        (Part::Main, false) => proposed,
    };
    // System metadata is the server's, whatever the client sent.
    for system in [
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "resourceVersion",
    ] {
        match existing["metadata"].get(system) {
            Some(v) => next["metadata"][system] = v.clone(),
            None => remove(&mut next["metadata"], system),
        }
    }
    // A client that sends no managedFields leaves them as they are (the real server's rule, so
    // that clients unaware of them cannot wipe them).
    if next["metadata"]["managedFields"].as_array().is_none_or(Vec::is_empty) {
        match existing["metadata"].get("managedFields") {
            Some(managed) => next["metadata"]["managedFields"] = managed.clone(),
            None => remove(&mut next["metadata"], "managedFields"),
        }
    }
    *warnings = validate(resource, &mut next, unknown)?;
    let causes = resource.update_check(existing, &next);
    if !causes.is_empty() {
        let name = next["metadata"]["name"].as_str().unwrap_or_default().to_string();
        return Err(invalid(resource, &name, causes));
    }
    if !existing["metadata"]["deletionTimestamp"].is_null() {
        let added = finalizers(&next)
            .into_iter()
            .any(|f| !finalizers(existing).contains(&f));
        if added {
            return Err(ApiError::Invalid {
                kind: resource.kind.clone(),
                group: resource.group.to_string(),
                name: next["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                causes: vec![FieldCause::invalid(
                    "metadata.finalizers",
                    "no new finalizers can be added if the object is being deleted",
                )],
            });
        }
        if !has_finalizers(&next) {
            return Ok(Action::Delete);
        }
    }
    if &next == existing {
        return Ok(Action::Nothing);
    }
    if without_metadata_and_status(&next) != without_metadata_and_status(existing) {
        bump_generation(&mut next);
    }
    Ok(Action::Put(next))
}

fn apply_patch(
    resource: &Resource,
    name: &str,
    served: &Value,
    patch_type: PatchType,
    patch: &Value,
) -> ApiResult<Value> {
    let mut target = served.clone();
    match patch_type {
        PatchType::Merge | PatchType::Apply => {
            if !patch.is_object() {
                return Err(ApiError::BadRequest(
                    "a merge or apply patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(&mut target, patch);
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(lenient_null_tests(served, patch.clone()))
                .map_err(|e| ApiError::BadRequest(format!("the JSON patch is not a list of operations: {e}")))?;
            // `patch_unsafe`: `target` is a copy that is dropped on failure, and `patch` undoes the
            // operations already applied, which panics when a `move` failed half way.
            json_patch::patch_unsafe(&mut target, &ops).map_err(|e| match e.kind {
                json_patch::PatchErrorKind::TestFailed => ApiError::Invalid {
                    kind: resource.kind.clone(),
                    group: resource.group.to_string(),
                    name: name.to_string(),
                    causes: vec![FieldCause::invalid(
                        e.path.to_string(),
                        format!("the JSON patch test failed: {e}"),
                    )],
                },
                _ => ApiError::Invalid {
                    kind: resource.kind.clone(),
                    group: resource.group.to_string(),
                    name: name.to_string(),
                    causes: vec![FieldCause::invalid(
                        e.path.to_string(),
                        format!("the JSON patch cannot be applied: {e}"),
                    )],
                },
            })?;
        }
    }
    Ok(target)
}

/// In Go's JSON patch (and so in the real server), `test` of a missing path against `null` passes;
/// kube-rs' finalizer helper relies on it (`test /metadata/finalizers == null`). The json-patch
/// crate fails such a test, so those operations are dropped before applying.
fn lenient_null_tests(target: &Value, patch: Value) -> Value {
    match patch {
        Value::Array(ops) => Value::Array(
            ops.into_iter()
                .filter(|op| {
                    let is_null_test = op["op"] == "test" && op.get("value").is_some_and(Value::is_null);
                    let path = op["path"].as_str().unwrap_or_default();
                    !(is_null_test && target.pointer(path).is_none_or(Value::is_null))
                })
                .collect(),
        ),
        other => other,
    }
}

fn validate(resource: &Resource, object: &mut Value, unknown: UnknownFields) -> ApiResult<Vec<String>> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let mut warnings = Vec::new();
    if let Some(schema) = &resource.schema {
        // Strict mode fails while decoding, before validation, as a 400 (as kube-apiserver does).
        let unknown_paths = if unknown == UnknownFields::Strict {
            schema.unknown_fields(object)
        } else {
            Vec::new()
        };
        if !unknown_paths.is_empty() {
            return Err(ApiError::BadRequest(super::schema::strict_decoding_error(
                &resource.kind,
                resource.version,
                &unknown_paths,
            )));
        }
        warnings = schema
            .check(object, unknown)
            .map_err(|causes| invalid(resource, &name, causes))?;
    }
    let mut causes = super::metadata::validate(object);
    causes.extend(resource.semantic_check(object));
    if !causes.is_empty() {
        return Err(invalid(resource, &name, causes));
    }
    Ok(warnings)
}

/// The body must be an object of this resource's apiVersion and kind.
fn check_type(resource: &Resource, body: Value) -> ApiResult<Value> {
    if !body.is_object() {
        return Err(ApiError::BadRequest(
            "the request body must be a JSON or YAML object".into(),
        ));
    }
    let (api_version, kind) = (
        body["apiVersion"].as_str().unwrap_or_default(),
        body["kind"].as_str().unwrap_or_default(),
    );
    if kind.is_empty() {
        return Err(ApiError::BadRequest(
            "Object 'Kind' is missing in the request body".into(),
        ));
    }
    if api_version != resource.api_version() || kind != resource.kind {
        return Err(ApiError::BadRequest(format!(
            "the object is a {kind} of apiVersion {api_version:?}, but this endpoint serves {} of apiVersion {:?}",
            resource.kind,
            resource.api_version()
        )));
    }
    if !body["metadata"].is_object() && !body["metadata"].is_null() {
        return Err(ApiError::BadRequest("metadata must be an object".into()));
    }
    let mut body = body;
    if body["metadata"].is_null() {
        body["metadata"] = json!({});
    }
    Ok(body)
}

fn check_body_name(body: &Value, name: &str) -> ApiResult<()> {
    match body["metadata"]["name"].as_str() {
        Some(n) if !n.is_empty() && n != name => Err(ApiError::BadRequest(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// The namespace the object lives in: the URL's, which a namespace in the body must match.
fn scope(resource: &Resource, url_namespace: Option<&str>, object: &Value) -> ApiResult<Option<String>> {
    let body_namespace = object["metadata"]["namespace"].as_str().filter(|ns| !ns.is_empty());
    if !resource.namespaced {
        return Ok(None);
    }
    match (url_namespace, body_namespace) {
        (Some(url), Some(body)) if url != body => Err(ApiError::BadRequest(format!(
            "the namespace of the provided object ({body}) does not match the namespace sent on the request ({url})"
        ))),
        (Some(ns), _) => Ok(Some(ns.to_string())),
        (None, _) => Err(ApiError::BadRequest(format!(
            "{} are namespaced: create them under /namespaces/<namespace>/",
            resource.plural
        ))),
    }
}

/// Names are DNS-1123 subdomains: they become file names, so nothing else may pass.
pub fn check_name(resource: &Resource, name: &str) -> ApiResult<()> {
    if let Some(problem) = dns1123_subdomain_problem(name) {
        return Err(invalid(
            resource,
            name,
            vec![FieldCause::invalid(
                "metadata.name",
                format!("Invalid value: {name:?}: {problem}"),
            )],
        ));
    }
    Ok(())
}

/// Namespaces are DNS-1123 labels (so `.`, `..` and `_cluster` never name one).
pub fn dns1123_label_problem(name: &str) -> Option<&'static str> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!ok).then_some(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
    )
}

pub fn dns1123_subdomain_problem(name: &str) -> Option<&'static str> {
    const RULE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')";
    if name.is_empty() || name.len() > 253 {
        return Some("must be no more than 253 characters and not empty");
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if !name.split('.').all(label_ok) {
        return Some(RULE);
    }
    None
}

/// A delete's preconditions must hold for the stored object (a 409 otherwise, worded as by the
/// real server).
fn check_preconditions(resource: &Resource, name: &str, existing: &Value, options: &DeleteOptions) -> ApiResult<()> {
    let failed = |what: &str, wanted: &str, found: &str| ApiError::Conflict {
        resource: resource.qualified_name(),
        name: name.to_string(),
        message: format!("Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {found}"),
    };
    if let Some(uid) = &options.uid {
        let found = existing["metadata"]["uid"].as_str().unwrap_or_default();
        if uid != found {
            return Err(failed("UID", uid, found));
        }
    }
    if let Some(rv) = &options.resource_version {
        let found = existing["metadata"]["resourceVersion"].as_str().unwrap_or_default();
        if rv != found {
            return Err(failed("ResourceVersion", rv, found));
        }
    }
    Ok(())
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

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the OS provides random bytes");
    bytes
}

/// A version-4 UUID.
fn uuid() -> String {
    let mut b = random_bytes::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Five characters for `generateName`, from the alphabet Kubernetes uses (no vowels, no look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    random_bytes::<5>()
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
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

    #[test]
    fn uuids_are_version_4() {
        let id = uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }
}
