//! The routing state every connection shares: which backend new connections go to, and which
//! slots' open connections are to be closed.
//!
//! Invariants:
//! - The backend is read once per connection from a watch channel (an atomic pointer swap for the
//!   writer, a short read lock for the reader); a switch never touches an open connection, which
//!   stays pinned to its slot until one side closes.
//! - What an open connection needs to know of the routing is one watched value, [`Routes`]: the
//!   active address (a connection to another one is *retired*) and the addresses being closed. A
//!   switch back to an address lifts its close.
//! - Each slot's counters live as long as the front process, so a slot switched away from and back
//!   to continues its counts.
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::accounting::{OpenCount, SlotCounters};
use crate::front::protocol::{Backend, SlotConnections};

/// The backend in force and the counters of its slot, swapped as one value.
#[derive(Debug)]
pub(super) struct Active {
    pub backend: Backend,
    pub counters: Arc<SlotCounters>,
}

/// Shared by the accept loop, every connection and the control server.
#[derive(Debug)]
pub struct Router {
    active: watch::Sender<Option<Arc<Active>>>,
    slots: Mutex<BTreeMap<String, Arc<SlotCounters>>>,
    /// Connections open in this process, whatever their slot; drained to 0 on shutdown.
    pub(super) open: OpenCount,
    /// Where new connections go, and which backends' open connections are to be closed: what an
    /// open connection watches.
    routes: watch::Sender<Routes>,
}

/// What an open connection needs to know of the routing, as one value it can watch.
#[derive(Debug, Default)]
pub(super) struct Routes {
    /// The backend new connections go to; a connection to another one is retired.
    pub active: Option<SocketAddr>,
    /// Backends whose open connections are to be closed (a slot that is shutting down).
    pub closing: BTreeSet<SocketAddr>,
}

impl Router {
    pub fn new(initial: Option<Backend>) -> Arc<Router> {
        let router = Arc::new(Router {
            active: watch::Sender::new(None),
            slots: Mutex::new(BTreeMap::new()),
            open: OpenCount::default(),
            routes: watch::Sender::new(Routes::default()),
        });
        if let Some(backend) = initial {
            router.switch(backend);
        }
        router
    }

    /// Closes every open connection to `address` (a slot that is shutting down: kcp keeps a
    /// stopping process alive while watches are open through it). Clients see their connection
    /// end and reconnect, to the active slot. A later switch to the same address lifts it.
    pub fn close(&self, address: SocketAddr) {
        self.routes.send_modify(|routes| {
            routes.closing.insert(address);
        });
    }

    /// Makes `backend` the target of new connections. Open connections stay on their slot, except
    /// kept-alive HTTP/1.1 ones to another slot, which are closed once idle between requests.
    pub fn switch(&self, backend: Backend) {
        let address = backend.address;
        let counters = self
            .slots
            .lock()
            .expect("slot counters lock")
            .entry(backend.slot.clone())
            .or_default()
            .clone();
        self.active.send_replace(Some(Arc::new(Active { backend, counters })));
        self.routes.send_if_modified(|routes| {
            let lifted = routes.closing.remove(&address);
            lifted || routes.active.replace(address) != Some(address)
        });
    }

    pub fn backend(&self) -> Option<Backend> {
        self.active.borrow().as_ref().map(|a| a.backend.clone())
    }
    pub fn connections(&self) -> BTreeMap<String, SlotConnections> {
        self.slots
            .lock()
            .expect("slot counters lock")
            .iter()
            .map(|(slot, c)| (slot.clone(), c.snapshot()))
            .collect()
    }

    pub fn open_connections(&self) -> u64 {
        self.open.get()
    }

    /// Waits until every connection of this process has closed, or `bound` has passed; returns the
    /// number still open.
    pub async fn drain(&self, bound: Duration) -> u64 {
        self.open.drain(bound).await
    }

    pub(super) fn current(&self) -> Option<Arc<Active>> {
        self.active.borrow().clone()
    }

    pub(super) async fn wait_for_backend(&self, deadline: Instant) -> Option<Arc<Active>> {
        let mut rx = self.active.subscribe();
        let found = tokio::time::timeout_at(deadline, async {
            rx.wait_for(|a| a.is_some()).await.ok().map(|a| a.clone())
        });
        found.await.ok().flatten().flatten()
    }

    /// What an open connection watches to learn that it is retired or its slot closing.
    pub(super) fn routes(&self) -> watch::Receiver<Routes> {
        self.routes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::front::proxy::accounting::{Pinned, Tracked};

    fn backend(slot: &str, port: u16) -> Backend {
        Backend {
            slot: slot.into(),
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    #[test]
    fn a_switch_changes_the_backend_and_keeps_each_slots_counts() {
        let router = Router::new(Some(backend("blue", 1)));
        let blue = router.current().unwrap();
        let pinned = Pinned::new(&blue.counters);
        router.switch(backend("green", 2));
        assert_eq!(router.backend(), Some(backend("green", 2)));
        let green = Pinned::new(&router.current().unwrap().counters);
        let counts = router.connections();
        assert_eq!((counts["blue"].open, counts["blue"].total), (1, 1));
        assert_eq!((counts["green"].open, counts["green"].total), (1, 1));
        drop(pinned);
        drop(green);
        // Back to blue: the same counters continue.
        router.switch(backend("blue", 1));
        let _again = Pinned::new(&router.current().unwrap().counters);
        let counts = router.connections();
        assert_eq!((counts["blue"].open, counts["blue"].total), (1, 2));
        assert_eq!((counts["green"].open, counts["green"].total), (0, 1));
    }

    #[tokio::test]
    async fn drain_waits_for_the_last_connection_or_the_bound() {
        let router = Router::new(None);
        assert_eq!(router.drain(Duration::from_secs(5)).await, 0);
        let tracked = Tracked::new(&router);
        assert_eq!(router.drain(Duration::from_millis(50)).await, 1);
        let closer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(tracked);
        });
        assert_eq!(router.drain(Duration::from_secs(5)).await, 0);
        closer.await.unwrap();
    }

    #[tokio::test]
    async fn a_connection_without_a_backend_waits_for_a_switch() {
        let router = Router::new(None);
        let waiter = {
            let router = router.clone();
            tokio::spawn(async move {
                router
                    .wait_for_backend(Instant::now() + Duration::from_secs(5))
                    .await
                    .map(|a| a.backend.clone())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        router.switch(backend("blue", 1));
        assert_eq!(waiter.await.unwrap(), Some(backend("blue", 1)));
        let none = Router::new(None)
            .wait_for_backend(Instant::now() + Duration::from_millis(20))
            .await;
        assert!(none.is_none());
    }
}
