//! The identity steps as the controller takes them: the plan's decisions (plan/identities.rs)
//! and what their steps write.
use super::*;
use crate::controller::plan::{
    self, Desired, RollRecord, SlotObservation, Step, accepted, identities_step, next_record, retiring,
};
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

fn record(ids: &[&str]) -> IdentitiesObservation {
    IdentitiesObservation {
        ids: ids.iter().map(|id| id.to_string()).collect(),
        ..Default::default()
    }
}

/// `o` with the record `r`.
fn seen(r: &IdentitiesObservation, mut o: Observed) -> Observed {
    o.identities = r.clone();
    o
}

fn desired(ids: Vec<String>) -> Desired {
    let mut d = plan::tests::desired("v0.31.2");
    d.template.accepted_identities = ids;
    d
}

#[test]
fn without_a_rotation_the_slots_accept_the_one_identity_and_nothing_rolls() {
    let r = record(&["old"]);
    let o = seen(&r, observed("a", vec![slot("a", &["old"])], None));
    assert_eq!(accepted(&r, &o), vec!["old"]);
    assert_eq!(plan::plan(&desired(accepted(&r, &o)), &o), Step::Idle);
    assert_eq!(for_kubeconfig(&r, &o).unwrap(), "old");
}

#[test]
fn a_rotation_rolls_twice_and_the_kubeconfig_moves_when_every_listening_slot_accepts_the_new() {
    let r = record(&["old", "new"]);
    // Requested: every slot is to accept both; the shard rolls.
    let o = seen(&r, observed("a", vec![slot("a", &["old"])], None));
    assert_eq!(accepted(&r, &o), vec!["old", "new"]);
    assert_eq!(
        plan::plan(&desired(accepted(&r, &o)), &o),
        Step::StartSlot { name: "b".into() }
    );
    assert_eq!(for_kubeconfig(&r, &o).unwrap(), "old");
    // Roll 1 under way: both still; the kubeconfig stays old while slot a listens.
    let mut o = seen(
        &r,
        observed("b", vec![slot("a", &["old"]), slot("b", &["old", "new"])], Some(roll())),
    );
    assert_eq!(accepted(&r, &o), vec!["old", "new"]);
    assert_eq!(for_kubeconfig(&r, &o).unwrap(), "old");
    // Slot a stopped listening: every slot that takes connections accepts the new one.
    stopped_listening(&mut o, "a");
    assert_eq!(for_kubeconfig(&r, &o).unwrap(), "new");
    // ...but the roll finishes before the second one starts.
    assert_eq!(accepted(&r, &o), vec!["old", "new"]);
    // Roll 1 done: the new one alone; roll 2 starts.
    let o = seen(&r, observed("b", vec![slot("b", &["old", "new"])], None));
    assert!(retiring(&r, &o));
    assert_eq!(accepted(&r, &o), vec!["new"]);
    // The record says that the second half began first (else, once roll 2 is under way, the
    // plan would start a third slot for both identities), then roll 2 starts.
    assert_eq!(plan::plan(&desired(accepted(&r, &o)), &o), Step::UpdateIdentities);
    let r = next_record(&r, &o);
    assert!(r.retiring);
    let o = seen(&r, o);
    assert_eq!(
        plan::plan(&desired(accepted(&r, &o)), &o),
        Step::StartSlot { name: "a".into() }
    );
    assert_eq!(for_kubeconfig(&r, &o).unwrap(), "new");
    // Roll 2 under way: the old slot still accepts the old identity, so the record keeps it.
    let o = seen(
        &r,
        observed("a", vec![slot("b", &["old", "new"]), slot("a", &["new"])], Some(roll())),
    );
    assert_eq!(accepted(&r, &o), vec!["new"]);
    assert_eq!(
        plan::plan(&desired(accepted(&r, &o)), &o),
        Step::TerminateSlot { name: "b".into() }
    );
    assert_eq!(for_kubeconfig(&r, &o).unwrap(), "new");
}

