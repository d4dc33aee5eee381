//! kcpshard's admin identities for a shard, as the controller keeps them on disk
//! (`shared/admin-identities.json`, 0600; docs/architecture.md, "The admin identity"). What is to
//! change is decided by the plan (controller/plan/identities.rs); the steps here carry it out:
//! [`issue`] a new identity, [`update`] the record, [`write_kubeconfig`] through the front. The
//! identity itself and its files: `slot/identity.rs`.
//!
//! The token appears in no status, event or log line (events and the condition name the
//! identity's id).
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Note;
use super::conditions::Verdict;
use super::plan::{IdentitiesObservation, Observed, for_kubeconfig};
use super::state::{self, ShardDirs};
use crate::fsutil;
use crate::slot::identity::{self, FrontKubeconfig, Identity};
use crate::slot::material::ADMIN_KUBECONFIG;

/// The condition that says whether a rotation is under way.
pub const CONDITION: &str = "CredentialsRotating";

/// The shard's admin identities (`shared/admin-identities.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityRecord {
    /// Oldest first; the last is the newest. Two while a rotation is under way.
    pub identities: Vec<Identity>,
    /// The `kcpshard.io/rotateCredentialsAt` value the newest was issued for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_request: Option<String>,
    /// A rotation's second half: every slot accepted the newest identity once, so the older ones
    /// are no longer to be accepted. Kept, so that the roll that drops them is not undone while it
    /// runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retiring: bool,
}

impl IdentityRecord {
    fn ids(&self) -> Vec<String> {
        self.identities.iter().map(|i| i.id.clone()).collect()
    }
}

/// The record as the plan sees it: ids, request and phase, no tokens.
pub fn observe(record: Option<&IdentityRecord>) -> IdentitiesObservation {
    let Some(record) = record else {
        return IdentitiesObservation::default();
    };
    IdentitiesObservation {
        ids: record.ids(),
        rotation_request: record.rotation_request.clone(),
        retiring: record.retiring,
        kubeconfig_stale: false,
    }
}

/// The record, with the tokens; an empty one when none is written yet.
pub fn load(dirs: &ShardDirs) -> std::io::Result<IdentityRecord> {
    Ok(state::read_json::<IdentityRecord>(&dirs.identities())?.unwrap_or_default())
}

/// IssueIdentity: the shard's first identity, or a second one for the rotation request `request`,
/// written before any slot can be started with it.
pub fn issue(dirs: &ShardDirs, request: Option<&str>, now: DateTime<Utc>) -> Result<Note, super::Error> {
    let mut record = load(dirs)?;
    let kubeconfig = dirs.front_kubeconfig();
    let new = Identity::issue(now)?;
    let note = match record.identities.last() {
        None => Note::normal(
            "AdminIdentityIssued",
            format!(
                "issued admin identity {} for the shard; {} carries it once a slot that accepts it serves",
                new.id,
                kubeconfig.display()
            ),
        ),
        Some(old) => Note::normal(
            "CredentialsRotating",
            format!(
                "rotation request {}: issued admin identity {} to replace {}; the shard rolls so that every slot accepts both, {} then holds {}, and a second roll makes the slots refuse {}",
                request.unwrap_or_default(),
                new.id,
                old.id,
                kubeconfig.display(),
                new.id,
                old.id
            ),
        ),
    };
    record.identities.push(new);
    record.rotation_request = request.map(str::to_string);
    record.retiring = false;
    state::write_json(&dirs.identities(), &record)?;
    Ok(note)
}

/// UpdateIdentities: the record becomes `next` (the plan's [`crate::controller::plan::next_record`]):
/// the rotation's second half begins, or identities no slot accepts any more are dropped, each
/// told in an event.
pub fn update(dirs: &ShardDirs, next: &IdentitiesObservation) -> Result<Vec<Note>, super::Error> {
    let mut record = load(dirs)?;
    let kubeconfig = dirs.front_kubeconfig();
    let mut notes = Vec::new();
    let newest = next.ids.last().cloned().unwrap_or_default();
    if next.retiring && !record.retiring {
        let old: Vec<&str> = record.identities[..record.identities.len() - 1]
            .iter()
            .map(|i| i.id.as_str())
            .collect();
        notes.push(Note::normal(
            "CredentialsRetiring",
            format!(
                "every slot accepts admin identity {newest}: the shard rolls to slots that refuse {}; kubeconfigs holding it are refused from that roll's switch on",
                old.join(", ")
            ),
        ));
    }
    let (kept, retired): (Vec<Identity>, Vec<Identity>) = std::mem::take(&mut record.identities)
        .into_iter()
        .partition(|i| next.ids.contains(&i.id));
    for old in &retired {
        notes.push(Note::normal(
            "CredentialsRetired",
            format!(
                "admin identity {} is no longer accepted: no slot accepts it any more, so kubeconfigs that hold it are refused (Unauthorized) from now on; {} holds admin identity {newest}",
                old.id,
                kubeconfig.display()
            ),
        ));
    }
    record.identities = kept;
    record.retiring = next.retiring;
    state::write_json(&dirs.identities(), &record)?;
    Ok(notes)
}

