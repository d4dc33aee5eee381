//! The controller's heartbeat: each reconcile of a shard beats once it has ended (whatever its
//! outcome), so that `serve`'s watchdog pings systemd only while every shard is being reconciled.
//! A controller that is wedged (a reconcile that never returns) or dead stops the beats, the
//! pings stop, and systemd restarts `serve` (`WatchdogSec=` of its unit).
//!
//! The hook is [`Heartbeat::beat`]; the judge is [`Heartbeat::stale`]. Every shard is reconciled
//! at least every few seconds while it exists (the idle requeue), so a shard that has not beaten
//! for longer than the watchdog's timeout is not making progress.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Default)]
pub struct Heartbeat {
    /// Per shard: its last beat, or when the watchdog first saw it without one.
    last: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Heartbeat {
    /// A reconcile of `shard` has ended.
    pub fn beat(&self, shard: &str) {
        self.lock().insert(shard.to_string(), Instant::now());
    }

    /// The shards of `shards` that have not beaten within `within`, at `now` (a shard never seen
    /// before counts from now). Shards no longer listed are forgotten.
    pub fn stale(&self, shards: &[String], within: Duration, now: Instant) -> Vec<String> {
        let mut last = self.lock();
        last.retain(|name, _| shards.contains(name));
        let mut stale: Vec<String> = shards
            .iter()
            .filter(|name| now.duration_since(*last.entry((*name).clone()).or_insert(now)) > within)
            .cloned()
            .collect();
        stale.sort();
        stale
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_that_stops_beating_is_stale_after_the_window_and_one_that_beats_is_not() {
        let heartbeat = Heartbeat::default();
        let start = Instant::now();
        let shards = vec!["a".to_string(), "b".to_string()];
        let window = Duration::from_secs(10);
        assert!(
            heartbeat.stale(&shards, window, start).is_empty(),
            "new shards get a window"
        );
        // a beats 8 s later, b never does.
        heartbeat.lock().insert("a".into(), start + Duration::from_secs(8));
        assert!(
            heartbeat
                .stale(&shards, window, start + Duration::from_secs(9))
                .is_empty()
        );
        assert_eq!(heartbeat.stale(&shards, window, start + Duration::from_secs(11)), ["b"]);
        assert_eq!(
            heartbeat.stale(&shards, window, start + Duration::from_secs(19)),
            ["a", "b"]
        );
        heartbeat.beat("b");
        assert_eq!(heartbeat.stale(&shards, window, Instant::now()), Vec::<String>::new());
    }

    #[test]
    fn a_deleted_shard_is_forgotten() {
        let heartbeat = Heartbeat::default();
        heartbeat.beat("gone");
        let later = Instant::now() + Duration::from_secs(60);
        assert!(heartbeat.stale(&[], Duration::from_secs(1), later).is_empty());
        assert!(heartbeat.lock().is_empty());
    }
}
