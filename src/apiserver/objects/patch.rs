//! What an update or a patch makes of the stored object: merge, JSON and strategic patches,
//! server-side apply and the managed fields each write leaves.
use super::*;

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
pub(super) fn server_side_apply(
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
    let scope = ownership_scope(resource, part);
    let mut applied = managed.apply(existing, &config, shape(resource), scope, &writer, options.force);
    // kubectl's move from client-side apply, as the real server makes it: an apply by `kubectl`
    // whose conflicts are all fields its last client-side apply set, still at the values it set,
    // takes them over (lastappliedmanager.go in k8s.io/apimachinery's managedfields).
    if let Err(conflicts) = &applied
        && options.manager == "kubectl"
        && let Some(last) = last_applied(resource, existing)
        && conflicts.within(&scope.still_as_applied(existing, &last, shape(resource)))
    {
        applied = managed.apply(existing, &config, shape(resource), scope, &writer, true);
    }
    let mut merged = applied.map_err(|conflicts| ApiError::ApplyConflict {
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

/// kubectl's last client-side configuration of `existing` (its annotation), in stored form.
fn last_applied(resource: &Resource, existing: &Value) -> Option<Value> {
    let text = existing["metadata"]["annotations"][apply::LAST_APPLIED].as_str()?;
    let applied: Value = serde_json::from_str(text).ok()?;
    Some(resource.from_view(&applied))
}

/// Whether writes to `resource` record `managedFields` (only resources with a schema: events are
/// served in two versions, and their field paths would need converting between them).
pub(super) fn tracks_managed_fields(resource: &Resource) -> bool {
    resource.schema.is_some()
}

pub(super) fn shape(resource: &Resource) -> Shape<'_> {
    Shape::root(resource.schema.as_ref().map(|s| s.root()))
}

pub(super) fn ownership_scope(resource: &Resource, part: Part) -> Scope {
    match part {
        Part::Main => Scope::Main {
            status_subresource: resource.status_subresource,
        },
        Part::Status => Scope::Status,
    }
}

pub(super) fn writer(resource: &Resource, manager: &str, part: Part) -> Writer {
    Writer {
        manager: manager.to_string(),
        subresource: (part == Part::Status).then_some("status"),
        api_version: resource.api_version(),
        now: now(),
    }
}

/// Records an Update by `manager` from `existing` to the object `next` stores. The managed fields
/// the client sent (kubectl's upgrade from client-side apply rewrites them) replace the stored
/// ones, as on the real server; `[{}]` clears them, the request's other changes included (as kcp
/// does: no entry for the writer either).
pub(super) fn track_update(resource: &Resource, existing: &Value, next: Action, part: Part, manager: &str) -> Action {
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

pub(super) fn apply_patch(
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
pub(super) fn lenient_null_tests(target: &Value, patch: Value) -> Value {
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
