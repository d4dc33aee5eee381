//! The `kcpshard front` process: binds (or inherits) the listening socket, serves the control
//! socket, forwards connections, and shuts down gracefully.
//!
//! Start order, chosen so that every failure leaves the dir in a state `ensure_running` can read:
//! refuse if another front already answers on the control socket; load `backend.json`; bind the
//! TCP address (on failure write `front.error` and exit non-zero); bind the metrics address; start
//! accepting; bind the control socket under a temp name, chmod 0600, rename it into place; write
//! `front.pid.json`; remove `front.error`. A successor (`--inherit-from`) receives the listening
//! socket instead of binding it, and renames its control socket into place only once the old
//! front has confirmed the handover.
//!
//! Shutdown: on SIGTERM or SIGINT the front stops accepting and closes its listening socket (so the
//! address is free at once), removes its control socket and pid file if they are still its own,
//! lets open connections finish for up to the drain timeout, and exits 0. A second signal exits at
//! once. After a handover the old front does the same, except that the listening socket lives on in
//! the successor and the files are the successor's.
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::front::error::FrontError;
use crate::front::fdstore;
use crate::front::handover;
use crate::front::lifecycle;
use crate::front::metrics;
use crate::front::protocol::{
    self, BACKEND_FILE, Backend, BackendFile, CONTROL_SOCKET, ERROR_FILE, FrontStatus, PID_FILE, PidRecord, Request,
    Response, StartError,
};
use crate::front::proxy::{self, Router};
use crate::fsutil;

/// How long an old front waits for its successor to confirm a handover before it carries on alone.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// How `kcpshard front` was asked to run.
#[derive(Clone, Debug)]
pub struct FrontConfig {
    /// The address clients dial. With `inherit_from`, the inherited socket's address wins.
    pub listen: SocketAddr,
    /// The front's private dir (0700): control socket, backend, pid file, log.
    pub dir: PathBuf,
    /// Where to serve Prometheus metrics at `/metrics`, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// How long open connections may run on after SIGTERM or a handover.
    pub drain_timeout: Duration,
    /// Take the listening socket over from the front answering on this control socket.
    pub inherit_from: Option<PathBuf>,
    /// Take the socket this process listens on at `listen` (any program: e.g. the kcp it
    /// replaces), with no connection refused in between (process/listener.rs).
    pub take_listener_of: Option<u32>,
}

/// The state every task of the front shares.
struct Front {
    dir: PathBuf,
    listen: SocketAddr,
    router: Arc<Router>,
    /// Taken (and so closed) on shutdown, so that the address is free while connections drain.
    listener: Mutex<Option<Arc<TcpListener>>>,
    /// Serializes changes of the serving set with each other and with a handover.
    switch_lock: tokio::sync::Mutex<()>,
    /// The successor's pid, once a handover is committed.
    handed_over: watch::Sender<Option<u32>>,
}

impl Front {
    fn status(&self) -> FrontStatus {
        FrontStatus {
            pid: std::process::id(),
            listen: self.listen,
            backends: self.router.backends(),
            connections: self.router.connections(),
        }
    }

    /// Makes `backends` the serving set: persisted first, then applied.
    async fn serve(&self, backends: Vec<Backend>) -> Response {
        if let Err(message) = protocol::validate_backends(&backends) {
            return Response::error(message);
        }
        let _serial = self.switch_lock.lock().await;
        let handed_over = *self.handed_over.borrow();
        if let Some(pid) = handed_over {
            return Response::retry_later(format!("this front has handed over to pid {pid}; ask again"));
        }
        // Persist first: a front restarted after this answer must come back on this set.
        let path = self.dir.join(BACKEND_FILE);
        let bytes = serde_json::to_vec_pretty(&BackendFile::new(&backends)).expect("a backend always serializes");
        let target = path.clone();
        let written = tokio::task::spawn_blocking(move || fsutil::write_atomically(&target, &bytes)).await;
        let written = written.unwrap_or_else(|join| Err(std::io::Error::other(join.to_string())));
        if let Err(err) = written {
            error!(path = %path.display(), error = %err, "cannot persist the serving set; not changing it");
            let serving: Vec<String> = self.router.backends().into_iter().map(|b| b.slot).collect();
            return Response::error(format!(
                "cannot write {}: {err}; the front still serves {serving:?}; free space or fix permissions in {}",
                path.display(),
                self.dir.display()
            ));
        }
        let slots: Vec<String> = backends.iter().map(|b| format!("{}={}", b.slot, b.address)).collect();
        self.router.serve(backends);
        info!(serving = ?slots, "new connections go to this serving set");
        Response::ok(self.status())
    }

