//! Structural-schema handling for custom resources, as kube-apiserver applies a CRD's
//! `openAPIV3Schema` on every create, update and patch
//! (k8s.io/apiextensions-apiserver/pkg/apiserver/schema):
//!
//! 1. **Prune**: drop fields the schema does not declare (except under
//!    `x-kubernetes-preserve-unknown-fields`, and `apiVersion`/`kind`/`metadata` at the root or in an
//!    embedded resource, which the server checks itself). `fieldValidation` decides what the client
//!    hears about them: nothing (Ignore), a warning (Warn), or an error (Strict).
//! 2. **Default**: fill missing fields that carry a `default` (nested defaults apply after their
//!    parent's), and treat `null` in a non-nullable field as missing.
//! 3. **Validate**: types, enums, patterns, bounds, lengths, required fields (with the `jsonschema`
//!    crate, on the schema with its `x-kubernetes-*` keys translated away), plus list-map key
//!    uniqueness. Errors become [`FieldCause`]s with dotted paths (`spec.store.type`) and the reasons
//!    and message shapes kube-apiserver uses, so kubectl prints them as it would for a cluster.
//!
//! CEL rules (`x-kubernetes-validations`) are not evaluated.
use std::collections::{BTreeMap, BTreeSet};

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::paths::LocationSegment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::{Map, Value, json};

use super::error::FieldCause;

/// What to do about fields the schema does not declare (the `fieldValidation` query parameter).
/// In every mode they are dropped from the object before it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownFields {
    /// Drop them silently.
    Ignore,
    /// Drop them and warn (`unknown field "spec.foo"`); the server's default.
    #[default]
    Warn,
    /// Refuse the object, one cause per unknown field.
    Strict,
}

/// Formats kube-apiserver checks whose meaning JSON Schema shares; other formats (`int64`,
/// `uint16`, ...) are annotations only.
const CHECKED_FORMATS: &[&str] = &["date-time", "ipv4", "ipv6", "uuid"];

/// A CRD version's schema, ready to prune, default and validate objects.
#[derive(Debug)]
pub struct StructuralSchema {
    root: Node,
    validator: Option<jsonschema::Validator>,
}

/// The parts of a schema node that pruning, defaulting and list checks need.
#[derive(Debug, Default)]
struct Node {
    properties: BTreeMap<String, Node>,
    /// `additionalProperties` as a schema: a map whose values all follow it.
    additional: Option<Box<Node>>,
    items: Option<Box<Node>>,
    /// Keep undeclared fields (`x-kubernetes-preserve-unknown-fields`, `additionalProperties: true`).
    preserve_unknown: bool,
    /// `x-kubernetes-embedded-resource`: keep apiVersion, kind and metadata.
    embedded: bool,
    nullable: bool,
    default: Option<Value>,
    /// Keys of an `x-kubernetes-list-type: map`, or empty.
    list_map_keys: Vec<String>,
    /// `x-kubernetes-list-type: set`.
    list_set: bool,
}

impl StructuralSchema {
    /// Builds the checker from a CRD version's `openAPIV3Schema`. Should the schema not compile for
    /// the validator (not the case for the KcpShard CRD; tests prove it), pruning and defaulting still
    /// work and the failure is logged.
    pub fn new(schema: &JSONSchemaProps) -> Self {
        match Self::try_new(schema) {
            Ok(built) => built,
            Err(err) => {
                tracing::error!(
                    "the CRD schema does not compile for validation, only pruning and defaulting apply: {err}"
                );
                Self {
                    root: Node::from_props(schema),
                    validator: None,
                }
            }
        }
    }

