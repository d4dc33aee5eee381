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
use super::error::{ApiError, ApiResult, FieldCause};
use super::negotiation::{Encoding, Rendering};
use super::objects::{DeleteOptions, Part, PatchType, WriteOptions, Written};
use super::schema::UnknownFields;
use super::selectors::Selector;
use super::{discovery, openapi, paging, reviews, watch};

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

    /// What the answer is rendered as, from `Accept` (a 406 when nothing this server makes fits).
    fn rendering(&self) -> ApiResult<Rendering> {
        let accept = self.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
        Rendering::negotiate(accept, self.param("includeObject"))
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

    /// The options of a write (`verb` names them in errors: CreateOptions, PatchOptions...).
    fn write_options(&self, verb: &str, patch_type: Option<PatchType>) -> ApiResult<WriteOptions> {
        let options_error = |cause: FieldCause| ApiError::Invalid {
            kind: format!("{verb}Options"),
            group: "meta.k8s.io".into(),
            name: String::new(),
            causes: vec![cause],
        };
        let dry_run = dry_run(self.param("dryRun").into_iter()).map_err(options_error)?;
        let explicit = self.param("fieldManager");
        if let Some(manager) = explicit
            && manager.len() > 128
        {
            return Err(options_error(FieldCause::invalid(
                "fieldManager",
                "Too long: may not be more than 128 bytes",
            )));
        }
        let apply = patch_type == Some(PatchType::Apply);
        if apply && explicit.is_none() {
            return Err(options_error(FieldCause::invalid(
                "fieldManager",
                "Required value: is required for apply patch",
            )));
        }
        let force = self.flag("force");
        if force && !apply {
            return Err(options_error(FieldCause::invalid(
                "force",
                "Forbidden: may not be specified for non-apply patch",
            )));
        }
        let manager = explicit.map(str::to_string).unwrap_or_else(|| {
            // The real server's default: the User-Agent's product, `kubectl` of `kubectl/v1.34 (...)`.
            let agent = self
                .headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let product = agent.split('/').next().unwrap_or_default();
            let product: String = product.chars().take(128).collect();
            if product.is_empty() { "unknown".into() } else { product }
        });
        Ok(WriteOptions {
            dry_run,
            manager,
            force,
            unknown: self.unknown_fields()?,
        })
    }

    /// DeleteOptions from the body (kubectl, client-go) and the query (curl, the Python client).
    fn delete_options(&self) -> ApiResult<DeleteOptions> {
        let body: Value = if self.body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            self.decode()?
        };
        let invalid = |cause: FieldCause| ApiError::Invalid {
            kind: "DeleteOptions".into(),
            group: "meta.k8s.io".into(),
            name: String::new(),
            causes: vec![cause],
        };
        let in_body = body["dryRun"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        let dry_run = dry_run(in_body.chain(self.param("dryRun"))).map_err(invalid)?;
        let policy = body["propagationPolicy"]
            .as_str()
            .map(str::to_string)
            .or_else(|| self.param("propagationPolicy").map(str::to_string));
        let orphan = match policy.as_deref() {
            None | Some("Background" | "Foreground") => false,
            Some("Orphan") => true,
            Some(other) => {
                return Err(invalid(FieldCause::not_supported(
                    "propagationPolicy",
                    format!(
                        "Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
                    ),
                )));
            }
        };
        // The old orphanDependents flag, still sent by some clients.
        let orphan = orphan || body["orphanDependents"] == json!(true);
        let precondition = |field: &str| body["preconditions"][field].as_str().map(str::to_string);
        Ok(DeleteOptions {
            dry_run,
            uid: precondition("uid"),
            resource_version: precondition("resourceVersion"),
            orphan,
        })
    }

    fn decode(&self) -> ApiResult<Value> {
        decode_body(self.content_type(), &self.body)
    }
}

