//! What Linux's `/proc` tells about a process: its start time (to tell a process from a later one
//! that reuses its pid), its state (a zombie is not running) and its argv; and whether anything
//! listens on a TCP port (the socket tables), which can be asked without connecting.
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

/// The parts of `/proc/<pid>/stat` that identify a process and say whether it still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Field 5.
    pub pgrp: i32,
    /// Field 6.
    pub session: i32,
    /// Field 22: clock ticks after boot at which the process started. With the pid, it names one
    /// process for the lifetime of the machine.
    pub start_time: u64,
    /// Fields 14 and 15: clock ticks the process (all its threads) ran in user and kernel mode.
    pub cpu_ticks: u64,
}

impl Stat {
    /// The process is gone or only waits to be reaped.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// The process is stopped (SIGSTOP, SIGTSTP) or held by a debugger: it answers nothing until it
    /// is continued. For a process of many threads this is its main thread's state, which a stop
    /// signal stops with all the others.
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }

    /// The CPU time the process has used.
    pub fn cpu_time(&self) -> Duration {
        Duration::from_secs_f64(self.cpu_ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
    }
}

/// Parses the text of `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may
/// itself hold spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // rest = " S ppid pgrp session ..."; its first field is field 3 of the file.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        state: field(3)?.chars().next()?,
        pgrp: field(5)?.parse().ok()?,
        session: field(6)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
        cpu_ticks: field(14)?.parse::<u64>().ok()? + field(15)?.parse::<u64>().ok()?,
    })
}

/// `/proc/<pid>/stat`, or None when there is no such process.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The argv of a process (`/proc/<pid>/cmdline`, NUL separated), or None when it is gone. A zombie
/// or kernel thread has an empty argv.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let bytes = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        bytes
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// The executable of a process, when readable (our own user's processes are).
pub fn exe(pid: u32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// The kcpshard unit whose cgroup holds the process (`/proc/<pid>/cgroup`: the unified hierarchy's
/// `0::/...`, or systemd's own `N:name=systemd:/...` on a hybrid host), if any.
pub fn unit(pid: u32) -> Option<super::UnitName> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    unit_in_cgroup(&text)
}

fn unit_in_cgroup(text: &str) -> Option<super::UnitName> {
    text.lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (controllers, path) = rest.split_once(':')?;
            (controllers.is_empty() || controllers == "name=systemd").then_some(path)
        })
        .find_map(|path| path.rsplit('/').find_map(super::UnitName::parse))
}

/// Every pid in `/proc`.
pub fn pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// Seconds since the epoch at which the machine booted (`btime` in `/proc/stat`).
pub fn boot_time() -> Option<u64> {
    fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Clock ticks per second, the unit of [`Stat::start_time`].
pub fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map(|t| t as u64)
        .unwrap_or(100)
}

/// Something on this machine listens on TCP `port` (any address, IPv4 or IPv6), from the socket
/// tables: asking this way opens no connection, so the listener logs nothing.
pub fn tcp_listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| fs::read_to_string(table).ok())
        .any(|text| table_listens(&text, port))
}

/// Whether a `/proc/net/tcp{,6}` table has a socket in state LISTEN (`0A`) on local port `port`.
fn table_listens(text: &str, port: u16) -> bool {
    !listening_inodes(text, port).is_empty()
}

/// The inodes of the sockets in state LISTEN on local port `port` in a `/proc/net/tcp{,6}` table.
fn listening_inodes(text: &str, port: u16) -> Vec<u64> {
    let wanted = format!(":{port:04X}");
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listens = fields.get(1).is_some_and(|l| l.ends_with(&wanted)) && fields.get(3) == Some(&"0A");
            listens.then(|| fields.get(9)?.parse().ok()).flatten()
        })
        .collect()
}

/// "pid 1234 (caddy run ...)" for an error about who holds an address.
pub fn describe(pid: u32) -> String {
    let argv = cmdline(pid).unwrap_or_default().join(" ");
    let argv: String = argv.chars().take(120).collect();
    format!("pid {pid} ({argv})")
}

/// The process that holds the listening socket on TCP `port`, when this user may see it (its
/// descriptors are readable: our own processes, or all of them as root).
pub fn listener_pid(port: u16) -> Option<u32> {
    pids().into_iter().find(|pid| listening_fd(*pid, port).is_some())
}

/// The descriptor of process `pid` that is a listening socket on TCP `port` (IPv4 or IPv6).
pub fn listening_fd(pid: u32, port: u16) -> Option<i32> {
    let wanted: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| fs::read_to_string(table).ok())
        .flat_map(|text| listening_inodes(&text, port))
        .map(|inode| format!("socket:[{inode}]"))
        .collect();
    if wanted.is_empty() {
        return None;
    }
    fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten().find_map(|fd| {
        let target = fs::read_link(fd.path()).ok()?;
        wanted
            .iter()
            .any(|w| target.as_os_str() == w.as_str())
            .then(|| fd.file_name().to_str()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_listening_socket_is_told_from_connections_on_the_same_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0050 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
";
        assert!(super::table_listens(table, 8080));
        assert!(
            !super::table_listens(table, 80),
            "an established connection is not a listener"
        );
        assert!(!super::table_listens(table, 443));
    }

    #[test]
    fn a_bound_listener_is_seen_and_a_closed_one_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(super::tcp_listening(port));
        assert_eq!(super::listener_pid(port), Some(std::process::id()));
        use std::os::fd::AsRawFd;
        assert_eq!(
            super::listening_fd(std::process::id(), port),
            Some(listener.as_raw_fd())
        );
        drop(listener);
        assert!(!super::tcp_listening(port));
    }

    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let text = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.pgrp, 4242);
        assert_eq!(s.session, 4242);
        assert_eq!(s.start_time, 987654);
        assert_eq!(s.cpu_ticks, 3, "utime 1 + stime 2");
        assert!(!s.is_dead());
    }

    #[test]
    fn the_unit_is_read_from_the_cgroup_path() {
        let user = "0::/user.slice/user-999.slice/user@999.service/app.slice/kcpshard-dev-front.service\n";
        assert_eq!(unit_in_cgroup(user), Some(crate::process::UnitName::front("dev")));
        assert_eq!(unit_in_cgroup("0::/system.slice/kcpshard.service\n"), None);
        let hybrid = "9:name=systemd:/user.slice/user-9.slice/user@9.service/app.slice/kcpshard-dev-kine.service\n8:pids:/\n0::/..\n";
        assert_eq!(
            unit_in_cgroup(hybrid),
            Some(crate::process::UnitName::shard_kine("dev"))
        );
        assert_eq!(unit_in_cgroup("0::/\n"), None);
    }

    #[test]
    fn zombies_are_dead() {
        let text = "7 (x) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert!(parse_stat(text).unwrap().is_dead());
    }

    #[test]
    fn our_own_stat_and_cmdline_are_readable() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert!(!s.is_dead());
        assert!(s.start_time > 0);
        assert!(!cmdline(me).unwrap().is_empty());
        assert!(pids().contains(&me));
        assert!(boot_time().unwrap() > 1_000_000_000);
    }
}
