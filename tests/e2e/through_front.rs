//! Clients of kcp THROUGH THE FRONT, as a user's: kube configs from the front's kubeconfig,
//! kubectl, raw requests, workspaces created and waited for, the admin tokens that must not leak.
use super::*;

/// A kube config for `context` of `kubeconfig`, dialing `server` instead of the kubeconfig's.
pub async fn config_for(kubeconfig: &Path, context: &str, server: &str) -> Config {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap_or_else(|e| panic!("read {}: {e}", kubeconfig.display()));
    let options = KubeConfigOptions {
        context: Some(context.to_string()),
        ..Default::default()
    };
    let mut config = Config::from_custom_kubeconfig(kc, &options)
        .await
        .unwrap_or_else(|e| panic!("{} context {context}: {e}", kubeconfig.display()));
    config.cluster_url = server.parse().unwrap();
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(10));
    config
}

/// The shard admin (persistent token, valid on every slot) dialing the front.
pub async fn front_shard_admin(env: &Env, shard: &str, front: &str) -> Config {
    config_for(
        &env.shard_dir(shard).join("shared/admin.kubeconfig"),
        "shard-base",
        &format!("https://{front}"),
    )
    .await
}

/// The kubeconfig users are given for kcp through the front: kcpshard's admin identity (kcp-admin
/// on every slot) in contexts root and base.
pub fn front_kubeconfig(env: &Env, shard: &str) -> PathBuf {
    env.shard_dir(shard).join("admin.kubeconfig")
}

/// kcpshard's admin identity (the `base` context of the shard's kubeconfig through the front),
/// from `kubeconfig` (the shard's, or a copy of it), dialing the front.
pub async fn front_admin_of(kubeconfig: &Path, front: &str) -> Config {
    config_for(kubeconfig, "base", &format!("https://{front}")).await
}

/// kcpshard's admin identity from the shard's kubeconfig through the front, dialing the front.
pub async fn front_admin(env: &Env, shard: &str, front: &str) -> Config {
    front_admin_of(&front_kubeconfig(env, shard), front).await
}

/// A copy of the shard's kubeconfig through the front, as a user would take one, under the test's
/// temp dir.
pub fn copy_front_kubeconfig(env: &Env, shard: &str, label: &str) -> PathBuf {
    let copy = env.dir().join(format!("{shard}-{label}.kubeconfig"));
    std::fs::copy(front_kubeconfig(env, shard), &copy)
        .unwrap_or_else(|e| env.fail(&format!("copy the front kubeconfig of {shard}: {e}")));
    copy
}

/// `kubectl --kubeconfig KUBECONFIG ARGS...` (bin/kubectl), with `stdin`: its exit status and
/// output.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(require("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// With `kubeconfig`, as a user would: `kubectl --context root get workspaces` works, and a
/// workspace created with `kubectl --context root create` reaches Ready. Err says which failed.
pub async fn kubectl_works(kubeconfig: &Path, name: &str, timeout: Duration) -> Result<Duration, String> {
    let (ok, out) = kubectl(kubeconfig, &["--context", "root", "get", "workspaces"], "");
    if !ok {
        return Err(format!("kubectl --context root get workspaces: {out}"));
    }
    let manifest = format!("apiVersion: tenancy.kcp.io/v1alpha1\nkind: Workspace\nmetadata:\n  name: {name}\n");
    let started = Instant::now();
    let (ok, out) = kubectl(kubeconfig, &["--context", "root", "create", "-f", "-"], &manifest);
    if !ok {
        return Err(format!("kubectl --context root create workspace {name}: {out}"));
    }
    let mut phase = String::new();
    while started.elapsed() < timeout {
        let (ok, out) = kubectl(
            kubeconfig,
            &[
                "--context",
                "root",
                "get",
                "workspace",
                name,
                "-o",
                "jsonpath={.status.phase}",
            ],
            "",
        );
        if ok && out.trim() == "Ready" {
            return Ok(started.elapsed());
        }
        phase = out.trim().to_string();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "workspace {name} (created with kubectl) not Ready within {timeout:?}: {phase:?}"
    ))
}

/// One request on a NEW connection (a fresh client): status and body, or the transport error.
pub async fn once(
    config: &Config,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let client = Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    request(&client, method, path, body).await
}