    /// Old side of a handover: send the listening socket, wait for the successor's commit.
    async fn handover(&self, reader: &mut BufReader<UnixStream>, successor: u32) -> std::io::Result<()> {
        let _serial = self.switch_lock.lock().await;
        let handed_over = *self.handed_over.borrow();
        if let Some(pid) = handed_over {
            let line = Response::error(format!("this front already handed over to pid {pid}")).to_line();
            return reader.get_mut().write_all(&line).await;
        }
        let listener = self.listener.lock().expect("listener lock").clone();
        let Some(listener) = listener else {
            let line = Response::error("this front is shutting down and has no listening socket").to_line();
            return reader.get_mut().write_all(&line).await;
        };
        info!(successor, "handing the listening socket over");
        let line = Response::ok(self.status()).to_line();
        handover::send_with_fd(reader.get_ref(), &line, listener.as_raw_fd()).await?;
        drop(listener);
        let commit = tokio::time::timeout(HANDOVER_TIMEOUT, protocol::read_line(reader)).await;
        match commit {
            Ok(Ok(Some(line))) if serde_json::from_str::<Request>(&line).ok() == Some(Request::Commit) => {
                // Under systemd, before this front can exit: its exit must not count as the unit's.
                fdstore::hand_main_to(successor).await;
                self.handed_over.send_replace(Some(successor));
                info!(successor, "handover committed; no longer accepting");
                reader.get_mut().write_all(&Response::ok(self.status()).to_line()).await
            }
            other => {
                warn!(successor, outcome = ?other, "handover abandoned; this front keeps serving");
                Ok(())
            }
        }
    }
}