/// `dryRun` values: none (a real write) or `All`; anything else is refused with `refuse`.
fn dry_run<'a>(values: impl Iterator<Item = &'a str>) -> Result<bool, FieldCause> {
    let mut dry = false;
    for value in values {
        match value {
            "All" => dry = true,
            other => {
                return Err(FieldCause::not_supported(
                    "dryRun",
                    format!("Unsupported value: [{other:?}]: supported values: \"All\""),
                ));
            }
        }
    }
    Ok(dry)
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

/// Answers above this size are gzipped for a client that accepts it (the real server's threshold).
const GZIP_FROM: usize = 128 * 1024;

pub async fn handle(server: &Arc<ApiServer>, request: ApiRequest) -> Response<Body> {
    let verb = request.method.clone();
    // Errors too are encoded as the client asked, where it asked for something this server makes.
    let encoding = request.rendering().map_or(Encoding::Json, |r| r.encoding);
    let gzip = request
        .headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|e| e.split(';').next().is_some_and(|e| e.trim() == "gzip"))
        });
    let reply = route(server, &request).await.unwrap_or_else(|e| {
        let status = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Reply::Json(status, e.to_status(), Vec::new())
    });
    let response = match reply {
        Reply::Json(status, value, warnings) => {
            let mut builder = Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, encoding.content_type());
            for warning in warnings {
                // RFC 7234 warning header, as the real server sends for unknown fields.
                builder = builder.header("Warning", format!("299 - {:?}", warning));
            }
            let body = encoding.encode(&value);
            if gzip && body.len() >= GZIP_FROM {
                builder
                    .header(header::CONTENT_ENCODING, "gzip")
                    .header(header::VARY, "Accept-Encoding")
                    .body(full(gzipped(&body)))
            } else {
                builder.body(full(body))
            }
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

fn gzipped(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(body).expect("writing to memory");
    encoder.finish().expect("writing to memory")
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
        (Method::GET, ["readyz"]) => {
            let (status, body) = server.readiness.answer();
            Ok(Reply::Text(status, "text/plain", body))
        }
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
        (Method::GET, ["openapi", "v2"]) => ok(openapi::swagger(resources)),
        (Method::GET, ["openapi", "v3"]) => ok(openapi::index(resources)),
        (
            Method::POST,
            [
                "apis",
                group @ ("authorization.k8s.io" | "authentication.k8s.io"),
                version,
                kind,
            ],
        ) => review(request, group, version, kind),
        (Method::GET, ["openapi", "v3", rest @ ..]) => {
            openapi::document(resources, &rest.join("/")).map_or(Err(ApiError::NoRoute), ok)
        }
        (_, ["api", version, rest @ ..]) => resource_request(server, request, "", version, rest).await,
        (_, ["apis", group, version, rest @ ..]) => resource_request(server, request, group, version, rest).await,
        _ => Err(ApiError::NoRoute),
    }
}

