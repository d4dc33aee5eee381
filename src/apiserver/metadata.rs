//! ObjectMeta checks the real server makes on every write (k8s.io/apimachinery
//! pkg/api/validation/objectmeta.go): label keys and values, annotation keys and total size,
//! finalizer names, ownerReferences, and the managedFields a client may send.
use serde_json::{Value, json};

use super::error::FieldCause;

/// The real server's limit on the annotations of one object, keys and values together.
const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

pub fn validate(object: &Value) -> Vec<FieldCause> {
    let metadata = &object["metadata"];
    let mut causes = Vec::new();
    if let Some(labels) = metadata.get("labels").filter(|v| !v.is_null()) {
        match labels.as_object() {
            None => causes.push(FieldCause::invalid("metadata.labels", "must be a map of strings")),
            Some(labels) => {
                for (key, value) in labels {
                    if let Some(problem) = qualified_name_problem(key) {
                        causes.push(FieldCause::invalid(
                            "metadata.labels",
                            format!("Invalid value: {key:?}: {problem}"),
                        ));
                    }
                    match value.as_str() {
                        Some(value) => {
                            if let Some(problem) = label_value_problem(value) {
                                causes.push(FieldCause::invalid(
                                    format!("metadata.labels.{key}"),
                                    format!("Invalid value: {value:?}: {problem}"),
                                ));
                            }
                        }
                        None => causes.push(FieldCause::invalid(
                            format!("metadata.labels.{key}"),
                            "must be a string",
                        )),
                    }
                }
            }
        }
    }
    if let Some(annotations) = metadata.get("annotations").filter(|v| !v.is_null()) {
        match annotations.as_object() {
            None => causes.push(FieldCause::invalid("metadata.annotations", "must be a map of strings")),
            Some(annotations) => {
                let mut size = 0;
                for (key, value) in annotations {
                    if let Some(problem) = qualified_name_problem(key) {
                        causes.push(FieldCause::invalid(
                            "metadata.annotations",
                            format!("Invalid value: {key:?}: {problem}"),
                        ));
                    }
                    size += key.len() + value.as_str().map_or(0, str::len);
                }
                if size > TOTAL_ANNOTATION_SIZE {
                    causes.push(FieldCause {
                        reason: "FieldValueTooLong",
                        field: "metadata.annotations".into(),
                        message: format!("Too long: may not be more than {TOTAL_ANNOTATION_SIZE} bytes"),
                    });
                }
            }
        }
    }
    for (i, finalizer) in array(metadata, "finalizers").iter().enumerate() {
        let field = format!("metadata.finalizers[{i}]");
        match finalizer.as_str() {
            Some(name) => {
                if let Some(problem) = qualified_name_problem(name) {
                    causes.push(FieldCause::invalid(
                        field,
                        format!("Invalid value: {name:?}: {problem}"),
                    ));
                }
            }
            None => causes.push(FieldCause::invalid(field, "must be a string")),
        }
    }
    let mut controllers = 0;
    for (i, reference) in array(metadata, "ownerReferences").iter().enumerate() {
        let field = |name: &str| format!("metadata.ownerReferences[{i}].{name}");
        for required in ["apiVersion", "kind", "name", "uid"] {
            if reference[required].as_str().is_none_or(str::is_empty) {
                causes.push(FieldCause::required(field(required)));
            }
        }
        if reference["controller"] == Value::Bool(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        causes.push(FieldCause::invalid(
            "metadata.ownerReferences",
            "Only one reference can have Controller set to true",
        ));
    }
    // `[{}]` is not an entry but the request to clear them (what tools send to reset ownership).
    let managed = array(metadata, "managedFields");
    let reset = managed == [json!({})];
    for (i, entry) in managed.iter().enumerate().filter(|_| !reset) {
        let field = |name: &str| format!("metadata.managedFields[{i}].{name}");
        if !matches!(entry["operation"].as_str(), Some("Apply" | "Update")) {
            causes.push(FieldCause::not_supported(
                field("operation"),
                format!(
                    "Unsupported value: {}: supported values: \"Apply\", \"Update\"",
                    entry["operation"]
                ),
            ));
        }
        if entry["fieldsType"].as_str() != Some("FieldsV1") {
            causes.push(FieldCause::not_supported(
                field("fieldsType"),
                format!(
                    "Unsupported value: {}: supported values: \"FieldsV1\"",
                    entry["fieldsType"]
                ),
            ));
        }
    }
    causes
}

fn array<'v>(metadata: &'v Value, name: &str) -> &'v [Value] {
    metadata[name].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// `[prefix/]name`: a DNS subdomain prefix and a name of at most 63 characters, alphanumeric at
/// both ends, `-`, `_` and `.` inside (label keys, annotation keys, finalizers).
pub fn qualified_name_problem(key: &str) -> Option<&'static str> {
    const NAME: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && super::objects::dns1123_subdomain_problem(prefix).is_some()
    {
        return Some(
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')",
        );
    }
    if name.is_empty() {
        return Some("name part must be non-empty");
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters");
    }
    if !simple_name(name) {
        return Some(NAME);
    }
    None
}

/// Empty, or at most 63 characters of the name-part alphabet.
pub fn label_value_problem(value: &str) -> Option<&'static str> {
    if value.len() > 63 {
        return Some("must be no more than 63 characters");
    }
    if !value.is_empty() && !simple_name(value) {
        return Some(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
        );
    }
    None
}

fn simple_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(object: Value) -> Vec<String> {
        validate(&object).into_iter().map(|c| c.field).collect()
    }

    #[test]
    fn good_metadata_passes() {
        let object = json!({"metadata": {
            "labels": {"app.kubernetes.io/name": "dev", "tier": ""},
            "annotations": {"kcpshard.io/restartedAt": "now"},
            "finalizers": ["kcpshard.io/cleanup"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u", "controller": true}],
            "managedFields": [{"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {}}],
        }});
        assert_eq!(fields(object), Vec::<String>::new());
    }

    #[test]
    fn bad_metadata_names_each_field() {
        let object = json!({"metadata": {
            "labels": {"bad key": "x", "ok": "bad value!"},
            "annotations": {"x": "y".repeat(TOTAL_ANNOTATION_SIZE)},
            "finalizers": ["not/a/finalizer"],
            "ownerReferences": [{"kind": "X", "name": "x", "uid": "u", "controller": true}, {"apiVersion": "v1", "kind": "X", "name": "y", "uid": "v", "controller": true}],
            "managedFields": [{"manager": "m", "operation": "Merge", "fieldsType": "FieldsV1"}],
        }});
        assert_eq!(
            fields(object),
            [
                "metadata.labels",
                "metadata.labels.ok",
                "metadata.annotations",
                "metadata.finalizers[0]",
                "metadata.ownerReferences[0].apiVersion",
                "metadata.ownerReferences",
                "metadata.managedFields[0].operation",
            ]
        );
    }
}