pub async fn request(
    client: &Client,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    exchange(client, method, path, body).await.map(|a| (a.status, a.body))
}

/// An answer: its status, its `Retry-After` in seconds if it had one, its body.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub body: String,
}

/// One request on `client`: the whole answer, or the transport error.
pub async fn exchange(
    client: &Client,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Answer, String> {
    use http_body_util::BodyExt;
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("accept", "application/json")
        .header("content-type", "application/json")
        .body(kube::client::Body::from(bytes))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.send(request))
        .await
        .map_err(|_| "timed out".to_string())?
        // With its causes: "client error (SendRequest)" alone does not say the connection closed.
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Answer {
        status,
        retry_after,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `/readyz` through the front on a new connection answers 200 `ok`.
pub async fn readyz_ok(config: &Config) -> Result<(), String> {
    // kube retries 429, 503 and 504 answers up to 15 times by default: a poll that met a slot
    // shutting down ("apiserver is shutting down", 503) would pass unseen.
    let mut config = config.clone();
    config.default_retry = false;
    match once(&config, http::Method::GET, "/readyz", None).await {
        Ok((200, body)) if body.trim() == "ok" => Ok(()),
        Ok((status, body)) => Err(format!("{status}: {}", body.trim())),
        Err(e) => Err(e),
    }
}

pub const WORKSPACES: &str = "/clusters/root/apis/tenancy.kcp.io/v1alpha1/workspaces";

/// The tokens of the shard's admin identities (`shared/admin-identities.json`), to search for.
pub fn admin_tokens(env: &Env, shard: &str) -> Vec<String> {
    let path = env.shard_dir(shard).join("shared/admin-identities.json");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_default())
        .unwrap_or_else(|e| env.fail(&format!("{}: {e}", path.display())));
    record["identities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["token"].as_str().map(str::to_string))
        .collect()
}

/// No admin token (nor a 16-character part of one) in the shard's status and events, serve's log,
/// any log under the state dir, or the argv of any process that names the state dir. Returns how
/// many places were searched.
pub async fn assert_no_token_leaked(env: &Env, shard: &str, tokens: &[String]) -> usize {
    let mut places: Vec<(String, String)> = vec![
        (
            "the KcpShard".into(),
            env.get(shard).await.map(|o| o.to_string()).unwrap_or_default(),
        ),
        ("its events".into(), summarize_events(&env.events(shard).await)),
        (
            "serve's log".into(),
            std::fs::read_to_string(env.serve_log()).unwrap_or_default(),
        ),
    ];
    let mut dirs = vec![env.state.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                places.push((
                    path.display().to_string(),
                    std::fs::read_to_string(&path).unwrap_or_default(),
                ));
            }
        }
    }
    for (pid, argv) in processes_with(&env.state.display().to_string()) {
        places.push((format!("argv of pid {pid}"), argv));
    }
    for token in tokens {
        let chars: Vec<char> = token.chars().collect();
        for part in chars.windows(16.min(chars.len())).map(|w| w.iter().collect::<String>()) {
            for (place, text) in &places {
                assert!(
                    !text.contains(&part),
                    "{place} holds a part of an admin token ({part:?})"
                );
            }
        }
    }
    places.len()
}

/// `GET path` on a new connection answers 200 (kube's retries off, as in [`readyz_ok`]).
pub async fn get_ok(config: &Config, path: &str) -> Result<(), String> {
    answered_ok(get_answer(config, path).await)
}

/// `GET path` on a new connection (kube's retries off, as in [`readyz_ok`]): the whole answer.
pub async fn get_answer(config: &Config, path: &str) -> Result<Answer, String> {
    let mut config = config.clone();
    config.default_retry = false;
    let client = Client::try_from(config).map_err(|e| e.to_string())?;
    exchange(&client, http::Method::GET, path, None).await
}

fn answered_ok(answer: Result<Answer, String>) -> Result<(), String> {
    match answer {
        Ok(a) if a.status == 200 => Ok(()),
        Ok(a) => Err(format!("{}: {}", a.status, a.body.trim())),
        Err(e) => Err(e),
    }
}

/// How often client-go asks again after an answer that says when to (rest/with_retry.go:309,
/// `checkWait`: a 429 or any status from 500 up with `Retry-After`; rest/request.go:167,
/// `maxRetries: 10`).
pub(super) const CLIENT_GO_RETRIES: u64 = 10;

