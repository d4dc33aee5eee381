//! kcpshard's API next to a real one: the same requests to `kcpshard serve` and to a real kcp that
//! serves the KcpShard CRD (crds/) in a workspace, comparing status codes and the fields that
//! matter (docs/api.md lists the cases and the deliberate differences). One kcp, one workspace,
//! every case in one test: about 33 s, 27 s of it kcp's start.
//!
//! Cases: dry runs of create, merge patch, apply, status apply and delete (and an unknown dryRun
//! value); server-side apply conflicts, force, removal of dropped fields, managedFields, and
//! conditions applied by two managers merged by type; DeleteOptions preconditions; a 253-character
//! name; ObjectMeta validation; a namespace on a cluster-scoped object; deletecollection;
//! PartialObjectMetadata, YAML and 406; /openapi/v2; SelfSubjectAccessReview and
//! SelfSubjectReview; limit/continue; malformed selectors; resourceVersionMatch; a core/v1 event
//! without eventTime; the details of NotFound and Conflict.
//!
//! Run it alone under the real-kcp lock: `flock /tmp/kcpshard-realkcp.lock cargo test --test api_compare`.
//!
//! Longer than 600 lines on purpose: one kcp, one workspace, every case of the comparison in one
//! test (kcp's start is most of its time). Each tests/*.rs file is a test binary of its own (40-60
//! MB, linked again on every change of the crate): one concern, one file.
mod common;
mod support;

use std::time::{Duration, Instant};

use http::{Method, Request};
use http_body_util::BodyExt;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

const COLLECTION: &str = "/apis/kcpshard.io/v1alpha1/kcpshards";
const WORKSPACE: &str = "compare";

/// One server under comparison: a client and the prefix its paths take.
struct Side {
    name: &'static str,
    client: Client,
    prefix: String,
}

#[derive(Debug, Clone)]
struct Reply {
    code: u16,
    content_type: String,
    body: Value,
    text: String,
}

/// A request, sent the same to both sides.
#[derive(Clone)]
struct Req {
    method: Method,
    path: String,
    content_type: &'static str,
    accept: &'static str,
    body: Option<String>,
}

fn req(method: Method, path: impl Into<String>) -> Req {
    Req {
        method,
        path: path.into(),
        content_type: "application/json",
        accept: "application/json",
        body: None,
    }
}

impl Req {
    fn json(mut self, body: Value) -> Req {
        self.body = Some(body.to_string());
        self
    }
    fn typed(mut self, content_type: &'static str) -> Req {
        self.content_type = content_type;
        self
    }
    fn accept(mut self, accept: &'static str) -> Req {
        self.accept = accept;
        self
    }
    /// Adds query parameters to a path that has some already.
    fn and(mut self, query: &str) -> Req {
        self.path.push('&');
        self.path.push_str(query);
        self
    }
}

impl Side {
    async fn send(&self, r: &Req) -> Reply {
        let request = Request::builder()
            .method(r.method.clone())
            .uri(format!("{}{}", self.prefix, r.path))
            .header(http::header::CONTENT_TYPE, r.content_type)
            .header(http::header::ACCEPT, r.accept)
            .body(kube::client::Body::from(
                r.body.clone().unwrap_or_default().into_bytes(),
            ))
            .unwrap();
        let response = self
            .client
            .send(request)
            .await
            .unwrap_or_else(|e| panic!("{}: {} {}: no answer: {e}", self.name, r.method, r.path));
        let code = response.status().as_u16();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_str(&text)
            .or_else(|_| serde_yaml::from_str(&text))
            .unwrap_or(Value::Null);
        Reply {
            code,
            content_type,
            body,
            text,
        }
    }
}

/// Both sides, and every difference found so far (reported together at the end).
struct Compare {
    ours: Side,
    real: Side,
    differences: Vec<String>,
    cases: usize,
}

