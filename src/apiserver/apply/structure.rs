//! What a value looks like to server-side apply: the fields it sets (a [`FieldSet`]), reading and
//! removing one path, and the structured merge of an applied configuration into a live object.
//!
//! The schema says how each list merges ([`ListType`]); `metadata` follows ObjectMeta as the real
//! server types it (labels and annotations are maps of their own keys, finalizers a set,
//! ownerReferences a map keyed by uid). Where no schema speaks, objects merge field by field and
//! lists are atomic, as in a CRD.
use serde_json::Value;

use super::fieldset::{Element, FieldSet, Path};
use crate::apiserver::schema::{ListType, SchemaNode};

/// The schema at one place in the value.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    Schema(SchemaNode<'a>),
    /// The object's own metadata.
    Metadata,
    /// Under no schema.
    Free,
}

const OWNER_REFERENCE_KEYS: &[&str] = &["uid"];

impl<'a> Shape<'a> {
    pub fn root(schema: Option<SchemaNode<'a>>) -> Shape<'a> {
        schema.map_or(Shape::Free, Shape::Schema)
    }

    fn field(self, name: &str, at_root: bool) -> Shape<'a> {
        if at_root && name == "metadata" {
            return Shape::Metadata;
        }
        match self {
            Shape::Schema(node) => node.field(name).map_or(Shape::Free, Shape::Schema),
            Shape::Metadata | Shape::Free => Shape::Free,
        }
    }

    fn items(self) -> Shape<'a> {
        match self {
            Shape::Schema(node) => node.items().map_or(Shape::Free, Shape::Schema),
            Shape::Metadata | Shape::Free => Shape::Free,
        }
    }

    fn list_type(self, parent: Option<(Shape<'_>, &str)>) -> List {
        if let Some((Shape::Metadata, name)) = parent {
            return match name {
                "finalizers" => List::Set,
                "ownerReferences" => List::Map(OWNER_REFERENCE_KEYS.iter().map(|k| k.to_string()).collect()),
                _ => List::Atomic,
            };
        }
        match self {
            Shape::Schema(node) => match node.list_type() {
                ListType::Atomic => List::Atomic,
                ListType::Set => List::Set,
                ListType::Map(keys) => List::Map(keys.to_vec()),
            },
            Shape::Metadata | Shape::Free => List::Atomic,
        }
    }
}

enum List {
    Atomic,
    Set,
    Map(Vec<String>),
}

/// Walks `value` with its shape; `parent` is the shape and field name it was reached by.
struct Walk<'s> {
    shape: Shape<'s>,
    parent: Option<(Shape<'s>, String)>,
    at_root: bool,
}

impl<'s> Walk<'s> {
    fn root(shape: Shape<'s>) -> Walk<'s> {
        Walk {
            shape,
            parent: None,
            at_root: true,
        }
    }

    fn field(&self, name: &str) -> Walk<'s> {
        Walk {
            shape: self.shape.field(name, self.at_root),
            parent: Some((self.shape, name.to_string())),
            at_root: false,
        }
    }

    fn item(&self) -> Walk<'s> {
        Walk {
            shape: self.shape.items(),
            parent: None,
            at_root: false,
        }
    }

    fn list(&self) -> List {
        self.shape
            .list_type(self.parent.as_ref().map(|(shape, name)| (*shape, name.as_str())))
    }
}

/// Every field `value` sets: each scalar, atomic list and empty object is a leaf; each item of a
/// set or map list is a path of its own (and a map item's fields below it).
pub fn fields_of(value: &Value, shape: Shape<'_>) -> FieldSet {
    let mut set = FieldSet::default();
    collect(value, &Walk::root(shape), &mut Vec::new(), &mut set);
    set
}

fn collect(value: &Value, walk: &Walk<'_>, path: &mut Path, out: &mut FieldSet) {
    match value {
        Value::Object(fields) if !fields.is_empty() => {
            for (name, child) in fields {
                path.push(Element::Field(name.clone()));
                collect(child, &walk.field(name), path, out);
                path.pop();
            }
        }
        Value::Array(items) => match walk.list() {
            List::Atomic => out.insert(path.clone()),
            List::Set => {
                for item in items {
                    path.push(Element::value_of(item));
                    out.insert(path.clone());
                    path.pop();
                }
            }
            List::Map(keys) => {
                for item in items {
                    // An item without its keys fails validation later; own the whole list meanwhile.
                    let Some(key) = Element::key_of(item, &keys) else {
                        out.insert(path.clone());
                        continue;
                    };
                    path.push(key);
                    out.insert(path.clone());
                    collect(item, &walk.item(), path, out);
                    path.pop();
                }
            }
        },
        _ => {
            if !path.is_empty() {
                out.insert(path.clone());
            }
        }
    }
}