/// `GET path` on a new connection as client-go asks it: a 429 or 500-and-up answer with `Retry-After`
/// is asked again after that many seconds, up to [`CLIENT_GO_RETRIES`] times; each such retry
/// is counted in `retried_after`, only the last outcome is the poll's.
pub(super) async fn get_like_client_go(config: &Config, path: &str, retried_after: &mut u64) -> Result<(), String> {
    let mut answer = get_answer(config, path).await;
    for _ in 0..CLIENT_GO_RETRIES {
        let wait = match &answer {
            Ok(a) if a.status == 429 || a.status >= 500 => a.retry_after,
            _ => None,
        };
        let Some(seconds) = wait else { break };
        *retried_after += 1;
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        answer = get_answer(config, path).await;
    }
    answered_ok(answer)
}

/// Creates workspace `name` in root (as whoever `config` is) and waits for phase Ready; returns
/// the time from the create to Ready, or Err with the last phase seen.
pub async fn create_workspace_ready(config: &Config, name: &str, timeout: Duration) -> Result<Duration, String> {
    create_workspace_ready_in(config, "root", name, timeout).await
}

/// [`create_workspace_ready`] in the workspace `parent` (e.g. `root:team`): a nested workspace.
pub async fn create_workspace_ready_in(
    config: &Config,
    parent: &str,
    name: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let workspaces = format!("/clusters/{parent}/apis/tenancy.kcp.io/v1alpha1/workspaces");
    let body = json!({ "apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": { "name": name } });
    let started = Instant::now();
    loop {
        match once(config, http::Method::POST, &workspaces, Some(&body)).await {
            Ok((201 | 200, _)) => break,
            // A parent that just got Ready may not be resolved by its path yet (kcp indexes
            // workspaces by path from its informers): "404 page not found" for a moment.
            Ok((404, _)) if started.elapsed() < timeout => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok((status, body)) => return Err(format!("create workspace {name}: {status} {body}")),
            Err(e) => return Err(format!("create workspace {name}: {e}")),
        }
    }
    let client = Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    let mut phase = String::new();
    while started.elapsed() < timeout {
        if let Ok((200, body)) = request(&client, http::Method::GET, &format!("{workspaces}/{name}"), None).await {
            let ws: Value = serde_json::from_str(&body).unwrap_or_default();
            phase = ws["status"]["phase"].as_str().unwrap_or_default().to_string();
            if phase == "Ready" {
                return Ok(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "workspace {name} not Ready within {timeout:?} (phase {phase:?})"
    ))
}

/// SIGSTOPs the one process of the shard's state dir whose argv contains `marker` (its kine:
/// `--endpoint=sqlite://`; its front: ` front `) and waits until another process with that marker
/// runs, the stopped one is gone and `/readyz` through the front answers `ok` again, failing after
/// `within`. Returns how long that took. A stopped process still there at the end is killed, so
/// that nothing is left behind.
pub async fn stop_and_await_replacement(
    env: &Env,
    readyz: &Config,
    what: &str,
    marker: &str,
    within: Duration,
) -> Duration {
    let needle = env.state.display().to_string();
    let pid = processes_with(&needle)
        .into_iter()
        .find(|(_, argv)| argv.contains(marker))
        .unwrap_or_else(|| env.fail(&format!("no {what} runs")))
        .0;
    signal(pid, libc::SIGSTOP);
    let stopped = Instant::now();
    let deadline = stopped + within;
    let outcome = loop {
        let replaced = !alive(pid)
            && processes_with(&needle)
                .iter()
                .any(|(p, argv)| argv.contains(marker) && *p != pid);
        if replaced && readyz_ok(readyz).await.is_ok() {
            break Ok(stopped.elapsed());
        }
        if Instant::now() >= deadline {
            break Err(format!(
                "the shard does not serve {within:?} after its {what} (pid {pid}) was SIGSTOPped: {}",
                if alive(pid) {
                    "the stopped one still runs"
                } else {
                    "it is gone"
                }
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if alive(pid) {
        signal(pid, libc::SIGKILL);
        signal(pid, libc::SIGCONT);
    }
    outcome.unwrap_or_else(|e| env.fail(&e))
}
