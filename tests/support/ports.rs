//! Ports for the programs a test starts that take a port number and bind it themselves (the
//! front's `spec.front.listen`, PostgreSQL, etcd, caddy): ports the kernel never hands out on its
//! own.
//!
//! A port found by binding port 0 and releasing it can be taken by anything before the program
//! binds it: the kernel picks the local ports of bind(0) and of every outgoing connection from its
//! ephemeral range (`net.ipv4.ip_local_port_range`). These ports come from outside that range, so
//! between this call and the program's bind only an explicit bind of that very port could take
//! one. Each test binary walks its own stretch of the range (it starts at a point chosen from its
//! pid), never hands a port out twice, and skips any port that something holds.
//!
//! kcp and kine need none of this: a slot's port is held by a `PortReservation` that kcp shares,
//! and kine listens on a unix socket.
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// The lowest port handed out: below it live the well-known services (PostgreSQL's 5432, kcp's
/// 6443, ...).
const LOWEST: u16 = 10_000;

/// A loopback port outside the kernel's ephemeral range that nothing holds and that this test
/// binary has not handed out before.
pub fn test_port() -> u16 {
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let (low, high) = quiet_range();
    let span = u32::from(high - low);
    let mut next = NEXT.lock().unwrap();
    let mut candidate = next.unwrap_or_else(|| low + (std::process::id().wrapping_mul(7919) % span) as u16);
    for _ in 0..span {
        let port = candidate;
        candidate = if candidate + 1 >= high { low } else { candidate + 1 };
        // Bound and dropped before anything connected: no TIME-WAIT is left on it.
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            *next = Some(candidate);
            return port;
        }
    }
    panic!("every port in {low}..{high} is taken")
}

/// The larger stretch outside the kernel's ephemeral range: below it (from [`LOWEST`]) or above
/// it, as `low..high`.
pub fn quiet_range() -> (u16, u16) {
    const RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
    let text = std::fs::read_to_string(RANGE).unwrap_or_else(|e| panic!("cannot read {RANGE}: {e}"));
    let bounds: Vec<u16> = text.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let [first, last] = bounds[..] else {
        panic!("{RANGE} holds {text:?}, not two ports")
    };
    let below = (LOWEST, first.max(LOWEST));
    let above = (last.saturating_add(1).max(LOWEST), u16::MAX);
    let size = |(low, high): (u16, u16)| high.saturating_sub(low);
    let range = if size(below) >= size(above) { below } else { above };
    assert!(
        size(range) >= 1000,
        "the kernel's ephemeral range ({first}-{last} in {RANGE}) leaves too few ports for tests: narrow it"
    );
    range
}
