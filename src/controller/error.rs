//! Why a reconcile failed. Each kind has a label for the failure metric
//! (`kcpshard_controller_steps_total{result="..."}`), so the metric says which error it was.
use std::net::SocketAddr;

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
    /// A field of the spec the schema cannot check.
    #[error("{0}")]
    Spec(String),
    #[error("{0:#}")]
    Front(anyhow::Error),
    #[error("{}", front_address_message(*listen, holder.as_deref(), source))]
    FrontAddress {
        listen: SocketAddr,
        /// The process that holds the address, when kcpshard can tell.
        holder: Option<String>,
        source: std::io::Error,
    },
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
    UnknownIdentity { id: String, record: std::path::PathBuf },
    #[error("cannot write the status of KcpShard {name}: {source}")]
    Status { name: String, source: kube::Error },
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The controller could not change the object's metadata (drop a request's annotation).
    #[error("{0}")]
    Metadata(String),
    /// One of the controller's own files does not parse; the message says which and what to do.
    #[error("{0}")]
    Unreadable(String),
    /// A preflight step found its record gone (removed meanwhile); the next look starts over.
    #[error("preflight: {0}")]
    Preflight(String),
    /// A job (a dump, a restore of the store) failed: how, and what happens next.
    #[error("{0}")]
    Job(String),
}

impl Error {
    /// The label of the failure metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Io(_) => "io",
            Error::Store(_) | Error::Job(_) => "store",
            Error::Process(_) => "process",
            Error::Slot(_) => "kcp",
            Error::Args(_) | Error::Spec(_) => "spec",
            Error::Front(_) | Error::FrontAddress { .. } => "front",
            Error::NoSuchSlot(_)
            | Error::Unadoptable { .. }
            | Error::Unreadable(_)
            | Error::UnknownIdentity { .. }
            | Error::Preflight(_) => "state",
            Error::Status { .. } | Error::Finalizer(_) | Error::Metadata(_) => "api",
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
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert!(denied.to_string().contains("CAP_NET_BIND_SERVICE"), "{denied}");
        assert!(!denied.to_string().contains("in use"), "{denied}");
        let taken = Error::FrontAddress {
            listen,
            holder: Some("pid 77 (nginx: master process)".into()),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert!(taken.to_string().contains("in use by pid 77 (nginx"), "{taken}");
        assert_eq!(taken.metric_label(), "front");
    }
}
