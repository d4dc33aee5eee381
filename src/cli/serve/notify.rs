//! What serve tells systemd: READY once the API listens, a STATUS line, and the watchdog while
//! the controller reconciles.
use super::*;

/// How often serve tells systemd its status without a watchdog.
pub(super) const STATUS_EVERY: Duration = Duration::from_secs(5);

/// How long one look at the shards may take.
pub(super) const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// `READY=1` (the API listens and the controller runs), then `STATUS=` when it changes and
/// `WATCHDOG=1` while the controller makes progress: every shard reconciled within the watchdog's
/// timeout, the controller task alive, the local API answering. Nothing without a notify socket.
pub(super) async fn notify_systemd(
    client: kube::Client,
    heartbeat: Heartbeat,
    controller: Option<tokio::task::AbortHandle>,
    assignment: Arc<Assignment>,
    readiness: Readiness,
) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = sd_notify::watchdog_enabled();
    let _ = sd_notify::notify(&[NotifyState::Ready]);
    let every = watchdog.map_or(STATUS_EVERY, |timeout| (timeout / 4).min(STATUS_EVERY));
    let api: kube::Api<KcpShard> = kube::Api::all(client);
    let mut last_status = String::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A serve that waits for its host's Lease is well: it says so, and has nothing to watch.
        if let Some(waiting) = readiness.reason(host_lease::READINESS_CHECK) {
            if waiting != last_status {
                let _ = sd_notify::notify(&[NotifyState::Status(&waiting)]);
                last_status = waiting;
            }
            if watchdog.is_some() {
                let _ = sd_notify::notify(&[NotifyState::Watchdog]);
            }
            continue;
        }
        let listed = tokio::time::timeout(LIST_TIMEOUT, api.list(&Default::default())).await;
        let shards = match listed {
            Ok(Ok(list)) => list
                .items
                .into_iter()
                .filter(|s| assignment.takes(s))
                .collect::<Vec<_>>(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot list the shards for systemd's status");
                continue;
            }
            Err(_) => {
                tracing::warn!("the API did not list the shards within {LIST_TIMEOUT:?}");
                continue;
            }
        };
        let status = status_line(&shards);
        if status != last_status {
            let _ = sd_notify::notify(&[NotifyState::Status(&status)]);
            last_status = status;
        }
        let Some(timeout) = watchdog else {
            continue;
        };
        let stale = match &controller {
            // --controller=false: the API answering is all there is to watch.
            None => Vec::new(),
            Some(task) if task.is_finished() => {
                tracing::error!("the controller has stopped; no longer pinging systemd's watchdog");
                continue;
            }
            Some(_) => {
                let names: Vec<String> = shards.iter().map(|s| s.name_any()).collect();
                heartbeat.stale(&names, timeout, Instant::now())
            }
        };
        if stale.is_empty() {
            let _ = sd_notify::notify(&[NotifyState::Watchdog]);
        } else {
            tracing::error!(
                ?stale,
                ?timeout,
                "the controller has not reconciled these shards in time; no longer pinging systemd's watchdog"
            );
        }
    }
}

/// `dev: Ready, big: Progressing`, or that there is no shard.
pub(super) fn status_line(shards: &[KcpShard]) -> String {
    if shards.is_empty() {
        return "no KcpShard".to_string();
    }
    shards
        .iter()
        .map(|s| {
            let phase = s
                .status
                .as_ref()
                .and_then(|st| st.phase)
                .map_or("Pending", |p| p.as_str());
            format!("{}: {phase}", s.name_any())
        })
        .collect::<Vec<_>>()
        .join(", ")
}
