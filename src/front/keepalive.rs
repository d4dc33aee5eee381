//! Which connections to a slot that left the serving set the front closes itself, and when: a
//! kept-alive HTTP/1.1 connection, at the moment the client starts its next request.
//!
//! Why: kcp fails `/readyz` from SIGTERM until it closes its idle connections, 0.02-0.12 s later
//! in the roll bench (its pre-shutdown hooks run in between). A client that keeps one connection
//! alive and asks in that window gets a 500 "shutdown", although the front moved every new
//! connection to a serving slot before. So no request that follows an answer is forwarded to a
//! retired slot: the front closes the connection instead, before any byte of an answer, which is
//! the close HTTP clients retry on a reused connection (Go's transport for an idempotent request,
//! curl always, urllib3 with its default retries), and the client dials again, to a serving slot.
//!
//! The front passes TLS through, so it sees no HTTP. What it does see, in the clear, and all this
//! relies on:
//! - the ClientHello's ALPN list: a client that does not offer `h2` speaks HTTP/1.1, one request
//!   at a time, and sends its next request only once it has read the whole answer (no client in
//!   use pipelines). An HTTP/2 connection multiplexes, so it is never "between requests": it is
//!   left to kcp, which ends it with GOAWAY.
//! - every TLS record's 5-byte header (type, version, length) in both directions, so the front
//!   knows where each record starts and whether the slot's last one is complete;
//! - the ServerHello: TLS 1.2 or 1.3 (`supported_versions`) and the cipher suite. In TLS 1.2 the
//!   handshake is in handshake records, and every application-data record is HTTP. In TLS 1.3 the
//!   client's encrypted handshake is application-data records too, ending with its Finished, whose
//!   record length the suite fixes (hash + 4 + 1 + tag): the client's records after that one are
//!   HTTP. The slot's NewSessionTickets may come after the client's Finished (not kcp's: Go sends
//!   them with its own Finished); they count as an answer only when a request is outstanding, in
//!   which case the whole answer follows them anyway. KeyUpdate and alert records (at most
//!   [`SMALL_RECORD`] bytes) are neither requests nor answers.
//!
//! The rules: once the slot is retired, a client application-data record that starts after the
//! slot answered the previous request with complete records is not forwarded; the connection is
//! closed. The first request on a connection is always forwarded (a client retries a close only
//! on a connection it reused). An answer is never cut: the front closes only on the client's
//! turn, however long the slot paused mid-answer and however short the client's pause. And a
//! connection left unused for [`IDLE_CLOSE`] after a complete answer (a pool's spare) is closed
//! then, so that its client drops it before reuse; only an answer paused that long mid-way is cut
//! by this one. A request
//! whose body the client sends after a `100 Continue` is closed before its answer like a new one.
//! An upgraded stream (`exec`, `attach`, `port-forward` over HTTP/1.1) looks like requests and
//! answers and is closed at the client's next record after the slot's; an HTTP/1.1 watch, after
//! [`IDLE_CLOSE`] without an event (its client re-watches through a serving slot).

use std::time::Duration;

/// How long the slot must have been silent after a complete answer before the front closes a
/// retired slot's kept-alive connection that its client does not use: a pool's idle connection,
/// which the client then drops before reuse instead of meeting the close at its next request
/// (hyper, and so kube-rs, and Python's requests would surface that as an error). Long against
/// a pause in the middle of an answer (kcp writes an answer from memory; a kcp stopped 50 ms
/// mid-answer is still served whole), short against the controller's 2 s wait before SIGTERM.
pub const IDLE_CLOSE: Duration = Duration::from_secs(1);

/// The longest encrypted TLS 1.3 record that is a KeyUpdate (22: 5 bytes of message, a content
/// type byte and a 16-byte tag) or an alert (19): never an HTTP request or answer, which are longer.
pub const SMALL_RECORD: usize = 22;

const CHANGE_CIPHER_SPEC: u8 = 20;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

