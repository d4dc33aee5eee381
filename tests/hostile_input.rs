//! Hostile input: what a local user without the token, or a process that reads logs,
//! events and objects, can get from `kcpshard serve`.
//!
//! - Every path the API serves, with every method, refuses a request without the right bearer
//!   token (401), and such a request changes nothing; plain HTTP gets no HTTP answer.
//! - Keys, tokens and kubeconfigs are 0600 in 0700 directories, after `serve` starts and after the
//!   controller has set up a shard's store and front.
//! - The API, kine and the front listen on loopback only; the defaults (`--api-listen`,
//!   `spec.front.listen`) are loopback addresses.
//! - No secret (the API token, the private keys) reaches serve's log, the logs under the state dir,
//!   an event, an object, /metrics, the CLI's output or a process's argv.
//!
//! The shard the controller runs here names a kcp binary that does not exist: the controller
//! starts kine and the front, then blocks with BinaryMissing, so no kcp is needed. The fuzz target
//! over request decoding lives in fuzz/ (hack/fuzz.sh); docs/reliability.md has both.
//!
//! Longer than 600 lines on purpose: every path and method of the API, with and without the token,
//! against one serve. Each tests/*.rs file is a test binary of its own (40-60 MB, linked again on
//! every change of the crate): one concern, one file.
mod common;
mod e2e;
mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SHARDS: &str = "/apis/kcpshard.io/v1alpha1/kcpshards";

// ------------------------------------------------------------------------------------------------
// Every path refuses a request without the token

/// Every path `serve` answers (src/apiserver/handler.rs `route`), the watch forms, paths it does
/// not serve, and attempts to leave the API's tree. Item paths name objects that exist.
fn api_paths() -> Vec<String> {
    let unknown = format!("/x-{:016x}", rand_u64());
    [
        "/",
        "/api",
        "/api/v1",
        "/apis",
        "/apis/kcpshard.io",
        "/apis/kcpshard.io/v1alpha1",
        SHARDS,
        "/apis/kcpshard.io/v1alpha1/kcpshards/dev",
        "/apis/kcpshard.io/v1alpha1/kcpshards/dev/status",
        "/apis/kcpshard.io/v1alpha1/kcpshards?watch=true",
        "/apis/kcpshard.io/v1alpha1/kcpshards?watch=1&resourceVersion=0&allowWatchBookmarks=true",
        "/apis/kcpshard.io/v1alpha1/kcpshards?watch=true&fieldSelector=metadata.name%3Ddev",
        "/api/v1/events",
        "/api/v1/events?watch=true",
        "/api/v1/namespaces/default/events",
        "/api/v1/namespaces/default/events?watch=true",
        "/api/v1/namespaces/default/events/dev.1",
        "/apis/events.k8s.io",
        "/apis/events.k8s.io/v1",
        "/apis/events.k8s.io/v1/events",
        "/apis/events.k8s.io/v1/events?watch=true",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        "/apis/events.k8s.io/v1/namespaces/default/events/dev.1",
        "/openapi/v2",
        "/openapi/v3",
        "/openapi/v3/apis/kcpshard.io/v1alpha1",
        "/openapi/v3/api/v1",
        "/version",
        "/healthz",
        "/readyz",
        "/livez",
        "/readyz?verbose",
        "/metrics",
        "/apis/kcpshard.io/v1alpha1/kcpshards/..%2F..%2Ftoken",
        "/apis/kcpshard.io/v1alpha1/namespaces/default/kcpshards",
        &unknown,
    ]
    .iter()
    .map(|p| p.to_string())
    .collect()
}

fn methods() -> Vec<Method> {
    let mut methods = vec![
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::OPTIONS,
        Method::TRACE,
    ];
    methods.push(Method::from_bytes(b"PROPFIND").unwrap());
    methods
}

/// A client with the kubeconfig's server and CA but no credentials: it sends exactly the
/// Authorization header a request carries, if any.
async fn anonymous_client(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a client config from the kubeconfig");
    config.auth_info = AuthInfo::default();
    Client::try_from(config).expect("a client")
}

struct Reply {
    code: StatusCode,
    body: Vec<u8>,
}