/// The paths of the non-empty objects (below the root, not list items) that `new` has and `old`
/// does not.
pub fn objects_added(old: &Value, new: &Value) -> FieldSet {
    fn walk(old: Option<&Value>, new: &Value, path: &mut Path, out: &mut FieldSet) {
        let Value::Object(fields) = new else { return };
        if old.is_none() && !path.is_empty() && !fields.is_empty() {
            out.insert(path.clone());
        }
        for (name, child) in fields {
            path.push(Element::Field(name.clone()));
            walk(old.and_then(|o| o.get(name)), child, path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::default();
    walk(Some(old), new, &mut Vec::new(), &mut out);
    out
}

/// The value at `path`, if there is one.
pub fn get<'v>(value: &'v Value, path: &[Element]) -> Option<&'v Value> {
    path.iter().try_fold(value, |value, element| match element {
        Element::Field(name) => value.get(name),
        Element::Key(_) | Element::Value(_) => value.as_array()?.iter().find(|item| matches(item, element)),
    })
}

/// Removes the value at `path`, if there is one.
pub fn remove(value: &mut Value, path: &[Element]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let parent = parent.iter().try_fold(value, |value, element| match element {
        Element::Field(name) => value.get_mut(name),
        Element::Key(_) | Element::Value(_) => value.as_array_mut()?.iter_mut().find(|item| matches(item, element)),
    });
    match (parent, last) {
        (Some(Value::Object(fields)), Element::Field(name)) => {
            fields.remove(name);
        }
        (Some(Value::Array(items)), element) => items.retain(|item| !matches(item, element)),
        _ => {}
    }
}

fn matches(item: &Value, element: &Element) -> bool {
    match element {
        Element::Value(_) => Element::value_of(item) == *element,
        Element::Key(key) => {
            let keys: Vec<String> = serde_json::from_str::<serde_json::Map<String, Value>>(key)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            Element::key_of(item, &keys).as_ref() == Some(element)
        }
        Element::Field(_) => false,
    }
}

/// `config` merged into `live`: objects field by field, map lists item by item (by key; new items
/// after the live ones), set lists as a union; anything else (scalars, atomic lists) as `config`
/// has it.
pub fn merge(live: &Value, config: &Value, shape: Shape<'_>) -> Value {
    merge_at(live, config, &Walk::root(shape))
}

fn merge_at(live: &Value, config: &Value, walk: &Walk<'_>) -> Value {
    match (live, config) {
        (Value::Object(live_fields), Value::Object(config_fields)) => {
            let mut out = live_fields.clone();
            for (name, value) in config_fields {
                let merged = match live_fields.get(name) {
                    Some(live_value) => merge_at(live_value, value, &walk.field(name)),
                    None => value.clone(),
                };
                out.insert(name.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(live_items), Value::Array(config_items)) => match walk.list() {
            List::Atomic => config.clone(),
            List::Set => {
                let mut out = live_items.clone();
                for item in config_items {
                    if !out.contains(item) {
                        out.push(item.clone());
                    }
                }
                Value::Array(out)
            }
            List::Map(keys) => {
                let mut out = live_items.clone();
                for item in config_items {
                    let key = Element::key_of(item, &keys);
                    let found = key.as_ref().and_then(|key| {
                        out.iter()
                            .position(|live| Element::key_of(live, &keys).as_ref() == Some(key))
                    });
                    match found {
                        Some(at) => out[at] = merge_at(&out[at], item, &walk.item()),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
        },
        _ => config.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources;
    use serde_json::json;

    fn f(name: &str) -> Element {
        Element::Field(name.into())
    }

    fn shards() -> resources::Resource {
        resources::all().remove(0)
    }

    #[test]
    fn conditions_merge_by_type_and_extra_args_are_replaced_whole() {
        let resource = shards();
        let shape = Shape::root(resource.schema.as_ref().map(|s| s.root()));
        let live = json!({
            "spec": {"kcp": {"extraArgs": ["--a", "--b"]}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Degraded", "status": "False"}]},
        });
        let config = json!({
            "spec": {"kcp": {"extraArgs": ["--c"]}},
            "status": {"conditions": [{"type": "Custom", "status": "True"}, {"type": "Ready", "status": "False"}]},
        });
        let merged = merge(&live, &config, shape);
        assert_eq!(merged["spec"]["kcp"]["extraArgs"], json!(["--c"]));
        assert_eq!(
            merged["status"]["conditions"],
            json!([{"type": "Ready", "status": "False"}, {"type": "Degraded", "status": "False"}, {"type": "Custom", "status": "True"}])
        );
    }

    #[test]
    fn the_fields_of_a_value_are_its_leaves_and_list_items() {
        let resource = shards();
        let shape = Shape::root(resource.schema.as_ref().map(|s| s.root()));
        let value = json!({
            "metadata": {"labels": {"a": "1"}, "finalizers": ["x"]},
            "spec": {"kcp": {"extraArgs": ["--a"]}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        let set = fields_of(&value, shape);
        let ready = Element::key_of(&json!({"type": "Ready"}), &["type".into()]).unwrap();
        let paths: Vec<Path> = set.iter().cloned().collect();
        assert_eq!(
            paths,
            [
                vec![f("metadata"), f("finalizers"), Element::value_of(&json!("x"))],
                vec![f("metadata"), f("labels"), f("a")],
                vec![f("spec"), f("kcp"), f("extraArgs")],
                vec![f("status"), f("conditions"), ready.clone()],
                vec![f("status"), f("conditions"), ready.clone(), f("status")],
                vec![f("status"), f("conditions"), ready, f("type")],
            ]
        );
    }

    #[test]
    fn get_and_remove_follow_keys_and_values() {
        let mut value = json!({"metadata": {"finalizers": ["x", "y"]}, "status": {"conditions": [{"type": "Ready"}, {"type": "Other"}]}});
        let ready = Element::key_of(&json!({"type": "Ready"}), &["type".into()]).unwrap();
        let path = vec![f("status"), f("conditions"), ready];
        assert_eq!(get(&value, &path), Some(&json!({"type": "Ready"})));
        remove(&mut value, &path);
        remove(
            &mut value,
            &[f("metadata"), f("finalizers"), Element::value_of(&json!("x"))],
        );
        assert_eq!(
            value,
            json!({"metadata": {"finalizers": ["y"]}, "status": {"conditions": [{"type": "Other"}]}})
        );
    }
}
