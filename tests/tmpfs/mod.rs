//! A small tmpfs for the full-disk tests, and a file that fills it.
//!
//! Mounting needs root (CAP_SYS_ADMIN): without it the test fails and says so; it never skips.
//!
//! Use from an integration test with `mod tmpfs;`.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted over a directory, unmounted (lazily: a process may still hold a file open) on drop.
pub struct Tmpfs {
    pub at: PathBuf,
}

impl Tmpfs {
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "cannot mount a {size} tmpfs on {} for the full-disk test ({}): it needs root (CAP_SYS_ADMIN); run the tests as root or in a container allowed to mount",
            at.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Tmpfs { at: at.to_path_buf() }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Fills the filesystem of `dir` with one file until about `leave` bytes are free (0: until the
/// kernel says ENOSPC, to the last byte); returns the file.
pub fn fill(dir: &Path, leave: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let available = || kcpshard::store::disk::free_space(&[dir]).expect("statvfs of the filled directory")[0].available;
    let chunk = vec![0xa5u8; 64 * 1024];
    let mut to_write = available().saturating_sub(leave);
    if leave > 0 {
        while to_write > 0 {
            let n = file.write(&chunk[..chunk.len().min(to_write as usize)]).unwrap();
            to_write -= n as u64;
        }
        return path;
    }
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // Whatever is left is less than a page: no new file fits.
    while let Ok(1) = file.write(&[0xa5]) {}
    path
}
