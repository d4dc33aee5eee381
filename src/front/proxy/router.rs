//! The routing state every connection shares: the serving set new connections are spread over,
//! and which slots' open connections are to be closed.
//!
//! Invariants:
//! - The serving set is read once per connection from a watch channel (an atomic pointer swap for
//!   the writer, a short read lock for the reader); a change never moves an open connection, which
//!   stays pinned to its slot until one side closes.
//! - A new connection goes to the serving backend with the fewest open connections; ties go round
//!   robin, so that an even set is filled evenly. An empty set holds new connections (up to the
//!   hold window) until a backend serves.
//! - What an open connection needs to know of the routing is one watched value, [`Routes`]: the
//!   serving addresses (a connection to any other is *retired*) and the addresses being closed. A
//!   set that names an address again lifts its close.
//! - Each slot's counters live as long as the front process, so a slot that leaves the set and
//!   joins it again continues its counts.
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::accounting::{OpenCount, SlotCounters};
use crate::front::protocol::{Backend, SlotConnections};

/// A serving backend and the counters of its slot.
#[derive(Debug)]
pub(super) struct Active {
    pub backend: Backend,
    pub counters: Arc<SlotCounters>,
}

/// A slot the front has been given, and its latest address.
#[derive(Debug)]
struct Slot {
    address: SocketAddr,
    counters: Arc<SlotCounters>,
}

/// Shared by the accept loop, every connection and the control server.
#[derive(Debug)]
pub struct Router {
    serving: watch::Sender<Vec<Arc<Active>>>,
    /// Where the next tie is broken: round robin over the serving set.
    next: AtomicUsize,
    slots: Mutex<BTreeMap<String, Slot>>,
    /// Connections open in this process, whatever their slot; drained to 0 on shutdown.
    pub(super) open: OpenCount,
    /// Where new connections go, and which backends' open connections are to be closed: what an
    /// open connection watches.
    routes: watch::Sender<Routes>,
}

/// What an open connection needs to know of the routing, as one value it can watch.
#[derive(Debug, Default)]
pub(super) struct Routes {
    /// The serving addresses; a connection to another one is retired.
    pub serving: Vec<SocketAddr>,
    /// Backends whose open connections are to be closed (a slot that is shutting down).
    pub closing: BTreeSet<SocketAddr>,
}

impl Routes {
    pub fn retired(&self, address: SocketAddr) -> bool {
        !self.serving.contains(&address)
    }
}

impl Router {
    pub fn new(initial: Vec<Backend>) -> Arc<Router> {
        let router = Arc::new(Router {
            serving: watch::Sender::new(Vec::new()),
            next: AtomicUsize::new(0),
            slots: Mutex::new(BTreeMap::new()),
            open: OpenCount::default(),
            routes: watch::Sender::new(Routes::default()),
        });
        router.serve(initial);
        router
    }

    /// Closes every open connection to `address` (a slot that is shutting down: kcp keeps a
    /// stopping process alive while watches are open through it). Clients see their connection
    /// end and reconnect, to a serving slot. A later set that names the address lifts it.
    pub fn close(&self, address: SocketAddr) {
        self.routes.send_modify(|routes| {
            routes.closing.insert(address);
        });
    }

    /// Makes `backends` (validated: each slot and address once) the serving set. Open connections
    /// stay on their slot, except kept-alive HTTP/1.1 ones to a slot that left the set, which are
    /// closed at their next request ([`crate::front::keepalive`]).
    pub fn serve(&self, backends: Vec<Backend>) {
        let serving: Vec<Arc<Active>> = {
            let mut slots = self.slots.lock().expect("slot counters lock");
            backends
                .into_iter()
                .map(|backend| {
                    let slot = slots.entry(backend.slot.clone()).or_insert_with(|| Slot {
                        address: backend.address,
                        counters: Arc::default(),
                    });
                    slot.address = backend.address;
                    let counters = slot.counters.clone();
                    Arc::new(Active { backend, counters })
                })
                .collect()
        };
        let addresses: Vec<SocketAddr> = serving.iter().map(|a| a.backend.address).collect();
        self.serving.send_replace(serving);
        self.routes.send_if_modified(|routes| {
            let mut changed = routes.serving != addresses;
            for address in &addresses {
                changed |= routes.closing.remove(address);
            }
            routes.serving = addresses;
            changed
        });
    }

    pub fn backends(&self) -> Vec<Backend> {
        self.serving.borrow().iter().map(|a| a.backend.clone()).collect()
    }

    pub fn connections(&self) -> BTreeMap<String, SlotConnections> {
        self.slots
            .lock()
            .expect("slot counters lock")
            .iter()
            .map(|(name, slot)| (name.clone(), slot.counters.snapshot(slot.address)))
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

    /// The serving backend a new connection goes to: the fewest open connections, ties round
    /// robin; other than `avoid` (a backend that just refused) while the set has another.
    pub(super) fn pick(&self, avoid: Option<SocketAddr>) -> Option<Arc<Active>> {
        let serving = self.serving.borrow();
        match serving.as_slice() {
            [] => None,
            [one] => Some(one.clone()),
            many => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                let mut best: Option<(&Arc<Active>, (bool, u64))> = None;
                for i in 0..many.len() {
                    let candidate = &many[(start + i) % many.len()];
                    let rank = (Some(candidate.backend.address) == avoid, candidate.counters.open());
                    if best.is_none_or(|(_, least)| rank < least) {
                        best = Some((candidate, rank));
                    }
                }
                best.map(|(active, _)| active.clone())
            }
        }
    }