async fn send(client: &Client, method: &Method, path: &str, authorization: Option<&str>) -> Reply {
    let content_type = if method == Method::PATCH {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let mut request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type);
    if let Some(value) = authorization {
        request = request.header(http::header::AUTHORIZATION, value);
    }
    let body = match *method {
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE => Vec::new(),
        // What a write would need to succeed, had it the token.
        _ => json!({"apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "evil"},
                    "spec": {"version": "v0.31.2", "store": {"type": "KineSqlite"}}})
        .to_string()
        .into_bytes(),
    };
    let request = request.body(kube::client::Body::from(body)).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.send(request))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within 10s"))
        .unwrap_or_else(|e| panic!("{method} {path}: no HTTP response: {e}"));
    let code = response.status();
    // A watch that was let through would never end: read what arrives within a second.
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                bytes.extend_from_slice(data);
            }
        }
    })
    .await;
    Reply { code, body: bytes }
}

/// Creates an events.k8s.io/v1 Event about KcpShard dev in `default`.
async fn post_event(client: &Client, name: &str, event_time: &str, reason: &str) -> Result<Value, kube::Error> {
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "default"}, "eventTime": event_time,
        "regarding": {"kind": "KcpShard", "name": "dev"}, "reason": reason, "note": "n", "type": "Normal",
        "action": "Test", "reportingController": "test", "reportingInstance": "test"});
    let request = Request::post("/apis/events.k8s.io/v1/namespaces/default/events")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(event.to_string().into_bytes())
        .unwrap();
    client.request(request).await
}

/// The store's resourceVersion, as a list answers it: it moves with every write.
async fn resource_version(client: &Client) -> String {
    let request = Request::get(SHARDS).body(Vec::new()).unwrap();
    let list: Value = client.request(request).await.expect("list kcpshards");
    list["metadata"]["resourceVersion"]
        .as_str()
        .expect("a list has a resourceVersion")
        .to_string()
}

/// Nothing is served anonymously, not even /healthz, /readyz, /livez, /version or discovery (the
/// real kube-apiserver lets `system:anonymous` read those). Nothing needs to: the controller uses
/// the in-process client, and every probe (tests, kubectl, `kcpshard get`) holds the kubeconfig and
/// so the token. Keeping the set empty means a local user without the token learns nothing, not
/// even that a shard named `dev` exists.
#[tokio::test]
async fn every_path_and_method_without_the_right_token_gets_401_and_changes_nothing() {
    let serve = common::Serve::start().await;
    let client = serve.client().await;
    let token = std::fs::read_to_string(serve.state_dir().join("token"))
        .expect("read the token")
        .trim()
        .to_string();
    // Objects for the item paths to name, so a 401 is not a 404 in disguise.
    let shards = common::kcpshards(&client);
    let dev: kube::api::DynamicObject = serde_json::from_value(common::dev_manifest()).unwrap();
    shards
        .create(&Default::default(), &dev)
        .await
        .unwrap_or_else(|e| serve.fail(&format!("create dev: {e}")));
    post_event(&client, "dev.1", "2026-01-02T03:04:05.000000Z", "Test")
        .await
        .unwrap_or_else(|e| serve.fail(&format!("create an event: {e}")));
    let before = resource_version(&client).await;

    let anonymous = anonymous_client(&serve.kubeconfig).await;
    let near_miss = {
        let mut t = token.clone();
        let last = t.pop().unwrap();
        t.push(if last == '0' { '1' } else { '0' });
        t
    };
    // Every path and method, with no token and with a wrong one.
    let mut refused = 0;
    for path in api_paths() {
        for method in methods() {
            for authorization in [None, Some("Bearer wrong")] {
                let reply = send(&anonymous, &method, &path, authorization).await;
                assert_eq!(
                    reply.code,
                    StatusCode::UNAUTHORIZED,
                    "{method} {path} with Authorization {authorization:?} answered {}: {}",
                    reply.code,
                    String::from_utf8_lossy(&reply.body)
                );
                if method != Method::HEAD {
                    let status: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
                    assert_eq!(
                        (&status["kind"], &status["reason"], &status["code"]),
                        (&json!("Status"), &json!("Unauthorized"), &json!(401)),
                        "{method} {path}: the 401 is a Status that says no more: {status}"
                    );
                }
                refused += 1;
            }
        }
    }
    // Tokens that are almost right, in the wrong place or under the wrong scheme.
    let basic = {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("admin:{token}"))
        )
    };
    let almost = [
        "Bearer".to_string(),
        "Bearer ".to_string(),
        format!("Bearer {}", &token[..token.len() - 1]),
        format!("Bearer {token}x"),
        format!("Bearer {near_miss}"),
        format!("Bearer {}", token.to_uppercase()),
        format!("Bearer  {token}"),
        format!("Token {token}"),
        token.clone(),
        basic,
    ];
    for path in api_paths() {
        for authorization in &almost {
            let reply = send(&anonymous, &Method::GET, &path, Some(authorization)).await;
            assert_eq!(
                reply.code,
                StatusCode::UNAUTHORIZED,
                "GET {path} with Authorization {authorization:?} answered {}",
                reply.code
            );
            refused += 1;
        }
    }
    for query in [
        format!("/healthz?access_token={token}"),
        format!("{SHARDS}?token={token}"),
    ] {
        let reply = send(&anonymous, &Method::GET, &query, None).await;
        assert_eq!(
            reply.code,
            StatusCode::UNAUTHORIZED,
            "GET {query}: a token in the query is no token"
        );
        refused += 1;
    }
    println!("{refused} requests without the right token, each refused with 401");

    // Nothing was written, and with the token the same paths answer (the 401s were the token's).
    assert_eq!(
        resource_version(&client).await,
        before,
        "a request without the token changed the store"
    );
    assert_eq!(
        common::kcpshard_names(&shards).await,
        ["dev"],
        "no KcpShard was created without the token"
    );
    let bearer = format!("Bearer {token}");
    for path in api_paths() {
        let reply = send(&anonymous, &Method::GET, &path, Some(&bearer)).await;
        assert_ne!(reply.code, StatusCode::UNAUTHORIZED, "GET {path} with the token");
    }
    let healthz = send(&anonymous, &Method::GET, "/healthz", Some(&bearer)).await;
    assert_eq!((healthz.code, healthz.body.as_slice()), (StatusCode::OK, &b"ok"[..]));
}

