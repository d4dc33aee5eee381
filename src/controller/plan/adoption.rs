//! Taking over a kcp that ran outside kcpshard (spec.adopt; docs/how-to/adopt.md, "Adopt a running
//! kcp"). One step, AdoptKcp, reads the kcp and its root directory (src/adopt), makes its key
//! material and tokens the shard's, and records its process as the shard's first slot and its
//! store as the shard's store. From then on it is a slot like any other: the front serves it, and
//! since spec.store names another store, the move of the data (plan/migration.rs) follows; its
//! switch stops the old kcp and a slot on spec.store serves in its place. Before the move begins,
//! the controllers Lease is held for the old kcp (HoldControllersLease): kcp runs its controllers
//! without leader election by default, and a slot on the new store must not lead them while the
//! old kcp still does. When the front is to listen where the old kcp does, it starts at the
//! switch, on the old kcp's own listening socket; until then clients reach the old kcp directly.
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::*;

/// How long after a refusal the kcp is inspected again with the same spec.
pub const ADOPT_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// An adoption, recorded in controller.json by the step that takes the kcp over (or refuses to).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionRecord {
    /// spec.adopt.rootDirectory, as it was when the kcp was inspected.
    pub root_directory: PathBuf,
    /// spec.version then.
    pub version: String,
    pub started_at: DateTime<Utc>,
    /// When the kcp was last inspected (a refusal is retried [`ADOPT_RETRY`] after it).
    #[serde(default = "Utc::now")]
    pub inspected_at: DateTime<Utc>,
    /// The kcp taken over (release, pid, address, store), as status.adoption.from says it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from: String,
    /// The slot its process is recorded as, once its material is the shard's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// Its embedded etcd's data directory: the mirror reads the last changes from a copy of it
    /// once the kcp (and its etcd with it) has exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// When the controllers Lease was made to say that the old kcp leads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_held_at: Option<DateTime<Utc>>,
    /// Where clients reached the old kcp (host:port).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// spec.adopt.caddyAdminAddress: a caddy in front of the old kcp, to send to the front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caddy_admin_address: Option<String>,
    /// When that caddy was made to send to the front what it sent to the old kcp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_moved_at: Option<DateTime<Utc>>,
    /// The front listens where the old kcp does (spec.front.listen is its address): it starts
    /// only at the switch, on the very socket the old kcp listens on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takes_address: bool,
    /// When the move's switch ended: the old kcp had exited, the new store had its last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
    /// Why the kcp was not taken over (nothing of it was touched), or, with `slot` set, why it
    /// cannot be taken over again after it exited before the switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl AdoptionRecord {
    /// Taken over and not complete.
    pub fn under_way(&self) -> bool {
        self.slot.is_some() && self.completed_at.is_none()
    }

    /// The old kcp serves as a slot of the shard, its data still in its own store.
    pub fn before_switch(&self) -> bool {
        self.under_way() && self.switched_at.is_none()
    }
}

/// The adoption's next step, while one is asked for or under way.
pub(super) fn adoption(desired: &Desired, observed: &Observed) -> Option<Step> {
    let Some(record) = &observed.adoption else {
        return desired.adopt.is_some().then_some(Step::AdoptKcp);
    };
    if let Some(refused) = &record.refused {
        // Tried again a while later (the kcp started since, its caddy was fixed); a kcp never
        // taken over also once the spec says something else (another directory, another
        // version). One taken over that exited before the switch is tried again whatever the
        // spec says now.
        let again = match (&record.slot, &desired.adopt) {
            (None, None) => return None,
            (None, Some(wanted)) => *wanted != record.root_directory || desired.template.version != record.version,
            (Some(_), _) => false,
        };
        if again || elapsed(observed.now, record.inspected_at) >= ADOPT_RETRY {
            return Some(Step::AdoptKcp);
        }
        // Nothing starts: a first slot on spec.store would serve an empty kcp.
        return Some(Step::Blocked {
            cause: BlockCause::AdoptionRefused {
                message: refused.clone(),
            },
        });
    }
    let slot = record.slot.as_ref().filter(|_| record.under_way())?;
    let moved = observed
        .migration
        .as_ref()
        .is_some_and(|m| m.record.started_at >= record.started_at && m.record.completed_at.is_some());
    if moved {
        return Some(Step::CompleteAdoption);
    }
    if !record.before_switch() {
        return None;
    }
    // The kcp exited before the switch (it crashed, or someone stopped it): its slot is not
    // replaced (nothing else can serve its store), it is taken over again once it runs again.
    if !switch_begun(observed) && observed.slot(slot).is_none_or(|s| !s.running) {
        return Some(Step::AdoptKcp);
    }
    let serves = observed.slot(slot).is_some_and(|s| s.running && s.health.ready);
    if record.lease_held_at.is_none() {
        return serves.then_some(Step::HoldControllersLease);
    }
    let proxy_waits = record.caddy_admin_address.is_some() && record.proxy_moved_at.is_none();
    (proxy_waits && serves && observed.front.forwards_to(slot)).then_some(Step::RedirectProxy)
}

/// The old kcp serves as a slot, and the Lease does not say yet that it leads, or its caddy still
/// sends to it: the move waits.
pub(super) fn adoption_waits(observed: &Observed) -> bool {
    observed.adoption.as_ref().is_some_and(|a| {
        a.before_switch()
            && (a.lease_held_at.is_none() || a.caddy_admin_address.is_some() && a.proxy_moved_at.is_none())
    })
}

/// While the old kcp serves on its own store, no slot of kcpshard's starts there (it stops at the
/// switch, and its store, an embedded etcd, with it), and the old kcp is never restarted.
pub(super) fn old_kcp_serves(observed: &Observed) -> bool {
    observed.adoption.as_ref().is_some_and(AdoptionRecord::before_switch)
}

/// The move's switch stopped the adopted kcp, and its embedded etcd (the shard's store until the
/// switch ends) with it: the store being down is the switch, not an outage.
pub(super) fn store_gone_with_old_kcp(observed: &Observed) -> bool {
    let embedded = observed
        .adoption
        .as_ref()
        .is_some_and(|a| a.before_switch() && a.data_dir.is_some());
    embedded && switch_begun(observed)
}

/// The front is to take the old kcp's address, and the switch has not begun: it does not run yet
/// (the old kcp listens there), and the old kcp serves without it.
pub(super) fn front_waits_for_switch(observed: &Observed) -> bool {
    let takes = observed
        .adoption
        .as_ref()
        .is_some_and(|a| a.before_switch() && a.takes_address);
    takes && !switch_begun(observed)
}

/// The move of the adopted kcp's data has begun its switch (which stops the adopted kcp).
fn switch_begun(observed: &Observed) -> bool {
    observed
        .migration
        .as_ref()
        .is_some_and(|m| m.record.under_way() && m.record.switch_started_at.is_some())
}
