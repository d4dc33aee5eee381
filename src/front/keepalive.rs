//! Which connections to a slot the front no longer forwards to can be closed before that slot gets
//! SIGTERM: kept-alive HTTP/1.1 connections between two requests.
//!
//! Why: kcp fails `/readyz` from SIGTERM until it closes its idle connections, 0.02-0.12 s later
//! in the roll bench (its pre-shutdown hooks run in between). A client that keeps one connection
//! alive and asks `/readyz` in that window gets a 500 "shutdown", although the front moved every
//! new connection to the new slot half a second before (docs/benchmarks.md, "Rolls under load": 6 of 30,714
//! requests). Closing such a connection while it is idle has the effect of kcp's own idle close,
//! earlier: the client dials again, through the front, to the new slot; a request racing the close
//! is retried by Go's transport as it would be against kcp's close.
//!
//! The front passes TLS through, so it sees no HTTP. What it can see, and all this relies on:
//! - the ClientHello's ALPN list, in the clear: a client that does not offer `h2` speaks
//!   HTTP/1.1, one request at a time (an HTTP/2 connection multiplexes, so it is never "between
//!   requests"; kcp ends those itself, with GOAWAY);
//! - whose turn it is: from the client's third flight of bytes on, every flight of the client's is
//!   a request and every flight of the slot's is the answer (TLS 1.2 and 1.3 handshakes take the
//!   first two; TLS 1.3 session tickets may come after the client's second);
//! - quiet: kcp writes a response as fast as it encodes it, from memory, so a silence of
//!   [`QUIET`] after the slot's bytes means the answer is complete, unless kcp was not scheduled
//!   for that long (then the answer is cut, and client-go retries a GET). A watch is silent
//!   between events and is cut then: it would be cut when the old slot stops anyway, and the
//!   client re-watches through the new slot.

use std::time::Duration;

use tokio::time::Instant;

/// How long the slot must have been silent after its answer before the connection is closed.
pub const QUIET: Duration = Duration::from_millis(20);

/// The client's flights of bytes that belong to the TLS handshake (client hello, then finished;
/// TLS 1.3 may put the first request in the second): from the third on, each is a request.
const HANDSHAKE_FLIGHTS: u32 = 2;

/// The first bytes a client sent hold a whole ClientHello that does not offer HTTP/2. Anything
/// else (a ClientHello split over two reads, not TLS, `h2` offered) is not known to be HTTP/1.1.
/// The test for `h2` is a search for its ALPN entry (length 2, "h2") anywhere in the hello, which
/// may also match random bytes of it: that errs on the side of leaving the connection alone.
pub fn offers_http1_only(first: &[u8]) -> bool {
    const HANDSHAKE: u8 = 0x16;
    const CLIENT_HELLO: u8 = 0x01;
    if first.len() < 6 || first[0] != HANDSHAKE || first[5] != CLIENT_HELLO {
        return false;
    }
    let record = 5 + u16::from_be_bytes([first[3], first[4]]) as usize;
    first.len() >= record && memchr::memmem::find(&first[..record], b"\x02h2").is_none()
}

/// Whose flight of bytes came last on a connection, and when the slot's ended.
#[derive(Debug, Default)]
pub struct Turns {
    client_flights: u32,
    /// The slot sent last, and when (its latest bytes).
    answered_at: Option<Instant>,
}

impl Turns {
    /// The client sent bytes (during one poll of the connection).
    pub fn client_sent(&mut self) {
        if self.answered_at.take().is_some() || self.client_flights == 0 {
            self.client_flights += 1;
        }
    }

    /// The slot sent bytes.
    pub fn slot_sent(&mut self, now: Instant) {
        self.answered_at = Some(now);
    }

    /// When the connection counts as idle between two requests, if it will unless someone sends:
    /// [`QUIET`] after the slot's answer to a request.
    pub fn idle_at(&self) -> Option<Instant> {
        match self.answered_at {
            Some(at) if self.client_flights > HANDSHAKE_FLIGHTS => Some(at + QUIET),
            _ => None,
        }
    }
}

/// A ClientHello record as a client sends it: one handshake record holding the hello, with an ALPN
/// extension listing `protocols`.
#[cfg(test)]
pub fn client_hello(protocols: &[&[u8]]) -> Vec<u8> {
    let mut alpn_list = Vec::new();
    for p in protocols {
        alpn_list.push(p.len() as u8);
        alpn_list.extend_from_slice(p);
    }
    let mut extension = vec![0x00, 0x10];
    extension.extend_from_slice(&((alpn_list.len() + 2) as u16).to_be_bytes());
    extension.extend_from_slice(&(alpn_list.len() as u16).to_be_bytes());
    extension.extend_from_slice(&alpn_list);
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x11; 32]); // random
    body.extend_from_slice(&[0x00]); // no session id
    body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // one cipher suite
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    body.extend_from_slice(&(extension.len() as u16).to_be_bytes());
    body.extend_from_slice(&extension);
    let mut handshake = vec![0x01, 0x00];
    handshake.extend_from_slice(&(body.len() as u16).to_be_bytes());
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_without_h2_is_http1_and_one_with_h2_is_not() {
        assert!(offers_http1_only(&client_hello(&[b"http/1.1"])));
        assert!(offers_http1_only(&client_hello(&[])));
        assert!(!offers_http1_only(&client_hello(&[b"h2", b"http/1.1"])));
        assert!(!offers_http1_only(&client_hello(&[b"http/1.1", b"h2"])));
    }

    #[test]
    fn a_hello_cut_short_or_anything_not_a_hello_is_left_alone() {
        let hello = client_hello(&[b"http/1.1"]);
        assert!(
            !offers_http1_only(&hello[..hello.len() - 1]),
            "the rest of the hello is unseen"
        );
        assert!(!offers_http1_only(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!offers_http1_only(&[]));
        let mut not_a_hello = hello.clone();
        not_a_hello[5] = 0x02;
        assert!(!offers_http1_only(&not_a_hello));
    }

    #[test]
    fn only_a_quiet_slot_after_an_answered_request_is_idle() {
        let t0 = Instant::now();
        let mut turns = Turns::default();
        turns.client_sent(); // client hello
        turns.slot_sent(t0); // server hello .. finished
        assert_eq!(turns.idle_at(), None, "mid-handshake");
        turns.client_sent(); // finished (and maybe the first request)
        turns.slot_sent(t0); // session tickets, or the answer
        assert_eq!(turns.idle_at(), None, "tickets may come before the first answer");
        turns.client_sent(); // a request
        assert_eq!(turns.idle_at(), None, "a request is in flight");
        turns.slot_sent(t0 + Duration::from_millis(5));
        assert_eq!(turns.idle_at(), Some(t0 + Duration::from_millis(5) + QUIET));
        // More of the answer moves the moment on; a new request cancels it.
        turns.slot_sent(t0 + Duration::from_millis(9));
        assert_eq!(turns.idle_at(), Some(t0 + Duration::from_millis(9) + QUIET));
        turns.client_sent();
        assert_eq!(turns.idle_at(), None);
    }

    #[test]
    fn a_request_sent_in_several_reads_is_one_flight() {
        let t0 = Instant::now();
        let mut turns = Turns::default();
        turns.client_sent();
        turns.client_sent();
        turns.slot_sent(t0);
        turns.client_sent();
        turns.client_sent();
        turns.slot_sent(t0);
        assert_eq!(turns.idle_at(), None, "still two client flights: the handshake");
    }
}
