//! The steps that start the front and change which slots it serves.
use chrono::Utc;

use super::Actor;
use super::Notes;
use crate::controller::Note;
use crate::controller::error::Error;
use crate::controller::front::FrontStart;
use crate::controller::plan::{FrontChange, FrontCheck, LeaveCause};
use crate::front::Backend;
use crate::slot;

impl Actor<'_> {
    pub(super) async fn ensure_front(&self) -> Result<Notes, Error> {
        let front = self.ctx.front(self.shard, self.dirs)?;
        if !front.is_ours()
            && let Some(ready) = self.world.observed.slots.iter().find(|s| s.health.ready)
        {
            // Caddy serves the shard's certificate: once a slot made it, it is in shared/ for
            // caddy's config (`kcpshard front caddy-config`), before caddy can run.
            slot::material::capture_shared(&self.dirs.slot(&ready.name).root(), &self.dirs.shared())?;
        }
        let unready = |e| match e {
            Error::Caddy(cause) => Error::CaddyUnready {
                cause,
                shared: self.dirs.shared(),
            },
            other => other,
        };
        let started = match front.start().await? {
            FrontStart::Started(started) => started,
            FrontStart::Check { admin, check } => match self.ask(&admin, check).await.map_err(unready)? {
                Some(checked) => checked,
                None => return Ok(vec![]),
            },
        };
        Ok(vec![Note::normal("FrontStarted", started)])
    }

    pub(super) async fn upgrade_front(&self) -> Result<Notes, Error> {
        let front = self.ctx.front(self.shard, self.dirs)?;
        Ok(vec![front.upgrade().await?])
    }

    pub(super) fn kill_front(&self) -> Result<Notes, Error> {
        let front = self.ctx.front(self.shard, self.dirs)?;
        let message = match front.kill() {
            Some(pid) => format!(
                "the front (pid {pid}) runs but did not answer on its control socket; killed it, it starts again on {}",
                front.listen()
            ),
            None => "the front did not answer on its control socket and has exited; it starts again".to_string(),
        };
        Ok(vec![Note::warning("FrontUnresponsive", message)])
    }

    /// Changes the front's serving set: records who joined and left first (a slot that left is
    /// then let settle before SIGTERM), then asks the front to apply it.
    ///
    /// The change is a request (to the front's control socket, or caddy's admin API): a front
    /// that answers late holds back no other step. Its answer is taken up by this step planned
    /// again, as it was asked, and the records are written again as of then: a slot left the
    /// front no earlier. A slot gone by then (it exited meanwhile) is passed over: the front's
    /// next change lets it go.
    pub(crate) async fn set_front(&self, change: &FrontChange) -> Result<Notes, Error> {
        let now = Utc::now();
        for name in &change.joined {
            if let Some(slot) = self.world.slot(name) {
                slot.dirs.update(|r| {
                    r.served_at.get_or_insert(now);
                    r.left_front_at = None;
                })?;
            }
        }
        for (name, _) in &change.left {
            if let Some(slot) = self.world.slot(name) {
                slot.dirs.update(|r| r.left_front_at = Some(now))?;
            }
        }
        // A new slot was ready when the front was first asked to take it: an answer taken up
        // later does not move that time past the switch it asked for.
        let joined_new_at = change
            .joined
            .iter()
            .filter_map(|j| self.world.slot(j))
            .filter(|s| s.record.template == self.desired.template)
            .map(|s| s.record.served_at.unwrap_or(now))
            .max();
        let joined_new = joined_new_at.is_some();
        if joined_new {
            self.update_roll(|roll| roll.new_slot_ready_at = joined_new_at)?;
        }
        // The first slot made the shard's key material; every later slot gets a copy before it starts.
        let mut renewed = None;
        if let Some(first) = change.joined.first() {
            slot::material::capture_shared(&self.dirs.slot(first).root(), &self.dirs.shared())?;
            renewed = crate::controller::credentials::write_kubeconfig(
                self.dirs,
                &self.world.observed,
                &self.desired.template.front_url,
            )?;
        }
        let backends: Vec<Backend> = change
            .backends
            .iter()
            .filter_map(|name| {
                self.world.slot(name).map(|s| Backend {
                    slot: name.clone(),
                    address: s.address(),
                })
            })
            .collect();
        let front = self.ctx.front(self.shard, self.dirs)?;
        let ours = front.is_ours();
        let about = format!("the serving set [{}]", change.backends.join(", "));
        let serve = async move { front.serve(&backends).await };
        if self.ask(&about, serve).await?.is_none() {
            return Ok(renewed.into_iter().collect());
        }
        if joined_new {
            self.update_roll(|roll| roll.front_switched_at = Some(Utc::now()))?;
        }
        let mut notes: Notes = renewed.into_iter().collect();
        notes.extend(change.joined.iter().map(|name| {
            let port = self.world.slot(name).map_or(0, |s| s.record.port);
            Note::normal(
                "SlotReady",
                format!("slot {name} answers /readyz on its own port {port}"),
            )
        }));
        for (name, cause) in &change.left {
            if *cause == LeaveCause::Unresponsive {
                let health = self
                    .world
                    .observed
                    .slot(name)
                    .map(|s| s.health.clone())
                    .unwrap_or_default();
                notes.push(Note::warning(
                    "SlotUnresponsive",
                    format!(
                        "slot {name} {} ({}); the front sends it no new connections, those pinned to it stay; it rejoins when it answers, and is killed if it does not answer within spec.rollout.livenessTimeout",
                        health.unresponsive_looks(),
                        health.problem.unwrap_or_default()
                    ),
                ));
            }
        }
        let serving = if change.backends.is_empty() {
            "no slot".to_string()
        } else {
            change.backends.join(", ")
        };
        let left = change
            .left
            .iter()
            .map(|(name, cause)| {
                let why = match cause {
                    LeaveCause::Replaced => "replaced",
                    LeaveCause::Unresponsive => "unresponsive",
                    LeaveCause::Exited => "exited",
                };
                format!("{name} ({why})")
            })
            .collect::<Vec<_>>();
        notes.push(Note::normal(
            "FrontSwitched",
            format!(
                "the front forwards new connections to {serving}{}; open connections stay on their slot",
                if left.is_empty() {
                    String::new()
                } else {
                    format!("; left: {}", left.join(", "))
                }
            ),
        ));
        if !ours && !change.backends.is_empty() {
            // Caddy terminates TLS and may be misconfigured in ways its admin API does not show:
            // later looks ask it as a client would (FinishFrontCheck).
            let mut state = self.dirs.load_state()?;
            state.front_check = Some(FrontCheck { since: Utc::now() });
            self.dirs.save_state(&state)?;
        }
        Ok(notes)
    }

    /// FinishFrontCheck: forgets the check of a caddy front's change, telling a failure.
    pub(super) fn finish_front_check(&self, failure: Option<&str>) -> Result<Notes, Error> {
        let mut state = self.dirs.load_state()?;
        state.front_check = None;
        self.dirs.save_state(&state)?;
        Ok(failure
            .map(|failure| {
                Note::warning(
                    "FrontCheckFailed",
                    format!("the front was changed, but {failure}: check caddy's config (kcpshard front caddy-config) and log"),
                )
            })
            .into_iter()
            .collect())
    }
}