impl Compare {
    /// Sends `r` to both; the status codes must match, and so must the values at `pointers`
    /// (JSON pointers into the answer). Returns (ours, real).
    async fn same(&mut self, case: &str, r: Req, pointers: &[&str]) -> (Reply, Reply) {
        self.cases += 1;
        let ours = self.ours.send(&r).await;
        let real = self.real.send(&r).await;
        if ours.code != real.code {
            self.differences.push(format!(
                "{case}: {} {}: kcpshard answered {}, kcp {}\n  kcpshard: {}\n  kcp: {}",
                r.method,
                r.path,
                ours.code,
                real.code,
                cut(&ours.text),
                cut(&real.text)
            ));
        }
        for pointer in pointers {
            let (a, b) = (ours.body.pointer(pointer), real.body.pointer(pointer));
            if a != b {
                self.differences.push(format!(
                    "{case}: {} {}: {pointer} is {} on kcpshard, {} on kcp",
                    r.method,
                    r.path,
                    a.map_or("absent".into(), Value::to_string),
                    b.map_or("absent".into(), Value::to_string)
                ));
            }
        }
        (ours, real)
    }

    /// Both sides must agree on `what` (computed from each side's answer).
    fn agree<T: PartialEq + std::fmt::Debug>(&mut self, case: &str, ours: T, real: T) {
        if ours != real {
            self.differences
                .push(format!("{case}: kcpshard has {ours:?}, kcp {real:?}"));
        }
    }
}

fn cut(text: &str) -> String {
    text.chars().take(400).collect()
}

fn shard(name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard",
        "metadata": {"name": name},
        "spec": {"version": "v0.31.2", "store": {"type": "KineSqlite"},
                 "front": {"type": "Tcp", "listen": format!("127.0.0.1:{port}")}},
    })
}

fn managers(object: &Value) -> Vec<String> {
    let mut managers: Vec<String> = object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{}/{}/{}",
                e["manager"].as_str().unwrap_or_default(),
                e["operation"].as_str().unwrap_or_default(),
                e["subresource"].as_str().unwrap_or_default()
            )
        })
        .collect();
    managers.sort();
    managers
}