/// The API speaks TLS only: a plain-HTTP request gets no HTTP answer, so a token sent by mistake
/// over `http://` is never answered, and nothing is served in the clear.
#[tokio::test]
async fn plain_http_to_the_api_gets_no_http_answer() {
    let serve = common::Serve::start().await;
    let address = api_address(&serve.kubeconfig);
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to the API");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("write a plain HTTP request");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut reply)).await;
    assert!(
        !reply.starts_with(b"HTTP/"),
        "plain HTTP got an HTTP answer: {}",
        String::from_utf8_lossy(&reply)
    );
}

fn api_address(kubeconfig: &Path) -> SocketAddr {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let server = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .expect("the kubeconfig names a server");
    let authority = server.trim_start_matches("https://").trim_end_matches('/');
    authority
        .parse()
        .unwrap_or_else(|e| panic!("the kubeconfig's server {server} is not an address: {e}"))
}

/// What the fuzz target found (fuzz/seeds/api_request/regression-*), through the real server: an
/// apply patch that is not an object, to a name not yet taken, is a 400, and a JSON patch whose
/// `move` fails after an earlier operation is a 422 (both panicked, dropping the connection); an
/// event whose time is not ASCII no longer breaks every read of /api/v1/events.
#[tokio::test]
async fn bodies_the_fuzzer_found_get_an_answer_and_leave_the_api_working() {
    let serve = common::Serve::start().await;
    let client = serve.client().await;
    for body in ["[]", "just a string", "{metadata: x}"] {
        let request = Request::patch(format!("{SHARDS}/new?fieldManager=test"))
            .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
            .body(kube::client::Body::from(body.as_bytes().to_vec()))
            .unwrap();
        let response = client
            .send(request)
            .await
            .unwrap_or_else(|e| serve.fail(&format!("apply {body:?}: no HTTP answer: {e}")));
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "apply {body:?}");
    }
    let shards = common::kcpshards(&client);
    let dev: kube::api::DynamicObject = serde_json::from_value(common::dev_manifest()).unwrap();
    shards.create(&Default::default(), &dev).await.unwrap();
    let slots = json!({"status": {"slots": [{"name": "a", "version": "v0.31.2", "ready": true}]}});
    shards
        .patch_status("dev", &Default::default(), &kube::api::Patch::Merge(&slots))
        .await
        .unwrap();
    let request = Request::patch(format!("{SHARDS}/dev/status"))
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .body(kube::client::Body::from(
            json!([{"op": "remove", "path": "/status/slots/0"}, {"op": "move", "from": "/status", "path": "/x/phase"}])
                .to_string()
                .into_bytes(),
        ))
        .unwrap();
    let response = client
        .send(request)
        .await
        .unwrap_or_else(|e| serve.fail(&format!("a failing JSON patch: no HTTP answer: {e}")));
    assert_eq!(
        response.status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "a JSON patch that fails half way"
    );
    let dev = shards.get("dev").await.unwrap();
    assert_eq!(
        dev.data["status"]["slots"][0]["name"], "a",
        "nothing of the failed patch was kept"
    );

    let odd_time = "2026-01-02T03:04:0\u{e9}5.1Z";
    post_event(&client, "odd", odd_time, "Odd")
        .await
        .unwrap_or_else(|e| serve.fail(&format!("create the event: {e}")));
    let events: Value = serde_json::from_str(&get_text(&client, "/api/v1/events").await).unwrap();
    assert_eq!(
        events["items"][0]["reason"], "Odd",
        "the core view lists the event: {events}"
    );
    assert_eq!(events["items"][0]["firstTimestamp"], odd_time);
    let healthz = get_text(&client, "/healthz").await;
    assert_eq!(healthz, "ok");
}

