//! The data path: accept, pick the backend, connect to it, copy bytes both ways.
//!
//! Invariants (docs/front.md), each kept by one file:
//! - [`accept`]: TCP_NODELAY and keepalive set once on the listening socket; each accepted
//!   connection runs as its own task.
//! - [`connect`]: the backend is connected *before* a byte is read from the client, retrying a
//!   refused connect every [`RETRY_STEP`] for up to [`RETRY_WINDOW`].
//! - [`opening`]: until the slot's first byte, what the client sent is kept, and a slot that
//!   fails or stays silent for [`opening::ANSWER_WAIT`] has the connection replayed to another serving slot.
//! - [`pump`]: the copy both ways, half-closes propagated, no idle timeout; kept-alive HTTP/1.1
//!   connections to a retired slot closed between requests.
//! - [`accounting`]: per-slot and per-process counts, held by guards that live as long as the
//!   connection.
//! - [`router`]: where new connections go and which slots' connections are closed; a switch never
//!   touches an open connection, which stays pinned to its slot until one side closes.
mod accept;
mod accounting;
mod connect;
mod opening;
mod pump;
mod router;
#[cfg(test)]
mod tests;

pub use accept::{accept_loop, tune_listener};
pub use connect::{HOLD_WINDOW, RETRY_STEP, RETRY_WINDOW};
pub use router::Router;
