//! `kcpshard snapshot list NAME`, `kcpshard snapshot create NAME` and `kcpshard snapshot restore
//! NAME SNAPSHOT`.
//!
//! `list` reads the shard's snapshots directory under the state dir (it runs on serve's host):
//! each snapshot kcpshard took before a version change (a pg_dump, a sqlite copy), with the version that served the data
//! in it.
//!
//! `create` asks the controller for a snapshot of the store now, while it serves: it sets the
//! `kcpshard.io/snapshotRequestedAt` annotation to the time (what `kubectl annotate` would do) and
//! follows status.lastSnapshot until it names that request.
//!
//! `restore` asks the controller for a restore, a planned outage: it refuses what the controller
//! would refuse (a snapshot of another kind of store, a spec.version other than the snapshot's; the
//! same words, `controller/restore.rs`), sets the `kcpshard.io/restoreSnapshot` annotation (what
//! `kubectl annotate` would do), then follows status.lastRestore like `rollout status` follows a
//! roll: a line per progress message, success once a slot serves the restored data, failure when
//! the request is refused or the shard is Degraded while it starts again.
use std::path::PathBuf;

use anyhow::{Context, bail};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use super::connect::{Cluster, Conn};
use super::follow::{FollowArgs, Progress, Wording, ask_and_follow};
use crate::api::{KcpShard, RESTORE_SNAPSHOT_ANNOTATION, SNAPSHOT_REQUEST_ANNOTATION};
use crate::controller::restore::{refusal, snapshots};
use crate::store::snapshot::{SnapshotName, keys_of};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// List a shard's store snapshots (taken before each version change, on request and on
    /// schedule; KinePostgres and KineSqlite).
    List(ListArgs),
    /// Take a snapshot of a shard's store now, while it serves (a pg_dump, or a copy of the sqlite
    /// database). Follows it until it is kept.
    Create(CreateArgs),
    /// Restore a store snapshot: every slot stops (the shard is down), the snapshot is restored,
    /// and slots of the kcp version that served the data in it start. Follows it to its end.
    Restore(RestoreArgs),
}

#[derive(Debug, clap::Args)]
struct ListArgs {
    /// The KcpShard whose snapshots to list.
    name: String,
    /// serve's state dir [default: $KCPSHARD_STATE_DIR, else ./.kcpshard]
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct CreateArgs {
    /// The KcpShard whose store to snapshot.
    name: String,
    #[command(flatten)]
    follow: FollowArgs,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Debug, clap::Args)]
struct RestoreArgs {
    /// The KcpShard to restore.
    name: String,
    /// A snapshot's file name (as `kcpshard snapshot list` shows it), or its path.
    snapshot: String,
    #[command(flatten)]
    follow: FollowArgs,
    #[command(flatten)]
    conn: Conn,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::List(args) => list(args),
        Command::Create(args) => create(args).await,
        Command::Restore(args) => restore(args).await,
    }
}

