//! What a new or written object must pass: its kind, its schema, its namespace, preconditions.
use super::*;

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
    metadata["uid"] = json!(uuid::Uuid::new_v4().to_string());
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

pub(super) fn validate(resource: &Resource, object: &mut Value, unknown: UnknownFields) -> ApiResult<Vec<String>> {
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
            return Err(ApiError::BadRequest(crate::apiserver::schema::strict_decoding_error(
                &resource.kind,
                resource.version,
                &unknown_paths,
            )));
        }
        warnings = schema
            .check(object, unknown)
            .map_err(|causes| invalid(resource, &name, causes))?;
    }
    let mut causes = crate::apiserver::metadata::validate(object);
    causes.extend(resource.semantic_check(object));
    if !causes.is_empty() {
        return Err(invalid(resource, &name, causes));
    }
    Ok(warnings)
}

/// The body must be an object of this resource's apiVersion and kind.
pub(super) fn check_type(resource: &Resource, body: Value) -> ApiResult<Value> {
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

/// A delete's preconditions must hold for the stored object (a 409 otherwise, worded as by the
/// real server's BeforeDelete, k8s.io/apiserver pkg/registry/rest/delete.go).
pub(super) fn check_preconditions(
    resource: &Resource,
    name: &str,
    existing: &Value,
    options: &DeleteOptions,
) -> ApiResult<()> {
    // The real server names the kind here, not the resource (`KcpShard.kcpshard.io`).
    let kind = match resource.group {
        "" => resource.kind.clone(),
        group => format!("{}.{group}", resource.kind),
    };
    let failed = |what: &str, wanted: &str, found: &str, meaning: &str| ApiError::Conflict {
        resource: kind.clone(),
        name: name.to_string(),
        message: format!(
            "the {what} in the precondition ({wanted}) does not match the {what} in record ({found}). The object might have been {meaning}"
        ),
    };
    if let Some(uid) = &options.uid {
        let found = existing["metadata"]["uid"].as_str().unwrap_or_default();
        if uid != found {
            return Err(failed("UID", uid, found, "deleted and then recreated"));
        }
    }
    if let Some(rv) = &options.resource_version {
        let found = existing["metadata"]["resourceVersion"].as_str().unwrap_or_default();
        if rv != found {
            return Err(failed("ResourceVersion", rv, found, "modified"));
        }
    }
    Ok(())
}