/// Runs the front until it is told to stop (or hands over), then drains.
pub async fn run(config: FrontConfig) -> Result<(), FrontError> {
    // Installed first: a SIGTERM during start-up must still mean "drain and exit", not "die".
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| FrontError::io("cannot handle SIGTERM", e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| FrontError::io("cannot handle SIGINT", e))?;
    lifecycle::prepare_dir(&config.dir)?;
    let control_path = config.dir.join(CONTROL_SOCKET);

    let (listener, router, successor) = match &config.inherit_from {
        None => {
            if let Ok(client) = crate::front::FrontClient::connect(&config.dir).await
                && let Ok(status) = client.status().await
            {
                return Err(FrontError::Refused {
                    message: format!(
                        "a front (pid {}) already serves {} on {}; stop it first",
                        status.pid,
                        config.dir.display(),
                        status.listen
                    ),
                });
            }
            let backends = load_backends(&config.dir);
            let listener = match (fdstore::inherited_listener(), config.take_listener_of) {
                (Some(inherited), _) => adopt_listener(inherited)?,
                (None, Some(pid)) => take_listener_of(pid, config.listen)?,
                (None, None) => bind(&config)?,
            };
            (listener, Router::new(backends), None)
        }
        Some(from) => {
            let (listener, old, conn) = take_over(from).await?;
            (listener, Router::new(old.backends), Some((conn, old.pid)))
        }
    };
    let listen = listener
        .local_addr()
        .map_err(|e| FrontError::io("cannot read the listening address", e))?;
    // Bound before anything is announced, so that a bad metrics address fails the start cleanly.
    let metrics_listener = match config.metrics_listen {
        Some(address) => {
            let bound = TcpListener::bind(address)
                .await
                .map_err(|e| FrontError::io(format!("cannot serve metrics on {address}"), e))?;
            info!(%address, "serving metrics at /metrics");
            Some(bound)
        }
        None => None,
    };
    proxy::tune_listener(&listener);
    let listener = Arc::new(listener);
    let announced = listener.clone();
    let front = Arc::new(Front {
        dir: config.dir.clone(),
        listen,
        router: router.clone(),
        listener: Mutex::new(Some(listener.clone())),
        switch_lock: tokio::sync::Mutex::new(()),
        handed_over: watch::Sender::new(None),
    });

    let (stop_accepting, stop_rx) = watch::channel(false);
    let accept = tokio::spawn(proxy::accept_loop(listener, router.clone(), stop_rx));

    // Bound under a temp name and renamed into place, so that the path always names a live socket.
    let staged = config.dir.join(format!("{CONTROL_SOCKET}.{}", std::process::id()));
    let _ = std::fs::remove_file(&staged);
    let control = UnixListener::bind(&staged)
        .map_err(|e| FrontError::io(format!("cannot bind the control socket {}", staged.display()), e))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| FrontError::io(format!("cannot chmod {}", staged.display()), e))?;

    if let Some((conn, old_pid)) = successor {
        match commit(conn).await {
            Ok(final_status) => {
                if router.backends() != final_status.backends {
                    router.serve(final_status.backends);
                }
                info!(old_pid, "took the listening socket over");
            }
            Err(err) => {
                let _ = std::fs::remove_file(&staged);
                let _ = stop_accepting.send(true);
                let _ = accept.await;
                let left = router.drain(config.drain_timeout).await;
                warn!(left, "handover not committed; the old front keeps serving; exiting");
                return Err(err);
            }
        }
    }
    std::fs::rename(&staged, &control_path).map_err(|e| {
        FrontError::io(
            format!("cannot move the control socket to {}", control_path.display()),
            e,
        )
    })?;
    let control_identity = identity(&control_path);
    lifecycle::write_pid_record(
        &config.dir,
        &PidRecord {
            pid: std::process::id(),
            start_time: lifecycle::start_time(std::process::id()).unwrap_or(0),
            listen,
            binary: std::env::current_exe().ok(),
        },
    )?;
    let _ = std::fs::remove_file(config.dir.join(ERROR_FILE));
    info!(%listen, dir = %config.dir.display(), backends = ?router.backends(), "front ready");
    fdstore::announce(announced.as_fd()).await;
    drop(announced);

    let control_task = tokio::spawn(serve_control(control, front.clone()));
    let metrics_task = metrics_listener.map(|l| tokio::spawn(serve_metrics(l, front.clone())));

    let mut handed_over = front.handed_over.subscribe();
    let reason = tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
        _ = async { let _ = handed_over.wait_for(|s| s.is_some()).await; } => "handover",
    };
    let handed = front.handed_over.borrow().is_some();
    if handed {
        // Kept-alive clients move to the successor: every slot counts as retired here, so each
        // kept-alive HTTP/1.1 connection is closed at its next request, before any byte of it is
        // forwarded (front/keepalive.rs), and its client opens a new one, which the successor
        // accepts and routes. Otherwise it would stay on this front until the drain timeout,
        // where no change of the serving set reaches it: a roll meanwhile would leave it on a
        // slot that is shutting down. Streams (watches) run on here until they end.
        router.serve(Vec::new());
    }

    // Stop accepting, and close the listening socket (it lives on in a successor, if any).
    let _ = stop_accepting.send(true);
    let _ = accept.await;
    front.listener.lock().expect("listener lock").take();
    control_task.abort();
    if let Some(task) = metrics_task {
        task.abort();
    }
    if !handed {
        // Remove only what is still ours: a successor may own these paths by now.
        if identity(&control_path).is_some() && identity(&control_path) == control_identity {
            let _ = std::fs::remove_file(&control_path);
        }
        if lifecycle::read_pid_record(&config.dir).is_some_and(|r| r.pid == std::process::id()) {
            let _ = std::fs::remove_file(config.dir.join(PID_FILE));
        }
    }
    let open = router.open_connections();
    info!(reason, open, bound = ?config.drain_timeout, "stopped accepting; draining open connections");
    let left = tokio::select! {
        left = router.drain(config.drain_timeout) => left,
        _ = sigterm.recv() => router.open_connections(),
        _ = sigint.recv() => router.open_connections(),
    };
    if left > 0 {
        warn!(left, "exiting with connections still open");
    } else {
        info!("all connections drained; exiting");
    }
    Ok(())
}