// ------------------------------------------------------------------------------------------------
// A shard the controller sets up without kcp

/// Applies a KcpShard whose kcp binary does not exist, on a free front port, and waits until the
/// controller has started its store and front and reports the roll blocked (BinaryMissing).
async fn blocked_shard(env: &e2e::Env, name: &str) -> String {
    let listen = format!("127.0.0.1:{}", e2e::test_port());
    env.apply_spec(
        name,
        json!({
            "version": "v0.31.2",
            "kcp": {"binary": "/nonexistent/kcpshard-test/kcp-{version}"},
            "store": {"type": "KineSqlite"},
            "front": {"type": "Tcp", "listen": listen},
        }),
    )
    .await;
    wait_blocked(env, name).await;
    listen
}

/// Waits until KcpShard `name` is Degraded with BinaryMissing, after its store and front started.
async fn wait_blocked(env: &e2e::Env, name: &str) {
    support::require("kine");
    env.until(
        name,
        Duration::from_secs(60),
        "Degraded=True reason BinaryMissing",
        |o| {
            o["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Degraded" && c["status"] == "True" && c["reason"] == "BinaryMissing")
                .then_some(())
        },
    )
    .await;
    let reasons: Vec<String> = env.events(name).await.into_iter().filter_map(|e| e.reason).collect();
    assert!(
        reasons.iter().any(|r| r == "StoreStarted") && reasons.iter().any(|r| r == "FrontStarted"),
        "the controller blocked before it started the store and the front: {reasons:?}"
    );
}

/// The mode bits of `path` (no symlinks followed).
fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every file and directory under `dir` (not `dir` itself), directories before their contents.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let is_dir = std::fs::symlink_metadata(&path).unwrap().is_dir();
        found.push(path.clone());
        if is_dir {
            found.extend(walk(&path));
        }
    }
    found
}

/// Keys, tokens and kubeconfigs, by name.
fn holds_a_secret(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    name == "token"
        || name.ends_with(".key")
        || name.contains("kubeconfig")
        || name.contains("token-store")
        || name.contains("admin-tokens")
        || name.contains("admin-identities")
        || name.contains("password")
        || name == "pgpass"
}

/// The secret files under `state` must be 0600, and `state` and every directory between it and a
/// secret file 0700. Returns what was checked, for the test's output.
fn assert_private(state: &Path) -> Vec<String> {
    let mut checked = Vec::new();
    assert_eq!(mode(state), 0o700, "the state dir {} is not 0700", state.display());
    for path in walk(state) {
        if path.is_dir() || !holds_a_secret(&path) {
            continue;
        }
        let relative = path.strip_prefix(state).unwrap();
        assert_eq!(
            mode(&path),
            0o600,
            "{} holds a secret and is {:o}, not 0600",
            relative.display(),
            mode(&path)
        );
        let mut dir = path.parent().unwrap();
        while dir != state {
            assert_eq!(
                mode(dir),
                0o700,
                "{} holds {} and is {:o}, not 0700",
                dir.strip_prefix(state).unwrap().display(),
                relative.display(),
                mode(dir)
            );
            dir = dir.parent().unwrap();
        }
        checked.push(relative.display().to_string());
    }
    checked
}

