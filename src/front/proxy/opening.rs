//! The opening of a connection, from its connect to the slot's first byte: what the client sends
//! meanwhile is kept, so that a slot that dies or hangs before it answers costs the client a
//! moment, not a failed connection.
//!
//! Why: a slot killed under load fails the new connections its listener had accepted, and the
//! ones whose TLS handshake was under way; a stopped (SIGSTOPped) slot's kernel still accepts
//! connections that then wait for an answer that never comes, until the controller takes the slot
//! out of the front. With TLS passthrough, what a client sends before the slot's first byte is its
//! ClientHello: nothing of it has reached kcp's HTTP handlers, so sending it to another slot is
//! safe, whatever the request that follows (HAProxy's `option redispatch` and Envoy's connect
//! retries do the same one step earlier, at the TCP connect).
//!
//! Invariants:
//! - Until the slot's first byte, every byte the client sends is written to the slot and kept, up
//!   to [`KEPT`] bytes (a whole TLS record of the largest size). A client whose first byte does not
//!   start a TLS handshake record, or that sends more than that before any answer, may have said
//!   something a slot acts on (a plain HTTP request): its connection is pinned at once, as it is
//!   once the slot answered.
//! - When the slot's connection fails before its first byte (a reset, an EOF, a failed write), or
//!   no byte comes within [`ANSWER_WAIT`] of the client's first, the connection goes to a serving
//!   slot it has not tried and the kept bytes are written there: a *replay*, counted in the
//!   abandoned slot's `replayed`. The abandoned connection is closed unread, so nothing it might
//!   still say reaches the client.
//! - With no untried slot serving, a failed slot's connection goes back to a slot it left for its
//!   silence (a slow slot is not a dead one); with none of those either, it fails (counted in the
//!   failed slot's `failed`), and a silent slot is waited for.
//! - Every byte is shown once to the connection's [`keepalive::Exchange`], the client's as it is
//!   read and the answering slot's as it passes, so that the copy that follows ([`super::pump`])
//!   goes on following the TLS records where the opening left off.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::accounting::Pinned;
use super::connect::{RETRY_WINDOW, connect, dial};
use super::router::{Active, Router};
use crate::front::keepalive;

/// The most a connection keeps of what its client sent before the slot answered: one TLS record
/// of the largest size (RFC 8446 section 5.1: 2^14 bytes and its 5-byte header), which a
/// ClientHello fits in.
pub const KEPT: usize = (1 << 14) + 5;

/// The content type of a TLS handshake record (RFC 8446 section 5.1), what a ClientHello is sent in.
const TLS_HANDSHAKE: u8 = 22;

/// How long a slot may take to answer a client's first bytes before the connection is replayed to
/// another serving slot. A kcp that runs answers a ClientHello in milliseconds; a stopped one never
/// does. Waiting too little costs only a handshake on another slot (the first one's is dropped
/// unread), and a slot left for its silence is asked again if the next one fails, so this is short.
pub const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// A connection whose slot has answered (or that can no longer be replayed): what the copy loop
/// takes over.
pub(super) struct Opened {
    pub active: Arc<Active>,
    pub pin: Pinned,
    pub upstream: TcpStream,
    /// The TLS records of both directions as far as they have passed.
    pub exchange: keepalive::Exchange,
    /// The client has ended its side (EOF), passed on to the slot as a half-close.
    pub client_ended: bool,
}

/// Why the slot of an opening connection is abandoned.
enum Abandoned {
    Failed(std::io::Error),
    Silent,
}

