//! Who holds the controllers' Lease, in terms of slots.
//!
//! kcp's leader election identity is `<hostname>_<uuid>`, new at every start
//! (`pkg/server/server.go:686-690` in kcp v0.31), and its election loop logs it before it first
//! tries to lead: `"(re-)starting leader election" ... identity="<id>"` (`server.go:756-767`, at the
//! default verbosity). The post-start hook that runs the election returns before `/readyz` turns
//! ok, so every slot that ever answered `/readyz` has logged its identity. Matching the Lease's
//! `spec.holderIdentity` against those lines says which slot leads. A holder that is no slot's,
//! while every running slot's identity is known, is a process that is gone: nothing can renew it.
use std::path::Path;

use super::plan::LeaseHolder;

/// The line kcp's election loop logs first, with its identity.
const ELECTION_STARTS: &str = "(re-)starting leader election";
/// What the process runtime writes to a log before each start.
const START_MARKER: &str = "--- kcpshard: starting ";

/// The identity the latest kcp started with this log logged, if it has yet.
pub fn identity_in_log(log: &Path) -> Option<String> {
    let text = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(&text);
    let latest = text.rfind(START_MARKER).map_or(&text[..], |at| &text[at..]);
    latest
        .lines()
        .find(|line| line.contains(ELECTION_STARTS))
        .and_then(|line| line.split_once("identity=\""))
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(id, _)| id.to_string())
}

/// The holder, as the plan reads it. `identities` are (slot, its identity if known, whether it
/// runs).
pub fn holder(holder_identity: Option<&str>, identities: &[(String, Option<String>, bool)]) -> LeaseHolder {
    let Some(holder) = holder_identity else {
        return LeaseHolder::Free;
    };
    if let Some((slot, _, _)) = identities.iter().find(|(_, id, _)| id.as_deref() == Some(holder)) {
        return LeaseHolder::Slot(slot.clone());
    }
    if identities.iter().all(|(_, id, running)| id.is_some() || !running) {
        LeaseHolder::Gone
    } else {
        LeaseHolder::Unmatched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_the_one_the_latest_start_logged() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("kcp.log");
        std::fs::write(
            &log,
            concat!(
                "--- kcpshard: starting slot-a at 2026-12-01T10:00:00Z: bin/kcp start\n",
                "I1201 10:00:03.1 1 server.go:767] \"(re-)starting leader election\" postStartHook=\"kcp-start-controllers\" identity=\"host_1111\" namespace=\"kube-system\" name=\"kcp-controllers\"\n",
                "--- kcpshard: starting slot-a at 2026-12-01T11:00:00Z: bin/kcp start\n",
                "I1201 11:00:01.0 2 server.go:100] \"starting\"\n",
            ),
        )
        .unwrap();
        assert_eq!(
            identity_in_log(&log),
            None,
            "the process running now has not logged yet"
        );
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str("I1201 11:00:03.2 2 server.go:767] \"(re-)starting leader election\" identity=\"host_2222\" name=\"kcp-controllers\"\n");
        std::fs::write(&log, text).unwrap();
        assert_eq!(identity_in_log(&log).as_deref(), Some("host_2222"));
        assert_eq!(identity_in_log(&dir.path().join("missing.log")), None);
    }

    #[test]
    fn a_holder_is_a_slot_a_gone_process_or_unknown_while_a_running_slot_has_not_said() {
        let slots = vec![
            ("a".to_string(), Some("h_1".to_string()), false),
            ("b".to_string(), Some("h_2".to_string()), true),
        ];
        assert_eq!(holder(None, &slots), LeaseHolder::Free);
        assert_eq!(holder(Some("h_1"), &slots), LeaseHolder::Slot("a".into()));
        assert_eq!(holder(Some("h_9"), &slots), LeaseHolder::Gone);
        let mut starting = slots.clone();
        starting.push(("c".into(), None, true));
        assert_eq!(holder(Some("h_9"), &starting), LeaseHolder::Unmatched);
        starting[2].2 = false;
        assert_eq!(
            holder(Some("h_9"), &starting),
            LeaseHolder::Gone,
            "a slot that is gone cannot renew"
        );
    }
}