    /// Like [`StructuralSchema::new`], but fails when the validator cannot be compiled.
    pub fn try_new(schema: &JSONSchemaProps) -> Result<Self, String> {
        let json = to_json_schema(schema);
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft4)
            .should_validate_formats(true)
            .build(&json)
            .map_err(|err| err.to_string())?;
        Ok(Self {
            root: Node::from_props(schema),
            validator: Some(validator),
        })
    }

    /// Prunes unknown fields, applies defaults, and validates `obj` in place, as kube-apiserver does
    /// before it stores a custom resource. Ok carries the warnings to send (Warn mode); Err the causes
    /// for a 422. In Strict mode unknown fields alone are reported (kube-apiserver fails decoding
    /// before it validates).
    pub fn check(&self, obj: &mut Value, unknown: UnknownFields) -> Result<Vec<String>, Vec<FieldCause>> {
        let unknown_paths = self.prune(obj);
        if unknown == UnknownFields::Strict && !unknown_paths.is_empty() {
            return Err(unknown_paths.into_iter().map(FieldCause::unknown).collect());
        }
        self.default(obj);
        let causes = self.validate(obj);
        if !causes.is_empty() {
            return Err(causes);
        }
        Ok(match unknown {
            UnknownFields::Warn => unknown_paths.iter().map(|p| format!("unknown field \"{p}\"")).collect(),
            UnknownFields::Ignore | UnknownFields::Strict => Vec::new(),
        })
    }

    /// Drops the fields the schema does not declare; returns their dotted paths, in document order.
    pub fn prune(&self, obj: &mut Value) -> Vec<String> {
        let mut unknown = Vec::new();
        prune(obj, &self.root, "", true, &mut unknown);
        unknown
    }

    /// The dotted paths of the fields [`StructuralSchema::prune`] would drop, leaving `obj` as it is.
    /// kube-apiserver refuses these in Strict mode with a 400 before it validates anything: see
    /// [`strict_decoding_error`].
    pub fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        self.prune(&mut obj.clone())
    }

    /// Fills in schema defaults for missing (or null, non-nullable) fields.
    pub fn default(&self, obj: &mut Value) {
        apply_defaults(obj, &self.root);
    }

    /// The schema's complaints about `obj`, as field causes. Empty when valid.
    pub fn validate(&self, obj: &Value) -> Vec<FieldCause> {
        let mut causes = Vec::new();
        if let Some(validator) = &self.validator {
            for error in validator.iter_errors(obj) {
                let path = dotted(error.instance_path().iter());
                let cause = to_cause(&path, error.kind(), error.instance());
                if !causes.contains(&cause) {
                    causes.push(cause);
                }
            }
        }
        // A value of the wrong type also fails its enum or pattern; the type is the news.
        let mistyped: BTreeSet<String> = causes
            .iter()
            .filter(|c| c.reason == "FieldValueTypeInvalid")
            .map(|c| c.field.clone())
            .collect();
        causes.retain(|c| c.reason == "FieldValueTypeInvalid" || !mistyped.contains(&c.field));
        check_lists(obj, &self.root, "", &mut causes);
        causes
    }
}

/// One node of a [`StructuralSchema`], read by server-side apply: which fields it declares and how
/// its lists merge (`x-kubernetes-list-type`; a list without one is atomic, as in a CRD).
#[derive(Debug, Clone, Copy)]
pub struct SchemaNode<'a>(&'a Node);

/// How a list merges in server-side apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType<'a> {
    /// Replaced whole by whoever sets it.
    Atomic,
    /// Items are scalars, each owned on its own.
    Set,
    /// Items are objects, each owned on its own, told apart by these fields.
    Map(&'a [String]),
}

impl StructuralSchema {
    /// The root node, for server-side apply.
    pub fn root(&self) -> SchemaNode<'_> {
        SchemaNode(&self.root)
    }
}

impl<'a> SchemaNode<'a> {
    /// The node of field `name` of an object (a declared property, or the map's value schema).
    pub fn field(self, name: &str) -> Option<SchemaNode<'a>> {
        self.0
            .properties
            .get(name)
            .or(self.0.additional.as_deref())
            .map(SchemaNode)
    }

    /// The node of a list's items.
    pub fn items(self) -> Option<SchemaNode<'a>> {
        self.0.items.as_deref().map(SchemaNode)
    }

    pub fn list_type(self) -> ListType<'a> {
        if !self.0.list_map_keys.is_empty() {
            ListType::Map(&self.0.list_map_keys)
        } else if self.0.list_set {
            ListType::Set
        } else {
            ListType::Atomic
        }
    }
}

/// kube-apiserver's message for a body refused in Strict mode (it answers 400 BadRequest), e.g.
/// `KcpShard in version "v1alpha1" cannot be handled as a KcpShard: strict decoding error: unknown
/// field "spec.foo"`.
pub fn strict_decoding_error(kind: &str, version: &str, unknown_paths: &[String]) -> String {
    let fields: Vec<String> = unknown_paths.iter().map(|p| format!("unknown field \"{p}\"")).collect();
    format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", ")
    )
}