    /// A serving backend none of `excluded` names (the fewest open connections): where a
    /// connection whose slot did not answer is replayed.
    pub(super) fn pick_other(&self, excluded: &[SocketAddr]) -> Option<Arc<Active>> {
        let serving = self.serving.borrow();
        serving
            .iter()
            .filter(|active| !excluded.contains(&active.backend.address))
            .min_by_key(|active| active.counters.open())
            .cloned()
    }

    /// Waits for the serving set to have a member, up to `deadline`, and picks one.
    pub(super) async fn wait_for_backend(&self, deadline: Instant) -> Option<Arc<Active>> {
        let mut rx = self.serving.subscribe();
        let found = tokio::time::timeout_at(deadline, async { rx.wait_for(|s| !s.is_empty()).await.is_ok() });
        match found.await {
            Ok(true) => self.pick(None),
            _ => None,
        }
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
    fn a_new_set_changes_where_connections_go_and_keeps_each_slots_counts() {
        let router = Router::new(vec![backend("blue", 1)]);
        let blue = router.pick(None).unwrap();
        let pinned = Pinned::new(&blue.counters);
        router.serve(vec![backend("green", 2)]);
        assert_eq!(router.backends(), vec![backend("green", 2)]);
        let green = Pinned::new(&router.pick(None).unwrap().counters);
        let counts = router.connections();
        assert_eq!((counts["blue"].open, counts["blue"].total), (1, 1));
        assert_eq!((counts["green"].open, counts["green"].total), (1, 1));
        assert_eq!(counts["green"].address, Some(backend("green", 2).address));
        drop(pinned);
        drop(green);
        // Back to blue: the same counters continue.
        router.serve(vec![backend("blue", 1)]);
        let _again = Pinned::new(&router.pick(None).unwrap().counters);
        let counts = router.connections();
        assert_eq!((counts["blue"].open, counts["blue"].total), (1, 2));
        assert_eq!((counts["green"].open, counts["green"].total), (0, 1));
    }

    #[test]
    fn new_connections_go_to_the_fewest_open_and_ties_take_turns() {
        let router = Router::new(vec![backend("a", 1), backend("b", 2), backend("c", 3)]);
        let mut held = Vec::new();
        let mut given = BTreeMap::<String, u32>::new();
        for _ in 0..9 {
            let active = router.pick(None).unwrap();
            *given.entry(active.backend.slot.clone()).or_default() += 1;
            held.push((active.backend.slot.clone(), Pinned::new(&active.counters)));
        }
        assert_eq!(given.values().copied().collect::<Vec<_>>(), vec![3, 3, 3], "{given:?}");
        // a's connections close: the next ones go to a until it has as many as the others.
        held.retain(|(slot, _)| slot != "a");
        for _ in 0..3 {
            let active = router.pick(None).unwrap();
            assert_eq!(active.backend.slot, "a");
            held.push((active.backend.slot.clone(), Pinned::new(&active.counters)));
        }
        // Ties without connections at all: round robin, every member in turn.
        let idle = Router::new(vec![backend("a", 1), backend("b", 2)]);
        let turns: Vec<String> = (0..4).map(|_| idle.pick(None).unwrap().backend.slot.clone()).collect();
        assert_ne!(turns[0], turns[1]);
        assert_eq!(turns[0], turns[2]);
        // A backend that just refused is avoided while another serves, and taken when alone.
        let a = backend("a", 1).address;
        for _ in 0..4 {
            assert_eq!(idle.pick(Some(a)).unwrap().backend.slot, "b");
        }
        let alone = Router::new(vec![backend("a", 1)]);
        assert_eq!(alone.pick(Some(a)).unwrap().backend.slot, "a");
        assert!(Router::new(Vec::new()).pick(None).is_none());
    }

    #[test]
    fn a_set_retires_the_addresses_it_leaves_out_and_lifts_their_close() {
        let router = Router::new(vec![backend("a", 1), backend("b", 2)]);
        let routes = router.routes();
        assert!(!routes.borrow().retired(backend("a", 1).address));
        router.close(backend("a", 1).address);
        router.serve(vec![backend("b", 2)]);
        assert!(routes.borrow().retired(backend("a", 1).address));
        assert!(routes.borrow().closing.contains(&backend("a", 1).address));
        router.serve(vec![backend("a", 1), backend("b", 2)]);
        assert!(!routes.borrow().retired(backend("a", 1).address));
        assert!(routes.borrow().closing.is_empty(), "serving it again lifts the close");
    }

    // On the paused clock a sleep ends once every other task waits: no assumption of how fast
    // this machine is.
    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_the_last_connection_or_the_bound() {
        let router = Router::new(Vec::new());
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

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_backend_waits_for_a_serving_set() {
        let router = Router::new(Vec::new());
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
        router.serve(vec![backend("blue", 1)]);
        assert_eq!(waiter.await.unwrap(), Some(backend("blue", 1)));
        let none = Router::new(Vec::new())
            .wait_for_backend(Instant::now() + Duration::from_millis(20))
            .await;
        assert!(none.is_none());
    }
}
