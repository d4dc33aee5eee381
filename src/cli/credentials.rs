//! `kcpshard credentials rotate NAME`: asks for a new admin identity for a shard by setting the
//! `kcpshard.io/rotateCredentialsAt` annotation to the current time (what `kubectl annotate`
//! would do, so GitOps and kubectl can ask too), then follows the rotation like `rollout status`:
//! a line each time the `CredentialsRotating` condition's message changes, success once that
//! condition is False for this request (every slot accepts only the new identity; the old one is
//! refused), failure when a roll of the rotation is blocked (Degraded), with the controller's
//! message. The controller does the work (controller/credentials.rs); `--wait=false` only asks.
use serde_json::Value;

use super::connect::Conn;
use super::follow::{FollowArgs, Progress, Wording, ask_and_follow};
use crate::api::ROTATE_CREDENTIALS_ANNOTATION;
use crate::controller::credentials::CONDITION;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Issue a new admin identity for the shard's kubeconfig through the front, and retire the old
    /// one once every slot accepts the new one (two rolls).
    Rotate(RotateArgs),
}

#[derive(Debug, clap::Args)]
struct RotateArgs {
    /// The KcpShard whose admin identity to rotate.
    name: String,
    #[command(flatten)]
    follow: FollowArgs,
    #[command(flatten)]
    conn: Conn,
}

/// Where the rotation asked for with `request` stands, read from the object.
fn progress(object: &Value, request: &str) -> Progress {
    let conditions = object["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let condition = |type_: &str| conditions.iter().find(|c| c["type"] == type_);
    let message = |c: &Value| c["message"].as_str().unwrap_or_default().to_string();
    let Some(rotating) = condition(CONDITION) else {
        return Progress::Stale;
    };
    // The condition names the request the newest identity was issued for.
    let ours = message(rotating).contains(&format!("rotation request {request})"));
    let under_way = rotating["status"] == "True";
    if !ours {
        // Not taken up yet (a Degraded now is not about it), or another rotation finishes first.
        return if under_way {
            Progress::Moving(message(rotating))
        } else {
            Progress::Stale
        };
    }
    if !under_way {
        return Progress::Done(message(rotating));
    }
    match condition("Degraded").filter(|c| c["status"] == "True") {
        Some(degraded) => Progress::Blocked(message(degraded)),
        None => Progress::Moving(message(rotating)),
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let Command::Rotate(args) = args.command;
    let cluster = args.conn.connect().await?;
    let request = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let words = Wording {
        done: "admin identity rotated",
        blocked: "admin identity rotation is blocked (it carries on once the roll can)",
        waiting: "admin identity rotation",
        timed_out: "admin identity rotation (it carries on)",
    };
    ask_and_follow(
        &cluster,
        &args.name,
        (ROTATE_CREDENTIALS_ANNOTATION, &request),
        &format!("admin identity rotation requested ({request})"),
        &args.follow,
        &words,
        |o| progress(o, &request),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shard(rotating: &str, message: &str, degraded: &str) -> Value {
        json!({ "status": { "conditions": [
            { "type": CONDITION, "status": rotating, "message": message },
            { "type": "Degraded", "status": degraded, "message": "the roll is blocked" },
        ] } })
    }

    #[test]
    fn a_rotation_is_done_when_the_condition_is_false_for_this_request() {
        let r = "2026-12-01T10:00:00.000000Z";
        let issued =
            |for_: &str| format!("the slots accept admin identity 1a2b (rotation request {for_}), which ... holds");
        assert_eq!(progress(&json!({ "status": {} }), r), Progress::Stale);
        assert_eq!(progress(&shard("False", &issued("older"), "False"), r), Progress::Stale);
        assert!(matches!(
            progress(&shard("True", &format!("rotating to admin identity 1a2b (rotation request {r}): roll 1 of 2"), "False"), r),
            Progress::Moving(m) if m.contains("roll 1 of 2")
        ));
        assert_eq!(
            progress(&shard("False", &issued(r), "False"), r),
            Progress::Done(issued(r))
        );
        assert_eq!(
            progress(&shard("True", &issued(r), "True"), r),
            Progress::Blocked("the roll is blocked".into())
        );
        // A shard that was Degraded before the request: the request is not blocked by it.
        assert_eq!(progress(&shard("False", &issued("older"), "True"), r), Progress::Stale);
        // Done is done, whatever else is wrong with the shard (no slot runs at all).
        assert_eq!(
            progress(&shard("False", &issued(r), "True"), r),
            Progress::Done(issued(r))
        );
    }
}
