//! Routing: from an HTTP request to a discovery document, an OpenAPI document, or a verb on a
//! resource; and from the result to a response (JSON, a Table, a watch stream, or a Status).
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use serde_json::{Value, json};

use super::ApiServer;
use super::error::{ApiError, ApiResult};
use super::objects::{Part, PatchType, Written};
use super::schema::UnknownFields;
use super::selectors::Selector;
use super::table::{self, IncludeObject};
use super::{discovery, openapi, watch};

pub type Body = BoxBody<Bytes, Infallible>;

/// Bodies above this size are refused with 413, like the real server's 3 MiB limit.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// A request with its body read.
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub query: HashMap<String, String>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl ApiRequest {
    fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("true" | "1"))
    }

    fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
    }

    /// `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (what `kubectl get` sends).
    fn wants_table(&self) -> Option<IncludeObject> {
        let accept = self
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let table = accept
            .split(',')
            .any(|media| media.split(';').any(|p| p.trim() == "as=Table"));
        table.then(|| IncludeObject::parse(self.param("includeObject")))
    }

    fn unknown_fields(&self) -> ApiResult<UnknownFields> {
        match self.param("fieldValidation") {
            None | Some("Warn") => Ok(UnknownFields::Warn),
            Some("Ignore") => Ok(UnknownFields::Ignore),
            Some("Strict") => Ok(UnknownFields::Strict),
            Some(other) => Err(ApiError::BadRequest(format!(
                "fieldValidation must be Ignore, Warn or Strict, not {other:?}"
            ))),
        }
    }

    fn decode(&self) -> ApiResult<Value> {
        decode_body(self.content_type(), &self.body)
    }
}

/// A request body as a JSON value; YAML is accepted where its media type says so (apply patches).
/// Pure, so that the fuzz target (fuzz/) feeds it arbitrary bytes.
pub fn decode_body(content_type: &str, body: &[u8]) -> ApiResult<Value> {
    if content_type.contains("yaml") {
        serde_yaml::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("the request body is not valid YAML: {e}")))
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("the request body is not valid JSON: {e}")))
    }
}

/// A handled request's answer, before it becomes a response.
pub enum Reply {
    Json(StatusCode, Value, Vec<String>),
    Watch(watch::WatchBody),
    Text(StatusCode, &'static str, String),
}

pub async fn handle(server: &Arc<ApiServer>, request: ApiRequest) -> Response<Body> {
    let verb = request.method.clone();
    let reply = route(server, &request).await.unwrap_or_else(|e| {
        let status = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Reply::Json(status, e.to_status(), Vec::new())
    });
    let response = match reply {
        Reply::Json(status, value, warnings) => {
            let mut builder = Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, "application/json");
            for warning in warnings {
                // RFC 7234 warning header, as the real server sends for unknown fields.
                builder = builder.header("Warning", format!("299 - {:?}", warning));
            }
            builder.body(full(serde_json::to_vec(&value).expect("values serialise")))
        }
        Reply::Watch(body) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CACHE_CONTROL, "no-cache, private")
            .body(BodyExt::boxed(body)),
        Reply::Text(status, content_type, text) => Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, content_type)
            .body(full(text)),
    };
    let response = response.expect("responses are well formed");
    server.metrics.observe(&verb, response.status().as_u16());
    response
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    BodyExt::boxed(Full::new(bytes.into()))
}

/// A Status answer, for errors raised before routing (auth, body size).
pub fn error_response(e: &ApiError) -> Response<Body> {
    Response::builder()
        .status(e.code())
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(serde_json::to_vec(&e.to_status()).expect("values serialise")))
        .expect("responses are well formed")
}

async fn route(server: &Arc<ApiServer>, request: &ApiRequest) -> ApiResult<Reply> {
    let segments: Vec<&str> = request
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let ok = |v: Value| Ok(Reply::Json(StatusCode::OK, v, Vec::new()));
    let resources = &server.resources;
    match (request.method.clone(), segments.as_slice()) {
        (Method::GET, ["readyz"]) => Ok(match server.not_ready() {
            Some(reason) => Reply::Text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("[-]controller failed: {reason}\nreadyz check failed\n"),
            ),
            None => Reply::Text(StatusCode::OK, "text/plain", "ok".into()),
        }),
        (Method::GET, ["healthz" | "livez"]) => Ok(Reply::Text(StatusCode::OK, "text/plain", "ok".into())),
        (Method::GET, ["version"]) => ok(discovery::version()),
        (Method::GET, ["metrics"]) => Ok(Reply::Text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            server.metrics.encode(),
        )),
        (Method::GET, ["api"]) => ok(discovery::core_versions()),
        (Method::GET, ["apis"]) => ok(discovery::groups(resources)),
        (Method::GET, ["api", version]) => {
            discovery::resource_list(resources, "", version).map_or(Err(ApiError::NoRoute), ok)
        }
        (Method::GET, ["apis", group]) => discovery::group(resources, group).map_or(Err(ApiError::NoRoute), ok),
        (Method::GET, ["apis", group, version]) => {
            discovery::resource_list(resources, group, version).map_or(Err(ApiError::NoRoute), ok)
        }
        (Method::GET, ["openapi", "v3"]) => ok(openapi::index(resources)),
        (Method::GET, ["openapi", "v3", rest @ ..]) => {
            openapi::document(resources, &rest.join("/")).map_or(Err(ApiError::NoRoute), ok)
        }
        (_, ["api", version, rest @ ..]) => resource_request(server, request, "", version, rest).await,
        (_, ["apis", group, version, rest @ ..]) => resource_request(server, request, group, version, rest).await,
        _ => Err(ApiError::NoRoute),
    }
}