/// `kubectl auth can-i` and `whoami`. kubectl sends these as protobuf (or CBOR), which this server
/// does not decode; the answer does not depend on the body, so only a JSON or YAML one is read (for
/// its spec).
fn review(request: &ApiRequest, group: &str, version: &str, kind: &str) -> ApiResult<Reply> {
    let content_type = request.content_type();
    let body = if content_type.contains("json") || content_type.contains("yaml") {
        request.decode()?
    } else {
        Value::Null
    };
    let review = reviews::answer(group, version, kind, &body).ok_or(ApiError::NoRoute)?;
    Ok(Reply::Json(StatusCode::CREATED, review, Vec::new()))
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
            selector.check_fields(resource.field_selectors)?;
            let rendering = request.rendering()?;
            if request.flag("watch") {
                return watch_request(server, request, index, namespace, selector, rendering);
            }
            let (items, rv) = objects.store.list(resource.storage, namespace);
            check_resource_version_match(request, rv)?;
            let items: Vec<Value> = items
                .iter()
                .map(|o| resource.to_view(o))
                .filter(|o| selector.matches(o))
                .collect();
            let page = paging::page(items, rv, request.param("limit"), request.param("continue"))?;
            let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
            if let Some(token) = &page.continue_token {
                metadata["continue"] = json!(token);
            }
            if let Some(remaining) = page.remaining {
                metadata["remainingItemCount"] = json!(remaining);
            }
            let items: Vec<Value> = page.items.into_iter().map(|o| with_type(resource, o)).collect();
            let list = json!({"apiVersion": resource.api_version(), "kind": format!("{}List", resource.kind), "metadata": metadata});
            Ok(Reply::Json(
                StatusCode::OK,
                rendering.list(resource, list, items, page.resource_version),
                Vec::new(),
            ))
        }
        (&Method::GET, Some(name)) => {
            let rendering = request.rendering()?;
            let object = with_type(resource, objects.get(resource, namespace, name)?);
            Ok(Reply::Json(StatusCode::OK, rendering.one(resource, object), Vec::new()))
        }
        (&Method::POST, None) => {
            let options = request.write_options("Create", None)?;
            written(objects.create(resource, namespace, request.decode()?, &options)?)
        }
        (&Method::PUT, Some(name)) => {
            let options = request.write_options("Update", None)?;
            written(objects.update(resource, namespace, name, part, request.decode()?, &options)?)
        }
        (&Method::PATCH, Some(name)) => {
            let patch_type = PatchType::from_content_type(request.content_type())?;
            let options = request.write_options("Patch", Some(patch_type))?;
            written(objects.patch(resource, namespace, name, part, patch_type, request.decode()?, &options)?)
        }
        (&Method::DELETE, Some(name)) if part == Part::Main => {
            let deleted = objects.delete(resource, namespace, name, &request.delete_options()?)?;
            // Gone at once: a Status saying so, as the real server answers; kept by finalizers:
            // the object, marked.
            let answer = if deleted.gone {
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                       "details": {"name": name, "group": resource.group, "kind": resource.plural,
                                   "uid": deleted.object["metadata"]["uid"]}})
            } else {
                with_type(resource, deleted.object)
            };
            Ok(Reply::Json(StatusCode::OK, answer, Vec::new()))
        }
        (&Method::DELETE, None) => {
            let selector = Selector::parse(request.param("labelSelector"), request.param("fieldSelector"))?;
            let options = request.delete_options()?;
            let deleted = objects.delete_collection(resource, namespace, |o| selector.matches(o), &options)?;
            let items: Vec<Value> = deleted.into_iter().map(|o| with_type(resource, o)).collect();
            Ok(Reply::Json(
                StatusCode::OK,
                json!({"apiVersion": resource.api_version(), "kind": format!("{}List", resource.kind),
                       "metadata": {"resourceVersion": objects.store.current_resource_version().to_string()}, "items": items}),
                Vec::new(),
            ))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// `resourceVersionMatch` on a list: NotOlderThan or Exact, with a resourceVersion. This store
/// serves the current state only, so Exact must name it (older ones are 410 Expired) and
/// NotOlderThan must not be ahead of it.
fn check_resource_version_match(request: &ApiRequest, current: u64) -> ApiResult<()> {
    let invalid = |message: String| ApiError::Invalid {
        kind: "ListOptions".into(),
        group: "meta.k8s.io".into(),
        name: String::new(),
        causes: vec![FieldCause::invalid("resourceVersionMatch", message)],
    };
    let rv = request.param("resourceVersion");
    let Some(matching) = request.param("resourceVersionMatch") else {
        return Ok(());
    };
    let Some(rv) = rv else {
        return Err(invalid(
            "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
        ));
    };
    let number = || {
        rv.parse::<u64>()
            .map_err(|_| ApiError::BadRequest(format!("invalid resourceVersion {rv:?}: must be a number")))
    };
    match matching {
        "NotOlderThan" => {
            if number()? > current {
                return Err(ApiError::Timeout(format!(
                    "Too large resource version: {rv}, current: {current}"
                )));
            }
            Ok(())
        }
        "Exact" if rv == "0" => Err(invalid(
            "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into(),
        )),
        "Exact" => match number()? {
            n if n == current => Ok(()),
            n if n > current => Err(ApiError::Timeout(format!(
                "Too large resource version: {rv}, current: {current}"
            ))),
            n => Err(ApiError::Expired {
                requested: n,
                oldest: current,
            }),
        },
        other => Err(invalid(format!(
            "Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
        ))),
    }
}

fn watch_request(
    server: &Arc<ApiServer>,
    request: &ApiRequest,
    index: usize,
    namespace: Option<&str>,
    selector: Selector,
    rendering: Rendering,
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
            rendering,
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
