//! OpenAPI v3 documents: `/openapi/v3` (the index) and one document per group-version.
//!
//! kubectl reads them for two things. `apply` (default `--validate=strict`) looks for a PATCH
//! operation tagged with the object's group-version-kind that declares the `fieldValidation` query
//! parameter, and aborts without one. `explain` finds the schema tagged with that
//! group-version-kind. The PATCH request body lists no strategic-merge content type, so a
//! client-side apply falls back to a JSON merge patch, as it must for custom resources
//! (kubectl/pkg/cmd/apply/patcher.go).
use serde_json::{Value, json};

use super::resources::Resource;

/// The `paths` index of `/openapi/v3`, keyed by `api/v1` or `apis/<group>/<version>`.
pub fn index(resources: &[Resource]) -> Value {
    let mut paths = serde_json::Map::new();
    for r in resources {
        let key = group_version_path(r);
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", hash(r))}),
        );
    }
    json!({"paths": paths})
}

/// The document for `api/v1` or `apis/<group>/<version>`.
pub fn document(resources: &[Resource], gv_path: &str) -> Option<Value> {
    let served: Vec<&Resource> = resources.iter().filter(|r| group_version_path(r) == gv_path).collect();
    if served.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for r in served {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let schema_name = format!("{}.{}.{}", reverse_domain(r.group), r.version, r.kind);
        let mut schema = r.openapi_schema.clone();
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        schemas.insert(schema_name.clone(), schema);
        let object_ref = json!({"$ref": format!("#/components/schemas/{schema_name}")});
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": object_ref}}}});
        let body = json!({"content": {"application/json": {"schema": object_ref}}});
        let query =
            |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        let write_params = json!([query("dryRun"), query("fieldManager"), query("fieldValidation")]);
        let op = |action: &str, extra: Value| {
            let mut op =
                json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk, "responses": ok});
            if let (Value::Object(op), Value::Object(extra)) = (&mut op, extra) {
                op.extend(extra);
            }
            op
        };
        let patch = op(
            "patch",
            json!({
                "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation"), query("force")],
                "requestBody": {"content": {
                    "application/json-patch+json": {"schema": {"type": "object"}},
                    "application/merge-patch+json": {"schema": {"type": "object"}},
                    "application/apply-patch+yaml": {"schema": {"type": "object"}},
                }},
            }),
        );
        let base = format!(
            "/{gv_path}/{}{}",
            if r.namespaced { "namespaces/{namespace}/" } else { "" },
            r.plural
        );
        let name_param = json!([{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]);
        paths.insert(
            base.clone(),
            json!({
                "get": op("list", json!({})),
                "post": op("post", json!({"parameters": write_params, "requestBody": body})),
            }),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "parameters": name_param,
                "get": op("get", json!({})),
                "put": op("put", json!({"parameters": write_params, "requestBody": body})),
                "patch": patch,
                "delete": op("delete", json!({})),
            }),
        );
        if r.status_subresource {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({
                    "parameters": name_param,
                    "get": op("get", json!({})),
                    "put": op("put", json!({"parameters": write_params, "requestBody": body})),
                    "patch": patch,
                }),
            );
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "kcpshard", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

fn group_version_path(r: &Resource) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

/// `kcpshard.io` -> `io.kcpshard`, as Kubernetes names schema definitions.
fn reverse_domain(group: &str) -> String {
    if group.is_empty() {
        "io.k8s.api.core".into()
    } else {
        group.split('.').rev().collect::<Vec<_>>().join(".")
    }
}

/// Changes when the served schema does, so that clients may cache a document by its URL.
fn hash(r: &Resource) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    r.openapi_schema.to_string().hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `/openapi/v2` as JSON (Swagger 2.0): the definitions, tagged with their group-version-kind,
/// and a path per resource and verb. The real server serves it as protobuf too; this one does
/// not (docs/api.md).
pub fn swagger(resources: &[Resource]) -> Value {
    let mut paths = serde_json::Map::new();
    let mut definitions = serde_json::Map::new();
    for r in resources {
        let gvk = json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
        let name = format!("{}.{}.{}", reverse_domain(r.group), r.version, r.kind);
        let mut schema = v2_schema(r.openapi_schema.clone());
        schema["x-kubernetes-group-version-kind"] = gvk.clone();
        definitions.insert(name.clone(), schema);
        let object_ref = json!({"$ref": format!("#/definitions/{name}")});
        let op = |action: &str| {
            json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk[0],
                   "consumes": ["application/json"], "produces": ["application/json", "application/yaml"],
                   "responses": {"200": {"description": "OK", "schema": object_ref}}})
        };
        let base = format!(
            "/{}/{}{}",
            group_version_path(r),
            if r.namespaced { "namespaces/{namespace}/" } else { "" },
            r.plural
        );
        paths.insert(
            base.clone(),
            json!({"get": op("list"), "post": op("post"), "delete": op("deletecollection")}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "kcpshard", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "definitions": definitions,
    })
}

/// An OpenAPI v3 schema as Swagger 2.0 has it: without `nullable`, which 2.0 does not know (the
/// real server drops it the same way).
fn v2_schema(mut schema: Value) -> Value {
    match &mut schema {
        Value::Object(fields) => {
            fields.remove("nullable");
            for value in fields.values_mut() {
                *value = v2_schema(value.take());
            }
        }
        Value::Array(items) => {
            for item in items {
                *item = v2_schema(item.take());
            }
        }
        _ => {}
    }
    schema
}
