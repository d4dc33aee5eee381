//! GitOps: `kcpshard serve --manifests DIR` keeps the KcpShards in DIR (a git checkout, typically)
//! applied to the API, so that a commit bumping `spec.version` rolls the shard with no other step.
//!
//! - [`manifests`]: which files count (`*.yaml`, `*.yml`, at any depth, none under a hidden
//!   directory such as `.git`) and the checks a file must pass; the API's own checks, run before
//!   anything is sent, so an invalid file applies nothing.
//! - [`sync`]: one pass: what each file calls for (pure), then server-side apply under the field
//!   manager [`FIELD_MANAGER`], with a log line per object and events on the objects.
//!
//! A pass runs at start, after each burst of changes in DIR (inotify through the `notify` crate,
//! waited out until DIR is quiet for 300 ms: git writes a checkout as renames and replacements,
//! many events per commit), and every `interval` in case the watch missed something (DIR replaced
//! wholesale, an inotify limit reached). Only files whose
//! bytes changed are applied, so an unchanged DIR writes nothing. Applies are server-side applies
//! (the API's own, src/apiserver/apply), so a field removed from a file is removed from the object.
//! A file that disappears leaves its objects alone by default (deleting is a decision for a
//! person, not a side effect of a rename), with a Warning event saying so; with `prune`, the
//! objects kcpshard-gitops created (annotated [`CREATED_BY`]) that no file holds are deleted.
pub mod manifests;
pub mod sync;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::Notify;

/// The field manager of every apply from the manifests dir.
pub const FIELD_MANAGER: &str = "kcpshard-gitops";

/// The annotation on the objects kcpshard-gitops created (value [`FIELD_MANAGER`]): the ones
/// `--manifests-prune` may delete.
pub const CREATED_BY: &str = "kcpshard.io/created-by";

/// How long DIR must be quiet before a burst of changes is acted on.
const DEBOUNCE: Duration = Duration::from_millis(300);
/// The longest a pass waits for DIR to go quiet.
const MAX_DEBOUNCE: Duration = Duration::from_secs(2);

/// Fails unless `dir` is a directory that can be listed: `serve --manifests` checks it before it
/// serves anything.
pub fn check_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => anyhow::bail!(
            "--manifests {}: is a file, not a directory: point it at a directory of KcpShard YAML files (a git checkout)",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "--manifests {}: no such directory: create it, or point --manifests at a git checkout of your KcpShard manifests",
            dir.display()
        ),
        Err(e) => anyhow::bail!("--manifests {}: {e}", dir.display()),
    }
    manifests::list_files(dir).map_err(|e| anyhow::anyhow!("--manifests {}: cannot list it: {e}", dir.display()))?;
    Ok(())
}

/// Applies the manifests in `dir` through `client` at start, after every burst of changes and
/// every `interval`, until `shutdown` resolves.
/// `host` is serve's --host-name: the instance its events report.
pub async fn run(
    client: kube::Client,
    host: String,
    dir: PathBuf,
    interval: Duration,
    prune: bool,
    shutdown: impl Future<Output = ()>,
) {
    let changed = Arc::new(Notify::new());
    // Kept alive for as long as the loop runs; dropping it stops the watch.
    let _watcher = watch(&dir, changed.clone(), interval);
    let mut syncer = sync::Syncer::new(client, host, dir.clone(), prune);
    tracing::info!(dir = %dir.display(), "applying the manifests in {} (field manager {FIELD_MANAGER})", dir.display());
    syncer.pass().await;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
            _ = changed.notified() => {
                // Wait out the burst: a checkout is many renames and writes, and a half-written
                // file read now would be reported invalid. A dir that never goes quiet is read
                // after MAX_DEBOUNCE all the same.
                let latest = tokio::time::Instant::now() + MAX_DEBOUNCE;
                loop {
                    let quiet = (tokio::time::Instant::now() + DEBOUNCE).min(latest);
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = changed.notified() => {}
                        _ = tokio::time::sleep_until(quiet) => break,
                    }
                }
            }
        }
        syncer.pass().await;
    }
}

/// Watches `dir` recursively and wakes `changed` on every change outside `.git`. Opening and
/// reading files is not a change (each pass reads them all). A watch that cannot start is logged;
/// the periodic pass still runs.
fn watch(dir: &Path, changed: Arc<Notify>, interval: Duration) -> Option<RecommendedWatcher> {
    let root = dir.to_path_buf();
    let handler = move |result: notify::Result<notify::Event>| match result {
        Ok(event) if matches!(event.kind, EventKind::Access(_)) => {}
        Ok(event) => {
            // Git rewrites its own files on every status and commit; only the work tree matters.
            let in_git = |path: &PathBuf| {
                let rel = path.strip_prefix(&root).unwrap_or(path);
                rel.components().any(|c| c.as_os_str() == ".git")
            };
            if event.paths.is_empty() || !event.paths.iter().all(in_git) {
                changed.notify_one();
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "watching the manifests dir failed; the periodic pass still runs");
            changed.notify_one();
        }
    };
    let started = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher.watch(dir, RecursiveMode::Recursive)?;
        Ok(watcher)
    });
    match started {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            tracing::warn!(
                dir = %dir.display(),
                "cannot watch {} ({e}); changes are picked up every {interval:?} instead",
                dir.display()
            );
            None
        }
    }
}
