//! Why a reconcile failed. Each kind has a label for the failure metric
//! (`kcpshard_controller_steps_total{result="..."}`), so the metric says which error it was.
//! A message that includes its cause keeps that cause out of `source()`, so that a chain printed
//! with `{:#}` says each cause once.
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::api::DurationError;
use crate::front::FrontError;
use crate::front::caddy::CaddyError;
use crate::process::ProcessError;
use crate::slot::{ArgsError, SlotError};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A request to a slot's kcp failed.
    #[error(transparent)]
    Slot(#[from] SlotError),
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// A duration of the spec that the schema's pattern let through does not parse.
    #[error("{field}: {cause}")]
    Duration { field: &'static str, cause: DurationError },
    #[error("spec.front.listen {value:?} is not an IP address and port ({cause}): write it as 127.0.0.1:6443")]
    FrontListen {
        value: String,
        cause: std::net::AddrParseError,
    },
    #[error("spec.front.type is Caddy but spec.front.caddy is missing: add adminAddress and upstreamId")]
    CaddyUnset,
    /// kcpshard's own front: starting, upgrading or telling it where to forward.
    #[error(transparent)]
    Front(#[from] FrontError),
    /// The user's caddy, through its admin API.
    #[error(transparent)]
    Caddy(#[from] CaddyError),
    #[error(
        "{cause} (the shard's certificate, key and CA for caddy's config are in {} once the first slot is ready)",
        shared.display()
    )]
    CaddyUnready { cause: CaddyError, shared: PathBuf },
    #[error("{}", front_address_message(*listen, holder.as_deref(), cause))]
    FrontAddress {
        listen: SocketAddr,
        /// The process that holds the address, when kcpshard can tell.
        holder: Option<String>,
        cause: std::io::Error,
    },
    /// A step that asks kcp through a serving slot found none.
    #[error("no slot answers /readyz")]
    NoServingSlot,
    #[error("slot {0} has no record (it was removed meanwhile); the next look starts over")]
    NoSuchSlot(String),
    #[error(
        "slot {slot}'s kcp (pid {pid}) runs without a slot record and its command line has no --secure-port to rebuild one from: stop it (kill {pid}) and the slot is started anew"
    )]
    Unadoptable { slot: String, pid: u32 },
    #[error(
        "admin identity {id}, which the slot is to accept, is not in {}: the controller makes it on its next look",
        record.display()
    )]
    UnknownIdentity { id: String, record: PathBuf },
    #[error(
        "the sharded kcp's system identity ({}) is missing: the root shard makes it on its next look",
        path.display()
    )]
    NoSystemIdentity { path: PathBuf },
    /// A preflight step found its record gone (removed meanwhile); the next look starts over.
    #[error("the preflight's record is gone; the next look starts over")]
    NoPreflight,
    /// A step that removes what a process used found it running again (started meanwhile).
    #[error("{what} (pid {pid}) runs again; the next look stops it first")]
    StillRunning { what: &'static str, pid: u32 },
    /// A step of a move of the data found no move under way (it ended meanwhile).
    #[error("no move of the data to another store is under way; the next look starts over")]
    NoMigration,
    /// An adoption step found no adoption under way (spec.adopt went, or it ended meanwhile).
    #[error("no adoption of a kcp is under way; the next look starts over")]
    NoAdoption,
    /// Only kcpshard's own (Tcp) front can take over an address another process listens on.
    #[error("spec.front.type is Caddy: only a Tcp front can take over the address the adopted kcp listens on")]
    FrontNotTcp,
    /// A restore step found the request annotation gone (removed meanwhile).
    #[error("the {annotation} annotation is gone; the restore is not started")]
    NoRestoreRequest { annotation: &'static str },
    /// A request to kcpshard's API about a KcpShard failed: what it was for, and kube's answer.
    #[error("cannot {what} of KcpShard {name}: {}", crate::errors::chain(cause))]
    Api {
        what: &'static str,
        name: String,
        cause: kube::Error,
    },
    /// A step's request (to kcp, PostgreSQL, etcd, caddy) was not answered in time
    /// (controller/requests.rs).
    #[error("{step} asked {about} and got no answer within {seconds} s; it asks again at its next try")]
    Unanswered {
        step: &'static str,
        about: String,
        seconds: u64,
    },
    /// A job (a dump, a restore of the store) failed: how, and what happens next.
    #[error("the {job} failed: {message}; {next}")]
    JobFailed {
        job: &'static str,
        message: String,
        next: &'static str,
    },
}

impl Error {
    /// The label of the failure metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Io(_) => "io",
            Error::Store(_) => "store",
            Error::JobFailed { .. } => "job",
            Error::Process(_) => "process",
            Error::Slot(_) => "kcp",
            Error::NoServingSlot => "no_serving_slot",
            Error::Args(_) | Error::Duration { .. } | Error::FrontListen { .. } | Error::CaddyUnset => "spec",
            Error::Front(_) => "front",
            Error::FrontAddress { .. } => "front_address",
            Error::Caddy(_) | Error::CaddyUnready { .. } => "caddy",
            Error::NoSuchSlot(_)
            | Error::Unadoptable { .. }
            | Error::UnknownIdentity { .. }
            | Error::NoSystemIdentity { .. }
            | Error::NoPreflight
            | Error::StillRunning { .. }
            | Error::NoRestoreRequest { .. }
            | Error::NoMigration
            | Error::NoAdoption
            | Error::FrontNotTcp => "state",
            Error::Api { .. } => "api",
            Error::Unanswered { .. } => "unanswered",
        }
    }
}

fn front_address_message(listen: SocketAddr, holder: Option<&str>, source: &std::io::Error) -> String {
    match source.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            "cannot listen on the front address {listen}: permission denied ({source}). A port below 1024 needs the CAP_NET_BIND_SERVICE capability (under systemd: AmbientCapabilities=CAP_NET_BIND_SERVICE in kcpshard.service) or root; or choose a spec.front.listen port from 1024 up"
        ),
        std::io::ErrorKind::AddrInUse => format!(
            "the front address {listen} is in use by {} ({source}): choose another spec.front.listen, or stop that process",
            holder.unwrap_or("a process this user cannot see")
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "cannot listen on the front address {listen}: no interface of this machine has that address ({source}); choose another spec.front.listen"
        ),
        _ => format!("cannot listen on the front address {listen}: {source}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_front_address_error_names_the_real_cause() {
        let listen: SocketAddr = "127.0.0.1:443".parse().unwrap();
        let denied = Error::FrontAddress {
            listen,
            holder: None,
            cause: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert!(denied.to_string().contains("CAP_NET_BIND_SERVICE"), "{denied}");
        assert!(!denied.to_string().contains("in use"), "{denied}");
        let taken = Error::FrontAddress {
            listen,
            holder: Some("pid 77 (nginx: master process)".into()),
            cause: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert!(taken.to_string().contains("in use by pid 77 (nginx"), "{taken}");
        assert_eq!(taken.metric_label(), "front_address");
    }
}