fn list(args: ListArgs) -> anyhow::Result<()> {
    let state_dir = args
        .state_dir
        .or_else(|| std::env::var_os("KCPSHARD_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".kcpshard"));
    let found = snapshots(&state_dir, &args.name)?;
    if found.is_empty() {
        println!(
            "No snapshots of shard {} in {} (they are taken before a version change, on request with `kcpshard snapshot create`, and every spec.backup.interval).",
            args.name,
            state_dir.display()
        );
        return Ok(());
    }
    let header = [
        "SNAPSHOT",
        "DATA VERSION",
        "TAKEN BEFORE ROLL TO",
        "TAKEN",
        "BYTES",
        "KEYS",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = std::iter::once(header.to_vec())
        .chain(found.iter().map(|path| {
            let file = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let name = SnapshotName::parse(&file);
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            vec![
                file,
                name.as_ref().map_or("?".into(), |n| n.from.clone()),
                name.as_ref()
                    .map_or("?".into(), |n| n.to.clone().unwrap_or_else(|| "-".into())),
                name.map_or("?".into(), |n| n.taken),
                size.to_string(),
                // The key material kept beside it (none when no slot had been ready yet).
                match keys_of(path).is_dir() {
                    true => "kept".into(),
                    false => "none".into(),
                },
            ]
        }))
        .collect();
    print!("{}", super::table::Columns::default().render(&rows));
    Ok(())
}

/// KcpShard `name` as read from the API, typed.
async fn typed_shard(cluster: &Cluster, name: &str) -> anyhow::Result<KcpShard> {
    let object = cluster.kcpshards().get(name).await.map_err(|e| cluster.explain(e))?;
    serde_json::from_value(serde_json::to_value(&object)?).with_context(|| format!("KcpShard {name} does not parse"))
}

async fn create(args: CreateArgs) -> anyhow::Result<()> {
    let cluster = args.conn.connect().await?;
    // A shard that is not there (or does not parse) is said before anything is asked.
    typed_shard(&cluster, &args.name).await?;
    let request = Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true);
    let words = Wording {
        done: "snapshot taken",
        blocked: "snapshot failed",
        waiting: "snapshot",
        timed_out: "snapshot (it carries on)",
    };
    ask_and_follow(
        &cluster,
        &args.name,
        (SNAPSHOT_REQUEST_ANNOTATION, &request),
        &format!("snapshot requested at {request}: the store is copied while it serves"),
        &args.follow,
        &words,
        |o| create_progress(o, &request),
    )
    .await
}

/// Where the snapshot asked for with `request` stands, read from the object.
fn create_progress(object: &Value, request: &str) -> Progress {
    let last = &object["status"]["lastSnapshot"];
    if last["request"] == request {
        return Progress::Done(format!(
            "{} ({} bytes)",
            last["path"].as_str().unwrap_or_default(),
            last["bytes"]
        ));
    }
    let conditions = object["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let failed = conditions.iter().find(|c| {
        c["type"] == "Degraded"
            && c["status"] == "True"
            && c["reason"] == "StepFailed"
            && c["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("the snapshot failed"))
    });
    match failed {
        Some(c) => Progress::Blocked(c["message"].as_str().unwrap_or_default().to_string()),
        None => Progress::Stale,
    }
}

async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let cluster = args.conn.connect().await?;
    let shard = typed_shard(&cluster, &args.name).await?;
    // A path is the controller's to read: made absolute here, where it was meant.
    let request = if args.snapshot.contains('/') {
        std::path::absolute(&args.snapshot)?.display().to_string()
    } else {
        args.snapshot.clone()
    };
    let file_name = std::path::Path::new(&request)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(refused) = refusal(&args.name, shard.spec.store.type_, &shard.spec.version, &file_name) {
        bail!("cannot restore {request}: {refused}");
    }
    if let Some(under_way) = shard
        .status
        .as_ref()
        .and_then(|s| s.last_restore.as_ref())
        .filter(|r| r.phase == "Stopping" || r.phase == "Starting")
    {
        bail!(
            "a restore of {} is under way ({}): follow it with `kcpshard rollout status {}`, and ask again once it is complete",
            under_way.snapshot.as_deref().unwrap_or(&under_way.request),
            under_way.phase,
            args.name
        );
    }
    let asked = Utc::now();
    let words = Wording {
        done: "restored",
        blocked: "restore is blocked",
        waiting: "restore",
        timed_out: "restore (it carries on)",
    };
    ask_and_follow(
        &cluster,
        &args.name,
        (RESTORE_SNAPSHOT_ANNOTATION, &request),
        &format!(
            "restore of {request} requested: the shard goes down until kcp {} serves the restored data; what was written after the snapshot was taken is gone",
            shard.spec.version
        ),
        &args.follow,
        &words,
        |o| progress(o, &request, asked),
    )
    .await
}

/// Where the restore asked for with `request` at `asked` stands, read from the object.
fn progress(object: &Value, request: &str, asked: DateTime<Utc>) -> Progress {
    let restore = &object["status"]["lastRestore"];
    let requested_at = restore["requestedAt"]
        .as_str()
        .and_then(|t| t.parse::<DateTime<Utc>>().ok());
    if restore["request"] != request || requested_at.is_none_or(|t| t < asked) {
        return Progress::Stale;
    }
    let conditions = object["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let condition = |type_: &str| conditions.iter().find(|c| c["type"] == type_);
    let message = |c: Option<&Value>| c.and_then(|c| c["message"].as_str()).unwrap_or_default().to_string();
    match restore["phase"].as_str().unwrap_or_default() {
        "Refused" => Progress::Blocked(restore["message"].as_str().unwrap_or_default().to_string()),
        "Complete" => Progress::Done(message(condition("Ready"))),
        "Starting" if condition("Degraded").is_some_and(|c| c["status"] == "True") => {
            Progress::Blocked(message(condition("Degraded")))
        }
        _ => Progress::Moving(message(condition("Progressing"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shard(phase: &str, requested_at: &str, degraded: &str) -> Value {
        json!({ "status": {
            "lastRestore": { "request": "s.dump", "phase": phase, "requestedAt": requested_at, "message": "refused: why" },
            "conditions": [
                { "type": "Ready", "status": "True", "message": "slot a (v0.30.0) serves through the front" },
                { "type": "Progressing", "status": "True", "message": "restoring s.dump: stopping slot a" },
                { "type": "Degraded", "status": degraded, "message": "no kcp binary" },
            ],
        } })
    }

    #[test]
    fn a_snapshot_asked_for_is_followed_until_status_names_its_request_or_it_fails() {
        let object = |request: &str, degraded: &str| {
            json!({ "status": {
                "lastSnapshot": { "request": request, "path": "/s/kcp-v0.31.2-t.dump", "bytes": 42 },
                "conditions": [{ "type": "Degraded", "status": "True", "reason": "StepFailed", "message": degraded }],
            } })
        };
        let asked = "2026-12-05T10:00:00.000000Z";
        assert_eq!(
            create_progress(&object(asked, "nothing"), asked),
            Progress::Done("/s/kcp-v0.31.2-t.dump (42 bytes)".into())
        );
        assert_eq!(
            create_progress(&object("earlier", "the roll failed: why"), asked),
            Progress::Stale,
            "another failure is not this snapshot's"
        );
        assert_eq!(
            create_progress(
                &object("earlier", "the snapshot failed: pg_dump: refused; it is tried again"),
                asked
            ),
            Progress::Blocked("the snapshot failed: pg_dump: refused; it is tried again".into())
        );
    }

    #[test]
    fn a_restore_is_followed_from_its_request_to_a_slot_serving_the_restored_data() {
        let asked: DateTime<Utc> = "2026-12-01T10:00:00Z".parse().unwrap();
        let after = "2026-12-01T10:00:01.000000Z";
        assert_eq!(
            progress(
                &shard("Complete", "2026-12-01T09:00:00.000000Z", "False"),
                "s.dump",
                asked
            ),
            Progress::Stale,
            "an earlier restore of the same snapshot"
        );
        assert_eq!(
            progress(&shard("Complete", after, "False"), "t.dump", asked),
            Progress::Stale
        );
        assert_eq!(
            progress(&shard("Stopping", after, "False"), "s.dump", asked),
            Progress::Moving("restoring s.dump: stopping slot a".into())
        );
        assert_eq!(
            progress(&shard("Starting", after, "True"), "s.dump", asked),
            Progress::Blocked("no kcp binary".into())
        );
        assert_eq!(
            progress(&shard("Refused", after, "False"), "s.dump", asked),
            Progress::Blocked("refused: why".into())
        );
        assert_eq!(
            progress(&shard("Complete", after, "False"), "s.dump", asked),
            Progress::Done("slot a (v0.30.0) serves through the front".into())
        );
    }
}