#[tokio::test]
async fn keys_tokens_and_kubeconfigs_are_0600_in_0700_directories() {
    // After serve starts: the API's PKI, token and kubeconfig.
    let serve = common::Serve::start().await;
    let checked = assert_private(&serve.state_dir());
    for expected in ["kubeconfig", "token", "pki/ca.key", "pki/serving.key"] {
        assert!(
            checked.iter().any(|c| c == expected),
            "{expected} was not written: {checked:?}"
        );
    }
    drop(serve);

    // After the controller set up a shard's store and front: its directories are 0700 too, and any
    // secret the controller wrote is private.
    let mut env = e2e::Env::start().await;
    blocked_shard(&env, "modes").await;
    let checked = assert_private(&env.state);
    println!("0600 in 0700 directories: {checked:?}");
    assert!(
        checked.iter().any(|c| c == "shards/modes/shared/admin-identities.json"),
        "the shard's admin identities are among what was checked: {checked:?}"
    );
    // Beyond the secrets by name: nothing under the state dir is open to other users, whoever
    // wrote it (kine's sqlite database holds kcp's Secrets; the lock file, logs, sockets).
    let shard = env.shard_dir("modes");
    let mut open = Vec::new();
    for path in walk(&env.state) {
        let expected = if path.is_dir() { 0o700 } else { 0o600 };
        if mode(&path) & 0o077 != 0 || (path.is_dir() && mode(&path) != expected) {
            open.push(format!(
                "{:o} {}",
                mode(&path),
                path.strip_prefix(&env.state).unwrap().display()
            ));
        }
    }
    assert!(open.is_empty(), "open to other users under the state dir: {open:#?}");
    assert!(
        shard.join("store/state.db").is_file(),
        "kine's database is among what was checked"
    );
    assert!(
        shard.join("store").is_dir() && shard.join("front").is_dir(),
        "the store and front dirs exist"
    );
    let left = env.shutdown(&["modes"]).await;
    assert!(left.is_empty(), "processes outlived the shard's deletion: {left:?}");
}

// ------------------------------------------------------------------------------------------------
// Loopback only

/// The TCP addresses process `pid` listens on, from its socket inodes and /proc/net/tcp{,6}.
fn listening_addresses(pid: i32) -> Vec<SocketAddr> {
    let mut inodes = BTreeSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(inode.to_string());
                }
            }
        }
    }
    let mut addresses = Vec::new();
    for (table, v6) in [("tcp", false), ("tcp6", true)] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if fields.len() < 10 || fields[3] != "0A" || !inodes.contains(fields[9]) {
                continue;
            }
            addresses.push(parse_proc_address(fields[1], v6));
        }
    }
    addresses
}

/// `0100007F:1F90` (IPv4, each 32-bit word in host order) as an address.
fn parse_proc_address(text: &str, v6: bool) -> SocketAddr {
    let (ip, port) = text.split_once(':').unwrap();
    let port = u16::from_str_radix(port, 16).unwrap();
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).unwrap().swap_bytes())
        .collect();
    let ip: IpAddr = if v6 {
        let mut octets = [0u8; 16];
        for (i, word) in words.iter().enumerate() {
            octets[i * 4..i * 4 + 4].copy_from_slice(&word.to_be_bytes());
        }
        Ipv6Addr::from(octets).into()
    } else {
        Ipv4Addr::from(words[0]).into()
    };
    SocketAddr::new(ip, port)
}

