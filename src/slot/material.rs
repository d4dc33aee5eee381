//! The shared material of a shard (docs/background.md section 2): the files every slot must have the same copy of.
//!
//! - `apiserver.crt`/`apiserver.key`: the serving certificate, which clients and the front's users
//!   pin as their CA.
//! - `sa.key`: signs and verifies service-account tokens; a slot with another key rejects them.
//! - `.admin-token-store`: the sha256 of the shard-admin token, whose token lives in
//!   `admin.kubeconfig`. kcp refuses to start with the hash but no kubeconfig holding its token
//!   ("cannot create the 'admin.kubeconfig' file with an empty token").
//! - `admin.kubeconfig`: rewritten by every start (new CA data, fresh kcp-admin token); the shard's
//!   copy is the last one a ready slot wrote.
//!
//! The first slot of a shard creates the material; [`capture_shared`] copies it into the shard's
//! directory once that slot is ready. Every later slot's root is [`seed_root`]ed from there before
//! it starts. Files are 0600 in 0700 directories, written atomically.
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::fsutil;

pub const SHARED_FILES: [&str; 5] = [
    "apiserver.crt",
    "apiserver.key",
    "sa.key",
    ".admin-token-store",
    "admin.kubeconfig",
];

/// Files that, once in the shard's directory, are never replaced: replacing one would cut every
/// client, token or slot that relies on the old one.
pub const PINNED_FILES: [&str; 4] = ["apiserver.crt", "apiserver.key", "sa.key", ".admin-token-store"];

pub const ADMIN_KUBECONFIG: &str = "admin.kubeconfig";
const TOKEN_STORE: &str = ".admin-token-store";

/// Copies the shared material that exists in `shared_dir` into `root_dir` (created 0700; files
/// 0600), before a slot starts there. Returns whether there was any material (false: the first
/// slot of a shard, which makes its own). Refuses incomplete material that would make kcp fail or
/// mint a second identity: a token hash without the kubeconfig, or half of the serving key pair.
pub fn seed_root(shared_dir: &Path, root_dir: &Path) -> io::Result<bool> {
    let mut present = Vec::new();
    for name in SHARED_FILES {
        if let Some(bytes) = fsutil::read_optional(&shared_dir.join(name))? {
            present.push((name, bytes));
        }
    }
    let has = |n: &str| present.iter().any(|(name, _)| *name == n);
    if has(TOKEN_STORE) && !has(ADMIN_KUBECONFIG) {
        return Err(invalid(format!(
            "{} has {TOKEN_STORE} but no {ADMIN_KUBECONFIG}: kcp cannot recover the shard-admin token; restore {ADMIN_KUBECONFIG} from a slot root",
            shared_dir.display()
        )));
    }
    if has("apiserver.crt") != has("apiserver.key") {
        return Err(invalid(format!(
            "{} has only one of apiserver.crt and apiserver.key",
            shared_dir.display()
        )));
    }
    make_private_dir(root_dir)?;
    for (name, bytes) in &present {
        fsutil::write_atomically(&root_dir.join(name), bytes)?;
    }
    Ok(!present.is_empty())
}

/// After a slot in `root_dir` is ready: copies its key material into `shared_dir` where missing
/// (never replacing the pinned files), and always refreshes `admin.kubeconfig`. Fails when the
/// slot's pinned files differ from the shard's, i.e. the slot does not share the shard's identity
/// (its root was not seeded); then nothing is written.
pub fn capture_shared(root_dir: &Path, shared_dir: &Path) -> io::Result<()> {
    let mut to_write = Vec::new();
    for name in PINNED_FILES {
        let Some(mine) = fsutil::read_optional(&root_dir.join(name))? else {
            continue;
        };
        match fsutil::read_optional(&shared_dir.join(name))? {
            None => to_write.push((name, mine)),
            Some(theirs) if theirs == mine => {}
            Some(_) => {
                return Err(invalid(format!(
                    "{name} in {} differs from the shard's copy in {}: the slot does not share the shard's identity",
                    root_dir.display(),
                    shared_dir.display()
                )));
            }
        }
    }
    let kubeconfig = fsutil::read_optional(&root_dir.join(ADMIN_KUBECONFIG))?
        .ok_or_else(|| invalid(format!("{} has no {ADMIN_KUBECONFIG} yet", root_dir.display())))?;
    make_private_dir(shared_dir)?;
    // Key material first, the kubeconfig last: a kubeconfig in the shard's directory always has
    // its token hash beside it.
    for (name, bytes) in to_write {
        fsutil::write_atomically(&shared_dir.join(name), &bytes)?;
    }
    fsutil::write_atomically(&shared_dir.join(ADMIN_KUBECONFIG), &kubeconfig)
}