async fn resource_request(
    server: &Arc<ApiServer>,
    request: &ApiRequest,
    group: &str,
    version: &str,
    rest: &[&str],
) -> ApiResult<Reply> {
    // [namespaces/<ns>/]<plural>[/<name>[/<subresource>]]
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        _ => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return Err(ApiError::NoRoute),
    };
    let index = server
        .resources
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
        .ok_or(ApiError::NoRoute)?;
    let resource = &server.resources[index];
    if namespace.is_some() && !resource.namespaced {
        return Err(ApiError::NoRoute);
    }
    let part = match subresource {
        None => Part::Main,
        Some("status") if resource.status_subresource => Part::Status,
        Some(_) => return Err(ApiError::NoRoute),
    };
    let objects = &server.objects;
    let written = |w: Written| {
        let status = if w.created { StatusCode::CREATED } else { StatusCode::OK };
        Ok(Reply::Json(status, w.object, w.warnings))
    };
    match (&request.method, name) {
        (&Method::GET, None) => {
            let selector = Selector::parse(request.param("labelSelector"), request.param("fieldSelector"))?;
            if request.flag("watch") {
                return watch_request(server, request, index, namespace, selector);
            }
            let (items, rv) = objects.store.list(resource.storage, namespace);
            let items: Vec<Value> = items
                .iter()
                .map(|o| resource.to_view(o))
                .filter(|o| selector.matches(o))
                .collect();
            if let Some(include) = request.wants_table() {
                return Ok(Reply::Json(
                    StatusCode::OK,
                    table::table(resource, &items, Some(rv), include),
                    Vec::new(),
                ));
            }
            let items: Vec<Value> = items.into_iter().map(|o| with_type(resource, o)).collect();
            Ok(Reply::Json(
                StatusCode::OK,
                {
                    // The items go in by move: `json!` would copy every object once more.
                    let mut list = json!({"apiVersion": resource.api_version(), "kind": format!("{}List", resource.kind), "metadata": {"resourceVersion": rv.to_string()}});
                    list["items"] = Value::Array(items);
                    list
                },
                Vec::new(),
            ))
        }
        (&Method::GET, Some(name)) => {
            let object = with_type(resource, objects.get(resource, namespace, name)?);
            if let Some(include) = request.wants_table() {
                let rv = super::store::resource_version_of(&object);
                return Ok(Reply::Json(
                    StatusCode::OK,
                    table::table(resource, &[object], Some(rv), include),
                    Vec::new(),
                ));
            }
            Ok(Reply::Json(StatusCode::OK, object, Vec::new()))
        }
        (&Method::POST, None) => {
            written(objects.create(resource, namespace, request.decode()?, request.unknown_fields()?)?)
        }
        (&Method::PUT, Some(name)) => written(objects.update(
            resource,
            namespace,
            name,
            part,
            request.decode()?,
            request.unknown_fields()?,
        )?),
        (&Method::PATCH, Some(name)) => {
            let patch_type = PatchType::from_content_type(request.content_type())?;
            written(objects.patch(
                resource,
                namespace,
                name,
                part,
                patch_type,
                request.decode()?,
                request.unknown_fields()?,
            )?)
        }
        (&Method::DELETE, Some(name)) if part == Part::Main => Ok(Reply::Json(
            StatusCode::OK,
            objects.delete(resource, namespace, name)?,
            Vec::new(),
        )),
        _ => Err(ApiError::MethodNotAllowed),
    }
}

fn watch_request(
    server: &Arc<ApiServer>,
    request: &ApiRequest,
    index: usize,
    namespace: Option<&str>,
    selector: Selector,
) -> ApiResult<Reply> {
    let send_initial_events = request.flag("sendInitialEvents");
    if send_initial_events && request.param("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(ApiError::BadRequest(
            "sendInitialEvents requires resourceVersionMatch=NotOlderThan".into(),
        ));
    }
    let resource_version = match request.param("resourceVersion") {
        None => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::BadRequest(format!("invalid resourceVersion {rv:?}: must be a number")))?,
        ),
    };
    let timeout = request
        .param("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs);
    let body = watch::start(
        server.clone(),
        watch::WatchRequest {
            resource: index,
            namespace: namespace.map(str::to_string),
            selector,
            resource_version,
            send_initial_events,
            bookmarks: request.flag("allowWatchBookmarks"),
            timeout,
            table: request.wants_table(),
        },
    )?;
    Ok(Reply::Watch(body))
}

/// Items in a list and single gets carry apiVersion and kind.
fn with_type(resource: &super::resources::Resource, mut object: Value) -> Value {
    object["apiVersion"] = json!(resource.api_version());
    object["kind"] = json!(resource.kind);
    object
}