#[test]
fn a_slot_from_before_identities_keeps_the_kubeconfig_until_it_stops_listening() {
    let r = record(&["first"]);
    let mut o = seen(
        &r,
        observed("b", vec![slot("a", &[]), slot("b", &["first"])], Some(roll())),
    );
    assert!(for_kubeconfig(&r, &o).is_none());
    stopped_listening(&mut o, "a");
    assert_eq!(for_kubeconfig(&r, &o).unwrap(), "first");
    assert!(for_kubeconfig(&r, &seen(&r, observed("a", vec![], None))).is_none());
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

const FRONT: &str = "https://127.0.0.1:6443";

/// What the looks of the controller did until the identity steps had nothing more to do.
struct Settled {
    steps: Vec<Step>,
    notes: Vec<Note>,
    /// The ids every slot must accept.
    accepted: Vec<String>,
    verdict: Verdict,
}

impl Settled {
    fn reasons(&self) -> Vec<&str> {
        self.notes.iter().map(|n| n.reason).collect()
    }
}

/// Looks as the controller takes them, with slots as in `slots` and the rotation request
/// `request`: observe the record and the kubeconfig, plan, and take the identity step planned.
fn settle(dirs: &ShardDirs, request: Option<&str>, slots: &Observed) -> Settled {
    let mut desired = plan::tests::desired("v0.31.2");
    desired.rotation_request = request.map(str::to_string);
    let (mut steps, mut notes) = (vec![], vec![]);
    loop {
        let record = load(dirs).unwrap();
        let mut o = slots.clone();
        o.identities = observe(Some(&record));
        o.identities.kubeconfig_stale = kubeconfig_stale(dirs, &record, &o, FRONT).unwrap();
        let Some(step) = identities_step(&desired, &o) else {
            let accepted = accepted(&o.identities, &o);
            let verdict = verdict(&o.identities, request, &accepted, &dirs.front_kubeconfig()).unwrap();
            return Settled {
                steps,
                notes,
                accepted,
                verdict,
            };
        };
        assert!(steps.len() < 5, "the identity steps do not settle: {steps:?}");
        match &step {
            Step::IssueIdentity => notes.push(issue(dirs, request, Utc::now()).unwrap()),
            Step::UpdateIdentities => notes.extend(update(dirs, &next_record(&o.identities, &o)).unwrap()),
            Step::WriteKubeconfig => notes.extend(write_kubeconfig(dirs, &o, FRONT).unwrap()),
            other => panic!("not an identity step: {other:?}"),
        }
        steps.push(step);
    }
}

#[test]
fn the_identity_is_made_once_kept_private_and_the_kubeconfig_written_once_and_only_when_it_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = ShardDirs::new(tmp.path(), "dev");
    let none = observed("a", vec![], None);
    let first = settle(&dirs, None, &none);
    assert_eq!(first.steps, vec![Step::IssueIdentity]);
    assert_eq!(first.reasons(), vec!["AdminIdentityIssued"]);
    assert_eq!(first.accepted.len(), 1);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dirs.identities()), 0o600);
    assert_eq!(mode(&dirs.shared()), 0o700);
    // No slot serves yet: no kubeconfig.
    assert!(!dirs.front_kubeconfig().exists());
    assert!(!first.verdict.status);

    // Nothing to do on later looks.
    let id = first.accepted[0].clone();
    let serving = observed("a", vec![slot("a", &[&id])], None);
    let again = settle(&dirs, None, &serving);
    assert_eq!(again.accepted, vec![id.clone()]);
    // The first slot made the CA and shard admin: the kubeconfig is written, once.
    assert!(again.steps.is_empty());
    material(&dirs);
    let written = settle(&dirs, None, &serving);
    assert_eq!(written.steps, vec![Step::WriteKubeconfig]);
    assert_eq!(written.reasons(), vec!["KubeconfigWritten"]);
    assert_eq!(mode(&dirs.front_kubeconfig()), 0o600);
    let bytes = std::fs::read(dirs.front_kubeconfig()).unwrap();
    let modified = std::fs::metadata(dirs.front_kubeconfig()).unwrap().modified().unwrap();
    // A restart roll (another template, the same identities) leaves the file alone.
    let mut restarted = slot("b", &[&id]);
    restarted.template.restarted_at = Some("now".into());
    let rolling = observed("b", vec![slot("a", &[&id]), restarted], Some(roll()));
    assert!(settle(&dirs, None, &rolling).steps.is_empty());
    assert_eq!(std::fs::read(dirs.front_kubeconfig()).unwrap(), bytes);
    assert_eq!(
        std::fs::metadata(dirs.front_kubeconfig()).unwrap().modified().unwrap(),
        modified
    );
    let record = load(&dirs).unwrap();
    let yaml = String::from_utf8(bytes).unwrap();
    assert!(yaml.contains(record.identities[0].token()), "{yaml}");
    assert!(yaml.contains("shard-admin-token"));
    // The front moved: the kubeconfig follows.
    let mut desired = plan::tests::desired("v0.31.2");
    desired.template.front_url = "https://127.0.0.1:7443".into();
    let mut o = serving.clone();
    o.identities = observe(Some(&record));
    o.identities.kubeconfig_stale = kubeconfig_stale(&dirs, &record, &o, "https://127.0.0.1:7443").unwrap();
    assert_eq!(identities_step(&desired, &o), Some(Step::WriteKubeconfig));
}

