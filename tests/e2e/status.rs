//! What the tests read of a shard: its status and conditions, events, serve's metrics (the
//! steps' durations) and the last roll's timings.
use super::*;

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub async fn api_client(kubeconfig: &Path) -> anyhow::Result<Client> {
    let config =
        Config::from_custom_kubeconfig(Kubeconfig::read_from(kubeconfig)?, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

pub fn event_time(e: &Event) -> String {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()))
        .unwrap_or_default()
}

/// How many times an event happened (a series counts more than once).
pub fn event_count(e: &Event) -> i32 {
    e.count.unwrap_or(1).max(1)
}

pub fn summarize_events(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} {} x{}: {}",
                event_time(e),
                e.type_.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
                event_count(e),
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ------------------------------------------------------------------------------------------------
// Status

pub fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

pub fn condition_is(object: &Value, type_: &str, status: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == status)
}

/// status.lastRoll is a completed roll to `version` that started after `after` (RFC 3339), and the
/// shard is Ready.
pub fn completed_roll_to(object: &Value, version: &str, after: &str) -> bool {
    let roll = &object["status"]["lastRoll"];
    roll["toVersion"] == version
        && roll["completedAt"].is_string()
        && roll["startedAt"].as_str().is_some_and(|t| t > after)
        && ready_now(object)
}

/// Ready=True, observed at the object's current generation.
pub fn ready_now(object: &Value) -> bool {
    let generation = &object["metadata"]["generation"];
    condition(object, "Ready").is_some_and(|c| c["status"] == "True" && &c["observedGeneration"] == generation)
        && &object["status"]["observedGeneration"] == generation
}

pub fn active_slot(object: &Value) -> Option<String> {
    object["status"]["activeSlot"].as_str().map(str::to_string)
}

/// The pid of the active slot, from status.slots.
pub fn active_pid(object: &Value) -> Option<i32> {
    let active = active_slot(object)?;
    object["status"]["slots"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == active.as_str())?["pid"]
        .as_i64()
        .map(|p| p as i32)
}

/// The slots the front serves from, as status says.
pub fn serving(object: &Value) -> Vec<String> {
    object["status"]["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["serving"] == true)
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect()
}

/// The slot status names as the controllers' Lease holder, with its pid.
pub fn leader(object: &Value) -> Option<(String, i32)> {
    object["status"]["slots"]
        .as_array()?
        .iter()
        .find(|s| s["leader"] == true && s["pid"].is_number())
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["pid"].as_i64().unwrap() as i32,
            )
        })
}

