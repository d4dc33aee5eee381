//! How serve ends: on SIGTERM or SIGINT, and with nothing of the controller left running before
//! the state dir's lock and the host's Lease go.

/// Waits up to `grace` for `task` to end, then aborts it and waits until it is gone: once this
/// returns nothing of it runs, so the state lock and the host's Lease may go (a task left to run
/// could act beside the next serve).
pub(super) async fn end_task(mut task: tokio::task::JoinHandle<()>, grace: std::time::Duration, what: &str) {
    if tokio::time::timeout(grace, &mut task).await.is_err() {
        tracing::warn!("{what} did not finish within {grace:?}; aborting it");
        task.abort();
        let _ = task.await;
    }
}

/// How long serve waits, after SIGTERM, for the controller's step in progress.
pub(super) const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Why the controller's task ended, for `/readyz` and the exit status.
pub(super) fn why_it_ended(ended: Result<(), tokio::task::JoinError>) -> String {
    match ended {
        Ok(()) => "the controller stopped".to_string(),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            format!("the controller panicked: {message}")
        }
        Err(e) => format!("the controller ended: {e}"),
    }
}

pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM can be handled");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down; slots, stores and fronts keep running");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// Set when the task's future is dropped: it can no longer run.
    struct Gone(Arc<AtomicBool>);

    impl Drop for Gone {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_past_its_grace_is_gone_before_end_task_returns() {
        let gone = Arc::new(AtomicBool::new(false));
        let guard = Gone(gone.clone());
        let task = tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await
        });
        let started = tokio::time::Instant::now();
        end_task(task, SHUTDOWN_GRACE, "a step that never ends").await;
        assert_eq!(started.elapsed(), SHUTDOWN_GRACE);
        assert!(
            gone.load(Ordering::SeqCst),
            "end_task returned while the task could still run"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ends_within_its_grace_is_waited_for_not_cut() {
        let finished = Arc::new(AtomicBool::new(false));
        let done = finished.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            done.store(true, Ordering::SeqCst);
        });
        let started = tokio::time::Instant::now();
        end_task(task, SHUTDOWN_GRACE, "a short step").await;
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        assert!(finished.load(Ordering::SeqCst), "the task was cut before it finished");
    }
}
