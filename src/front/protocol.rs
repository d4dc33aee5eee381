//! What the front and its clients say to each other, and the files the front keeps in its dir.
//!
//! The control protocol is one JSON object per line each way: a request carries `"op"`, an answer
//! carries `"ok"` and either `"status"` or `"error"`. Every successful answer carries the status
//! *after* the request took effect, so a client never needs a second round trip to see it.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The Unix socket the front is controlled through (mode 0600, in a 0700 dir).
pub const CONTROL_SOCKET: &str = "control.sock";
/// The backend, written before it is applied, read at start.
pub const BACKEND_FILE: &str = "backend.json";
/// The pid and start time of the front that owns the dir.
pub const PID_FILE: &str = "front.pid.json";
/// The front's stdout and stderr, appended to by every front started in the dir.
pub const LOG_FILE: &str = "front.log";
/// Why the last front failed to start (removed when one starts).
pub const ERROR_FILE: &str = "front.error";

/// Longest request or answer line; anything longer is a protocol error, not a reason to buffer.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// A slot the front forwards to: its name (used in counts and metrics) and its address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Backend {
    pub slot: String,
    pub address: SocketAddr,
}

/// Connections forwarded to one slot since the front started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotConnections {
    /// The slot's address (the latest one, if the slot name was given another).
    #[serde(default)]
    pub address: Option<SocketAddr>,
    /// Client connections pinned to the slot now.
    pub open: u64,
    /// Client connections ever given to the slot.
    pub total: u64,
    /// Of those, the ones closed because the slot could not be reached within the retry window, or
    /// because it failed before answering and no other slot served to take them.
    #[serde(default)]
    pub failed: u64,
    /// Connections the slot did not answer (it closed or reset them, or stayed silent for the
    /// answer wait) that the front sent on to another serving slot, the client none the wiser.
    #[serde(default)]
    pub replayed: u64,
    /// When a new connection was last replayed because the slot stayed silent (no answer within
    /// the answer wait): a hung slot, seen by the front before any health check can be sure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_silent: Option<chrono::DateTime<chrono::Utc>>,
    /// Open kept-alive HTTP/1.1 connections to the slot while it is out of the serving set that
    /// may still carry a request to it: a request in flight, or a connection before its first.
    /// Once a connection's answer is out, the front closes it at its next request instead of
    /// forwarding that, so it no longer counts: wait for 0 before stopping the slot.
    #[serde(default)]
    pub retired_pending: u64,
    /// Open connections to the slot while it is out of the serving set that the front cannot judge
    /// (HTTP/2, or no TLS ClientHello it can read): the slot's own shutdown ends them.
    #[serde(default)]
    pub retired_unjudged: u64,
}

/// What `status` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StatusWire", into = "StatusWire")]
pub struct FrontStatus {
    pub pid: u32,
    pub listen: SocketAddr,
    /// The serving set: where new connections go (the one with the fewest open connections).
    pub backends: Vec<Backend>,
    pub connections: BTreeMap<String, SlotConnections>,
}

/// `status` as it is written: `backends`, and `backend` for readers of the single-backend protocol
/// (a set of one is that backend; a larger set names its first). A status without `backends`
/// (a front of the single-backend protocol, during an upgrade) reads as the set of its `backend`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StatusWire {
    pid: u32,
    listen: SocketAddr,
    #[serde(default)]
    backend: Option<Backend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backends: Option<Vec<Backend>>,
    connections: BTreeMap<String, SlotConnections>,
}

impl From<StatusWire> for FrontStatus {
    fn from(wire: StatusWire) -> FrontStatus {
        FrontStatus {
            pid: wire.pid,
            listen: wire.listen,
            backends: wire.backends.unwrap_or_else(|| wire.backend.into_iter().collect()),
            connections: wire.connections,
        }
    }
}