/// The pid of slot `name`, from status.slots.
pub fn slot_pid(object: &Value, name: &str) -> Option<i32> {
    object["status"]["slots"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
        .and_then(|s| s["pid"].as_i64())
        .map(|p| p as i32)
}

/// The pids of every running slot, from status.slots.
pub fn slot_pids(object: &Value) -> Vec<i32> {
    object["status"]["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

/// Ready, nothing in progress, and `n` slots, every one serving.
pub async fn settled(env: &Env, name: &str, n: usize, timeout: Duration) -> Value {
    env.until(name, timeout, &format!("{n} slots serving, the roll done"), |o| {
        let idle = condition(o, "Progressing").is_some_and(|c| c["status"] == "False");
        (ready_now(o) && idle && serving(o).len() == n && o["status"]["slots"].as_array()?.len() == n)
            .then(|| o.clone())
    })
    .await
}

/// Events about the shard since `since` (lastTimestamp has whole seconds: one second of slack),
/// as (type, reason, message).
pub async fn events_since(env: &Env, shard: &str, since: DateTime<Utc>) -> Vec<(String, String, String)> {
    env.events(shard)
        .await
        .into_iter()
        .filter(|e| {
            event_time(e)
                .parse::<DateTime<Utc>>()
                .is_ok_and(|t| t >= since - chrono::Duration::seconds(1))
        })
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

pub fn render_events(events: &[(String, String, String)]) -> String {
    events
        .iter()
        .map(|(t, r, m)| format!("    {t} {r}: {m}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the shard's front says of itself (kcpshard's front): its serving set and, per slot, the
/// connections it gave each slot (the numbers of its `/metrics`).
pub async fn front_status(env: &Env, shard: &str) -> kcpshard::front::FrontStatus {
    let dir = env.shard_dir(shard).join("front");
    let front = kcpshard::front::FrontClient::connect(&dir)
        .await
        .unwrap_or_else(|e| env.fail(&format!("the front of {shard}: {e}")));
    front
        .status()
        .await
        .unwrap_or_else(|e| env.fail(&format!("status of the front of {shard}: {e}")))
}

/// serve's `/metrics`.
pub async fn serve_metrics(env: &Env) -> String {
    env.client()
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap_or_else(|e| env.fail(&format!("GET /metrics: {e}")))
}

/// The longest a step may take in the real-kcp tests (a bucket of [`slow_steps`]). Every step
/// starts its work and returns: a request to kcp or PostgreSQL it does not have the answer to
/// within 50 ms runs on beside the reconcile (controller/requests.rs), a process or a copy is
/// observed later. What is left is the step's own work (records written and fsynced, a process
/// spawned): under 0.1 s on a quiet 2-core machine, but an fsync on the disk kine's sqlite writes
/// to waits for the journal's commit of that data too: in CI a SetFront (a few records) took
/// over 0.25 s and a CompleteRoll (one) over 0.1 s once. A step that waited for a process or an
/// answer would take seconds.
pub const STEP_BOUND: &str = "0.5";

/// The steps the controller took for `shard` that took longer than `over` seconds to act (a bucket
/// of serve's `kcpshard_controller_step_duration_seconds`: "0.1", "0.25", "0.5", "1.0"): per step,
/// how many of how many.
pub async fn slow_steps(env: &Env, shard: &str, over: &str) -> Vec<(String, u64, u64)> {
    steps_over(&serve_metrics(env).await, shard, over).unwrap_or_else(|e| env.fail(&e))
}

/// [`slow_steps`] in the text of serve's `/metrics`.
pub fn steps_over(metrics: &str, shard: &str, over: &str) -> Result<Vec<(String, u64, u64)>, String> {
    let series = |prefix: &str, step: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(&format!("{prefix}{step}\"}} "))?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    let mut slow = Vec::new();
    let count_prefix = format!("kcpshard_controller_step_duration_seconds_count{{shard=\"{shard}\",step=\"");
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(&count_prefix) else {
            continue;
        };
        let Some((step, count)) = rest.split_once("\"} ") else {
            continue;
        };
        let count: u64 = count.trim().parse().unwrap_or(0);
        let bucket =
            format!("kcpshard_controller_step_duration_seconds_bucket{{le=\"{over}\",shard=\"{shard}\",step=\"");
        let fast = series(&bucket, step).ok_or_else(|| format!("no {over} s bucket for {step}:\n{metrics}"))?;
        if fast < count {
            slow.push((step.to_string(), count - fast, count));
        }
    }
    Ok(slow)
}

pub fn parse_time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()?.parse().ok()
}

/// The phases of status.lastRoll, in the order they must happen. The old slot's exit is not among
/// them: it drains while the Lease is handed over and the probe runs, so it may come before or after
/// those (see [`roll_timings`]).
pub const ROLL_PHASES: [&str; 8] = [
    "startedAt",
    "newSlotStartedAt",
    "newSlotReadyAt",
    "frontSwitchedAt",
    "oldSlotStoppedListeningAt",
    "leaseReleasedAt",
    "probeSucceededAt",
    "completedAt",
];

/// The timings of a completed roll, each phase relative to startedAt, and a check that each is
/// set and in order, and that the old slot exited after it stopped listening and before the roll
/// completed. Err names what is missing or out of order. Sorted by time.
pub fn roll_timings(last_roll: &Value) -> Result<Vec<(&'static str, DateTime<Utc>)>, String> {
    let at = |phase: &'static str| {
        parse_time(&last_roll[phase]).ok_or_else(|| format!("status.lastRoll.{phase} is not set: {last_roll}"))
    };
    let mut times = Vec::new();
    for phase in ROLL_PHASES {
        let t = at(phase)?;
        if let Some((before, previous)) = times.last()
            && t < *previous
        {
            return Err(format!(
                "status.lastRoll.{phase} ({t}) is before {before} ({previous}): {last_roll}"
            ));
        }
        times.push((phase, t));
    }
    let exited = at("oldSlotExitedAt")?;
    if exited < at("oldSlotStoppedListeningAt")? || exited > at("completedAt")? {
        return Err(format!(
            "status.lastRoll.oldSlotExitedAt ({exited}) is not between oldSlotStoppedListeningAt and completedAt: {last_roll}"
        ));
    }
    times.push(("oldSlotExitedAt", exited));
    times.sort_by_key(|(_, t)| *t);
    Ok(times)
}

/// status.lastRoll's `phase` when it belongs to the roll started at or after `since`: set, and
/// not before that roll's startedAt (a value left from an earlier roll would be).
pub fn roll_phase(last_roll: &Value, phase: &str, since: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let started = parse_time(&last_roll["startedAt"]).filter(|t| *t >= since - chrono::Duration::milliseconds(5))?;
    parse_time(&last_roll[phase]).filter(|t| *t >= started)
}

/// Phases of status.lastRoll stamped before its startedAt: left over from an earlier roll.
pub fn stale_phases(last_roll: &Value) -> Vec<String> {
    let Some(started) = parse_time(&last_roll["startedAt"]) else {
        return vec![];
    };
    ROLL_PHASES
        .iter()
        .chain(&["oldSlotExitedAt"])
        .filter(|p| parse_time(&last_roll[**p]).is_some_and(|t| t < started))
        .map(|p| format!("{p}={}", last_roll[*p]))
        .collect()
}

/// One line per phase: its offset from startedAt and from the phase before.
pub fn format_timings(times: &[(&'static str, DateTime<Utc>)]) -> String {
    let start = times[0].1;
    let mut out = String::new();
    let mut previous = start;
    for (phase, t) in times {
        out.push_str(&format!(
            "    {phase:<18} +{:>7.3}s  (step {:>6.3}s)\n",
            (*t - start).num_microseconds().unwrap() as f64 / 1e6,
            (*t - previous).num_microseconds().unwrap() as f64 / 1e6
        ));
        previous = *t;
    }
    out
}