#[test]
fn a_rotation_request_issues_one_new_identity_and_the_old_one_is_retired_with_an_event_once_no_slot_accepts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = ShardDirs::new(tmp.path(), "dev");
    material(&dirs);
    let old = settle(&dirs, None, &observed("a", vec![], None)).accepted[0].clone();
    let before = observed("a", vec![slot("a", &[&old])], None);
    settle(&dirs, None, &before);
    let kubeconfig_before = std::fs::read(dirs.front_kubeconfig()).unwrap();

    let request = Some("2026-12-01T10:00:00Z");
    let rotating = settle(&dirs, request, &before);
    assert_eq!(rotating.reasons(), vec!["CredentialsRotating"]);
    assert_eq!(rotating.accepted.len(), 2);
    assert_eq!(rotating.accepted[0], old);
    let new = rotating.accepted[1].clone();
    assert!(rotating.verdict.status);
    assert_eq!(rotating.verdict.reason, "AcceptingBoth");
    assert!(rotating.verdict.message.contains("2026-12-01T10:00:00Z"));
    // The kubeconfig stays old while a slot that takes connections refuses the new one.
    assert_eq!(std::fs::read(dirs.front_kubeconfig()).unwrap(), kubeconfig_before);
    // The same request again issues nothing more; another one waits for this one.
    let again = settle(&dirs, request, &before);
    assert!(again.steps.is_empty());
    assert_eq!(again.accepted, vec![old.clone(), new.clone()]);
    let waiting = settle(&dirs, Some("later"), &before);
    assert_eq!(waiting.accepted.len(), 2);
    assert!(waiting.verdict.message.contains("rotation request later follows"));

    // Roll 1 done: the kubeconfig holds the new identity; roll 2 is asked for.
    let both = observed("b", vec![slot("b", &[&old, &new])], None);
    let second = settle(&dirs, request, &both);
    assert_eq!(second.accepted, vec![new.clone()]);
    assert_eq!(second.reasons(), vec!["CredentialsRetiring", "KubeconfigWritten"]);
    assert_eq!(second.verdict.reason, "RetiringOld");
    let record = load(&dirs).unwrap();
    let yaml = std::fs::read_to_string(dirs.front_kubeconfig()).unwrap();
    assert!(yaml.contains(record.identities[1].token()) && !yaml.contains(record.identities[0].token()));

    // Roll 2 under way: the old slot still accepts the old one, so it stays.
    let mid = observed("a", vec![slot("b", &[&old, &new]), slot("a", &[&new])], Some(roll()));
    assert!(settle(&dirs, request, &mid).steps.is_empty());
    // Slot b gone: the old identity is retired, said in an event naming it, not its token.
    let after = observed("a", vec![slot("a", &[&new])], Some(roll()));
    let done = settle(&dirs, request, &after);
    assert_eq!(done.reasons(), vec!["CredentialsRetired"]);
    assert!(done.notes[0].message.contains(&old));
    assert!(!done.verdict.status);
    assert!(done.verdict.message.contains("rotation request 2026-12-01T10:00:00Z"));
    let record = load(&dirs).unwrap();
    assert_eq!(record.ids(), vec![new.clone()]);
    for note in rotating.notes.iter().chain(&second.notes).chain(&done.notes) {
        assert!(!note.message.contains(record.identities[0].token()));
    }
}

#[test]
fn a_shard_made_with_the_annotation_set_does_not_rotate_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = ShardDirs::new(tmp.path(), "dev");
    let none = observed("a", vec![], None);
    let first = settle(&dirs, Some("t0"), &none);
    let again = settle(&dirs, Some("t0"), &none);
    assert_eq!(first.steps, vec![Step::IssueIdentity]);
    assert_eq!(first.accepted, again.accepted);
    assert!(again.steps.is_empty());
    assert!(!again.verdict.status);
    assert!(again.verdict.message.contains("rotation request t0"));
}
