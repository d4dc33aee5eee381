//! Content negotiation, as the real server does it for custom resources: the `Accept` header picks
//! the encoding (JSON or YAML) and what the object is rendered as: itself, a `meta.k8s.io/v1`
//! Table (`;as=Table`, what kubectl get asks for) or PartialObjectMetadata(List)
//! (`;as=PartialObjectMetadata`, what metadata informers ask for). Anything else is a 406.
//! Protobuf is not served (custom resources are JSON-only on the real server too).
use serde_json::{Value, json};

use super::error::ApiError;
use super::resources::Resource;
use super::table::{self, IncludeObject};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Yaml,
}

impl Encoding {
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Yaml => "application/yaml",
        }
    }

    pub fn encode(self, value: &Value) -> Vec<u8> {
        match self {
            Encoding::Json => serde_json::to_vec(value).expect("values serialise"),
            Encoding::Yaml => serde_yaml::to_string(value).expect("values serialise").into_bytes(),
        }
    }
}

/// What the object is rendered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Object,
    Table(IncludeObject),
    Metadata,
}

/// The answer's form, chosen from `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rendering {
    pub encoding: Encoding,
    pub view: View,
}

impl Default for Rendering {
    fn default() -> Self {
        Rendering {
            encoding: Encoding::Json,
            view: View::Object,
        }
    }
}

const ACCEPTED: &str = "only the following media types are accepted: application/json, application/yaml";

impl Rendering {
    /// The first media range of `accept` this server can produce (clients list their preferred
    /// first); none, a 406.
    pub fn negotiate(accept: Option<&str>, include_object: Option<&str>) -> Result<Rendering, ApiError> {
        let accept = accept.unwrap_or_default().trim();
        if accept.is_empty() {
            return Ok(Rendering::default());
        }
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
            let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
            let encoding = match media {
                "application/json" | "application/*" | "*/*" => Encoding::Json,
                "application/yaml" => Encoding::Yaml,
                _ => continue,
            };
            let view = match param("as") {
                None => View::Object,
                Some(kind) => {
                    // Conversions are meta.k8s.io/v1 (and v1beta1, which the real server still serves).
                    if param("g") != Some("meta.k8s.io") || !matches!(param("v"), Some("v1" | "v1beta1")) {
                        continue;
                    }
                    match kind {
                        "Table" => View::Table(IncludeObject::parse(include_object)),
                        "PartialObjectMetadata" | "PartialObjectMetadataList" => View::Metadata,
                        _ => continue,
                    }
                }
            };
            return Ok(Rendering { encoding, view });
        }
        Err(ApiError::NotAcceptable(ACCEPTED.into()))
    }

    /// One object (a get, a write's answer, a watch event's object) in this rendering.
    pub fn one(&self, resource: &Resource, object: Value) -> Value {
        match self.view {
            View::Object => object,
            View::Table(include) => {
                let rv = super::store::resource_version_of(&object);
                table::table(resource, &[object], Some(rv), include)
            }
            View::Metadata => partial(&object),
        }
    }

    /// A list in this rendering; `list` carries apiVersion, kind and metadata, `items` the objects.
    pub fn list(&self, resource: &Resource, mut list: Value, items: Vec<Value>, rv: u64) -> Value {
        match self.view {
            View::Object => {
                list["items"] = Value::Array(items);
                list
            }
            View::Table(include) => {
                let mut table = table::table(resource, &items, Some(rv), include);
                table["metadata"] = list["metadata"].clone();
                table
            }
            View::Metadata => {
                let items = items.iter().map(partial).collect();
                json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                       "metadata": list["metadata"], "items": Value::Array(items)})
            }
        }
    }
}

fn partial(object: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(accept: &str) -> Result<Rendering, ApiError> {
        Rendering::negotiate(Some(accept), None)
    }

    #[test]
    fn the_first_range_this_server_can_produce_wins() {
        assert_eq!(view("application/json").unwrap(), Rendering::default());
        assert_eq!(view("application/yaml").unwrap().encoding, Encoding::Yaml);
        let kubectl_get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(view(kubectl_get).unwrap().view, View::Table(IncludeObject::Metadata));
        let informer = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(view(informer).unwrap().view, View::Metadata);
        assert_eq!(
            view("application/vnd.kubernetes.protobuf, */*").unwrap(),
            Rendering::default()
        );
    }

    #[test]
    fn nothing_this_server_can_produce_is_a_406() {
        for accept in [
            "application/vnd.kubernetes.protobuf",
            "text/html",
            "application/json;as=Unknown;g=meta.k8s.io;v=v1",
            "application/json;as=Table;g=other;v=v1",
        ] {
            assert!(matches!(view(accept), Err(ApiError::NotAcceptable(_))), "{accept}");
        }
    }
}