/// The first bytes a client sent hold a whole ClientHello that does not offer HTTP/2. Anything
/// else (a ClientHello split over two reads, not TLS, `h2` offered) is not known to be HTTP/1.1.
/// The test for `h2` is a search for its ALPN entry (length 2, "h2") anywhere in the hello, which
/// may also match random bytes of it: that errs on the side of leaving the connection alone.
pub fn offers_http1_only(first: &[u8]) -> bool {
    const CLIENT_HELLO: u8 = 0x01;
    if first.len() < 6 || first[0] != HANDSHAKE || first[5] != CLIENT_HELLO {
        return false;
    }
    let record = 5 + u16::from_be_bytes([first[3], first[4]]) as usize;
    first.len() >= record && memchr::memmem::find(&first[..record], b"\x02h2").is_none()
}

/// Finds the record boundaries in one direction's bytes as they pass.
#[derive(Debug, Default)]
struct Records {
    header: [u8; 5],
    /// Header bytes seen of the next record (0 to 4: a header split between two reads).
    filled: usize,
    /// Bytes of the current record's body still to come.
    remaining: usize,
}

impl Records {
    fn at_boundary(&self) -> bool {
        self.filled == 0 && self.remaining == 0
    }

    /// Calls `each(type, length, body)` for every record whose header completes in `bytes`; `body`
    /// is as much of the record's body as `bytes` holds. Stops early when `each` returns false.
    fn feed(&mut self, mut bytes: &[u8], mut each: impl FnMut(u8, usize, &[u8]) -> bool) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let skip = self.remaining.min(bytes.len());
                self.remaining -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (5 - self.filled).min(bytes.len());
            self.header[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled < 5 {
                return;
            }
            self.filled = 0;
            let length = u16::from_be_bytes([self.header[3], self.header[4]]) as usize;
            self.remaining = length;
            if !each(self.header[0], length, &bytes[..length.min(bytes.len())]) {
                return;
            }
        }
    }
}

/// What the front makes of a connection's bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Judge {
    /// Nothing from the client yet.
    #[default]
    Unseen,
    /// TLS carrying HTTP/1.1, followed record by record.
    Http1,
    /// Anything else (HTTP/2, not TLS, something the front does not follow): left alone.
    Unjudged,
}

/// Where an HTTP/1.1 exchange stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// No request yet.
    #[default]
    Idle,
    /// The client sent a request (or part of one); the answer has not begun.
    Requested,
    /// The slot has sent (part of) the answer.
    Answered,
}

/// What to do with bytes the client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    /// They start the next request on a connection to a retired slot: close it instead.
    Close,
}

/// One connection's TLS records as the front follows them (see the module's doc).
#[derive(Debug, Default)]
pub struct Exchange {
    judge: Judge,
    client: Records,
    slot: Records,
    /// From the ServerHello: TLS 1.3, and the length of the client's Finished record. `None`
    /// until it was seen.
    tls13: Option<Option<usize>>,
    /// The client's handshake is over: its application-data records are HTTP.
    client_done: bool,
    turn: Turn,
}

impl Exchange {
    /// Whether the front closes this connection itself once its slot is retired (kept-alive
    /// HTTP/1.1 it follows), as opposed to leaving it to the slot.
    pub fn closable(&self) -> bool {
        self.judge == Judge::Http1
    }

    /// The slot has begun answering the last request: the client's next request is its last on
    /// this connection once the slot is retired (closed, not forwarded), so no request of this
    /// connection reaches a retired slot any more.
    pub fn answering(&self) -> bool {
        self.judge == Judge::Http1 && self.turn == Turn::Answered
    }

    /// The slot's answer to the last request is out in complete records and the client has not
    /// started another: between two requests, unless the slot pauses mid-answer.
    pub fn answered(&self) -> bool {
        self.judge == Judge::Http1 && self.turn == Turn::Answered && self.slot.at_boundary()
    }

