//! Durable, private file writes shared by every part that keeps state on disk.
//!
//! A crash leaves either the old file or the new one, never a part of one: write a temp file,
//! fsync it, rename it over the target, fsync the directory. Keys, tokens, kubeconfigs and state
//! files are 0600 in 0700 directories.
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Replaces `path` with `bytes` atomically and durably, mode 0600.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("a file path needs a parent directory"))?;
    create_private_dir(dir)?;
    let tmp = path.with_extension("tmp");
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A leftover temp file keeps its old mode through open(); make sure it is 0600.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        // A part of a file (a full disk) is not left behind to take space or be mistaken for data.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, path)?;
    sync_dir(dir)
}

/// The write failed because the disk (or the user's quota) is full.
pub fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Makes a directory entry change (rename, remove) durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing parents with mode 0700.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    // A new directory's entry lives in its parent: make it durable too, or the first file written
    // into it could be lost with the directory on a power loss.
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => Ok(()),
    }
}

/// Reads a file that may not exist yet.
pub fn read_optional(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
