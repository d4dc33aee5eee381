//! Durable, private file writes shared by every part that keeps state on disk.
//!
//! A crash leaves either the old file or the new one, never a part of one: write a temp file,
//! fsync it, rename it over the target, fsync the directory. Keys, tokens, kubeconfigs and state
//! files are 0600 in 0700 directories.
use std::fs;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Replaces `path` with `bytes` atomically and durably, mode 0600.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("a file path needs a parent directory"))?;
    create_private_dir(dir)?;
    // A temp file of its own (0600), removed when dropped: a part of a file (a full disk) is not
    // left behind to take space or be mistaken for data, and two writers never share one.
    let mut tmp = tempfile::Builder::new().prefix(".").suffix(".tmp").tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// The write failed because the disk (or the user's quota) is full.
pub fn is_no_space(e: &std::io::Error) -> bool {
    // By kind too: tempfile wraps the OS error with the temp file's path, keeping only its kind.
    e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
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

/// Removes a file that may already be gone.
pub fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
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