/// Connects `client` to a slot and carries its opening, replaying it to another slot when the one
/// it went to fails or stays silent. `None` when the connection is over: no slot took it, or its
/// client went away.
pub(super) async fn open(router: &Router, client: &mut TcpStream, peer: SocketAddr) -> Option<Opened> {
    let (mut active, mut pin, mut upstream) = connect(router, peer).await?;
    // The slots this connection went to, and those of them whose connection failed.
    let mut tried = vec![active.backend.address];
    let mut failed: Vec<SocketAddr> = Vec::new();
    let mut kept: Vec<u8> = Vec::new();
    let mut exchange = keepalive::Exchange::default();
    let mut client_ended = false;
    // Set by the client's first byte; `None` while nothing is awaited, or once nobody else could answer.
    let mut answer_by: Option<Instant> = None;
    loop {
        let abandoned = tokio::select! {
            biased;
            readable = upstream.readable() => {
                let mut answer = Vec::new();
                match readable.and_then(|()| read_into(&upstream, &mut answer)) {
                    Ok(None) => continue,
                    Ok(Some(0)) => Abandoned::Failed(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(Some(_)) => {
                        exchange.slot_sent(&answer);
                        if let Err(err) = client.write_all(&answer).await {
                            debug!(%peer, error = %err, "the client went away before its slot's answer reached it");
                            return None;
                        }
                        return Some(Opened { active, pin, upstream, exchange, client_ended });
                    }
                    Err(err) => Abandoned::Failed(err),
                }
            },
            readable = client.readable(), if !client_ended => {
                let start = kept.len();
                match readable.and_then(|()| read_into(client, &mut kept)) {
                    Ok(None) => continue,
                    Ok(Some(0)) => {
                        client_ended = true;
                        match upstream.shutdown().await {
                            Ok(()) => continue,
                            Err(err) => Abandoned::Failed(err),
                        }
                    }
                    Ok(Some(_)) => {
                        // The first request on a connection is always forwarded: no verdict to heed.
                        exchange.client_sent(&kept[start..], false);
                        answer_by.get_or_insert(Instant::now() + ANSWER_WAIT);
                        if let Err(err) = upstream.write_all(&kept[start..]).await {
                            Abandoned::Failed(err)
                        } else if kept.len() > KEPT || kept[0] != TLS_HANDSHAKE {
                            return Some(Opened { active, pin, upstream, exchange, client_ended });
                        } else {
                            continue;
                        }
                    }
                    Err(err) => {
                        debug!(%peer, error = %err, "the client's connection failed before its slot answered");
                        return None;
                    }
                }
            },
            () = tokio::time::sleep_until(answer_by.unwrap_or_else(Instant::now)), if answer_by.is_some() => Abandoned::Silent,
        };
        // Replay on the next untried serving slot that takes the kept bytes; when this one failed,
        // a slot left earlier for its silence is slow, not dead, and may be asked again.
        let gone = active.clone();
        if let Abandoned::Failed(_) = abandoned {
            failed.push(gone.backend.address);
        }
        let replayed = loop {
            let next = match abandoned {
                Abandoned::Failed(_) => router.pick_other(&tried).or_else(|| router.pick_other(&failed)),
                Abandoned::Silent => router.pick_other(&tried),
            };
            let Some(next) = next else {
                break None;
            };
            tried.push(next.backend.address);
            match replay(&next, &kept, client_ended).await {
                Ok(stream) => break Some((next, stream)),
                Err(err) => {
                    debug!(%peer, slot = %next.backend.slot, error = %err, "a replay found its slot gone too");
                    failed.push(next.backend.address);
                }
            }
        };
        match (replayed, abandoned) {
            (Some((next, stream)), abandoned) => {
                let why = match &abandoned {
                    Abandoned::Failed(err) => err.to_string(),
                    Abandoned::Silent => format!("no answer within {ANSWER_WAIT:?}"),
                };
                debug!(%peer, from = %gone.backend.slot, to = %next.backend.slot, why, "replayed a connection its slot did not answer");
                gone.counters.count_replayed(matches!(abandoned, Abandoned::Silent));
                pin = Pinned::new(&next.counters);
                (active, upstream) = (next, stream);
                answer_by = (!kept.is_empty()).then(|| Instant::now() + ANSWER_WAIT);
            }
            (None, Abandoned::Silent) => answer_by = None,
            (None, Abandoned::Failed(err)) => {
                warn!(%peer, slot = %gone.backend.slot, error = %err,
                    "closing a client connection: its slot failed before answering and no other slot serves");
                gone.counters.count_failed();
                return None;
            }
        }
    }
}

/// Reads what `stream` has into `into`'s spare room (growing it by a read's worth): `None` when
/// nothing was there after all, else the bytes read (empty at EOF).
fn read_into(stream: &TcpStream, into: &mut Vec<u8>) -> std::io::Result<Option<usize>> {
    into.reserve(4096);
    match stream.try_read_buf(into) {
        Ok(n) => Ok(Some(n)),
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(err) => Err(err),
    }
}

/// A connection to `to` carrying what the client sent so far (and its half-close, if it ended).
async fn replay(to: &Active, kept: &[u8], client_ended: bool) -> std::io::Result<TcpStream> {
    let mut stream = dial(to.backend.address, Instant::now() + RETRY_WINDOW).await?;
    stream.write_all(kept).await?;
    if client_ended {
        stream.shutdown().await?;
    }
    Ok(stream)
}