/// The managed fields as the set of paths each manager owns (fieldsV1, with timestamps left out).
fn ownership(object: &Value) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or_default().to_string(),
                e["fieldsV1"].clone(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn apply(name: &str, manager: &str, force: bool, body: Value) -> Req {
    let force = if force { "&force=true" } else { "" };
    req(
        Method::PATCH,
        format!("{COLLECTION}/{name}?fieldManager={manager}{force}"),
    )
    .typed("application/apply-patch+yaml")
    .json(body)
}

/// kcp serving the KcpShard CRD in a workspace, as a [`Side`].
async fn real_side(kcp: &support::Kcp) -> Side {
    kcp.create_workspace(WORKSPACE);
    let kubeconfig = Kubeconfig::read_from(&kcp.kubeconfig).unwrap();
    let options = KubeConfigOptions {
        context: Some("shard-base".into()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    let side = Side {
        name: "kcp",
        client: Client::try_from(config).unwrap(),
        prefix: format!("/clusters/root:{WORKSPACE}"),
    };
    let crd: Value = serde_yaml::from_str(
        &std::fs::read_to_string(support::repo_root().join("crds/kcpshards.kcpshard.io.yaml")).unwrap(),
    )
    .unwrap();
    let created = side
        .send(&req(Method::POST, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions").json(crd))
        .await;
    assert_eq!(
        created.code, 201,
        "the CRD is created in the workspace: {}",
        created.text
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while side.send(&req(Method::GET, COLLECTION)).await.code != 200 {
        assert!(Instant::now() < deadline, "kcp did not serve kcpshards within 60s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    side
}

#[tokio::test(flavor = "multi_thread")]
async fn kcpshards_api_answers_as_a_real_apiserver_does() {
    let started = Instant::now();
    let kine = support::Kine::sqlite();
    let root = tempfile::tempdir().unwrap();
    let kcp = support::Kcp::start(support::KcpOptions::new(root.path(), &kine.url()));
    let serve = common::Serve::start().await;
    let real = real_side(&kcp).await;
    let ours = Side {
        name: "kcpshard",
        client: serve.client().await,
        prefix: String::new(),
    };
    let set_up = started.elapsed();
    let mut c = Compare {
        ours,
        real,
        differences: Vec::new(),
        cases: 0,
    };

    // --- create, and dry runs of every write -------------------------------------------------
    let (dev, real_dev) = c
        .same(
            "create",
            req(Method::POST, COLLECTION).json(shard("dev", 16443)),
            &["/metadata/generation", "/spec"],
        )
        .await;
    let (ours, real) = c
        .same(
            "dry-run create",
            req(Method::POST, format!("{COLLECTION}?dryRun=All")).json(shard("other", 16444)),
            &["/metadata/generation", "/metadata/resourceVersion", "/spec"],
        )
        .await;
    c.agree(
        "dry-run create has a uid",
        ours.body["metadata"]["uid"].is_string(),
        real.body["metadata"]["uid"].is_string(),
    );
    c.same(
        "dry-run create stored nothing",
        req(Method::GET, format!("{COLLECTION}/other")),
        &["/reason", "/details"],
    )
    .await;
    c.same(
        "unknown dryRun value",
        req(Method::POST, format!("{COLLECTION}?dryRun=Some")).json(shard("other", 16444)),
        &["/reason", "/message", "/details/causes"],
    )
    .await;
    c.same(
        "dry-run merge patch",
        req(Method::PATCH, format!("{COLLECTION}/dev?dryRun=All"))
            .typed("application/merge-patch+json")
            .json(json!({"spec": {"version": "v0.31.3"}})),
        &["/spec/version", "/metadata/generation"],
    )
    .await;
    c.same(
        "dry-run apply",
        apply("dev", "alice", true, json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "dev"}, "spec": {"version": "v0.31.3"}}))
            .and("dryRun=All"),
        &["/spec/version", "/metadata/generation"],
    )
    .await;
    c.same(
        "dry-run status apply",
        req(
            Method::PATCH,
            format!("{COLLECTION}/dev/status?fieldManager=ctl&dryRun=All"),
        )
        .typed("application/apply-patch+yaml")
        .json(
            json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "dev"},
                         "status": {"phase": "Ready"}}),
        ),
        &["/status/phase"],
    )
    .await;
    c.same(
        "dry-run delete",
        req(Method::DELETE, format!("{COLLECTION}/dev"))
            .json(json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]})),
        &["/metadata/name"],
    )
    .await;
    let (ours, real) = c
        .same(
            "after the dry runs",
            req(Method::GET, format!("{COLLECTION}/dev")),
            &["/spec/version", "/metadata/generation", "/status"],
        )
        .await;
    let unchanged = |after: &Reply, before: &Reply| {
        after.body["metadata"]["resourceVersion"] == before.body["metadata"]["resourceVersion"]
    };
    c.agree(
        "dry runs moved no resourceVersion",
        (unchanged(&ours, &dev), unchanged(&real, &real_dev)),
        (true, true),
    );

    // --- server-side apply ---------------------------------------------------------------------
    let config = |version: &str, extra: bool| {
        let mut spec = json!({"version": version});
        if extra {
            spec["kcp"] = json!({"extraArgs": ["--v=2"]});
        }
        json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "ssa"}, "spec": spec})
    };
    let mut first = config("v0.31.2", true);
    first["spec"]["store"] = json!({"type": "KineSqlite"});
    first["spec"]["front"] = json!({"type": "Tcp", "listen": "127.0.0.1:16445"});
    let (ours, real) = c
        .same("apply creates", apply("ssa", "alice", false, first.clone()), &["/spec"])
        .await;
    c.agree("apply's managers", managers(&ours.body), managers(&real.body));
    c.agree("apply's fields", ownership(&ours.body), ownership(&real.body));
    c.same(
        "apply without a field manager",
        req(Method::PATCH, format!("{COLLECTION}/ssa"))
            .typed("application/apply-patch+yaml")
            .json(config("v0.31.3", false)),
        &["/reason"],
    )
    .await;
    c.same(
        "a second manager's conflicting apply",
        apply("ssa", "bob", false, config("v0.31.3", false)),
        &["/reason", "/message", "/details/causes"],
    )
    .await;
    c.same(
        "the same value is shared, not a conflict",
        apply("ssa", "carol", false, config("v0.31.2", false)),
        &["/spec/version"],
    )
    .await;
    let (ours, real) = c
        .same(
            "forced",
            apply("ssa", "bob", true, config("v0.31.3", false)),
            &["/spec/version"],
        )
        .await;
    c.agree("after force, managers", managers(&ours.body), managers(&real.body));
    c.agree("after force, fields", ownership(&ours.body), ownership(&real.body));
    let mut dropped = first.clone();
    dropped["spec"].as_object_mut().unwrap().remove("kcp");
    dropped["spec"]["version"] = json!("v0.31.3");
    let (ours, real) = c
        .same(
            "alice drops extraArgs",
            apply("ssa", "alice", false, dropped),
            &["/spec/kcp", "/spec/version"],
        )
        .await;
    c.agree("after the drop, fields", ownership(&ours.body), ownership(&real.body));
    let (ours, real) = c
        .same(
            "an update (merge patch) by a manager",
            req(Method::PATCH, format!("{COLLECTION}/ssa?fieldManager=editor"))
                .typed("application/merge-patch+json")
                .json(json!({"metadata": {"labels": {"team": "a"}}})),
            &["/metadata/labels"],
        )
        .await;
    c.agree("after an update, managers", managers(&ours.body), managers(&real.body));
    c.agree("after an update, fields", ownership(&ours.body), ownership(&real.body));
    let condition = |type_: &str| json!({"type": type_, "status": "True", "reason": "R", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    for (manager, type_) in [("ctl", "Ready"), ("other", "Custom")] {
        let body = json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "ssa"},
                          "status": {"conditions": [condition(type_)]}});
        let r = req(Method::PATCH, format!("{COLLECTION}/ssa/status?fieldManager={manager}"))
            .typed("application/apply-patch+yaml")
            .json(body);
        c.same(&format!("status apply by {manager}"), r, &["/status/conditions"])
            .await;
    }
    // How tools reset field ownership: `managedFields: [{}]` in a write other than apply.
    for (case, patch) in [
        (
            "managedFields reset with a label change",
            json!({"metadata": {"managedFields": [{}], "labels": {"team": "b"}}}),
        ),
        (
            "managedFields reset alone",
            json!({"metadata": {"managedFields": [{}]}}),
        ),
    ] {
        let (ours, real) = c
            .same(
                case,
                req(Method::PATCH, format!("{COLLECTION}/ssa?fieldManager=resetter"))
                    .typed("application/merge-patch+json")
                    .json(patch),
                &["/metadata/labels"],
            )
            .await;
        c.agree(&format!("{case}: fields"), ownership(&ours.body), ownership(&real.body));
    }

    // --- delete options ------------------------------------------------------------------------
    let wrong_uid = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}});
    let (ours, real) = c
        .same(
            "delete with a wrong uid",
            req(Method::DELETE, format!("{COLLECTION}/ssa")).json(wrong_uid),
            &["/reason", "/details"],
        )
        .await;
    // The message up to the stored uid, which differs between the two.
    let asked = |r: &Reply| {
        let message = r.body["message"].as_str().unwrap_or_default();
        message.split(" does not match").next().map(str::to_string)
    };
    c.agree("delete with a wrong uid: message", asked(&ours), asked(&real));
    let wrong_rv = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": "1"}});
    let (ours, real) = c
        .same(
            "delete with a stale resourceVersion",
            req(Method::DELETE, format!("{COLLECTION}/ssa")).json(wrong_rv),
            &["/reason", "/details"],
        )
        .await;
    c.agree(
        "delete with a stale resourceVersion: message",
        asked(&ours),
        asked(&real),
    );
    let bad_policy = json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Sometimes"});
    c.same(
        "delete with an unknown propagationPolicy",
        req(Method::DELETE, format!("{COLLECTION}/ssa")).json(bad_policy),
        &["/reason", "/details/causes"],
    )
    .await;

    // --- names and metadata --------------------------------------------------------------------
    let long = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    c.same(
        "a 253-character name",
        req(Method::POST, COLLECTION).json(shard(&long, 16446)),
        &["/metadata/name"],
    )
    .await;
    for (case, metadata) in [
        ("a bad label key", json!({"name": "m1", "labels": {"bad key": "x"}})),
        ("a bad label value", json!({"name": "m2", "labels": {"k": "bad value"}})),
        ("a bad finalizer", json!({"name": "m3", "finalizers": ["a/b/c"]})),
        (
            "annotations over 256 KiB",
            json!({"name": "m4", "annotations": {"big": "x".repeat(256 * 1024)}}),
        ),
        (
            "an ownerReference without a uid",
            json!({"name": "m5", "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x"}]}),
        ),
    ] {
        let mut object = shard("m", 16447);
        object["metadata"] = metadata;
        c.same(case, req(Method::POST, COLLECTION).json(object), &["/reason"])
            .await;
    }
    let mut namespaced = shard("nsd", 16448);
    namespaced["metadata"]["namespace"] = json!("default");
    c.same(
        "a namespace on a cluster-scoped object",
        req(Method::POST, COLLECTION).json(namespaced),
        &["/metadata/namespace"],
    )
    .await;

    // --- lists -----------------------------------------------------------------------------------
    let (ours, real) = c
        .same(
            "limit",
            req(Method::GET, format!("{COLLECTION}?limit=1")),
            &["/metadata/remainingItemCount"],
        )
        .await;
    c.agree(
        "limit gives one item",
        ours.body["items"].as_array().map(Vec::len),
        real.body["items"].as_array().map(Vec::len),
    );
    c.agree(
        "limit gives a continue token",
        ours.body["metadata"]["continue"].is_string(),
        real.body["metadata"]["continue"].is_string(),
    );
    if let Some(token) = ours.body["metadata"]["continue"].as_str() {
        let next = c
            .ours
            .send(&req(Method::GET, format!("{COLLECTION}?limit=1&continue={token}")))
            .await;
        assert_eq!(next.code, 200, "{}", next.text);
        assert_ne!(
            next.body["items"][0]["metadata"]["name"],
            ours.body["items"][0]["metadata"]["name"]
        );
    }
    c.same(
        "a malformed label selector",
        req(Method::GET, format!("{COLLECTION}?labelSelector=a%20in%20(b")),
        &["/reason"],
    )
    .await;
    c.same(
        "a bad label value in a selector",
        req(Method::GET, format!("{COLLECTION}?labelSelector=a%3Db%20c")),
        &["/reason"],
    )
    .await;
    c.same(
        "an unselectable field",
        req(Method::GET, format!("{COLLECTION}?fieldSelector=spec.version%3Dv1")),
        &["/reason"],
    )
    .await;
    c.same(
        "a selectable field",
        req(Method::GET, format!("{COLLECTION}?fieldSelector=metadata.name%3Ddev")),
        &["/items/0/metadata/name"],
    )
    .await;
    c.same(
        "resourceVersionMatch without resourceVersion",
        req(Method::GET, format!("{COLLECTION}?resourceVersionMatch=NotOlderThan")),
        &["/reason"],
    )
    .await;
    c.same(
        "an unknown resourceVersionMatch",
        req(
            Method::GET,
            format!("{COLLECTION}?resourceVersion=1&resourceVersionMatch=Sometimes"),
        ),
        &["/reason"],
    )
    .await;
    c.same(
        "resourceVersionMatch=Exact of 0",
        req(
            Method::GET,
            format!("{COLLECTION}?resourceVersion=0&resourceVersionMatch=Exact"),
        ),
        &["/reason"],
    )
    .await;
    c.same(
        "resourceVersionMatch=NotOlderThan of 0",
        req(
            Method::GET,
            format!("{COLLECTION}?resourceVersion=0&resourceVersionMatch=NotOlderThan"),
        ),
        &["/kind"],
    )
    .await;

    // --- content negotiation -------------------------------------------------------------------
    c.same(
        "PartialObjectMetadataList",
        req(Method::GET, COLLECTION).accept("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
        &["/kind", "/apiVersion", "/items/0/kind", "/items/0/spec"],
    )
    .await;
    c.same(
        "PartialObjectMetadata",
        req(Method::GET, format!("{COLLECTION}/dev"))
            .accept("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
        &["/kind", "/metadata/name", "/spec"],
    )
    .await;
    c.same(
        "an unsupported Accept",
        req(Method::GET, COLLECTION).accept("text/html"),
        &["/reason"],
    )
    .await;
    let (ours, real) = c
        .same(
            "YAML",
            req(Method::GET, format!("{COLLECTION}/dev")).accept("application/yaml"),
            &["/metadata/name", "/kind"],
        )
        .await;
    c.agree("YAML content type", ours.content_type, real.content_type);
    c.same("openapi v2", req(Method::GET, "/openapi/v2"), &["/swagger"])
        .await;
    // kcp's workspace document leaves the CRD's definitions out; kcpshard's has them for clients
    // that look a kind up there.
    let swagger = c.ours.send(&req(Method::GET, "/openapi/v2")).await;
    assert!(
        swagger.body["definitions"]["io.kcpshard.v1alpha1.KcpShard"]["x-kubernetes-group-version-kind"].is_array(),
        "{}",
        cut(&swagger.text)
    );

    // --- kubectl auth can-i / whoami -----------------------------------------------------------
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                        "spec": {"resourceAttributes": {"group": "kcpshard.io", "resource": "kcpshards", "verb": "create"}}});
    c.same(
        "SelfSubjectAccessReview",
        req(Method::POST, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews").json(review),
        &["/kind", "/status/allowed"],
    )
    .await;
    let whoami = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    c.same(
        "SelfSubjectReview",
        req(Method::POST, "/apis/authentication.k8s.io/v1/selfsubjectreviews").json(whoami),
        &["/kind"],
    )
    .await;

    // --- events ----------------------------------------------------------------------------------
    let legacy = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "dev.legacy", "namespace": "default"},
        "involvedObject": {"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "name": "dev"},
        "reason": "Tested", "message": "posted as client-go's recorder does", "type": "Normal",
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
        "source": {"component": "test"}});
    c.same(
        "a core/v1 event without eventTime",
        req(Method::POST, "/api/v1/namespaces/default/events").json(legacy),
        &["/reason", "/lastTimestamp", "/eventTime"],
    )
    .await;
    c.same(
        "the event list with it",
        req(Method::GET, "/api/v1/namespaces/default/events"),
        &["/items/0/reason", "/items/0/eventTime"],
    )
    .await;
    c.same(
        "events.k8s.io reads it",
        req(
            Method::GET,
            "/apis/events.k8s.io/v1/namespaces/default/events/dev.legacy",
        ),
        &["/note", "/reason", "/eventTime"],
    )
    .await;
    // What `kubectl get events` prints (its columns of priority 0; `-o wide` all).
    let columns = |table: &Value| -> Vec<(Value, Value, Value)> {
        let columns = table["columnDefinitions"].as_array().cloned().unwrap_or_default();
        columns
            .iter()
            .map(|c| (c["name"].clone(), c["priority"].clone(), c["format"].clone()))
            .collect()
    };
    for group in ["/api/v1", "/apis/events.k8s.io/v1"] {
        let (ours, real) = c
            .same(
                &format!("the event table of {group}"),
                req(Method::GET, format!("{group}/namespaces/default/events"))
                    .accept("application/json;as=Table;v=v1;g=meta.k8s.io"),
                &["/kind"],
            )
            .await;
        c.agree(
            &format!("{group}: event columns"),
            columns(&ours.body),
            columns(&real.body),
        );
        c.agree(
            &format!("{group}: event cells"),
            &ours.body["rows"][0]["cells"],
            &real.body["rows"][0]["cells"],
        );
    }

    // --- deletecollection ------------------------------------------------------------------------
    c.same(
        "deletecollection",
        req(Method::DELETE, format!("{COLLECTION}?labelSelector=team%3Da")),
        &["/kind", "/items/0/metadata/name"],
    )
    .await;
    c.same(
        "deletecollection deleted",
        req(Method::GET, format!("{COLLECTION}/ssa")),
        &["/reason"],
    )
    .await;

    // --- the real kubectl against both: dry runs, diff, client-side then server-side apply ------
    let kcp_server = format!("--server=https://127.0.0.1:{}/clusters/root:{WORKSPACE}", kcp.port);
    // kubectl caches discovery by host and port, not path: the workspace needs a cache of its own.
    let cache = tempfile::tempdir().unwrap();
    let kcp_cache = format!("--cache-dir={}", cache.path().display());
    // kcp's discovery lists a new CRD a moment after it serves it: wait, as kubectl needs it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kcp.kubectl_as(
            "shard-base",
            &[
                &kcp_server,
                &kcp_cache,
                "api-resources",
                "--api-group=kcpshard.io",
                "-o",
                "name",
            ],
            None,
        );
        if String::from_utf8_lossy(&out.stdout).contains("kcpshards") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kcp's discovery did not list kcpshards within 60s: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut kubectl = |case: &str, args: &[&str], manifest: Option<&Value>| {
        c.cases += 1;
        let stdin = manifest.map(Value::to_string);
        let mut ours_args: Vec<&str> = args.to_vec();
        if stdin.is_some() {
            ours_args.extend(["-f", "-"]);
        }
        let ours = serve.kubectl_with(&ours_args, stdin.as_deref(), &[]);
        let mut real_args = vec![kcp_server.as_str(), kcp_cache.as_str()];
        real_args.extend_from_slice(args);
        let real = kcp.kubectl_as("shard-base", &real_args, stdin.as_deref());
        let text = |o: &std::process::Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        // kubectl diff prints temporary paths and server-set fields: its exit code is the answer.
        let same_output = args.first() == Some(&"diff") || ours.stdout == real.stdout;
        if ours.status.code() != real.status.code() || !same_output {
            c.differences.push(format!(
                "{case}: kubectl {}: kcpshard ({:?}):\n{}\n  kcp ({:?}):\n{}",
                args.join(" "),
                ours.status.code(),
                text(&ours),
                real.status.code(),
                text(&real)
            ));
        }
    };
    let mut gated = shard("csa", 16449);
    gated["spec"]["rollout"] = json!({"allowMinorVersionChange": true});
    kubectl("client-side apply", &["apply"], Some(&gated));
    let mut edited = gated.clone();
    edited["spec"]["version"] = json!("v0.31.3");
    kubectl(
        "client-side apply, dry run",
        &["apply", "--dry-run=server", "-o", "jsonpath={.spec.version}"],
        Some(&edited),
    );
    kubectl("diff", &["diff"], Some(&edited));
    kubectl(
        "patch, dry run",
        &[
            "patch",
            "ks",
            "csa",
            "--type=merge",
            "--dry-run=server",
            "-o",
            "jsonpath={.spec.version}",
            "-p",
            r#"{"spec":{"version":"v0.31.3"}}"#,
        ],
        None,
    );
    kubectl("delete, dry run", &["delete", "ks", "csa", "--dry-run=server"], None);
    kubectl(
        "server-side dry run over client-side apply's fields",
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-o",
            "jsonpath={.spec.version}",
        ],
        Some(&edited),
    );
    kubectl("server-side diff over them", &["diff", "--server-side"], Some(&edited));
    // (The managers' order depends on the second their entries were written: not compared.)
    let mut ungated = gated.clone();
    ungated["spec"].as_object_mut().unwrap().remove("rollout");
    kubectl(
        "server-side apply takes over from client-side apply",
        &["apply", "--server-side"],
        Some(&ungated),
    );
    kubectl(
        "the gate the file dropped is gone",
        &[
            "get",
            "ks",
            "csa",
            "-o",
            "jsonpath={.spec.rollout.allowMinorVersionChange} {.spec.version}",
        ],
        None,
    );
    kubectl("client-side apply after it", &["apply"], Some(&edited));

    let took = started.elapsed();
    println!(
        "MEASURE api_compare: {} cases in {:.1}s ({:.1}s of it starting kcp, the workspace and serve)",
        c.cases,
        took.as_secs_f64(),
        set_up.as_secs_f64()
    );
    assert!(
        c.differences.is_empty(),
        "{} of {} cases differ from the real apiserver (see docs/api.md for the deliberate differences):\n\n{}",
        c.differences.len(),
        c.cases,
        c.differences.join("\n\n")
    );
}