fn is_loopback(address: &SocketAddr) -> bool {
    match address.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

#[test]
fn proc_net_addresses_parse() {
    assert_eq!(
        parse_proc_address("0100007F:1920", false),
        "127.0.0.1:6432".parse().unwrap()
    );
    assert_eq!(
        parse_proc_address("00000000:0050", false),
        "0.0.0.0:80".parse().unwrap()
    );
    assert_eq!(
        parse_proc_address("00000000000000000000000001000000:1F90", true),
        "[::1]:8080".parse().unwrap()
    );
}

/// `serve` with no `--api-listen` binds 127.0.0.1:6440. If that port is taken the start fails, and
/// the error names the address it tried: loopback either way.
#[tokio::test]
async fn the_api_listens_on_loopback_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut command = Command::new(env!("CARGO_BIN_EXE_kcpshard"));
    command
        .arg("serve")
        .arg("--state-dir")
        .arg(&state)
        .arg("--controller=false")
        .env_remove("KCPSHARD_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap())
        .process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    let mut child = command.spawn().expect("spawn kcpshard serve");
    let pid = child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(30);
    let outcome = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Err(status);
        }
        let addresses = listening_addresses(pid);
        if !addresses.is_empty() && state.join("kubeconfig").is_file() {
            break Ok(addresses);
        }
        assert!(
            Instant::now() < deadline,
            "serve neither listened nor exited within 30s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    e2e::signal(pid, libc::SIGKILL);
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    match outcome {
        Ok(addresses) => {
            assert_eq!(
                addresses,
                ["127.0.0.1:6440".parse::<SocketAddr>().unwrap()],
                "serve's listening sockets by default"
            );
            assert_eq!(
                api_address(&state.join("kubeconfig")),
                "127.0.0.1:6440".parse().unwrap()
            );
        }
        Err(status) => assert!(
            log.contains("cannot listen on 127.0.0.1:6440"),
            "serve exited ({status}) without naming the loopback address it tried:\n{log}"
        ),
    }
}

/// A KcpShard that does not say where its front listens gets 127.0.0.1:6443, and the Caddy admin
/// API it would drive defaults to loopback too.
#[tokio::test]
async fn the_front_listens_on_loopback_unless_the_spec_says_otherwise() {
    let serve = common::Serve::start().await;
    let shards = common::kcpshards(&serve.client().await);
    let bare: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "bare"},
        "spec": {"version": "v0.31.2", "store": {"type": "KineSqlite"}},
    }))
    .unwrap();
    let created = shards.create(&Default::default(), &bare).await.unwrap();
    assert_eq!(created.data["spec"]["front"]["listen"], "127.0.0.1:6443");
    // Two shards cannot share the default address.
    shards.delete("bare", &Default::default()).await.unwrap();
    let caddy: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kcpshard.io/v1alpha1", "kind": "KcpShard", "metadata": {"name": "caddy"},
        "spec": {"version": "v0.31.2", "store": {"type": "KineSqlite"},
                 "front": {"type": "Caddy", "caddy": {"upstreamId": "kcp-proxy"}}},
    }))
    .unwrap();
    let created = shards.create(&Default::default(), &caddy).await.unwrap();
    assert_eq!(created.data["spec"]["front"]["listen"], "127.0.0.1:6443");
    assert_eq!(created.data["spec"]["front"]["caddy"]["adminAddress"], "127.0.0.1:2019");

    let help = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
        .args(["front", "--help"])
        .output()
        .expect("run kcpshard front --help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("[default: 127.0.0.1:6443]"),
        "kcpshard front listens on loopback by default:\n{help}"
    );
}

#[tokio::test]
async fn serve_kine_and_the_front_listen_on_loopback_only() {
    let mut env = e2e::Env::start().await;
    let front = blocked_shard(&env, "lo").await;
    let processes = e2e::processes_with(&env.state.display().to_string());
    let mut seen = Vec::new();
    for (pid, argv) in &processes {
        for address in listening_addresses(*pid) {
            assert!(
                is_loopback(&address),
                "{argv} (pid {pid}) listens on {address}, not loopback"
            );
            seen.push(format!(
                "{address} {}",
                argv.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
            ));
        }
    }
    println!("listening: {seen:#?}");
    let front: SocketAddr = front.parse().unwrap();
    assert!(
        processes
            .iter()
            .any(|(pid, _)| listening_addresses(*pid).contains(&front)),
        "nothing listens on the front address {front}: {seen:?}"
    );
    assert!(seen.len() >= 2, "expected the API and the front to listen: {seen:?}");
    // kine listens on a unix socket in the state dir, on no network address.
    assert!(
        processes
            .iter()
            .any(|(_, argv)| argv.contains(&format!("--listen-address=unix://{}", env.state.display()))),
        "no kine listens on a socket in the state dir: {processes:?}"
    );
    let left = env.shutdown(&["lo"]).await;
    assert!(left.is_empty(), "processes outlived the shard's deletion: {left:?}");
}

// ------------------------------------------------------------------------------------------------
// No secret in logs, events, objects or argv

/// A secret, and the strings whose presence anywhere would leak it.
struct Secret {
    what: String,
    needles: Vec<String>,
}

impl Secret {
    /// A token or password: the whole value, and every 16-character part of a longer one (a log
    /// line that cuts it, or a near miss that differs in one character, still leaks it).
    fn value(what: &str, value: &str) -> Secret {
        let value = value.trim();
        assert!(!value.is_empty(), "{what} is empty");
        let chars: Vec<char> = value.chars().collect();
        let width = chars.len().min(16);
        let needles = chars.windows(width).map(|w| w.iter().collect()).collect();
        Secret {
            what: what.into(),
            needles,
        }
    }

    /// A PEM private key: each line of its body.
    fn private_key(what: &str, pem: &str) -> Secret {
        let needles: Vec<String> = pem
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("-----"))
            .map(str::to_string)
            .collect();
        assert!(!needles.is_empty(), "{what} has no PEM body");
        Secret {
            what: what.into(),
            needles,
        }
    }
}

