//! The names of the processes kcpshard runs, as systemd units. Every name is made here, so that
//! `systemctl list-units 'kcpshard-*'` and `journalctl` find a shard's processes by one scheme:
//!
//! | process | unit |
//! |---|---|
//! | a slot's kcp | `kcpshard-<shard>-slot-<slot>.service` |
//! | the shard's kine (KineSqlite) | `kcpshard-<shard>-kine.service` |
//! | a slot's own kine (KinePostgres) | `kcpshard-<shard>-slot-<slot>-kine.service` |
//! | a preflight's kcp | `kcpshard-<shard>-preflight.service` |
//! | a preflight's kine | `kcpshard-<shard>-preflight-kine.service` |
//! | a managed PostgreSQL | `kcpshard-<shard>-postgres.service` |
//! | the initdb that makes a managed PostgreSQL's cluster | `kcpshard-<shard>-postgres-initdb.service` |
//! | the front | `kcpshard-<shard>-front.service` |
//! | a job: a dump or a restore of the store | `kcpshard-<shard>-job.service` |
//!
//! The detached runtime names no unit, but keeps the name in its log lines. Shard and slot names
//! are Kubernetes object names (lowercase letters, digits, `-`, `.`), which unit names allow as
//! they are; anything else is escaped the way `systemd-escape` does.
use std::fmt;

/// The prefix every unit of kcpshard's has.
pub const PREFIX: &str = "kcpshard-";

/// A unit name (`kcpshard-dev-slot-a.service`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnitName(String);

impl UnitName {
    /// A shard's job (a dump or a restore of its store).
    pub fn job(shard: &str) -> UnitName {
        UnitName::of(&[shard, "job"])
    }

    /// A slot's kcp.
    pub fn slot(shard: &str, slot: &str) -> UnitName {
        UnitName::of(&[shard, "slot", slot])
    }

    /// The kine every slot of a KineSqlite shard dials.
    pub fn shard_kine(shard: &str) -> UnitName {
        UnitName::of(&[shard, "kine"])
    }

    /// A slot's own kine (KinePostgres).
    pub fn slot_kine(shard: &str, slot: &str) -> UnitName {
        UnitName::of(&[shard, "slot", slot, "kine"])
    }

    /// The kcp of a shard's preflight (a new version alone on a copy of the data).
    pub fn preflight(shard: &str) -> UnitName {
        UnitName::of(&[shard, "preflight"])
    }

    /// The kine that serves a preflight's copy of the data.
    pub fn preflight_kine(shard: &str) -> UnitName {
        UnitName::of(&[shard, "preflight", "kine"])
    }

    /// The PostgreSQL kcpshard runs for a shard.
    pub fn postgres(shard: &str) -> UnitName {
        UnitName::of(&[shard, "postgres"])
    }

    /// The initdb that makes a managed PostgreSQL's cluster.
    pub fn postgres_initdb(shard: &str) -> UnitName {
        UnitName::of(&[shard, "postgres", "initdb"])
    }

    /// The shard's front.
    pub fn front(shard: &str) -> UnitName {
        UnitName::of(&[shard, "front"])
    }

    /// A process that belongs to no shard (a tool, a test's helper): `kcpshard-<name>.service`.
    pub fn other(name: &str) -> UnitName {
        UnitName::of(&[name])
    }

    fn of(parts: &[&str]) -> UnitName {
        let body: Vec<String> = parts.iter().map(|p| escape(p)).collect();
        UnitName(format!("{PREFIX}{}.service", body.join("-")))
    }

    /// A unit name read back (from a record or a cgroup path); None unless it is one of ours.
    pub fn parse(name: &str) -> Option<UnitName> {
        (name.starts_with(PREFIX) && name.ends_with(".service")).then(|| UnitName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `systemd-escape` for one name part: bytes outside `[A-Za-z0-9:_.-]` become `\xNN`; a leading `.`
/// too.
fn escape(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for (i, b) in part.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'-') || (b == b'.' && i > 0);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_process_of_a_shard_has_the_documented_unit_name() {
        assert_eq!(UnitName::slot("dev", "a").as_str(), "kcpshard-dev-slot-a.service");
        assert_eq!(UnitName::shard_kine("dev").as_str(), "kcpshard-dev-kine.service");
        assert_eq!(
            UnitName::slot_kine("dev", "b").as_str(),
            "kcpshard-dev-slot-b-kine.service"
        );
        assert_eq!(UnitName::postgres("dev").as_str(), "kcpshard-dev-postgres.service");
        assert_eq!(UnitName::front("my.shard").as_str(), "kcpshard-my.shard-front.service");
    }

    #[test]
    fn what_a_unit_name_cannot_hold_is_escaped_as_systemd_escape_does() {
        assert_eq!(UnitName::other("a b/c").as_str(), "kcpshard-a\\x20b\\x2fc.service");
        assert_eq!(UnitName::other(".x").as_str(), "kcpshard-\\x2ex.service");
    }

    #[test]
    fn only_our_own_service_units_parse() {
        assert_eq!(
            UnitName::parse("kcpshard-dev-front.service"),
            Some(UnitName::front("dev"))
        );
        assert_eq!(UnitName::parse("sshd.service"), None);
        assert_eq!(UnitName::parse("kcpshard-dev.slice"), None);
    }
}
