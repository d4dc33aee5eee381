//! KinePostgres shards: their spec, and each slot's own kine on the test's PostgreSQL.
use super::*;

/// A KinePostgres shard on `pg` (database kcp_e2e, user postgres, the password in `password_file`).
pub fn postgres_spec(
    version: &str,
    front: &str,
    pg: &crate::support::Postgres,
    password_file: &std::path::Path,
) -> Value {
    json!({
        "version": version,
        "store": {
            "type": "KinePostgres",
            "kinePostgres": {
                "host": "127.0.0.1",
                "port": pg.port,
                "database": "kcp_e2e",
                "user": "postgres",
                "passwordFrom": { "file": password_file.display().to_string() },
            },
        },
        "front": { "type": "Tcp", "listen": front },
    })
}

/// spec.store of a managed PostgreSQL on `port` (user kcp, database kcp), its password in
/// `password_file`.
pub fn managed_postgres_store(port: u16, password_file: &std::path::Path) -> Value {
    json!({
        "type": "KinePostgres",
        "kinePostgres": {
            "host": "127.0.0.1",
            "port": port,
            "database": "kcp",
            "user": "kcp",
            "passwordFrom": { "file": password_file.display().to_string() },
            "managed": true,
        },
    })
}

/// The postmaster's pid of a shard's managed PostgreSQL, from its `postmaster.pid`.
pub fn managed_postmaster(env: &Env, shard: &str) -> Option<i32> {
    let pid_file = env.shard_dir(shard).join("store/postgres/data/postmaster.pid");
    std::fs::read_to_string(pid_file)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Live kine processes of this shard's slots on this PostgreSQL (their endpoint names both).
pub fn slot_kines(pg: &crate::support::Postgres, shard: &str) -> Vec<(i32, String)> {
    processes_with(&format!("@127.0.0.1:{}/", pg.port))
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains(&format!("application_name=kcpshard-{shard}-")))
        // A preflight's kine serves a scratch copy, not a slot.
        .filter(|(_, cmdline)| !cmdline.contains(&format!("application_name=kcpshard-{shard}-preflight")))
        .collect()
}

/// Waits up to 15 s until `n` slot kines of the shard run on `pg` (an old slot's kine stops after
/// its slot); fails naming those that run.
pub fn await_slot_kines(pg: &crate::support::Postgres, shard: &str, n: usize) {
    let settled = crate::support::poll(Duration::from_secs(15), Duration::from_millis(100), || {
        (slot_kines(pg, shard).len() == n).then_some(())
    });
    assert!(
        settled.is_some(),
        "want {n} slot kines, an old slot's kine still runs: {:?}",
        slot_kines(pg, shard)
    );
}

/// Slot kines have no state dir in their argv, which is what the e2e sweep looks for: sweep
/// them by their PostgreSQL's port, however the test ends.
pub struct SweepKines(pub u16);

impl Drop for SweepKines {
    fn drop(&mut self) {
        sweep(&format!("@127.0.0.1:{}/", self.0), Duration::from_secs(5));
    }
}