/// Every secret `serve` holds for a state dir. One line per secret.
fn secrets(state: &Path) -> Vec<Secret> {
    let read = |p: &str| std::fs::read_to_string(state.join(p)).unwrap_or_else(|e| panic!("read {p}: {e}"));
    vec![
        Secret::value("the API's bearer token", &read("token")),
        Secret::private_key("the API CA's private key", &read("pki/ca.key")),
        Secret::private_key("the API's serving key", &read("pki/serving.key")),
    ]
}

/// The admin identities' tokens of shard `name` (kcpshard's identity for kcp through the front), as
/// its record holds them now.
fn admin_identity_secrets(state: &Path, name: &str) -> Vec<Secret> {
    let path = state.join("shards").join(name).join("shared/admin-identities.json");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let tokens: Vec<Secret> = record["identities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| Secret::value(&format!("admin identity {}", i["id"]), i["token"].as_str().unwrap()))
        .collect();
    assert!(!tokens.is_empty(), "{} holds no identity", path.display());
    tokens
}

/// Fails if any haystack holds a needle of any secret, or any PEM private key at all.
fn assert_no_secret(secrets: &[Secret], haystacks: &[(String, String)]) {
    for (place, text) in haystacks {
        assert!(
            !text.contains("PRIVATE KEY"),
            "{place} holds a PEM private key:\n{}",
            context(text, "PRIVATE KEY")
        );
        for secret in secrets {
            for needle in &secret.needles {
                assert!(
                    !text.contains(needle.as_str()),
                    "{place} holds {} ({needle:?}):\n{}",
                    secret.what,
                    context(text, needle)
                );
            }
        }
    }
}

/// The line around the first `needle` in `text`.
fn context(text: &str, needle: &str) -> String {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_default()
        .chars()
        .take(400)
        .collect()
}

/// What `path` answers with the token, as text.
async fn get_text(client: &Client, path: &str) -> String {
    let request = Request::get(path).body(Vec::new()).unwrap();
    client
        .request_text(request)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

#[tokio::test]
async fn no_secret_reaches_logs_events_objects_metrics_cli_output_or_argv() {
    let mut env = e2e::Env::start().await;
    let state = env.state.clone();
    let kubeconfig = state.join("kubeconfig");
    let kcpshard = |args: &[&str], config: &Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_kcpshard"))
            .args(args)
            .arg("--kubeconfig")
            .arg(config)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("run kcpshard");
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let mut outputs: Vec<(String, String)> = Vec::new();

    // Apply (the CLI), get, describe, events; the controller runs the store and the front.
    let manifest = env.dir().join("secret-test.yaml");
    let listen = format!("127.0.0.1:{}", e2e::test_port());
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata: {{name: quiet}}\nspec:\n  version: v0.31.2\n  \
             kcp: {{binary: \"/nonexistent/kcpshard-test/kcp-{{version}}\"}}\n  store: {{type: KineSqlite}}\n  \
             front: {{type: Tcp, listen: \"{listen}\"}}\n"
        ),
    )
    .unwrap();
    let applied = kcpshard(&["apply", "-f", &manifest.display().to_string()], &kubeconfig);
    assert!(applied.contains("quiet"), "kcpshard apply: {applied}");
    outputs.push(("kcpshard apply".into(), applied));
    wait_blocked(&env, "quiet").await;
    // The shard's admin identity, then a rotation (no slot runs: the old one is retired at once),
    // so that both identities' tokens are searched for, in the rotation's events and output too.
    let mut admin_identities = admin_identity_secrets(&state, "quiet");
    let rotated = kcpshard(&["credentials", "rotate", "quiet", "--timeout", "60"], &kubeconfig);
    assert!(
        rotated.contains("admin identity rotated"),
        "kcpshard credentials rotate: {rotated}"
    );
    outputs.push(("kcpshard credentials rotate".into(), rotated));
    admin_identities.extend(admin_identity_secrets(&state, "quiet"));
    for args in [&["get"][..], &["get", "quiet"], &["describe", "quiet"], &["events"]] {
        outputs.push((format!("kcpshard {}", args.join(" ")), kcpshard(args, &kubeconfig)));
    }
    // A refused write (its message echoes what was sent) and failed authentication, with a token
    // that differs from the real one in its last character.
    let bad = env.dir().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata: {name: bad}\nspec: {version: latest, store: {type: KineSqlite}}\n",
    )
    .unwrap();
    outputs.push((
        "kcpshard apply (refused)".into(),
        kcpshard(&["apply", "-f", &bad.display().to_string()], &kubeconfig),
    ));
    let token = std::fs::read_to_string(state.join("token")).unwrap().trim().to_string();
    let mut near_miss = token.clone();
    let last = near_miss.pop().unwrap();
    near_miss.push(if last == 'a' { 'b' } else { 'a' });
    let wrong_config = env.dir().join("wrong.kubeconfig");
    std::fs::write(
        &wrong_config,
        std::fs::read_to_string(&kubeconfig)
            .unwrap()
            .replace(&token, &near_miss),
    )
    .unwrap();
    let refused = kcpshard(&["get"], &wrong_config);
    assert!(refused.contains("Unauthorized"), "a wrong token is refused: {refused}");
    outputs.push(("kcpshard get (wrong token)".into(), refused));
    let anonymous = anonymous_client(&kubeconfig).await;
    for path in [SHARDS, "/api/v1/events", "/healthz"] {
        let reply = send(&anonymous, &Method::GET, path, Some(&format!("Bearer {near_miss}"))).await;
        assert_eq!(reply.code, StatusCode::UNAUTHORIZED);
        outputs.push((
            format!("401 of GET {path}"),
            String::from_utf8_lossy(&reply.body).into_owned(),
        ));
    }

    // Where a secret could land: serve's log and every log under the state dir, every event in
    // both views, every object (with its status), /metrics, the CLI's output, and the argv of every
    // process serve started.
    let client = env.client();
    let mut haystacks = outputs;
    haystacks.push(("serve's log".into(), std::fs::read_to_string(env.serve_log()).unwrap()));
    for path in walk(&state) {
        if path.extension().is_some_and(|e| e == "log") {
            haystacks.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
        }
    }
    for path in [
        "/api/v1/events",
        "/apis/events.k8s.io/v1/events",
        SHARDS,
        "/apis/kcpshard.io/v1alpha1/kcpshards/quiet/status",
        "/metrics",
    ] {
        haystacks.push((format!("GET {path}"), get_text(&client, path).await));
    }
    for (pid, argv) in e2e::processes_with(&state.display().to_string()) {
        haystacks.push((format!("argv of pid {pid}"), argv));
    }
    let events: Value = serde_json::from_str(&get_text(&client, "/api/v1/events").await).unwrap();
    assert!(
        events["items"].as_array().is_some_and(|items| items.len() >= 2),
        "the controller's events are among what is searched: {events}"
    );
    assert!(
        haystacks
            .iter()
            .any(|(place, text)| place == "serve's log" && text.contains("serving the kcpshard API")),
        "serve's log is among what is searched"
    );

    let mut secrets = secrets(&state);
    // The search finds what it looks for: each secret is in the file that holds it.
    for (secret, file) in secrets.iter().zip(["kubeconfig", "pki/ca.key", "pki/serving.key"]) {
        let text = std::fs::read_to_string(state.join(file)).unwrap();
        assert!(
            secret.needles.iter().all(|n| text.contains(n.as_str())),
            "the search for {} does not find it in {file}",
            secret.what
        );
    }
    let identities = std::fs::read_to_string(state.join("shards/quiet/shared/admin-identities.json")).unwrap();
    assert_eq!(admin_identities.len(), 2, "the identity before and after the rotation");
    assert!(
        admin_identities[1]
            .needles
            .iter()
            .all(|n| identities.contains(n.as_str()))
            && !admin_identities[0]
                .needles
                .iter()
                .any(|n| identities.contains(n.as_str())),
        "after the rotation the record holds the new identity only"
    );
    let events = get_text(&client, "/api/v1/events").await;
    for reason in ["AdminIdentityIssued", "CredentialsRotating", "CredentialsRetired"] {
        assert!(events.contains(reason), "no {reason} event among what is searched");
    }
    secrets.extend(admin_identities);
    assert_no_secret(&secrets, &haystacks);
    println!(
        "searched {} places ({} bytes) for {} secrets: none found",
        haystacks.len(),
        haystacks.iter().map(|(_, t)| t.len()).sum::<usize>(),
        secrets.len()
    );
    let left = env.shutdown(&["quiet"]).await;
    assert!(left.is_empty(), "processes outlived the shard's deletion: {left:?}");
}

fn rand_u64() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("random bytes");
    u64::from_ne_bytes(bytes)
}
