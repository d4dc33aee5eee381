//! kcpshard's admin identities for a shard, as the plan decides them (docs/architecture.md, "The
//! admin identity"; the record and its files: controller/credentials.rs; the identity itself:
//! slot/identity.rs).
//!
//! - The identity is made once per shard (`IssueIdentity`); a rotation request (a new
//!   `kcpshard.io/rotateCredentialsAt`) issues a second one beside it, one rotation at a time.
//! - Which identities every slot must accept ([`accepted`]) is the slot template's
//!   `acceptedIdentities`, so a change rolls the shard. During a rotation: the old and the new,
//!   until no roll is under way and every running slot accepts the new one; from then on the new
//!   one alone (the second roll).
//! - The record follows (`UpdateIdentities`): it marks the rotation's second half, and drops an
//!   old identity once no slot accepts it (from then on it is refused).
//! - `shards/<name>/admin.kubeconfig` holds the newest identity that every slot still listening
//!   accepts ([`for_kubeconfig`]); it is written (`WriteKubeconfig`) only when its bytes would
//!   change, so a roll that keeps the identities leaves it as it is.
//!
//! Invariants: a slot only starts with identities the record holds (these steps come before any
//! start); the kubeconfig never names an identity that a slot taking new connections refuses.
use super::*;

/// The shard's admin identities as recorded, without their tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentitiesObservation {
    /// Oldest first; the last is the newest. Two while a rotation is under way.
    pub ids: Vec<String>,
    /// The `kcpshard.io/rotateCredentialsAt` value the newest was issued for.
    pub rotation_request: Option<String>,
    /// The rotation's second half: every slot accepted the newest once.
    pub retiring: bool,
    /// The kubeconfig through the front would change if written for [`for_kubeconfig`]'s
    /// identity (it holds another, names another front, or is missing while the shard's CA is
    /// there).
    pub kubeconfig_stale: bool,
}

impl IdentitiesObservation {
    fn newest(&self) -> Option<&String> {
        self.ids.last()
    }
}

/// Whether a rotation is in its second half: it was already, or no roll is in progress and every
/// running slot accepts the newest identity. A roll in progress finishes first: changing its
/// target would leave it without its RollComplete.
pub fn retiring(identities: &IdentitiesObservation, observed: &Observed) -> bool {
    let Some(newest) = identities.newest() else {
        return false;
    };
    identities.retiring
        || (observed.roll.is_none()
            && observed
                .slots
                .iter()
                .filter(|s| s.running)
                .all(|s| s.template.accepted_identities.contains(newest)))
}

/// The identities every slot must accept, oldest first: all the record holds in a rotation's
/// first half, the newest alone otherwise.
pub fn accepted(identities: &IdentitiesObservation, observed: &Observed) -> Vec<String> {
    match identities.newest() {
        None => vec![],
        Some(newest) if identities.ids.len() == 1 || retiring(identities, observed) => vec![newest.clone()],
        Some(_) => identities.ids.clone(),
    }
}

/// The identity the kubeconfig through the front must carry: the newest one that every slot still
/// listening accepts (the roll's old slot, once it stopped listening after SIGTERM, takes no new
/// connection). None when no slot listens, or one accepts none of the record's (a slot started
/// before kcpshard had identities): the file stays as it is.
pub fn for_kubeconfig<'r>(identities: &'r IdentitiesObservation, observed: &Observed) -> Option<&'r str> {
    let stopped_listening = |s: &SlotObservation| s.stopping() && !s.listening;
    let listening: Vec<&SlotObservation> = observed
        .slots
        .iter()
        .filter(|s| s.running && !stopped_listening(s))
        .collect();
    if listening.is_empty() {
        return None;
    }
    identities
        .ids
        .iter()
        .rev()
        .find(|id| listening.iter().all(|s| s.template.accepted_identities.contains(id)))
        .map(String::as_str)
}

/// What the record becomes on this look: the rotation's second half marked once it begins, and
/// the identities no slot accepts any more dropped. Equal to the record when nothing changes.
pub fn next_record(identities: &IdentitiesObservation, observed: &Observed) -> IdentitiesObservation {
    let mut next = identities.clone();
    let Some(newest) = identities.newest().cloned() else {
        return next;
    };
    next.retiring = identities.ids.len() > 1 && retiring(identities, observed);
    let accepted = accepted(&next, observed);
    let still_accepted = |id: &String| {
        accepted.contains(id)
            || observed
                .slots
                .iter()
                .any(|s| s.template.accepted_identities.contains(id))
    };
    next.ids.retain(|id| *id == newest || still_accepted(id));
    next.retiring &= next.ids.len() > 1;
    next
}

/// The step that keeps the identities, if one is due; None while the shard is being deleted.
pub fn identities_step(desired: &Desired, observed: &Observed) -> Option<Step> {
    let identities = &observed.identities;
    let request = desired.rotation_request.as_ref();
    if identities.ids.is_empty()
        || (request.is_some() && request != identities.rotation_request.as_ref() && identities.ids.len() == 1)
    {
        return Some(Step::IssueIdentity);
    }
    if next_record(identities, observed) != *identities {
        return Some(Step::UpdateIdentities);
    }
    identities.kubeconfig_stale.then_some(Step::WriteKubeconfig)
}
