//! Who holds the controllers' Lease, in terms of slots.
//!
//! kcp's leader election identity is `<hostname>_<uuid>`, new at every start
//! (`pkg/server/server.go:686-690` in kcp v0.31), and its election loop logs it before it first
//! tries to lead: `"(re-)starting leader election" ... identity="<id>"` (`server.go:756-767`, at the
//! default verbosity). The post-start hook that runs the election returns before `/readyz` turns
//! ok, so every slot that ever answered `/readyz` has logged its identity. Matching the Lease's
//! `spec.holderIdentity` against those lines says which slot leads. A holder that is no slot's,
//! while every running slot's identity is known, is a process that is gone: nothing can renew it.
use super::plan::LeaseHolder;

/// The line kcp's election loop logs first, with its identity.
const ELECTION_STARTS: &str = "(re-)starting leader election";

/// The identity in what one kcp process printed since it started, if it has logged it yet.
pub fn identity_in_log(since_start: &str) -> Option<String> {
    since_start
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
    fn the_identity_is_the_one_kcp_logged_when_its_election_started() {
        let mut log = String::from("--- kcpshard: starting slot-a at 2026-12-01T11:00:00Z: bin/kcp start\n");
        log.push_str("I1201 11:00:01.0 2 server.go:100] \"starting\"\n");
        assert_eq!(identity_in_log(&log), None, "not logged yet");
        log.push_str(concat!(
            "I1201 11:00:03.2 2 server.go:767] \"(re-)starting leader election\" postStartHook=\"kcp-start-controllers\" ",
            "identity=\"host_2222\" namespace=\"kube-system\" name=\"kcp-controllers\"\n"
        ));
        assert_eq!(identity_in_log(&log).as_deref(), Some("host_2222"));
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
