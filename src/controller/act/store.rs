//! The steps that start the shard's store and replace a kine that does not answer.

use chrono::Utc;
use nix::sys::signal::Signal;

use super::Actor;
use super::Notes;
use crate::controller::Note;
use crate::controller::error::Error;
use crate::store::SlotStoreStart;

impl Actor<'_> {
    /// Starts the store's shard-wide part, then brings back the own kine of every running slot
    /// whose kine is down (at the address that slot dials).
    pub(super) async fn ensure_store(&self) -> Result<Notes, Error> {
        // A new slot that is still starting will be started again once the store is back.
        let now = Utc::now();
        let starting = self
            .world
            .observed
            .slots
            .iter()
            .any(|s| s.running && !s.health.ever_ready);
        self.update_roll(|roll| {
            if starting {
                roll.store_down_at = Some(now);
            }
        })?;
        let store = self.store()?;
        let runs = self.world.observed.slots.iter().any(|s| s.running);
        // The shard-wide part went away under running slots (a kine killed, PostgreSQL restarted):
        // an outage the user should hear about, not a start (as this look found it).
        let outage = match &self.world.observed.store_problem {
            Some(problem) if runs => Some(problem.clone()),
            _ => None,
        };
        let Some(started) = self.ensure_store_of(&store).await? else {
            return Ok(vec![]);
        };
        let mut notes = vec![match outage {
            Some(problem) => Note::warning(
                "StoreRestarted",
                format!("the store was down while slots ran ({problem}); {started}"),
            ),
            None => Note::normal("StoreStarted", started),
        }];
        // The slots' own kines (KinePostgres) need the shard-wide part: a managed PostgreSQL just
        // started is waited for (Wait (Store)), and the next EnsureStore brings them back.
        let runtime = &self.ctx.runtime;
        if store.starting(runtime).await.is_some() {
            return Ok(notes);
        }
        for (slot, seen) in self.world.slots.iter().zip(&self.world.observed.slots) {
            let name = slot.name();
            let dir = slot.dirs.store();
            if seen.running
                && store.running_slot_kine(runtime, &dir, name).await.is_none()
                && store.starting_slot_kine(runtime, &dir, name).await.is_none()
            {
                let message = match store.start_slot_store(runtime, &dir, name).await? {
                    SlotStoreStart::Ready(own) => {
                        format!(
                            "the kine of slot {name} was down; it runs again at {}",
                            own.etcd_servers
                        )
                    }
                    SlotStoreStart::Starting { pid, etcd_servers } => format!(
                        "the kine of slot {name} was down; started it again (pid {pid}) at {etcd_servers}, where the slot's kcp dials it"
                    ),
                };
                notes.push(Note::warning("SlotStoreRestarted", message));
            }
        }
        Ok(notes)
    }

    /// Kills the kines that accept connections but do not answer reads; EnsureStore starts them
    /// again at the same addresses.
    pub(super) fn kill_store(&self) -> Result<Notes, Error> {
        let mut notes = Vec::new();
        for (kine, problem) in &self.world.unresponsive_kines {
            self.ctx.runtime.signal(&kine.record, Signal::SIGKILL)?;
            notes.push(Note::warning(
                "StoreUnresponsive",
                format!(
                    "kine at {} (pid {}) accepted connections but answered no read ({problem}); killed it, it starts again on the same port",
                    kine.endpoint(), kine.record.pid
                ),
            ));
        }
        Ok(notes)
    }
}