    /// The client sent `bytes`; `retired` says whether the connection's slot left the serving set.
    pub fn client_sent(&mut self, bytes: &[u8], retired: bool) -> Verdict {
        match self.judge {
            Judge::Unjudged => return Verdict::Forward,
            Judge::Unseen if !offers_http1_only(bytes) => {
                self.judge = Judge::Unjudged;
                return Verdict::Forward;
            }
            _ => self.judge = Judge::Http1,
        }
        let mut verdict = Verdict::Forward;
        let mut judge = Judge::Http1;
        let (tls13, slot_complete) = (self.tls13, self.slot.at_boundary());
        let (client_done, turn) = (&mut self.client_done, &mut self.turn);
        self.client.feed(bytes, |kind, length, _| {
            match (kind, tls13) {
                (APPLICATION_DATA, None) => judge = Judge::Unjudged, // early data: not followed
                (APPLICATION_DATA, Some(Some(finished))) if !*client_done => *client_done = length == finished,
                (APPLICATION_DATA, _) if length <= SMALL_RECORD => {}
                (APPLICATION_DATA, _) => {
                    if retired && *turn == Turn::Answered && slot_complete {
                        verdict = Verdict::Close;
                        return false;
                    }
                    *turn = Turn::Requested;
                }
                (HANDSHAKE, _) if *turn != Turn::Idle => judge = Judge::Unjudged, // renegotiation
                (HANDSHAKE | CHANGE_CIPHER_SPEC | ALERT, _) => {}
                _ => judge = Judge::Unjudged,
            }
            judge == Judge::Http1
        });
        self.judge = judge;
        verdict
    }

    /// The slot sent `bytes`.
    pub fn slot_sent(&mut self, bytes: &[u8]) {
        if self.judge != Judge::Http1 {
            return;
        }
        let mut judge = Judge::Http1;
        let (tls13, turn) = (&mut self.tls13, &mut self.turn);
        self.slot.feed(bytes, |kind, length, body| {
            match kind {
                HANDSHAKE if tls13.is_none() => match read_server_hello(body, length) {
                    Some(Hello::Retry) => {}
                    Some(Hello::Tls12) => *tls13 = Some(None),
                    Some(Hello::Tls13 { finished }) => *tls13 = Some(Some(finished)),
                    None => judge = Judge::Unjudged,
                },
                HANDSHAKE if *turn != Turn::Idle => judge = Judge::Unjudged, // renegotiation
                APPLICATION_DATA if tls13.is_none() => judge = Judge::Unjudged,
                APPLICATION_DATA if length > SMALL_RECORD && *turn == Turn::Requested => *turn = Turn::Answered,
                HANDSHAKE | APPLICATION_DATA | CHANGE_CIPHER_SPEC | ALERT => {}
                _ => judge = Judge::Unjudged,
            }
            judge == Judge::Http1
        });
        self.judge = judge;
    }
}

/// What a ServerHello says.
#[derive(Debug, PartialEq, Eq)]
enum Hello {
    /// A HelloRetryRequest: the real ServerHello follows.
    Retry,
    Tls12,
    /// TLS 1.3, with the length of the client's Finished record.
    Tls13 {
        finished: usize,
    },
}

/// Reads the ServerHello at the start of a handshake record's `body` (of `length` bytes): `None`
/// if the record is not whole in `body` or not a ServerHello the front can read.
fn read_server_hello(body: &[u8], length: usize) -> Option<Hello> {
    const SERVER_HELLO: u8 = 2;
    const SUPPORTED_VERSIONS: u16 = 0x002b;
    /// SHA-256 of "HelloRetryRequest" (RFC 8446 section 4.1.3).
    const RETRY_RANDOM: [u8; 32] = [
        0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2, 0xa2,
        0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
    ];
    let body = body.get(..length)?;
    let mut at = Reader(body);
    if at.u8()? != SERVER_HELLO {
        return None;
    }
    let length = at.u24()?;
    let message = at.take(length)?;
    let mut hello = Reader(message);
    hello.take(2)?; // legacy_version
    let random = hello.take(32)?;
    let session_id = hello.u8()? as usize;
    hello.take(session_id)?;
    let suite = hello.u16()?;
    hello.take(1)?; // compression
    let mut tls13 = false;
    if let Some(length) = hello.u16() {
        let mut extensions = Reader(hello.take(length as usize)?);
        while let Some(kind) = extensions.u16() {
            let length = extensions.u16()? as usize;
            let data = extensions.take(length)?;
            if kind == SUPPORTED_VERSIONS {
                tls13 = data == [0x03, 0x04];
            }
        }
    }
    if !tls13 {
        return Some(Hello::Tls12);
    }
    if random == RETRY_RANDOM {
        return Some(Hello::Retry);
    }
    // TLS 1.3 suites: the hash's length and the AEAD tag's (RFC 8446 appendix B.4).
    let (hash, tag) = match suite {
        0x1301 | 0x1303 | 0x1304 => (32, 16),
        0x1302 => (48, 16),
        0x1305 => (32, 8),
        _ => return None,
    };
    Some(Hello::Tls13 {
        finished: 4 + hash + 1 + tag,
    })
}