impl Node {
    fn from_props(props: &JSONSchemaProps) -> Node {
        let mut node = Node {
            properties: props
                .properties
                .iter()
                .flatten()
                .map(|(name, child)| (name.clone(), Node::from_props(child)))
                .collect(),
            preserve_unknown: props.x_kubernetes_preserve_unknown_fields == Some(true),
            embedded: props.x_kubernetes_embedded_resource == Some(true),
            nullable: props.nullable == Some(true),
            default: props.default.as_ref().map(|d| d.0.clone()),
            ..Node::default()
        };
        match &props.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(schema)) => node.additional = Some(Box::new(Node::from_props(schema))),
            Some(JSONSchemaPropsOrBool::Bool(true)) => node.preserve_unknown = true,
            _ => {}
        }
        match &props.items {
            Some(JSONSchemaPropsOrArray::Schema(schema)) => node.items = Some(Box::new(Node::from_props(schema))),
            Some(JSONSchemaPropsOrArray::Schemas(schemas)) if !schemas.is_empty() => {
                node.items = Some(Box::new(Node::from_props(&schemas[0])))
            }
            _ => {}
        }
        match props.x_kubernetes_list_type.as_deref() {
            Some("map") => node.list_map_keys = props.x_kubernetes_list_map_keys.clone().unwrap_or_default(),
            Some("set") => node.list_set = true,
            _ => {}
        }
        node
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn prune(value: &mut Value, node: &Node, path: &str, is_root: bool, unknown: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            let keep_meta = is_root || node.embedded;
            let names: Vec<String> = fields.keys().cloned().collect();
            for name in names {
                if keep_meta && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let child_path = join(path, &name);
                let child = fields.get_mut(&name).expect("key listed above");
                if let Some(child_node) = node.properties.get(&name) {
                    prune(child, child_node, &child_path, false, unknown);
                } else if let Some(child_node) = &node.additional {
                    prune(child, child_node, &child_path, false, unknown);
                } else if !node.preserve_unknown {
                    fields.remove(&name);
                    unknown.push(child_path);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_node) = &node.items {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item, item_node, &format!("{path}[{i}]"), false, unknown);
                }
            }
        }
        _ => {}
    }
}

fn apply_defaults(value: &mut Value, node: &Node) {
    match value {
        Value::Object(fields) => {
            for (name, child_node) in &node.properties {
                let missing = match fields.get(name) {
                    None => true,
                    Some(Value::Null) => !child_node.nullable,
                    Some(_) => false,
                };
                if missing {
                    match &child_node.default {
                        Some(default) => {
                            fields.insert(name.clone(), default.clone());
                        }
                        None => {
                            fields.remove(name);
                        }
                    }
                }
                if let Some(child) = fields.get_mut(name) {
                    apply_defaults(child, child_node);
                }
            }
            if let Some(value_node) = &node.additional {
                for (name, child) in fields.iter_mut() {
                    if !node.properties.contains_key(name) {
                        apply_defaults(child, value_node);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_node) = &node.items {
                items.iter_mut().for_each(|item| apply_defaults(item, item_node));
            }
        }
        _ => {}
    }
}

/// `x-kubernetes-list-type: map` keys and `set` items must be unique (FieldValueDuplicate).
fn check_lists(value: &Value, node: &Node, path: &str, causes: &mut Vec<FieldCause>) {
    match value {
        Value::Object(fields) => {
            for (name, child) in fields {
                if let Some(child_node) = node.properties.get(name).or(node.additional.as_deref()) {
                    check_lists(child, child_node, &join(path, name), causes);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_node) = &node.items else { return };
            let mut seen = BTreeSet::new();
            for (i, item) in items.iter().enumerate() {
                let item_path = format!("{path}[{i}]");
                let key = if !node.list_map_keys.is_empty() {
                    let key: Map<String, Value> = node
                        .list_map_keys
                        .iter()
                        .filter_map(|k| item.get(k).map(|v| (k.clone(), v.clone())))
                        .collect();
                    Some(Value::Object(key))
                } else if node.list_set {
                    Some(item.clone())
                } else {
                    None
                };
                if let Some(key) = key
                    && !seen.insert(key.to_string())
                {
                    causes.push(FieldCause {
                        reason: "FieldValueDuplicate",
                        field: item_path.clone(),
                        message: format!("Duplicate value: {}", render(&key)),
                    });
                }
                check_lists(item, item_node, &item_path, causes);
            }
        }
        _ => {}
    }
}

/// `spec.slots[0].name` from a JSON pointer's segments.
fn dotted<'a>(segments: impl Iterator<Item = LocationSegment<'a>>) -> String {
    let mut path = String::new();
    for segment in segments {
        match segment {
            LocationSegment::Property(name) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&name);
            }
            LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
        }
    }
    path
}

