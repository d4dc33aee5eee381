//! kcpshard's admin identity for a shard, as the controller keeps it (docs/architecture.md, "The
//! admin identity"; the identity itself and its files: `slot/identity.rs`).
//!
//! [`reconcile`] runs every look, after observe and before the plan, and:
//! - makes the identity once per shard (`shared/admin-identities.json`, 0600);
//! - takes up a rotation request (a new `kcpshard.io/rotateCredentialsAt`): a new identity is
//!   issued beside the old one, one rotation at a time;
//! - decides which identities every slot must accept ([`accepted`]): that list is the slot
//!   template's `acceptedIdentities`, so a change rolls the shard. During a rotation: the old and
//!   the new, until no roll is under way and every running slot accepts the new one; from then on
//!   the new one alone (the second roll);
//! - writes `shards/<name>/admin.kubeconfig` with the newest identity that every slot still
//!   listening accepts ([`for_kubeconfig`]), only when its bytes would change: a roll that keeps
//!   the identities leaves the file as it is, so a copy taken before the roll works after it;
//! - retires an old identity once no slot accepts it and says so in an event: from then on it is
//!   refused.
//!
//! Invariants: a slot only starts with identities the record holds (the record is written before
//! the plan can start a slot with a new one); the kubeconfig never names an identity that a slot
//! taking new connections refuses; the token appears in no status, event or log line (events and
//! the condition name the identity's id).
use std::path::Path;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use super::Note;
use super::conditions::Verdict;
use super::plan::{Observed, SlotObservation};
use super::state::{self, ShardDirs};
use crate::api::{KcpShard, ROTATE_CREDENTIALS_ANNOTATION};
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
    fn newest(&self) -> &Identity {
        self.identities.last().expect("a shard's record has an identity")
    }

    fn ids(&self) -> Vec<String> {
        self.identities.iter().map(|i| i.id.clone()).collect()
    }

    /// What the newest identity was issued for, as the condition and events say it.
    fn issued_for(&self) -> String {
        match &self.rotation_request {
            Some(request) => format!("rotation request {request}"),
            None => "made with the shard".into(),
        }
    }
}

/// What [`reconcile`] decided.
#[derive(Debug)]
pub struct Credentials {
    /// The ids every slot must accept: the desired template's `acceptedIdentities`.
    pub accepted: Vec<String>,
    /// What changed, for events.
    pub notes: Vec<Note>,
    /// The [`CONDITION`] condition.
    pub verdict: Verdict,
}

/// Whether a rotation is in its second half: it was already, or no roll is in progress and every
/// running slot accepts the newest identity. A roll in progress finishes first: changing its
/// target would leave it without its RollComplete.
pub fn retiring(record: &IdentityRecord, observed: &Observed) -> bool {
    let newest = &record.newest().id;
    record.retiring
        || (observed.roll.is_none()
            && observed
                .slots
                .iter()
                .filter(|s| s.running)
                .all(|s| s.template.accepted_identities.contains(newest)))
}

/// The identities every slot must accept, oldest first: all the record holds in a rotation's
/// first half, the newest alone otherwise.
pub fn accepted(record: &IdentityRecord, observed: &Observed) -> Vec<String> {
    if record.identities.len() == 1 || retiring(record, observed) {
        vec![record.newest().id.clone()]
    } else {
        record.ids()
    }
}

/// The identity the kubeconfig through the front must carry: the newest one that every slot still
/// listening accepts (the roll's old slot, once it stopped listening after SIGTERM, takes no new
/// connection). None when no slot listens, or one accepts none of the record's (a slot started
/// before kcpshard had identities): the file stays as it is.
pub fn for_kubeconfig<'r>(record: &'r IdentityRecord, observed: &Observed) -> Option<&'r Identity> {
    let stopped_listening = |s: &SlotObservation| s.stopping() && !s.listening;
    let listening: Vec<&SlotObservation> = observed
        .slots
        .iter()
        .filter(|s| s.running && !stopped_listening(s))
        .collect();
    if listening.is_empty() {
        return None;
    }
    record
        .identities
        .iter()
        .rev()
        .find(|i| listening.iter().all(|s| s.template.accepted_identities.contains(&i.id)))
}