/// Big-endian fields off the front of a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3).map(|b| u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize)
    }
}

/// Handshake and record shapes for tests, as clients and servers send them.
#[cfg(test)]
pub mod shapes {
    /// A ClientHello record with an ALPN extension listing `protocols`.
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
        handshake(1, &body)
    }

    /// A ServerHello record: TLS 1.3 with TLS_AES_128_GCM_SHA256 (a client Finished record of
    /// [`FINISHED`] bytes), or TLS 1.2.
    pub fn server_hello(tls13: bool) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[0x22; 32]);
        body.extend_from_slice(&[0x00, 0x13, 0x01, 0x00]);
        let extensions: &[u8] = if tls13 {
            &[0x00, 0x2b, 0x00, 0x02, 0x03, 0x04]
        } else {
            &[]
        };
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(extensions);
        handshake(2, &body)
    }

    /// The client's Finished record under the suite of [`server_hello`].
    pub const FINISHED: usize = 4 + 32 + 1 + 16;

    /// One record of `kind` with a body of `length` bytes.
    pub fn record(kind: u8, length: usize) -> Vec<u8> {
        let mut record = vec![kind, 0x03, 0x03];
        record.extend_from_slice(&(length as u16).to_be_bytes());
        record.resize(5 + length, 0x5a);
        record
    }

    /// An application-data record of `length` bytes.
    pub fn data(length: usize) -> Vec<u8> {
        record(23, length)
    }

    fn handshake(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut message = vec![kind, 0x00];
        message.extend_from_slice(&(body.len() as u16).to_be_bytes());
        message.extend_from_slice(body);
        let mut record = vec![0x16, 0x03, 0x01];
        record.extend_from_slice(&(message.len() as u16).to_be_bytes());
        record.extend_from_slice(&message);
        record
    }
}

#[cfg(test)]
mod tests {
    use super::shapes::*;
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
    fn server_hellos_say_the_version_and_the_finished_length() {
        let tls13 = server_hello(true);
        assert_eq!(server_hello_of(&tls13), Some(Hello::Tls13 { finished: FINISHED }));
        assert_eq!(server_hello_of(&server_hello(false)), Some(Hello::Tls12));
        assert_eq!(server_hello_of(&tls13[..tls13.len() - 1]), None, "cut short");
        let mut retry = tls13.clone();
        retry[11..43].copy_from_slice(&[
            0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2, 0xa2,
            0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
        ]);
        assert_eq!(server_hello_of(&retry), Some(Hello::Retry));
    }

    fn server_hello_of(record: &[u8]) -> Option<Hello> {
        let length = u16::from_be_bytes([record[3], record[4]]) as usize;
        read_server_hello(&record[5..], length)
    }

    /// A TLS 1.3 connection through its handshake (Go's order: tickets with the server's Finished)
    /// and one request and answer.
    fn after_one_exchange(retired: bool) -> Exchange {
        let mut e = Exchange::default();
        assert_eq!(e.client_sent(&client_hello(&[b"http/1.1"]), retired), Verdict::Forward);
        e.slot_sent(&[server_hello(true), record(20, 1), data(2000), data(90), data(90)].concat());
        assert_eq!(
            e.client_sent(&[record(20, 1), data(FINISHED)].concat(), retired),
            Verdict::Forward
        );
        assert_eq!(
            e.client_sent(&data(300), retired),
            Verdict::Forward,
            "the first request"
        );
        e.slot_sent(&data(400));
        e
    }