/// Whether the material in `a` and `b` is one identity: the same pinned files (the serving key
/// pair, `sa.key`, the admin token store). A snapshot's key material restored into a shard of
/// another identity (another host, a state dir made anew) replaces the shard's; into its own
/// shard, nothing of it changes.
pub fn same_identity(a: &Path, b: &Path) -> io::Result<bool> {
    for name in PINNED_FILES {
        if fsutil::read_optional(&a.join(name))? != fsutil::read_optional(&b.join(name))? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn make_private_dir(dir: &Path) -> io::Result<()> {
    fsutil::create_private_dir(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn write(dir: &Path, name: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn the_first_slot_gets_an_empty_private_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("slot-a");
        assert!(!seed_root(&tmp.path().join("shared"), &root).unwrap());
        assert_eq!(mode(&root), 0o700);
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
    }

    #[test]
    fn every_slot_root_gets_the_shared_material_before_start() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        for name in SHARED_FILES {
            write(&shared, name, &format!("content of {name}"));
        }
        let root = tmp.path().join("slot-b");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(seed_root(&shared, &root).unwrap());
        assert_eq!(mode(&root), 0o700);
        for name in SHARED_FILES {
            let p = root.join(name);
            assert_eq!(fs::read_to_string(&p).unwrap(), format!("content of {name}"));
            assert_eq!(mode(&p), 0o600, "{name}");
        }
    }

    #[test]
    fn a_token_hash_without_its_kubeconfig_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        write(&shared, ".admin-token-store", "hash");
        let err = seed_root(&shared, &tmp.path().join("slot-b")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("admin.kubeconfig"), "{err}");
    }

    #[test]
    fn half_a_serving_key_pair_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        write(&shared, "apiserver.key", "key");
        assert!(seed_root(&shared, &tmp.path().join("slot-b")).is_err());
    }

    #[test]
    fn capture_copies_what_is_missing_and_refreshes_the_kubeconfig() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, shared) = (tmp.path().join("slot-a"), tmp.path().join("shared"));
        for name in SHARED_FILES {
            write(&root, name, &format!("{name} v1"));
        }
        capture_shared(&root, &shared).unwrap();
        assert_eq!(mode(&shared), 0o700);
        for name in SHARED_FILES {
            assert_eq!(fs::read_to_string(shared.join(name)).unwrap(), format!("{name} v1"));
            assert_eq!(mode(&shared.join(name)), 0o600);
        }
        // The next start rewrote the kubeconfig (fresh kcp-admin token): the shard's copy follows.
        write(&root, "admin.kubeconfig", "admin.kubeconfig v2");
        capture_shared(&root, &shared).unwrap();
        assert_eq!(
            fs::read_to_string(shared.join("admin.kubeconfig")).unwrap(),
            "admin.kubeconfig v2"
        );
    }

    #[test]
    fn capture_never_replaces_pinned_material() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, shared) = (tmp.path().join("slot-b"), tmp.path().join("shared"));
        for name in SHARED_FILES {
            write(&shared, name, &format!("{name} shard"));
        }
        for name in SHARED_FILES {
            write(&root, name, &format!("{name} other"));
        }
        for pinned in PINNED_FILES {
            let err = capture_shared(&root, &shared).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            // Make this file agree and try again: the next one is still refused.
            write(&root, pinned, &format!("{pinned} shard"));
        }
        capture_shared(&root, &shared).unwrap();
        for name in PINNED_FILES {
            assert_eq!(fs::read_to_string(shared.join(name)).unwrap(), format!("{name} shard"));
        }
        assert_eq!(
            fs::read_to_string(shared.join("admin.kubeconfig")).unwrap(),
            "admin.kubeconfig other"
        );
    }

    #[test]
    fn capture_needs_the_kubeconfig() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("slot-a");
        write(&root, "sa.key", "k");
        assert!(capture_shared(&root, &tmp.path().join("shared")).is_err());
        assert!(!tmp.path().join("shared").join("sa.key").exists());
    }
}
