//! Reading manifests: YAML text (JSON is YAML) as `kubectl apply -f` reads it, one object per
//! document, the items of a `kind: List` unpacked, empty documents skipped. Shared by
//! `kcpshard apply` and `serve --manifests`, which check the objects each in their own way.
use serde::Deserialize;
use serde_json::Value;

/// The objects of each document, numbered from 1, or why that document cannot be read. A document
/// that is not YAML ends the list: the parser cannot resume after it.
pub fn documents(text: &str) -> Vec<(usize, Result<Vec<Value>, String>)> {
    let mut out = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let at = index + 1;
        let value = match serde_yaml::Value::deserialize(document) {
            Ok(value) => value,
            Err(e) => {
                out.push((at, Err(format!("is not valid YAML: {e}"))));
                break;
            }
        };
        let value: Value = match serde_json::to_value(value) {
            Ok(value) => value,
            Err(e) => {
                out.push((at, Err(format!("cannot be read as JSON: {e}"))));
                continue;
            }
        };
        if value.is_null() {
            continue;
        }
        let items = if value["kind"] == "List" {
            value["items"].as_array().cloned().unwrap_or_default()
        } else {
            vec![value]
        };
        out.push((at, Ok(items)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_lists_and_empty_documents() {
        let text = "a: 1\n---\n# only a comment\n---\nkind: List\nitems: [{b: 2}, {c: 3}]\n";
        let docs = documents(text);
        assert_eq!(
            docs,
            [
                (1, Ok(vec![json!({"a": 1})])),
                (3, Ok(vec![json!({"b": 2}), json!({"c": 3})]))
            ]
        );
    }

    #[test]
    fn a_broken_document_ends_the_list() {
        let docs = documents("a: 1\n---\nb: [\n---\nc: 3\n");
        assert_eq!(docs.len(), 2);
        assert!(
            docs[1].1.as_ref().unwrap_err().starts_with("is not valid YAML"),
            "{docs:?}"
        );
    }
}