/// A value as kube-apiserver quotes it in messages: strings in double quotes, the rest as JSON.
fn render(value: &Value) -> String {
    let text = value.to_string();
    if text.len() <= 120 {
        return text;
    }
    let end = (0..=117).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}...", &text[..end])
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// One jsonschema error as kube-apiserver would word it (k8s.io/kube-openapi/pkg/validation/errors).
fn to_cause(path: &str, kind: &ValidationErrorKind, instance: &Value) -> FieldCause {
    let invalid = |what: String| {
        FieldCause::invalid(
            path,
            format!("Invalid value: {}: {path} in body {what}", render(instance)),
        )
    };
    match kind {
        ValidationErrorKind::Required { property } => {
            FieldCause::required(join(path, property.as_str().unwrap_or_default()))
        }
        ValidationErrorKind::Enum { options } => {
            let supported: Vec<String> = options
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| !v.is_null())
                .map(render)
                .collect();
            FieldCause::not_supported(
                path,
                format!(
                    "Unsupported value: {}: supported values: {}",
                    render(instance),
                    supported.join(", ")
                ),
            )
        }
        ValidationErrorKind::Type { kind } => {
            let expected: Vec<String> = match kind {
                TypeKind::Single(t) => vec![t.to_string()],
                TypeKind::Multiple(set) => set.iter().map(|t| t.to_string()).filter(|t| t != "null").collect(),
            };
            let actual = json_type(instance);
            FieldCause {
                reason: "FieldValueTypeInvalid",
                field: path.to_string(),
                message: format!(
                    "Invalid value: \"{actual}\": {path} in body must be of type {}: \"{actual}\"",
                    expected.join(",")
                ),
            }
        }
        ValidationErrorKind::Pattern { pattern } => invalid(format!("should match '{pattern}'")),
        ValidationErrorKind::Minimum { limit } => {
            invalid(format!("should be greater than or equal to {}", number(limit)))
        }
        ValidationErrorKind::Maximum { limit } => invalid(format!("should be less than or equal to {}", number(limit))),
        ValidationErrorKind::ExclusiveMinimum { limit } => invalid(format!("should be greater than {}", number(limit))),
        ValidationErrorKind::ExclusiveMaximum { limit } => invalid(format!("should be less than {}", number(limit))),
        ValidationErrorKind::MinLength { limit } => invalid(format!("should be at least {limit} chars long")),
        ValidationErrorKind::MaxLength { limit } => invalid(format!("should be at most {limit} chars long")),
        ValidationErrorKind::MinItems { limit } => invalid(format!("should have at least {limit} items")),
        ValidationErrorKind::MaxItems { limit } => FieldCause {
            reason: "FieldValueTooMany",
            field: path.to_string(),
            message: format!(
                "Too many: {}: must have at most {limit} items",
                instance.as_array().map_or(0, Vec::len)
            ),
        },
        ValidationErrorKind::MinProperties { limit } => invalid(format!("should have at least {limit} properties")),
        ValidationErrorKind::MaxProperties { limit } => invalid(format!("should have at most {limit} properties")),
        ValidationErrorKind::UniqueItems => FieldCause {
            reason: "FieldValueDuplicate",
            field: path.to_string(),
            message: format!("Duplicate value: {}", render(instance)),
        },
        ValidationErrorKind::MultipleOf { .. } => invalid(format!("{kind:?}")),
        ValidationErrorKind::Format { format } => invalid(format!("must be of type {format}")),
        other => invalid(format!("is invalid ({})", other.keyword())),
    }
}

/// `1` rather than `1.0` for a whole-number limit.
fn number(limit: &Value) -> String {
    match limit.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => limit.to_string(),
    }
}

/// The CRD schema as a plain draft-4 JSON Schema: `nullable` becomes a `null` type, int-or-string
/// becomes `["integer", "string"]`, other `x-kubernetes-*` keys, defaults and descriptions go, and
/// only formats in [`CHECKED_FORMATS`] stay.
fn to_json_schema(props: &JSONSchemaProps) -> Value {
    let mut json = serde_json::to_value(props).expect("JSONSchemaProps serializes");
    translate(&mut json);
    json
}

fn translate(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    let nullable = map.remove("nullable") == Some(Value::Bool(true));
    if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) && !map.contains_key("type") {
        map.insert("type".into(), json!(["integer", "string"]));
    }
    map.retain(|key, _| !key.starts_with("x-kubernetes-"));
    for key in [
        "default",
        "description",
        "example",
        "externalDocs",
        "title",
        "$schema",
        "id",
    ] {
        map.remove(key);
    }
    if let Some(Value::String(format)) = map.get("format")
        && !CHECKED_FORMATS.contains(&format.as_str())
    {
        map.remove("format");
    }
    if nullable {
        match map.get_mut("type") {
            Some(Value::String(t)) => {
                let t = t.clone();
                map.insert("type".into(), json!([t, "null"]));
            }
            Some(Value::Array(types)) => types.push(json!("null")),
            _ => {}
        }
        if let Some(Value::Array(values)) = map.get_mut("enum")
            && !values.contains(&Value::Null)
        {
            values.push(Value::Null);
        }
    }
    for key in ["properties", "patternProperties", "definitions"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            children.values_mut().for_each(translate);
        }
    }
    for key in ["items", "additionalProperties", "additionalItems", "not"] {
        match map.get_mut(key) {
            Some(Value::Array(children)) => children.iter_mut().for_each(translate),
            Some(child @ Value::Object(_)) => translate(child),
            _ => {}
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            children.iter_mut().for_each(translate);
        }
    }
}

#[cfg(test)]
mod tests;
