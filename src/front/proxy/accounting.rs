//! Per-slot and per-process connection counts, kept by guards whose lifetime is the connection's:
//! a count can never be left behind by an early return or a panic.
//!
//! - [`SlotCounters`]: `open`, `total`, `failed`, `replayed` and `last_silent` of one slot, as
//!   `status` and `/metrics` show them. [`Pinned`] adds one to `total` and `open` when a connection is given to the slot and
//!   takes it off `open` when the connection ends. [`RetiredCount`] counts it in `retired_*` while
//!   its slot is out of the serving set.
//! - [`OpenCount`]: connections open in this process, whatever their slot, which a shutdown or a
//!   handover drains to 0. [`Tracked`] holds one from accept to close.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::router::Router;
use crate::front::protocol::SlotConnections;

#[derive(Default, Debug)]
pub(super) struct SlotCounters {
    open: AtomicU64,
    total: AtomicU64,
    failed: AtomicU64,
    replayed: AtomicU64,
    /// When a connection was last replayed because this slot stayed silent: Unix time in ms, 0
    /// for never.
    last_silent_ms: AtomicU64,
    retired_pending: AtomicU64,
    retired_unjudged: AtomicU64,
}

impl SlotCounters {
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// A connection given to this slot that could not be connected within the retry window.
    pub fn count_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection this slot did not answer that went to another; `silent`: it stayed silent (it
    /// did not fail).
    pub fn count_replayed(&self, silent: bool) {
        self.replayed.fetch_add(1, Ordering::Relaxed);
        if silent {
            let now = chrono::Utc::now().timestamp_millis();
            self.last_silent_ms
                .store(u64::try_from(now).unwrap_or(0), Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self, address: SocketAddr) -> SlotConnections {
        SlotConnections {
            address: Some(address),
            open: self.open.load(Ordering::Relaxed),
            total: self.total.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            last_silent: match self.last_silent_ms.load(Ordering::Relaxed) {
                0 => None,
                ms => chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)),
            },
            retired_pending: self.retired_pending.load(Ordering::Relaxed),
            retired_unjudged: self.retired_unjudged.load(Ordering::Relaxed),
        }
    }
}

/// What a retired connection counts as in its slot's `retired_*` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Retired {
    /// Serving, or not counted.
    No,
    /// Kept-alive HTTP/1.1 that may still carry a request to the slot: one in flight, or its first.
    Pending,
    /// Anything else: the slot's shutdown ends it.
    Unjudged,
}

/// Counts a connection in its slot's `retired_*` counts while it is retired, by what it is.
pub(super) struct RetiredCount<'a> {
    counters: &'a SlotCounters,
    now: Retired,
}

impl<'a> RetiredCount<'a> {
    pub fn new(counters: &'a SlotCounters) -> RetiredCount<'a> {
        RetiredCount {
            counters,
            now: Retired::No,
        }
    }

    pub fn set(&mut self, to: Retired) {
        if to == self.now {
            return;
        }
        if let Some(from) = self.counter(self.now) {
            from.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(to) = self.counter(to) {
            to.fetch_add(1, Ordering::Relaxed);
        }
        self.now = to;
    }

    fn counter(&self, what: Retired) -> Option<&'a AtomicU64> {
        match what {
            Retired::No => None,
            Retired::Pending => Some(&self.counters.retired_pending),
            Retired::Unjudged => Some(&self.counters.retired_unjudged),
        }
    }
}

impl Drop for RetiredCount<'_> {
    fn drop(&mut self) {
        self.set(Retired::No);
    }
}

/// Counts one connection in its slot: total at once, open for as long as it lives.
pub(super) struct Pinned(Arc<SlotCounters>);

impl Pinned {
    pub fn counters(&self) -> &SlotCounters {
        &self.0
    }

    pub fn new(counters: &Arc<SlotCounters>) -> Pinned {
        counters.total.fetch_add(1, Ordering::Relaxed);
        counters.open.fetch_add(1, Ordering::Relaxed);
        Pinned(counters.clone())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Connections open in this process. An atomic (not a watch channel, whose every update takes a
/// lock and wakes its shards) because it changes twice per connection; `idle` is notified when it
/// drops to 0.
#[derive(Debug, Default)]
pub(super) struct OpenCount {
    open: AtomicU64,
    idle: Notify,
}

impl OpenCount {
    pub fn get(&self) -> u64 {
        self.open.load(Ordering::Acquire)
    }

    /// Waits until the count is 0, or `bound` has passed; returns the count then.
    pub async fn drain(&self, bound: Duration) -> u64 {
        let _ = tokio::time::timeout(bound, async {
            loop {
                // Registered before the check, so that a close in between is not missed.
                let idle = self.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if self.get() == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await;
        self.get()
    }
}

/// Counts a connection in the process total, from accept to close.
pub(super) struct Tracked(Arc<Router>);

impl Tracked {
    pub fn new(router: &Arc<Router>) -> Tracked {
        router.open.open.fetch_add(1, Ordering::AcqRel);
        Tracked(router.clone())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let count = &self.0.open;
        if count.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            count.idle.notify_waiters();
        }
    }
}