    #[test]
    fn the_next_request_to_a_retired_slot_is_closed_and_to_a_serving_one_forwarded() {
        let mut serving = after_one_exchange(false);
        assert!(serving.closable());
        assert_eq!(serving.client_sent(&data(300), false), Verdict::Forward);
        serving.slot_sent(&data(400));
        assert_eq!(serving.client_sent(&data(300), true), Verdict::Close, "retired since");
        let mut retired = after_one_exchange(true);
        assert_eq!(retired.client_sent(&data(300), true), Verdict::Close);
    }

    #[test]
    fn the_first_request_is_forwarded_even_after_late_session_tickets() {
        // A server that sends its tickets after the client's Finished, and a client that waits.
        let mut e = Exchange::default();
        e.client_sent(&client_hello(&[]), true);
        e.slot_sent(&[server_hello(true), data(2000)].concat());
        assert_eq!(e.client_sent(&data(FINISHED), true), Verdict::Forward);
        e.slot_sent(&[data(90), data(90)].concat());
        assert_eq!(
            e.client_sent(&data(300), true),
            Verdict::Forward,
            "no request was answered yet"
        );
        e.slot_sent(&data(400));
        assert_eq!(e.client_sent(&data(300), true), Verdict::Close);
    }

    #[test]
    fn an_answer_split_anywhere_or_paused_is_never_cut() {
        let mut e = after_one_exchange(false);
        assert_eq!(e.client_sent(&data(300), false), Verdict::Forward);
        let answer = [data(16384), data(16384), data(100)].concat();
        // The slot's answer arrives in odd pieces, its last record still incomplete.
        for piece in answer[..answer.len() - 1].chunks(7000) {
            e.slot_sent(piece);
        }
        // A KeyUpdate from the client mid-answer is not a request.
        assert_eq!(e.client_sent(&data(SMALL_RECORD), true), Verdict::Forward);
        e.slot_sent(&answer[answer.len() - 1..]);
        assert_eq!(e.client_sent(&data(300), true), Verdict::Close, "the answer is whole");
    }

    #[test]
    fn a_record_header_split_between_reads_is_followed() {
        let mut e = after_one_exchange(true);
        let request = data(300);
        assert_eq!(e.client_sent(&request[..3], true), Verdict::Forward, "not known yet");
        assert_eq!(e.client_sent(&request[3..], true), Verdict::Close);
    }

    #[test]
    fn a_slot_record_after_the_request_starts_the_answer_but_a_key_update_does_not() {
        let mut e = after_one_exchange(false);
        e.client_sent(&data(300), false);
        e.slot_sent(&data(SMALL_RECORD));
        assert_eq!(e.client_sent(&data(300), true), Verdict::Forward, "no answer yet");
    }

    #[test]
    fn tls12_records_are_http_from_the_first() {
        let mut e = Exchange::default();
        e.client_sent(&client_hello(&[]), true);
        e.slot_sent(&[server_hello(false), record(22, 900)].concat());
        e.client_sent(&[record(22, 70), record(20, 1), record(22, 40)].concat(), true);
        e.slot_sent(&[record(20, 1), record(22, 40)].concat());
        assert_eq!(e.client_sent(&data(300), true), Verdict::Forward);
        e.slot_sent(&data(400));
        assert_eq!(e.client_sent(&data(300), true), Verdict::Close);
    }

    #[test]
    fn http2_plain_http_early_data_and_renegotiation_are_not_judged() {
        let mut h2 = Exchange::default();
        h2.client_sent(&client_hello(&[b"h2"]), true);
        assert!(!h2.closable());
        let mut plain = Exchange::default();
        plain.client_sent(b"GET / HTTP/1.1\r\n\r\n", true);
        assert!(!plain.closable());
        let mut early = Exchange::default();
        early.client_sent(&[client_hello(&[]), data(300)].concat(), true);
        assert!(!early.closable());
        let mut renegotiated = after_one_exchange(true);
        renegotiated.slot_sent(&record(22, 40));
        assert!(!renegotiated.closable());
        assert_eq!(renegotiated.client_sent(&data(300), true), Verdict::Forward);
    }
}