/// WriteKubeconfig, and SetFront when a slot first joins the front (so that the shard's first
/// Ready already comes with the file): writes the kubeconfig through the front for the identity
/// the plan picks ([`for_kubeconfig`]) when its bytes would change.
pub fn write_kubeconfig(dirs: &ShardDirs, observed: &Observed, front_url: &str) -> Result<Option<Note>, super::Error> {
    let record = load(dirs)?;
    let Some(identity) = picked(&record, observed) else {
        return Ok(None);
    };
    let Some(yaml) = render_kubeconfig(dirs, front_url, identity)? else {
        return Ok(None);
    };
    let path = dirs.front_kubeconfig();
    if fsutil::read_optional(&path)?.as_deref() == Some(yaml.as_bytes()) {
        return Ok(None);
    }
    fsutil::write_atomically(&path, yaml.as_bytes())?;
    Ok(Some(Note::normal(
        "KubeconfigWritten",
        format!(
            "wrote {} for admin identity {}: contexts root and base reach kcp through the front as kcp-admin on every slot, across rolls, until the identity is rotated",
            path.display(),
            identity.id
        ),
    )))
}

/// For observe: the kubeconfig through the front would change if written now.
pub fn kubeconfig_stale(
    dirs: &ShardDirs,
    record: &IdentityRecord,
    observed: &Observed,
    front_url: &str,
) -> std::io::Result<bool> {
    let Some(identity) = picked(record, observed) else {
        return Ok(false);
    };
    let Some(yaml) = render_kubeconfig(dirs, front_url, identity)? else {
        return Ok(false);
    };
    Ok(fsutil::read_optional(&dirs.front_kubeconfig())?.as_deref() != Some(yaml.as_bytes()))
}

/// The identity of `record` that [`for_kubeconfig`] picks.
fn picked<'r>(record: &'r IdentityRecord, observed: &Observed) -> Option<&'r Identity> {
    let id = for_kubeconfig(&observe(Some(record)), observed)?.to_string();
    record.identities.iter().find(|i| i.id == id)
}

/// Writes the `--token-auth-file` of a slot that is to accept the identities `ids`, from the
/// shard's record, the lines `also` (a sharded kcp's: controller/sharding.rs), and the tokens an
/// adopted kcp accepted (controller/adoption.rs).
pub fn write_token_file(dirs: &ShardDirs, ids: &[String], also: &str, path: &Path) -> Result<(), super::Error> {
    let adopted = fsutil::read_optional(&dirs.shared().join(super::adoption::ADOPTED_TOKENS))?.unwrap_or_default();
    let also = format!("{also}{}", String::from_utf8_lossy(&adopted));
    let record = state::read_json::<IdentityRecord>(&dirs.identities())?.unwrap_or_default();
    let identities = ids
        .iter()
        .map(|id| {
            record
                .identities
                .iter()
                .find(|i| &i.id == id)
                .ok_or_else(|| super::Error::UnknownIdentity {
                    id: id.clone(),
                    record: dirs.identities(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    identity::write_token_file(path, &identities, &also)?;
    Ok(())
}

/// The kubeconfig through the front for `identity`. None before the first slot has made the
/// shard's CA and shard-admin token (in `shared/`).
fn render_kubeconfig(dirs: &ShardDirs, front_url: &str, identity: &Identity) -> std::io::Result<Option<String>> {
    let shared = dirs.shared();
    let Some(ca_pem) = fsutil::read_optional(&shared.join("apiserver.crt"))? else {
        return Ok(None);
    };
    let Some(shard_admin_token) =
        fsutil::read_optional(&shared.join(ADMIN_KUBECONFIG))?.and_then(|kc| identity::shard_admin_token(&kc))
    else {
        return Ok(None);
    };
    Ok(Some(
        FrontKubeconfig {
            front_url,
            ca_pem: &ca_pem,
            identity,
            shard_admin_token: &shard_admin_token,
        }
        .render(),
    ))
}

/// The [`CONDITION`] condition: True while a rotation is under way, with the roll it waits for.
pub fn verdict(
    identities: &IdentitiesObservation,
    request: Option<&str>,
    accepted: &[String],
    kubeconfig: &Path,
) -> Option<Verdict> {
    let newest = identities.ids.last()?;
    let kubeconfig = kubeconfig.display();
    let issued_for = match &identities.rotation_request {
        Some(request) => format!("rotation request {request}"),
        None => "made with the shard".into(),
    };
    if identities.ids.len() == 1 {
        return Some(Verdict {
            type_: CONDITION,
            status: false,
            reason: "IdentityCurrent".into(),
            message: format!("the slots accept admin identity {newest} ({issued_for}), which {kubeconfig} holds"),
        });
    }
    let old = identities.ids[..identities.ids.len() - 1].join(", ");
    let (reason, mut message) = if accepted.len() > 1 {
        (
            "AcceptingBoth",
            format!(
                "rotating to admin identity {newest} ({issued_for}): roll 1 of 2 makes every slot accept both {old} and {newest}; {kubeconfig} holds {newest} once every slot taking connections does"
            ),
        )
    } else {
        (
            "RetiringOld",
            format!(
                "rotating to admin identity {newest} ({issued_for}): {kubeconfig} holds {newest}; roll 2 of 2 makes the slots refuse {old}"
            ),
        )
    };
    if let Some(next) = request.filter(|r| Some(*r) != identities.rotation_request.as_deref()) {
        message.push_str(&format!("; rotation request {next} follows once this one is done"));
    }
    Some(Verdict {
        type_: CONDITION,
        status: true,
        reason: reason.into(),
        message,
    })
}

#[cfg(test)]
mod tests;
