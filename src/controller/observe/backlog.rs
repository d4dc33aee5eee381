//! The leading slot's backlog while the roll's probe waits, read at most every [`READ_EVERY`].
//!
//! kcp's `/metrics` grows with the shard (megabytes at a few hundred workspaces) and the
//! controller looks every 100 ms while the probe waits, so reading it on every look would put ten
//! such reads a second on the very slot that is catching up. A reading is kept and reused until it
//! is [`READ_EVERY`] old; a read that failed is kept as well, so a slot too busy to answer is not
//! asked again on the next look.
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::super::clients::Identity;
use super::super::health::LOOK_TIMEOUT;
use super::super::plan::{Backlog, LeaseHolder};
use super::{Context, World};
use crate::slot::backlog;

/// How long a reading of a slot's backlog is reused.
pub const READ_EVERY: Duration = Duration::from_secs(3);

/// A slot process: its kubeconfig and port.
type SlotKey = (PathBuf, u16);

/// A reading and when it was taken.
type Reading = (Instant, Option<Backlog>);

/// The last reading of each slot's backlog.
#[derive(Default)]
pub struct BacklogReadings {
    last: Mutex<HashMap<SlotKey, Reading>>,
}

impl BacklogReadings {
    /// The last reading of this slot's backlog if it is younger than [`READ_EVERY`], else a new one.
    async fn get_or_read<F>(&self, kubeconfig: &Path, port: u16, read: F) -> Option<Backlog>
    where
        F: Future<Output = Option<Backlog>>,
    {
        let key = (kubeconfig.to_path_buf(), port);
        if let Some((at, reading)) = self.lock().get(&key)
            && at.elapsed() < READ_EVERY
        {
            return reading.clone();
        }
        let reading = read.await;
        let mut last = self.lock();
        // Readings of other slots of this kubeconfig are of processes that have gone.
        last.retain(|k, _| k.0 != key.0);
        last.insert(key, (Instant::now(), reading.clone()));
        reading
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SlotKey, Reading>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The backlog of the leading slot's controllers, read on its own port.
pub async fn leader_backlog(ctx: &Context, world: &World) -> Option<Backlog> {
    let LeaseHolder::Slot(leader) = &world.observed.lease else {
        return None;
    };
    let slot = world.slot(leader)?;
    let kubeconfig = slot.dirs.admin_kubeconfig();
    let port = slot.record.port;
    let read = async {
        let client = ctx
            .slot_clients
            .get(&kubeconfig, port, Identity::ShardAdmin)
            .await
            .ok()?;
        tokio::time::timeout(LOOK_TIMEOUT, backlog::read(&client))
            .await
            .ok()?
            .ok()
    };
    ctx.backlog_readings.get_or_read(&kubeconfig, port, read).await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slots_backlog_is_read_again_only_once_the_last_reading_is_read_every_old() {
        let readings = BacklogReadings::default();
        let reads = AtomicU32::new(0);
        let kubeconfig = Path::new("/state/shards/root/slots/a/admin.kubeconfig");
        let read = |queued| {
            let reads = &reads;
            async move {
                reads.fetch_add(1, Ordering::SeqCst);
                Some(Backlog {
                    queued,
                    deepest: vec![],
                })
            }
        };

        let first = readings.get_or_read(kubeconfig, 6443, read(1170)).await;
        tokio::time::advance(READ_EVERY - Duration::from_millis(100)).await;
        let reused = readings.get_or_read(kubeconfig, 6443, read(802)).await;
        assert_eq!(
            (
                first.unwrap().queued,
                reused.unwrap().queued,
                reads.load(Ordering::SeqCst)
            ),
            (1170, 1170, 1)
        );

        tokio::time::advance(Duration::from_millis(100)).await;
        let fresh = readings.get_or_read(kubeconfig, 6443, read(802)).await;
        assert_eq!((fresh.unwrap().queued, reads.load(Ordering::SeqCst)), (802, 2));

        // Another process of the slot (a new port) is read at once.
        let restarted = readings.get_or_read(kubeconfig, 6444, read(479)).await;
        assert_eq!((restarted.unwrap().queued, reads.load(Ordering::SeqCst)), (479, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_kept_too_so_a_busy_slot_is_not_asked_on_every_look() {
        let readings = BacklogReadings::default();
        let reads = AtomicU32::new(0);
        let kubeconfig = Path::new("/state/shards/root/slots/b/admin.kubeconfig");
        for _ in 0..10 {
            let reading = readings
                .get_or_read(kubeconfig, 6443, async {
                    reads.fetch_add(1, Ordering::SeqCst);
                    None
                })
                .await;
            assert_eq!(reading, None);
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }
}