/// One look's worth of identity keeping (see the module doc). `front_url` is the URL the
/// kubeconfig names (the desired template's).
pub fn reconcile(
    dirs: &ShardDirs,
    shard: &KcpShard,
    observed: &Observed,
    front_url: &str,
    now: DateTime<Utc>,
) -> Result<Credentials, super::Error> {
    let path = dirs.identities();
    let request = shard.annotations().get(ROTATE_CREDENTIALS_ANNOTATION).cloned();
    let kubeconfig = dirs.front_kubeconfig();
    let mut notes = Vec::new();
    let stored = state::read_json::<IdentityRecord>(&path)?.filter(|r| !r.identities.is_empty());
    let mut record = stored.clone().unwrap_or_default();
    if record.identities.is_empty() {
        let first = Identity::issue(now)?;
        notes.push(Note::normal(
            "AdminIdentityIssued",
            format!(
                "issued admin identity {} for the shard; {} carries it once a slot that accepts it serves",
                first.id,
                kubeconfig.display()
            ),
        ));
        record.identities.push(first);
        record.rotation_request = request.clone();
    } else if request.is_some() && request != record.rotation_request && record.identities.len() == 1 {
        let new = Identity::issue(now)?;
        notes.push(Note::normal(
            "CredentialsRotating",
            format!(
                "rotation request {}: issued admin identity {} to replace {}; the shard rolls so that every slot accepts both, {} then holds {}, and a second roll makes the slots refuse {}",
                request.as_deref().unwrap_or_default(),
                new.id,
                record.newest().id,
                kubeconfig.display(),
                new.id,
                record.newest().id
            ),
        ));
        record.identities.push(new);
        record.rotation_request = request.clone();
        record.retiring = false;
    }
    let was_retiring = record.retiring;
    record.retiring = record.identities.len() > 1 && retiring(&record, observed);
    if record.retiring && !was_retiring {
        let old: Vec<&str> = record.identities[..record.identities.len() - 1]
            .iter()
            .map(|i| i.id.as_str())
            .collect();
        notes.push(Note::normal(
            "CredentialsRetiring",
            format!(
                "every slot accepts admin identity {}: the shard rolls to slots that refuse {}; kubeconfigs holding it are refused from that roll's switch on",
                record.newest().id,
                old.join(", ")
            ),
        ));
    }
    let accepted = accepted(&record, observed);
    let newest = record.newest().id.clone();
    let still_accepted = |id: &str| {
        accepted.iter().any(|a| a == id)
            || observed
                .slots
                .iter()
                .any(|s| s.template.accepted_identities.iter().any(|a| a == id))
    };
    let (kept, retired): (Vec<Identity>, Vec<Identity>) = std::mem::take(&mut record.identities)
        .into_iter()
        .partition(|i| i.id == newest || still_accepted(&i.id));
    record.identities = kept;
    record.retiring &= record.identities.len() > 1;
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
    // The record first: a slot may only start with identities the record holds.
    if stored.as_ref() != Some(&record) {
        state::write_json(&path, &record)?;
    }
    if let Some(identity) = for_kubeconfig(&record, observed)
        && let Some(note) = write_kubeconfig(dirs, front_url, identity)?
    {
        notes.push(note);
    }
    let verdict = verdict(&record, request.as_deref(), &accepted, &kubeconfig);
    Ok(Credentials {
        accepted,
        notes,
        verdict,
    })
}

/// Writes the kubeconfig through the front now if what it must hold changed: called when a slot
/// first joins the front, so that the shard's first Ready already comes with the file (the shard's
/// CA and shard-admin token exist from then on).
pub fn renew_kubeconfig(dirs: &ShardDirs, observed: &Observed, front_url: &str) -> Result<Option<Note>, super::Error> {
    let Some(record) = state::read_json::<IdentityRecord>(&dirs.identities())? else {
        return Ok(None);
    };
    match for_kubeconfig(&record, observed) {
        Some(identity) => Ok(write_kubeconfig(dirs, front_url, identity)?),
        None => Ok(None),
    }
}