impl From<FrontStatus> for StatusWire {
    fn from(status: FrontStatus) -> StatusWire {
        StatusWire {
            pid: status.pid,
            listen: status.listen,
            backend: status.backends.first().cloned(),
            backends: Some(status.backends),
            connections: status.connections,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    Status,
    /// Make `backends` the serving set (persisted first).
    Serve {
        backends: Vec<Backend>,
    },
    /// The single-backend form of `serve`: a serving set of one.
    Switch(Backend),
    /// From a successor front: send me the listening socket (the answer carries it, SCM_RIGHTS).
    Handover {
        pid: u32,
    },
    /// From the successor, on the same connection: I accept now; stop accepting and drain.
    Commit,
    /// Close every open connection to this address (a slot shutting down).
    Close {
        address: SocketAddr,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<FrontStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Set when asking again shortly will work (this front is handing over to a successor).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry: bool,
}

impl Response {
    pub fn ok(status: FrontStatus) -> Self {
        Response {
            ok: true,
            status: Some(status),
            error: None,
            retry: false,
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Response {
            ok: false,
            status: None,
            error: Some(message.into()),
            retry: false,
        }
    }

    pub fn retry_later(message: impl Into<String>) -> Self {
        Response {
            retry: true,
            ..Response::error(message)
        }
    }

    /// One line of JSON, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("a response always serializes");
        line.push(b'\n');
        line
    }
}

impl Request {
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("a request always serializes");
        line.push(b'\n');
        line
    }
}

/// Slot names become metric label values and file content: keep them short and plain.
pub fn validate_backend(backend: &Backend) -> Result<(), String> {
    let slot = &backend.slot;
    if slot.is_empty() || slot.len() > 253 {
        return Err(format!("slot name must have 1 to 253 characters, got {}", slot.len()));
    }
    if let Some(c) = slot
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
    {
        return Err(format!(
            "slot name {slot:?} contains {c:?}; use letters, digits, '-', '.' and '_'"
        ));
    }
    if backend.address.port() == 0 {
        return Err(format!("backend address {} has port 0", backend.address));
    }
    if backend.address.ip().is_unspecified() {
        return Err(format!(
            "backend address {} is unspecified; name the slot's own address",
            backend.address
        ));
    }
    Ok(())
}

/// A serving set, each backend valid, no slot name or address twice.
pub fn validate_backends(backends: &[Backend]) -> Result<(), String> {
    for (i, backend) in backends.iter().enumerate() {
        validate_backend(backend)?;
        if let Some(twice) = backends[..i]
            .iter()
            .find(|b| b.slot == backend.slot || b.address == backend.address)
        {
            return Err(format!(
                "the serving set names slot {} at {} and slot {} at {}: each slot, and each address, at most once",
                twice.slot, twice.address, backend.slot, backend.address
            ));
        }
    }
    Ok(())
}

/// The contents of `backend.json`: `backends`, the serving set, and `backend`, its first member,
/// for a front of the single-backend protocol (a downgrade). A file without `backends` (written by
/// such a front) reads as the set of its `backend`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BackendFile {
    pub backend: Option<Backend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends: Option<Vec<Backend>>,
}

impl BackendFile {
    pub fn new(backends: &[Backend]) -> BackendFile {
        BackendFile {
            backend: backends.first().cloned(),
            backends: Some(backends.to_vec()),
        }
    }

    pub fn serving(self) -> Vec<Backend> {
        self.backends.unwrap_or_else(|| self.backend.into_iter().collect())
    }
}

/// The contents of `front.pid.json`. `start_time` is field 22 of `/proc/<pid>/stat` (clock ticks
/// since boot), so a pid reused by another process is not mistaken for the front.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PidRecord {
    pub pid: u32,
    pub start_time: u64,
    pub listen: SocketAddr,
    #[serde(default)]
    pub binary: Option<PathBuf>,
}

/// The contents of `front.error`: why the front could not start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StartError {
    /// `address_in_use` or `cannot_listen`, or `other`.
    pub reason: String,
    pub address: SocketAddr,
    pub message: String,
}

