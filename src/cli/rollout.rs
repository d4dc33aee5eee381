//! `kcpshard rollout status NAME`: follows a roll to its end, like `kubectl rollout status`. It prints
//! a line each time the controller's progress message changes, succeeds once the shard is Ready
//! and no longer Progressing at its current generation, with the active slot started for the
//! current restart request, and fails when the roll is blocked (Degraded), with the controller's
//! message saying what to fix.
use serde_json::Value;

use super::connect::Conn;
use super::follow::{Progress, Wording, follow};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Wait for the KcpShard's roll to finish, printing its progress.
    Status(StatusArgs),
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// The KcpShard to follow.
    name: String,
    /// Give up after this many seconds (0: wait as long as it takes).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
    #[command(flatten)]
    conn: Conn,
}

/// Where a roll stands, read from the object.
fn progress(object: &Value) -> Progress {
    let generation = object["metadata"]["generation"].as_i64();
    let conditions = object["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let condition = |type_: &str| {
        conditions
            .iter()
            .find(|c| c["type"] == type_ && c["observedGeneration"].as_i64() == generation)
    };
    let (Some(ready), Some(progressing)) = (condition("Ready"), condition("Progressing")) else {
        return Progress::Stale;
    };
    let message = |c: &Value| c["message"].as_str().unwrap_or_default().to_string();
    if let Some(degraded) = condition("Degraded").filter(|c| c["status"] == "True") {
        return Progress::Blocked(message(degraded));
    }
    if progressing["status"] == "True" {
        return Progress::Moving(message(progressing));
    }
    // A restart request changes an annotation, not the generation: until the active slot was
    // started for it, the roll it asks for is still to come.
    if let Some(pending) = restart_not_taken_up(object) {
        return Progress::Moving(pending);
    }
    if ready["status"] == "True" {
        return Progress::Done(message(ready));
    }
    Progress::Moving(message(progressing))
}

/// What is pending when the active slot was not started for the restartedAt annotation as it is
/// (the controller replaces the slot whenever they differ, a removed annotation included).
fn restart_not_taken_up(object: &Value) -> Option<String> {
    let requested = object["metadata"]["annotations"][crate::api::RESTARTED_AT_ANNOTATION].as_str();
    // `status.activeSlot` names every slot the front forwards to, comma-separated (spec.slots).
    let serving: Vec<&str> = object["status"]["activeSlot"]
        .as_str()
        .map(|active| active.split(',').collect())
        .unwrap_or_default();
    let restarted_at = |name: &str| {
        object["status"]["slots"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|slot| slot["name"] == name)
            .and_then(|slot| slot["restartedAt"].as_str())
    };
    let stale = serving.iter().find(|name| restarted_at(name) != requested)?;
    Some(match requested {
        Some(at) => format!("a restart was requested ({at}); serving slot {stale} was started before it"),
        None => format!("the restart annotation was removed; serving slot {stale} was started for it"),
    })
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let Command::Status(args) = args.command;
    let cluster = args.conn.connect().await?;
    let words = Wording {
        done: "successfully rolled out",
        blocked: "roll is blocked",
        waiting: "roll to finish",
        timed_out: "to roll out",
    };
    follow(&cluster, &args.name, args.timeout, &words, progress).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shard(generation: i64, observed: i64, ready: &str, progressing: &str, degraded: &str) -> Value {
        let condition = |t: &str, s: &str| json!({"type": t, "status": s, "observedGeneration": observed, "message": format!("{t} message")});
        json!({"metadata": {"generation": generation}, "status": {"conditions": [
            condition("Ready", ready), condition("Progressing", progressing), condition("Degraded", degraded)]}})
    }

    #[test]
    fn a_roll_is_done_when_ready_and_no_longer_progressing_at_the_current_generation() {
        assert_eq!(
            progress(&shard(2, 2, "True", "False", "False")),
            Progress::Done("Ready message".into())
        );
        assert_eq!(
            progress(&shard(2, 1, "True", "False", "False")),
            Progress::Stale,
            "status of an older generation"
        );
        assert_eq!(
            progress(&shard(2, 2, "True", "True", "False")),
            Progress::Moving("Progressing message".into())
        );
        assert_eq!(
            progress(&shard(2, 2, "True", "False", "True")),
            Progress::Blocked("Degraded message".into())
        );
    }

    #[test]
    fn a_restart_request_is_done_only_once_the_active_slot_was_started_for_it() {
        let mut object = shard(2, 2, "True", "False", "False");
        object["status"]["activeSlot"] = json!("a");
        object["status"]["slots"] = json!([{"name": "a", "restartedAt": "1"}, {"name": "b", "restartedAt": "2"}]);
        object["metadata"]["annotations"] = json!({ "kcpshard.io/restartedAt": "2" });
        assert!(
            matches!(progress(&object), Progress::Moving(m) if m.contains("a restart was requested (2)")),
            "the annotation just changed; the status is of the generation, which did not"
        );
        object["status"]["activeSlot"] = json!("b");
        assert_eq!(progress(&object), Progress::Done("Ready message".into()));
        object["metadata"]["annotations"] = json!({});
        assert!(matches!(progress(&object), Progress::Moving(m) if m.contains("removed")));
        object["status"]["slots"] = json!([{"name": "b"}]);
        assert_eq!(
            progress(&object),
            Progress::Done("Ready message".into()),
            "never requested"
        );
        // Two slots serve: done once both were started for the request.
        object["metadata"]["annotations"] = json!({ "kcpshard.io/restartedAt": "3" });
        object["status"]["activeSlot"] = json!("c,d");
        object["status"]["slots"] = json!([{"name": "c", "restartedAt": "3"}, {"name": "d", "restartedAt": "2"}]);
        assert!(matches!(progress(&object), Progress::Moving(m) if m.contains("serving slot d")));
        object["status"]["slots"][1]["restartedAt"] = json!("3");
        assert_eq!(progress(&object), Progress::Done("Ready message".into()));
        let mut blocked = shard(2, 2, "True", "False", "True");
        blocked["status"]["activeSlot"] = json!("b");
        blocked["status"]["slots"] = json!([{"name": "b"}]);
        blocked["metadata"]["annotations"] = json!({ "kcpshard.io/restartedAt": "3" });
        assert_eq!(
            progress(&blocked),
            Progress::Blocked("Degraded message".into()),
            "a blocked restart says why, not that it waits"
        );
    }
}