/// The persisted serving set; empty (until the controller sends one) when there is none or it
/// cannot be read. A file of a front of the single-backend protocol reads as a set of one.
fn load_backends(dir: &Path) -> Vec<Backend> {
    let path = dir.join(BACKEND_FILE);
    match fsutil::read_optional(&path) {
        Ok(None) => Vec::new(),
        Ok(Some(bytes)) => match serde_json::from_slice::<BackendFile>(&bytes) {
            Ok(file) => {
                let backends = file.serving();
                info!(?backends, "loaded the serving set from {}", path.display());
                backends
            }
            Err(err) => {
                error!(path = %path.display(), error = %err,
                    "cannot read the persisted serving set; starting without one until the controller sends one");
                Vec::new()
            }
        },
        Err(err) => {
            error!(path = %path.display(), error = %err, "cannot read the persisted serving set");
            Vec::new()
        }
    }
}

/// A listening socket handed over (by systemd) or taken over, made ready for tokio.
fn adopt_listener(listener: std::net::TcpListener) -> Result<TcpListener, FrontError> {
    listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
        .map_err(|e| FrontError::io("cannot use the listening socket handed over", e))
}

/// The socket process `pid` listens on at `address`, taken over and made ready for tokio.
fn take_listener_of(pid: u32, address: SocketAddr) -> Result<TcpListener, FrontError> {
    let taken = crate::process::listener::take_listener(pid, address).map_err(|e| FrontError::CannotListen {
        address,
        message: e.to_string(),
    })?;
    info!(pid, %address, "took over the listening socket of another process");
    adopt_listener(taken)
}

fn bind(config: &FrontConfig) -> Result<TcpListener, FrontError> {
    let bound = std::net::TcpListener::bind(config.listen).and_then(|l| {
        l.set_nonblocking(true)?;
        TcpListener::from_std(l)
    });
    bound.map_err(|err| {
        let start_error = StartError {
            reason: if err.kind() == std::io::ErrorKind::AddrInUse {
                "address_in_use".into()
            } else {
                "cannot_listen".into()
            },
            address: config.listen,
            message: err.to_string(),
        };
        let bytes = serde_json::to_vec_pretty(&start_error).expect("a start error always serializes");
        if let Err(write_err) = fsutil::write_atomically(&config.dir.join(ERROR_FILE), &bytes) {
            error!(error = %write_err, "cannot write {ERROR_FILE}");
        }
        start_error.into_error()
    })
}

/// Successor side of a handover, up to (not including) the commit.
async fn take_over(from: &Path) -> Result<(TcpListener, FrontStatus, BufReader<UnixStream>), FrontError> {
    let fail = |what: String| FrontError::Handover(what);
    let stream = UnixStream::connect(from)
        .await
        .map_err(|e| fail(format!("cannot reach the old front on {}: {e}", from.display())))?;
    let mut reader = BufReader::new(stream);
    let request = Request::Handover {
        pid: std::process::id(),
    };
    reader
        .get_mut()
        .write_all(&request.to_line())
        .await
        .map_err(|e| fail(format!("cannot send the handover request: {e}")))?;
    // The answer's first bytes carry the fd; read it with recvmsg, the rest of the line plainly.
    let mut buf = vec![0u8; protocol::MAX_LINE];
    let (mut n, fd) = tokio::time::timeout(HANDOVER_TIMEOUT, handover::recv_with_fd(reader.get_ref(), &mut buf))
        .await
        .map_err(|_| fail("the old front did not answer in 10 s".into()))?
        .map_err(|e| fail(format!("cannot receive the listening socket: {e}")))?;
    while n > 0 && buf[n - 1] != b'\n' && n < buf.len() {
        let more = reader
            .get_mut()
            .read(&mut buf[n..])
            .await
            .map_err(|e| fail(format!("cannot read the handover answer: {e}")))?;
        if more == 0 {
            break;
        }
        n += more;
    }
    let response: Response = serde_json::from_slice(buf[..n].trim_ascii_end())
        .map_err(|e| fail(format!("unreadable handover answer: {e}")))?;
    if !response.ok {
        return Err(fail(response.error.unwrap_or_else(|| "refused".into())));
    }
    let status = response
        .status
        .ok_or_else(|| fail("the handover answer has no status".into()))?;
    let fd = fd.ok_or_else(|| fail("the old front sent no socket".into()))?;
    let listener = std::net::TcpListener::from(fd);
    listener
        .set_nonblocking(true)
        .map_err(|e| fail(format!("cannot use the received socket: {e}")))?;
    let listener = TcpListener::from_std(listener).map_err(|e| fail(format!("cannot use the received socket: {e}")))?;
    Ok((listener, status, reader))
}

