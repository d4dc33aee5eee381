//! Snapshots of a KinePostgres store before a version change (docs/background.md section 6: a roll to a
//! new release may migrate stored objects, and only a dump taken before it can undo that).
//!
//! `pg_dump --format=custom` of the shard's database into `<shard>/snapshots/`, named
//! `<database>-<from>-to-<to>-<UTC time>.dump`; restore with `pg_restore` (docs/operations.md).
//! Only the newest `keep` dumps stay.
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use super::StoreError;
use super::managed::binary;
use super::postgres::PostgresServer;

pub const EXTENSION: &str = "dump";

/// Dumps the database into `dir`, then removes all but the newest `keep` dumps. Returns the path.
pub async fn pg_dump(
    server: &PostgresServer,
    dir: &Path,
    from: &str,
    to: &str,
    now: DateTime<Utc>,
    keep: usize,
) -> Result<PathBuf, StoreError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { path, source }
    };
    crate::fsutil::create_private_dir(dir).map_err(io(dir))?;
    let name = format!(
        "{}-{from}-to-{to}-{}.{EXTENSION}",
        server.database,
        now.format("%Y%m%dT%H%M%S%.3fZ")
    );
    let path = dir.join(&name);
    let partial = dir.join(format!(".{name}.partial"));
    let program = binary("pg_dump")?;
    let mut cmd = tokio::process::Command::new(&program);
    cmd.arg("--format=custom")
        .arg(format!("--file={}", partial.display()))
        .arg(format!("--host={}", server.host))
        .arg(format!("--port={}", server.port))
        .arg(format!("--username={}", server.user))
        .arg("--no-password")
        .arg(&server.database)
        .env("PGSSLMODE", server.ssl_mode.as_str())
        .envs(server.env());
    let out = cmd
        .output()
        .await
        .map_err(|e| StoreError::Invalid(format!("cannot run {}: {e}", program.display())))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(StoreError::Postgres {
            server: server.describe(),
            message: format!(
                "pg_dump failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    std::fs::set_permissions(&partial, std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(io(&partial))?;
    std::fs::rename(&partial, &path).map_err(io(&path))?;
    crate::fsutil::sync_dir(dir).map_err(io(dir))?;
    prune(dir, keep)?;
    Ok(path)
}

/// Removes all but the newest `keep` dumps in `dir` (by modification time).
pub fn prune(dir: &Path, keep: usize) -> Result<Vec<PathBuf>, StoreError> {
    let io = |source| StoreError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut dumps: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .map_err(io)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == EXTENSION))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    dumps.sort();
    let excess = dumps.len().saturating_sub(keep);
    let removed: Vec<PathBuf> = dumps.into_iter().take(excess).map(|(_, p)| p).collect();
    for path in &removed {
        std::fs::remove_file(path).map_err(io)?;
        tracing::info!(path = %path.display(), "removed an old snapshot");
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_dumps_stay() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            let path = dir.path().join(format!("kcp-v1-to-v2-{i}.dump"));
            std::fs::write(&path, "x").unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + i);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), "kept").unwrap();
        let removed = prune(dir.path(), 2).unwrap();
        let names = |paths: Vec<PathBuf>| {
            let mut n: Vec<String> = paths
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        assert_eq!(
            names(removed),
            ["kcp-v1-to-v2-0.dump", "kcp-v1-to-v2-1.dump", "kcp-v1-to-v2-2.dump"]
        );
        let left = names(
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect(),
        );
        assert_eq!(left, ["kcp-v1-to-v2-3.dump", "kcp-v1-to-v2-4.dump", "notes.txt"]);
    }
}