impl StartError {
    pub fn into_error(self) -> crate::front::FrontError {
        use crate::front::FrontError;
        match self.reason.as_str() {
            "address_in_use" => FrontError::AddressInUse { address: self.address },
            "cannot_listen" => FrontError::CannotListen {
                address: self.address,
                message: self.message,
            },
            _ => FrontError::Refused { message: self.message },
        }
    }
}

/// Reads one line (without its newline); `None` at a clean end of stream. A line longer than
/// [`MAX_LINE`] is an error rather than a reason to buffer without bound.
pub(crate) async fn read_line<R>(reader: &mut R) -> std::io::Result<Option<String>>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut line = String::new();
    let n = reader.take(MAX_LINE as u64).read_line(&mut line).await?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with('\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            if n >= MAX_LINE {
                "line too long"
            } else {
                "stream ended inside a line"
            },
        ));
    }
    line.pop();
    Ok(Some(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(slot: &str, address: &str) -> Backend {
        Backend {
            slot: slot.into(),
            address: address.parse().unwrap(),
        }
    }

    #[test]
    fn requests_have_the_documented_shape() {
        let switch: Request =
            serde_json::from_str(r#"{"op":"switch","slot":"blue","address":"127.0.0.1:7001"}"#).unwrap();
        assert_eq!(switch, Request::Switch(backend("blue", "127.0.0.1:7001")));
        let serve: Request = serde_json::from_str(
            r#"{"op":"serve","backends":[{"slot":"a","address":"127.0.0.1:7001"},{"slot":"b","address":"127.0.0.1:7002"}]}"#,
        )
        .unwrap();
        assert_eq!(
            serve,
            Request::Serve {
                backends: vec![backend("a", "127.0.0.1:7001"), backend("b", "127.0.0.1:7002")]
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"status"}"#).unwrap(),
            Request::Status
        );
        assert_eq!(
            String::from_utf8(Request::Handover { pid: 7 }.to_line()).unwrap(),
            "{\"op\":\"handover\",\"pid\":7}\n"
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"reboot"}"#).is_err());
    }

    #[test]
    fn a_status_answer_carries_the_status_and_no_error() {
        let status = FrontStatus {
            pid: 42,
            listen: "127.0.0.1:6443".parse().unwrap(),
            backends: vec![backend("green", "127.0.0.1:7002"), backend("blue", "127.0.0.1:7001")],
            connections: BTreeMap::from([(
                "green".to_string(),
                SlotConnections {
                    address: Some("127.0.0.1:7002".parse().unwrap()),
                    open: 1,
                    total: 3,
                    retired_pending: 1,
                    ..SlotConnections::default()
                },
            )]),
        };
        let line = String::from_utf8(Response::ok(status.clone()).to_line()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["ok"], true);
        assert_eq!(value["status"]["backends"][1]["slot"], "blue");
        assert_eq!(
            value["status"]["backend"]["slot"], "green",
            "the first of the set, for readers of the single-backend protocol"
        );
        assert_eq!(value["status"]["connections"]["green"]["total"], 3);
        assert_eq!(value["status"]["connections"]["green"]["retired_pending"], 1);
        assert!(value.get("error").is_none());
        let back: Response = serde_json::from_str(&line).unwrap();
        assert_eq!(back.status, Some(status));
        let error = String::from_utf8(Response::error("no").to_line()).unwrap();
        assert_eq!(error, "{\"ok\":false,\"error\":\"no\"}\n");
    }

    #[tokio::test]
    async fn lines_are_bounded() {
        let mut input: &[u8] = b"{\"op\":\"status\"}\nrest";
        assert_eq!(
            read_line(&mut input).await.unwrap().as_deref(),
            Some("{\"op\":\"status\"}")
        );
        assert!(read_line(&mut input).await.is_err());
        let mut empty: &[u8] = b"";
        assert_eq!(read_line(&mut empty).await.unwrap(), None);
        let long = vec![b'x'; MAX_LINE + 10];
        let mut long: &[u8] = &long;
        assert_eq!(read_line(&mut long).await.unwrap_err().to_string(), "line too long");
    }

    #[test]
    fn slot_connections_read_without_the_later_fields() {
        let c: SlotConnections = serde_json::from_str(r#"{"open":2,"total":5}"#).unwrap();
        assert_eq!(
            c,
            SlotConnections {
                open: 2,
                total: 5,
                ..SlotConnections::default()
            }
        );
    }

    #[test]
    fn a_status_and_a_backend_file_of_the_single_backend_protocol_read_as_a_set_of_one() {
        let old = r#"{"pid":1,"listen":"127.0.0.1:6443","backend":{"slot":"a","address":"127.0.0.1:7001"},
            "connections":{"a":{"open":1,"total":2,"failed":0}}}"#;
        let status: FrontStatus = serde_json::from_str(old).unwrap();
        assert_eq!(status.backends, vec![backend("a", "127.0.0.1:7001")]);
        let none: FrontStatus =
            serde_json::from_str(r#"{"pid":1,"listen":"127.0.0.1:6443","backend":null,"connections":{}}"#).unwrap();
        assert!(none.backends.is_empty());
        let file: BackendFile = serde_json::from_str(r#"{"backend":{"slot":"a","address":"127.0.0.1:7001"}}"#).unwrap();
        assert_eq!(file.serving(), vec![backend("a", "127.0.0.1:7001")]);
        // What this front writes, a front of the single-backend protocol reads as the first member.
        let written = serde_json::to_value(BackendFile::new(&[
            backend("a", "127.0.0.1:7001"),
            backend("b", "127.0.0.1:7002"),
        ]))
        .unwrap();
        assert_eq!(written["backend"]["slot"], "a");
        assert_eq!(written["backends"][1]["slot"], "b");
        let empty = serde_json::to_value(BackendFile::new(&[])).unwrap();
        assert_eq!(empty, serde_json::json!({"backend": null, "backends": []}));
    }

    #[test]
    fn a_serving_set_names_each_slot_and_address_once() {
        let a = backend("a", "127.0.0.1:7001");
        assert!(validate_backends(&[]).is_ok());
        assert!(validate_backends(&[a.clone(), backend("b", "127.0.0.1:7002")]).is_ok());
        assert!(validate_backends(&[a.clone(), backend("a", "127.0.0.1:7002")]).is_err());
        assert!(validate_backends(&[a.clone(), backend("b", "127.0.0.1:7001")]).is_err());
        assert!(validate_backends(&[backend("", "127.0.0.1:7002")]).is_err());
    }

    #[test]
    fn backends_are_validated() {
        assert!(validate_backend(&backend("slot-1.a_b", "127.0.0.1:1")).is_ok());
        assert!(validate_backend(&backend("", "127.0.0.1:1")).is_err());
        assert!(validate_backend(&backend("a b", "127.0.0.1:1")).is_err());
        assert!(validate_backend(&backend("a\"", "127.0.0.1:1")).is_err());
        assert!(validate_backend(&backend("a", "127.0.0.1:0")).is_err());
        assert!(validate_backend(&backend("a", "0.0.0.0:80")).is_err());
        assert!(validate_backend(&backend(&"x".repeat(254), "127.0.0.1:1")).is_err());
    }

    #[test]
    fn a_start_error_maps_to_the_user_facing_error() {
        let e = StartError {
            reason: "address_in_use".into(),
            address: "127.0.0.1:6443".parse().unwrap(),
            message: "Address already in use (os error 98)".into(),
        };
        assert_eq!(
            e.into_error().to_string(),
            "front address 127.0.0.1:6443 is in use by another program; choose another spec.front.listen"
        );
    }
}
