//! The front: the one address clients dial (default `127.0.0.1:6443`). It forwards each TCP
//! connection, bytes untouched (TLS stays end-to-end between client and kcp), to the active slot.
//!
//! It runs as its own long-lived process, `kcpshard front --listen ADDR --dir DIR`, so that the
//! controller (`kcpshard serve`) can crash, restart or be upgraded without closing a connection.
//! `serve` starts or adopts it with [`ensure_running`], gives it the slots to serve with
//! [`FrontClient::serve`], reads its counts with [`FrontClient::status`], replaces its binary
//! without closing the listening socket with [`upgrade`], and ends it with [`stop`].
//!
//! Files:
//! - [`proxy`]: the data path, one file per concern: accept, connect with a bounded retry, the
//!   copy loop, per-slot accounting, routing and closing.
//! - [`server`]: the `kcpshard front` process: start order, control socket, shutdown, handover.
//! - [`protocol`]: the control protocol's messages and the files kept in DIR.
//! - [`client`], [`lifecycle`]: the controller's side (talk to, start, adopt, stop).
//! - [`handover`]: SCM_RIGHTS passing of the listening socket to a successor.
//! - [`fdstore`]: the listening socket from and into systemd (its descriptor store, or the
//!   unit's stdin), and the front's readiness notice.
//! - [`metrics`]: Prometheus series from status snapshots: a front's own, and every shard's front
//!   in serve's `/metrics`.
//! - [`caddy`]: the other front type, a caddy the user runs, driven through its admin API.
//!
//! See docs/front.md for the protocol, the files and what survives what.
pub mod caddy;
mod client;
mod error;
mod fdstore;
mod handover;
mod keepalive;
mod lifecycle;
mod metrics;
mod protocol;
mod proxy;
mod server;

pub use client::FrontClient;
pub use error::FrontError;
pub use lifecycle::{
    FrontLaunch, PROCESS_FILE, START_TIMEOUT, STOP_TIMEOUT, UPGRADE_FAILED_FILE, UpgradeStart, ensure_running,
    recorded_pid, recorded_process, runs_other_binary, start_error, start_front, start_front_taking, start_upgrade,
    starting, stop, upgrade, upgrading,
};
pub use metrics::FrontsSeen;
pub use protocol::{
    BACKEND_FILE, Backend, CONTROL_SOCKET, ERROR_FILE, FrontStatus, LOG_FILE, PID_FILE, SlotConnections,
};
pub use proxy::{HOLD_WINDOW, RETRY_STEP, RETRY_WINDOW};
pub use server::{FrontConfig, run};
