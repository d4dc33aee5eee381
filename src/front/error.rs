//! One error type for everything the front does, each message saying what to do next. The
//! controller copies these messages into the KcpShard's FrontReady condition, so they name the
//! address, the file or the spec field the user has to look at. Each message includes its cause
//! (an `io::Error` is part of the text, not a `source()`), so `to_string()` is the whole story.
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    #[error("front address {address} is in use by another program; choose another spec.front.listen")]
    AddressInUse { address: SocketAddr },

    #[error("the front cannot listen on {address}: {message}; choose another spec.front.listen")]
    CannotListen { address: SocketAddr, message: String },

    #[error("no front answers on {socket} ({cause}); `kcpshard serve` starts one, its log is {log}")]
    NotRunning {
        socket: PathBuf,
        log: PathBuf,
        cause: std::io::Error,
    },

    #[error("talking to the front on {socket} failed: {cause}; see its log {log}")]
    Control {
        socket: PathBuf,
        log: PathBuf,
        cause: std::io::Error,
    },

    #[error(
        "the front on {socket} gave an answer this kcpshard cannot read ({detail}); \
         run the same kcpshard version for serve and front, or restart the front"
    )]
    Protocol { socket: PathBuf, detail: String },

    #[error("the front refused the request: {message}")]
    Refused { message: String },

    #[error("invalid backend: {0}")]
    InvalidBackend(String),

    #[error("cannot start the front binary {binary}: {cause}; check that the path exists and is executable")]
    Spawn { binary: PathBuf, cause: std::io::Error },

    #[error("the front exited while starting ({status}); see {log}, which ends with:\n{tail}")]
    Exited {
        status: String,
        /// Where its output is: a file, or the journal command that shows it.
        log: String,
        tail: String,
    },

    /// Killed by a signal before it answered (a stop of serve's own unit takes what it just
    /// spawned with it): no failure of the front's, so an upgrade is tried again.
    #[error("the front was killed while starting ({status}); it is started again on the next try; see {log}")]
    KilledWhileStarting { status: String, log: String },

    /// Under systemd: its unit restarts a front that crashed a moment ago, on the socket it keeps;
    /// the caller looks again later.
    #[error("systemd restarts the front (unit {unit} is active); it serves once it answers on its control socket")]
    RestartingUnderUnit { unit: String },

    #[error("the front (pid {pid}) did not answer on {socket} within {seconds} s; it was killed, see {log}")]
    StartTimeout {
        pid: u32,
        socket: PathBuf,
        log: String,
        seconds: u64,
    },

    #[error("front handover failed: {0}; the old front keeps serving")]
    Handover(String),

    #[error("{context}: {cause}")]
    Io { context: String, cause: std::io::Error },
}

impl FrontError {
    pub(crate) fn io(context: impl Into<String>, cause: std::io::Error) -> Self {
        FrontError::Io {
            context: context.into(),
            cause,
        }
    }
}