/// Writes the `--token-auth-file` of a slot that is to accept the identities `ids`, from the
/// shard's record, and the lines `also` (a sharded kcp's: controller/sharding.rs).
pub fn write_token_file(dirs: &ShardDirs, ids: &[String], also: &str, path: &Path) -> Result<(), super::Error> {
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
    identity::write_token_file(path, &identities, also)?;
    Ok(())
}

/// Writes the kubeconfig through the front for `identity` when its bytes would change. Nothing
/// before the first slot has made the shard's CA and shard-admin token (in `shared/`).
fn write_kubeconfig(dirs: &ShardDirs, front_url: &str, identity: &Identity) -> std::io::Result<Option<Note>> {
    let shared = dirs.shared();
    let Some(ca_pem) = fsutil::read_optional(&shared.join("apiserver.crt"))? else {
        return Ok(None);
    };
    let Some(shard_admin_token) =
        fsutil::read_optional(&shared.join(ADMIN_KUBECONFIG))?.and_then(|kc| identity::shard_admin_token(&kc))
    else {
        return Ok(None);
    };
    let yaml = FrontKubeconfig {
        front_url,
        ca_pem: &ca_pem,
        identity,
        shard_admin_token: &shard_admin_token,
    }
    .render();
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

/// The [`CONDITION`] condition: True while a rotation is under way, with the roll it waits for.
fn verdict(record: &IdentityRecord, request: Option<&str>, accepted: &[String], kubeconfig: &Path) -> Verdict {
    let newest = &record.newest().id;
    let kubeconfig = kubeconfig.display();
    let issued_for = record.issued_for();
    if record.identities.len() == 1 {
        return Verdict {
            type_: CONDITION,
            status: false,
            reason: "IdentityCurrent".into(),
            message: format!("the slots accept admin identity {newest} ({issued_for}), which {kubeconfig} holds"),
        };
    }
    let old = record.identities[..record.identities.len() - 1]
        .iter()
        .map(|i| i.id.as_str())
        .collect::<Vec<_>>()
        .join(", ");
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
    if let Some(next) = request.filter(|r| Some(*r) != record.rotation_request.as_deref()) {
        message.push_str(&format!("; rotation request {next} follows once this one is done"));
    }
    Verdict {
        type_: CONDITION,
        status: true,
        reason: reason.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::plan::{self, Desired, RollRecord, Step};
    use std::os::unix::fs::PermissionsExt;

    fn slot(name: &str, ids: &[&str]) -> SlotObservation {
        let mut s = plan::tests::slot(name, "v0.31.2", true);
        s.template.accepted_identities = ids.iter().map(|s| s.to_string()).collect();
        s
    }

    fn observed(backend: &str, slots: Vec<SlotObservation>, roll: Option<RollRecord>) -> Observed {
        let mut o = plan::tests::observed(&[backend], slots);
        o.roll = roll;
        o
    }

    fn roll() -> RollRecord {
        RollRecord {
            to_version: "v0.31.2".into(),
            started_at: Utc::now(),
            ..Default::default()
        }
    }

    /// Slot `name` was sent SIGTERM and stopped listening: it takes no new connection.
    fn stopped_listening(o: &mut Observed, name: &str) {
        let s = o.slots.iter_mut().find(|s| s.name == name).unwrap();
        s.stop = Some(plan::StopRecord {
            cause: plan::StopCause::Retired,
            at: Utc::now(),
            killed: false,
        });
        s.listening = false;
    }

    fn record(ids: &[&str]) -> IdentityRecord {
        IdentityRecord {
            identities: ids
                .iter()
                .map(|id| {
                    let mut i = Identity::issue(Utc::now()).unwrap();
                    i.id = id.to_string();
                    i
                })
                .collect(),
            rotation_request: None,
            retiring: false,
        }
    }

    fn desired(ids: Vec<String>) -> Desired {
        let mut d = plan::tests::desired("v0.31.2");
        d.template.accepted_identities = ids;
        d
    }

    #[test]
    fn without_a_rotation_the_slots_accept_the_one_identity_and_nothing_rolls() {
        let r = record(&["old"]);
        let o = observed("a", vec![slot("a", &["old"])], None);
        assert_eq!(accepted(&r, &o), vec!["old"]);
        assert_eq!(plan::plan(&desired(accepted(&r, &o)), &o), Step::Idle);
        assert_eq!(for_kubeconfig(&r, &o).unwrap().id, "old");
    }

    #[test]
    fn a_rotation_rolls_twice_and_the_kubeconfig_moves_when_every_listening_slot_accepts_the_new() {
        let r = record(&["old", "new"]);
        // Requested: every slot is to accept both; the shard rolls.
        let o = observed("a", vec![slot("a", &["old"])], None);
        assert_eq!(accepted(&r, &o), vec!["old", "new"]);
        assert_eq!(
            plan::plan(&desired(accepted(&r, &o)), &o),
            Step::StartSlot { name: "b".into() }
        );
        assert_eq!(for_kubeconfig(&r, &o).unwrap().id, "old");
        // Roll 1 under way: both still; the kubeconfig stays old while slot a listens.
        let mut o = observed("b", vec![slot("a", &["old"]), slot("b", &["old", "new"])], Some(roll()));
        assert_eq!(accepted(&r, &o), vec!["old", "new"]);
        assert_eq!(for_kubeconfig(&r, &o).unwrap().id, "old");
        // Slot a stopped listening: every slot that takes connections accepts the new one.
        stopped_listening(&mut o, "a");
        assert_eq!(for_kubeconfig(&r, &o).unwrap().id, "new");
        // ...but the roll finishes before the second one starts.
        assert_eq!(accepted(&r, &o), vec!["old", "new"]);
        // Roll 1 done: the new one alone; roll 2 starts.
        let o = observed("b", vec![slot("b", &["old", "new"])], None);
        assert!(retiring(&r, &o));
        assert_eq!(accepted(&r, &o), vec!["new"]);
        assert_eq!(
            plan::plan(&desired(accepted(&r, &o)), &o),
            Step::StartSlot { name: "a".into() }
        );
        assert_eq!(for_kubeconfig(&r, &o).unwrap().id, "new");
        // Roll 2 under way: the record says the second half began, so it stays so (else the
        // plan would start a third slot for both identities).
        let mut r = r;
        r.retiring = true;
        let o = observed("a", vec![slot("b", &["old", "new"]), slot("a", &["new"])], Some(roll()));
        assert_eq!(accepted(&r, &o), vec!["new"]);
        assert_eq!(
            plan::plan(&desired(accepted(&r, &o)), &o),
            Step::TerminateSlot { name: "b".into() }
        );
        assert_eq!(for_kubeconfig(&r, &o).unwrap().id, "new");
    }

    #[test]
    fn a_slot_from_before_identities_keeps_the_kubeconfig_until_it_stops_listening() {
        let r = record(&["first"]);
        let mut o = observed("b", vec![slot("a", &[]), slot("b", &["first"])], Some(roll()));
        assert!(for_kubeconfig(&r, &o).is_none());
        stopped_listening(&mut o, "a");
        assert_eq!(for_kubeconfig(&r, &o).unwrap().id, "first");
        assert!(for_kubeconfig(&r, &observed("a", vec![], None)).is_none());
    }

    fn shard(annotations: &[(&str, &str)]) -> KcpShard {
        let mut shard: KcpShard = serde_json::from_value(serde_json::json!({
            "apiVersion": "kcpshard.io/v1alpha1",
            "kind": "KcpShard",
            "metadata": { "name": "dev" },
            "spec": { "version": "v0.31.2", "store": { "type": "KineSqlite" }, "front": { "type": "Tcp", "listen": "127.0.0.1:6443" } },
        }))
        .unwrap();
        shard.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        shard
    }

    fn material(dirs: &ShardDirs) {
        let shared = dirs.shared();
        fsutil::write_atomically(&shared.join("apiserver.crt"), b"-----BEGIN CERTIFICATE-----\n").unwrap();
        fsutil::write_atomically(
            &shared.join(ADMIN_KUBECONFIG),
            b"users:\n- name: shard-admin\n  user:\n    token: shard-admin-token\n",
        )
        .unwrap();
    }

    fn reasons(c: &Credentials) -> Vec<&str> {
        c.notes.iter().map(|n| n.reason).collect()
    }

    const FRONT: &str = "https://127.0.0.1:6443";

    #[test]
    fn the_identity_is_made_once_kept_private_and_the_kubeconfig_written_once_and_only_when_it_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(tmp.path(), "dev");
        let none = observed("a", vec![], None);
        let first = reconcile(&dirs, &shard(&[]), &none, FRONT, Utc::now()).unwrap();
        assert_eq!(reasons(&first), vec!["AdminIdentityIssued"]);
        assert_eq!(first.accepted.len(), 1);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dirs.identities()), 0o600);
        assert_eq!(mode(&dirs.shared()), 0o700);
        // No slot serves yet: no kubeconfig.
        assert!(!dirs.front_kubeconfig().exists());
        assert!(!first.verdict.status);

        // The same on every later look.
        let id = first.accepted[0].clone();
        let serving = observed("a", vec![slot("a", &[&id])], None);
        let again = reconcile(&dirs, &shard(&[]), &serving, FRONT, Utc::now()).unwrap();
        assert_eq!(again.accepted, vec![id.clone()]);
        // The first slot made the CA and shard admin: the kubeconfig is written, once.
        assert!(reasons(&again).is_empty());
        material(&dirs);
        let written = reconcile(&dirs, &shard(&[]), &serving, FRONT, Utc::now()).unwrap();
        assert_eq!(reasons(&written), vec!["KubeconfigWritten"]);
        assert_eq!(mode(&dirs.front_kubeconfig()), 0o600);
        let bytes = std::fs::read(dirs.front_kubeconfig()).unwrap();
        let modified = std::fs::metadata(dirs.front_kubeconfig()).unwrap().modified().unwrap();
        // A restart roll (another template, the same identities) leaves the file alone.
        let mut restarted = slot("b", &[&id]);
        restarted.template.restarted_at = Some("now".into());
        let rolling = observed("b", vec![slot("a", &[&id]), restarted], Some(roll()));
        let during = reconcile(&dirs, &shard(&[]), &rolling, FRONT, Utc::now()).unwrap();
        assert!(reasons(&during).is_empty());
        assert_eq!(std::fs::read(dirs.front_kubeconfig()).unwrap(), bytes);
        assert_eq!(
            std::fs::metadata(dirs.front_kubeconfig()).unwrap().modified().unwrap(),
            modified
        );
        let record: IdentityRecord = state::read_json(&dirs.identities()).unwrap().unwrap();
        let yaml = String::from_utf8(bytes).unwrap();
        assert!(yaml.contains(record.identities[0].token()), "{yaml}");
        assert!(yaml.contains("shard-admin-token"));
    }

    #[test]
    fn a_rotation_request_issues_one_new_identity_and_the_old_one_is_retired_with_an_event_once_no_slot_accepts_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(tmp.path(), "dev");
        material(&dirs);
        let first = reconcile(&dirs, &shard(&[]), &observed("a", vec![], None), FRONT, Utc::now()).unwrap();
        let old = first.accepted[0].clone();
        let before = observed("a", vec![slot("a", &[&old])], None);
        reconcile(&dirs, &shard(&[]), &before, FRONT, Utc::now()).unwrap();
        let kubeconfig_before = std::fs::read(dirs.front_kubeconfig()).unwrap();

        let request = [(ROTATE_CREDENTIALS_ANNOTATION, "2026-12-01T10:00:00Z")];
        let rotating = reconcile(&dirs, &shard(&request), &before, FRONT, Utc::now()).unwrap();
        assert_eq!(reasons(&rotating), vec!["CredentialsRotating"]);
        assert_eq!(rotating.accepted.len(), 2);
        assert_eq!(rotating.accepted[0], old);
        let new = rotating.accepted[1].clone();
        assert!(rotating.verdict.status);
        assert_eq!(rotating.verdict.reason, "AcceptingBoth");
        assert!(rotating.verdict.message.contains("2026-12-01T10:00:00Z"));
        // The kubeconfig stays old while a slot that takes connections refuses the new one.
        assert_eq!(std::fs::read(dirs.front_kubeconfig()).unwrap(), kubeconfig_before);
        // The same request again issues nothing more; another one waits for this one.
        let again = reconcile(&dirs, &shard(&request), &before, FRONT, Utc::now()).unwrap();
        assert!(reasons(&again).is_empty());
        assert_eq!(again.accepted, vec![old.clone(), new.clone()]);
        let later = [(ROTATE_CREDENTIALS_ANNOTATION, "later")];
        let waiting = reconcile(&dirs, &shard(&later), &before, FRONT, Utc::now()).unwrap();
        assert_eq!(waiting.accepted.len(), 2);
        assert!(waiting.verdict.message.contains("rotation request later follows"));

        // Roll 1 done: the kubeconfig holds the new identity; roll 2 is asked for.
        let both = observed("b", vec![slot("b", &[&old, &new])], None);
        let second = reconcile(&dirs, &shard(&request), &both, FRONT, Utc::now()).unwrap();
        assert_eq!(second.accepted, vec![new.clone()]);
        assert_eq!(reasons(&second), vec!["CredentialsRetiring", "KubeconfigWritten"]);
        assert_eq!(second.verdict.reason, "RetiringOld");
        let record: IdentityRecord = state::read_json(&dirs.identities()).unwrap().unwrap();
        let yaml = std::fs::read_to_string(dirs.front_kubeconfig()).unwrap();
        assert!(yaml.contains(record.identities[1].token()) && !yaml.contains(record.identities[0].token()));

        // Roll 2 under way: the old slot still accepts the old one, so it stays.
        let mid = observed("a", vec![slot("b", &[&old, &new]), slot("a", &[&new])], Some(roll()));
        assert!(reasons(&reconcile(&dirs, &shard(&request), &mid, FRONT, Utc::now()).unwrap()).is_empty());
        // Slot b gone: the old identity is retired, said in an event naming it, not its token.
        let after = observed("a", vec![slot("a", &[&new])], Some(roll()));
        let done = reconcile(&dirs, &shard(&request), &after, FRONT, Utc::now()).unwrap();
        assert_eq!(reasons(&done), vec!["CredentialsRetired"]);
        assert!(done.notes[0].message.contains(&old));
        assert!(!done.verdict.status);
        assert!(done.verdict.message.contains("rotation request 2026-12-01T10:00:00Z"));
        let record: IdentityRecord = state::read_json(&dirs.identities()).unwrap().unwrap();
        assert_eq!(record.ids(), vec![new.clone()]);
        for note in rotating.notes.iter().chain(&second.notes).chain(&done.notes) {
            assert!(!note.message.contains(record.identities[0].token()));
        }
    }

    #[test]
    fn a_shard_made_with_the_annotation_set_does_not_rotate_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = ShardDirs::new(tmp.path(), "dev");
        let request = [(ROTATE_CREDENTIALS_ANNOTATION, "t0")];
        let none = observed("a", vec![], None);
        let first = reconcile(&dirs, &shard(&request), &none, FRONT, Utc::now()).unwrap();
        let again = reconcile(&dirs, &shard(&request), &none, FRONT, Utc::now()).unwrap();
        assert_eq!(first.accepted, again.accepted);
        assert!(!again.verdict.status);
        assert!(again.verdict.message.contains("rotation request t0"));
    }
}