/// Successor side: tell the old front we accept now; its answer carries its final backend.
async fn commit(mut reader: BufReader<UnixStream>) -> Result<FrontStatus, FrontError> {
    let fail = |what: String| FrontError::Handover(what);
    reader
        .get_mut()
        .write_all(&Request::Commit.to_line())
        .await
        .map_err(|e| fail(format!("cannot send the commit: {e}")))?;
    let line = tokio::time::timeout(HANDOVER_TIMEOUT, protocol::read_line(&mut reader))
        .await
        .map_err(|_| fail("the old front did not confirm in 10 s".into()))?
        .map_err(|e| fail(format!("cannot read the confirmation: {e}")))?
        .ok_or_else(|| fail("the old front closed without confirming".into()))?;
    let response: Response = serde_json::from_str(&line).map_err(|e| fail(format!("unreadable confirmation: {e}")))?;
    match (response.ok, response.status) {
        (true, Some(status)) => Ok(status),
        _ => Err(fail(response.error.unwrap_or_else(|| "not confirmed".into()))),
    }
}

async fn serve_control(listener: UnixListener, front: Arc<Front>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_control_connection(stream, front.clone()));
            }
            Err(err) => {
                warn!(error = %err, "control accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_control_connection(stream: UnixStream, front: Arc<Front>) {
    let mut reader = BufReader::new(stream);
    loop {
        let line = match protocol::read_line(&mut reader).await {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(err) => {
                let answer = Response::error(format!("cannot read the request: {err}")).to_line();
                let _ = reader.get_mut().write_all(&answer).await;
                return;
            }
        };
        let response = match serde_json::from_str::<Request>(&line) {
            Err(err) => Response::error(format!(
                "cannot read the request ({err}); send one JSON object per line, e.g. {{\"op\":\"status\"}}"
            )),
            Ok(Request::Status) => Response::ok(front.status()),
            Ok(Request::Serve { backends }) => front.serve(backends).await,
            Ok(Request::Switch(backend)) => front.serve(vec![backend]).await,
            Ok(Request::Handover { pid }) => {
                if let Err(err) = front.handover(&mut reader, pid).await {
                    warn!(successor = pid, error = %err, "handover failed; this front keeps serving");
                }
                return;
            }
            Ok(Request::Commit) => Response::error("commit without a handover"),
            Ok(Request::Close { address }) => {
                front.router.close(address);
                Response::ok(front.status())
            }
        };
        if reader.get_mut().write_all(&response.to_line()).await.is_err() {
            return;
        }
    }
}

/// A deliberately tiny HTTP/1 responder: `GET /metrics` and nothing else, one request per connection.
async fn serve_metrics(listener: TcpListener, front: Arc<Front>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let front = front.clone();
        tokio::spawn(async move {
            let mut head = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let (code, body) = if head.starts_with(b"GET /metrics ") || head.starts_with(b"GET /metrics?") {
                ("200 OK", metrics::render(&front.status()))
            } else {
                ("404 Not Found", "only /metrics is served here\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
