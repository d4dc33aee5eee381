//! The controller's side of the control socket.
//!
//! Each request opens its own connection: a front that was restarted or upgraded in between is
//! simply the one answering now. A connect refused for a moment (a successor taking over the
//! socket path) and an answer marked `retry` (an old front handing over) are retried for up to
//! [`RECONNECT_WINDOW`].
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::time::Instant;

use crate::front::error::FrontError;
use crate::front::protocol::{self, Backend, CONTROL_SOCKET, FrontStatus, LOG_FILE, Request, Response};

const RECONNECT_WINDOW: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_STEP: Duration = Duration::from_millis(50);

/// A handle on the front that serves one dir.
#[derive(Clone, Debug)]
pub struct FrontClient {
    dir: PathBuf,
    socket: PathBuf,
}

impl FrontClient {
    /// Checks that a front answers on `dir/control.sock`.
    pub async fn connect(dir: &Path) -> Result<FrontClient, FrontError> {
        let client = FrontClient {
            dir: dir.to_path_buf(),
            socket: dir.join(CONTROL_SOCKET),
        };
        UnixStream::connect(&client.socket)
            .await
            .map_err(|source| client.not_running(source))?;
        Ok(client)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub async fn status(&self) -> Result<FrontStatus, FrontError> {
        self.request(&Request::Status).await
    }

    /// Makes `backends` the serving set: new connections go to the one with the fewest open
    /// connections. Returns once the front has persisted the set to `backend.json` and applied it.
    pub async fn serve(&self, backends: &[Backend]) -> Result<(), FrontError> {
        protocol::validate_backends(backends).map_err(FrontError::InvalidBackend)?;
        let request = Request::Serve {
            backends: backends.to_vec(),
        };
        let status = self.request(&request).await?;
        if status.backends != backends {
            return Err(self.protocol(format!("serve answered with backends {:?}", status.backends)));
        }
        Ok(())
    }

    /// Closes the front's open connections to `address`: clients reconnect, to the active slot.
    pub async fn close(&self, address: SocketAddr) -> Result<(), FrontError> {
        self.request(&Request::Close { address }).await.map(|_| ())
    }

    async fn request(&self, request: &Request) -> Result<FrontStatus, FrontError> {
        let deadline = Instant::now() + RECONNECT_WINDOW;
        loop {
            let stream = match UnixStream::connect(&self.socket).await {
                Ok(stream) => stream,
                Err(err) if Instant::now() < deadline && transient(&err) => {
                    tokio::time::sleep(RETRY_STEP).await;
                    continue;
                }
                Err(err) => return Err(self.not_running(err)),
            };
            let answer = tokio::time::timeout(REQUEST_TIMEOUT, exchange(stream, request))
                .await
                .map_err(|_| self.control(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 10 s")))?
                .map_err(|err| self.control(err))?;
            let response: Response = serde_json::from_str(&answer).map_err(|err| self.protocol(err.to_string()))?;
            if response.ok {
                return response
                    .status
                    .ok_or_else(|| self.protocol("an ok answer without a status".into()));
            }
            if response.retry && Instant::now() < deadline {
                tokio::time::sleep(RETRY_STEP).await;
                continue;
            }
            return Err(FrontError::Refused {
                message: response.error.unwrap_or_else(|| "no reason given".into()),
            });
        }
    }

    fn not_running(&self, cause: std::io::Error) -> FrontError {
        FrontError::NotRunning {
            socket: self.socket.clone(),
            log: self.dir.join(LOG_FILE),
            cause,
        }
    }

    fn control(&self, cause: std::io::Error) -> FrontError {
        FrontError::Control {
            socket: self.socket.clone(),
            log: self.dir.join(LOG_FILE),
            cause,
        }
    }

    fn protocol(&self, detail: String) -> FrontError {
        FrontError::Protocol {
            socket: self.socket.clone(),
            detail,
        }
    }
}

fn transient(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
    )
}

async fn exchange(stream: UnixStream, request: &Request) -> std::io::Result<String> {
    let mut reader = BufReader::new(stream);
    reader.get_mut().write_all(&request.to_line()).await?;
    protocol::read_line(&mut reader)
        .await?
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the front closed without answering"))
}
