//! Free space under the store: how much room the filesystems that hold a shard's store and its
//! state dir have left, and whether that is a problem the user must hear about.
//!
//! [`free_space`] only reads (statvfs); one [`DiskSpace`] per distinct filesystem, however many
//! of the paths lie on it. [`verdict`] is pure: the figures in, the worst problem out, with a
//! message that gives them and says what to do.
//!
//! Why it matters: kine's sqlite store refuses writes once its filesystem is full (kine answers
//! "database or disk is full"), and kine cannot start again until there is room, because its
//! start-up checkpoints the WAL into the database file (docs/reliability.md, "A full disk under
//! the store"). The watermark warns while the store still works; [`Level::Full`] says that writes
//! fail now.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bytesize::ByteSize;

use super::StoreError;

/// One filesystem and the watched paths on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpace {
    /// Where the filesystem is mounted: the highest ancestor of the paths on the same device.
    pub mount_point: PathBuf,
    /// The watched paths on this filesystem, in the order given.
    pub paths: Vec<PathBuf>,
    /// Bytes a process without root's reserve may still write (statvfs `f_bavail` × `f_frsize`).
    pub available: u64,
    /// The filesystem's size (statvfs `f_blocks` × `f_frsize`).
    pub total: u64,
}

impl DiskSpace {
    /// Free space in whole percent of the size, rounded down (0 for a filesystem of size 0).
    pub fn free_percent(&self) -> u64 {
        (u128::from(self.available) * 100)
            .checked_div(u128::from(self.total))
            .map_or(0, |p| p as u64)
    }
}

/// When free space is a problem. Low below `max(floor, min(fraction × size, ceiling))`; full
/// below `full`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Watermark {
    /// Share of the filesystem's size: kubelet's default hard eviction threshold for a node's
    /// filesystem (`nodefs.available<10%`), a figure operators already act on.
    pub fraction: f64,
    /// Never warn later than this: room for kine's sqlite WAL between checkpoints (1000 pages of
    /// 4 KiB, then as much again while the checkpoint grows the database file), its start-up
    /// VACUUM of a small database, and the logs of a few kcp starts.
    pub floor: u64,
    /// Never warn earlier than this: on a large disk, 10% is far more than a shard writes in days.
    pub ceiling: u64,
    /// Below this, writes fail now or within seconds and kine cannot restart.
    pub full: u64,
}

impl Default for Watermark {
    fn default() -> Self {
        Watermark {
            fraction: 0.10,
            floor: 64 * bytesize::MIB,
            ceiling: bytesize::GIB,
            full: 8 * bytesize::MIB,
        }
    }
}

impl Watermark {
    /// Free bytes below which a filesystem of `total` bytes is low.
    pub fn low_below(&self, total: u64) -> u64 {
        let share = (total as f64 * self.fraction) as u64;
        share.min(self.ceiling).max(self.floor)
    }
}

/// How bad it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Below the watermark: the store still takes writes.
    Low,
    /// Below [`Watermark::full`]: the store's writes fail (or are about to).
    Full,
}

/// The worst filesystem, for a condition, an event and a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskProblem {
    pub level: Level,
    pub space: DiskSpace,
    /// The figures and what to do.
    pub message: String,
}

impl DiskProblem {
    /// The condition and event reason: `StoreDiskLow` or `StoreDiskFull`.
    pub fn reason(&self) -> &'static str {
        match self.level {
            Level::Low => "StoreDiskLow",
            Level::Full => "StoreDiskFull",
        }
    }
}

/// The free space of the filesystems that hold `paths`, one entry per filesystem. A path that does
/// not exist yet (a store directory before its first start) counts as its nearest existing ancestor.
pub fn free_space(paths: &[&Path]) -> Result<Vec<DiskSpace>, StoreError> {
    let mut found: Vec<(u64, DiskSpace)> = Vec::new();
    for &path in paths {
        let existing = nearest_existing(path).map_err(StoreError::io(path))?;
        let device = std::fs::metadata(&existing).map_err(StoreError::io(path))?.dev();
        if let Some((_, space)) = found.iter_mut().find(|(d, _)| *d == device) {
            space.paths.push(path.to_path_buf());
            continue;
        }
        let stat = nix::sys::statvfs::statvfs(&existing).map_err(|e| StoreError::io(path)(e.into()))?;
        let fragment = stat.fragment_size() as u64;
        let space = DiskSpace {
            mount_point: mount_point(&existing, device),
            paths: vec![path.to_path_buf()],
            available: stat.blocks_available() as u64 * fragment,
            total: stat.blocks() as u64 * fragment,
        };
        found.push((device, space));
    }
    Ok(found.into_iter().map(|(_, space)| space).collect())
}

/// The worst filesystem below the watermark (full before low, then the least free relative to its
/// threshold), or None when every one has room.
pub fn verdict(spaces: &[DiskSpace], watermark: &Watermark) -> Option<DiskProblem> {
    let level = |s: &DiskSpace| {
        if s.available < watermark.full {
            Some(Level::Full)
        } else if s.available < watermark.low_below(s.total) {
            Some(Level::Low)
        } else {
            None
        }
    };
    let (level, space) = spaces
        .iter()
        .filter_map(|s| level(s).map(|l| (l, s)))
        .max_by(|(la, a), (lb, b)| {
            // Within a level, the one with less room relative to its threshold is worse.
            let room = |s: &DiskSpace| s.available as f64 / watermark.low_below(s.total).max(1) as f64;
            la.cmp(lb).then(room(b).total_cmp(&room(a)))
        })?;
    let paths: Vec<String> = space.paths.iter().map(|p| p.display().to_string()).collect();
    let figures = format!(
        "the filesystem of {} (mounted at {}) has {} of {} free ({}%)",
        paths.join(" and "),
        space.mount_point.display(),
        size(space.available),
        size(space.total),
        space.free_percent(),
    );
    let message = match level {
        Level::Full => format!(
            "{figures}: the store's writes fail now (kine answers \"database or disk is full\") and kine cannot \
             restart until there is room; free space on it or grow it"
        ),
        Level::Low => format!(
            "{figures}, below the watermark of {}; kcp's writes fail once it is full: free space on it or grow it",
            size(watermark.low_below(space.total)),
        ),
    };
    Some(DiskProblem {
        level,
        space: space.clone(),
        message,
    })
}

fn size(bytes: u64) -> String {
    ByteSize::b(bytes).display().iec().to_string()
}

fn nearest_existing(path: &Path) -> std::io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    let mut candidate = absolute.as_path();
    loop {
        match candidate.try_exists() {
            Ok(true) => return Ok(candidate.to_path_buf()),
            Ok(false) => {}
            Err(e) => return Err(e),
        }
        candidate = candidate
            .parent()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no ancestor exists"))?;
    }
}

/// The highest ancestor of `path` on `device` (a bind mount of a directory shows as the mount
/// point of the filesystem it lives on).
fn mount_point(path: &Path, device: u64) -> PathBuf {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut top = canonical.as_path();
    while let Some(parent) = top.parent() {
        match std::fs::metadata(parent) {
            Ok(m) if m.dev() == device => top = parent,
            _ => break,
        }
    }
    top.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = bytesize::MIB;
    const GIB: u64 = bytesize::GIB;

    fn space(mount: &str, available: u64, total: u64) -> DiskSpace {
        DiskSpace {
            mount_point: PathBuf::from(mount),
            paths: vec![PathBuf::from(mount).join("store")],
            available,
            total,
        }
    }

    #[test]
    fn the_watermark_is_a_tenth_held_between_the_floor_and_the_ceiling() {
        let w = Watermark::default();
        assert_eq!(
            w.low_below(150 * MIB),
            64 * MIB,
            "a small filesystem warns at the floor"
        );
        assert_eq!(w.low_below(2 * GIB), 2 * GIB / 10);
        assert_eq!(w.low_below(2000 * GIB), GIB, "a large one at the ceiling");
    }

    #[test]
    fn room_above_the_watermark_is_no_problem() {
        let w = Watermark::default();
        assert_eq!(verdict(&[space("/state", 100 * MIB, 150 * MIB)], &w), None);
        assert_eq!(
            verdict(&[space("/", 300 * GIB, 2000 * GIB)], &w),
            None,
            "85% used but 300 GiB free"
        );
        assert_eq!(verdict(&[], &w), None);
    }

    #[test]
    fn a_low_filesystem_gives_its_figures_and_what_to_do() {
        let problem = verdict(&[space("/state", 12 * MIB, 150 * MIB)], &Watermark::default()).unwrap();
        assert_eq!(problem.level, Level::Low);
        assert_eq!(problem.reason(), "StoreDiskLow");
        assert_eq!(
            problem.message,
            "the filesystem of /state/store (mounted at /state) has 12.0 MiB of 150.0 MiB free (8%), below the \
             watermark of 64.0 MiB; kcp's writes fail once it is full: free space on it or grow it"
        );
    }

    #[test]
    fn a_full_filesystem_says_that_writes_fail_now() {
        let problem = verdict(&[space("/state", 3 * MIB, 150 * MIB)], &Watermark::default()).unwrap();
        assert_eq!(problem.level, Level::Full);
        assert_eq!(problem.reason(), "StoreDiskFull");
        assert!(
            problem.message.starts_with(
                "the filesystem of /state/store (mounted at /state) has 3.0 MiB of 150.0 MiB free (2%): the store's \
                 writes fail now"
            ),
            "{}",
            problem.message
        );
        assert!(problem.message.ends_with("free space on it or grow it"));
    }

    #[test]
    fn the_worst_filesystem_is_the_one_reported() {
        let w = Watermark::default();
        let low_state = space("/state", 40 * MIB, 150 * MIB);
        let lower_store = space("/data", 100 * MIB, 10 * GIB);
        let full = space("/tmp", MIB, 150 * MIB);
        // 40 of 64 MiB against 100 of 1 GiB: the second has less room relative to its threshold.
        let problem = verdict(&[low_state.clone(), lower_store.clone()], &w).unwrap();
        assert_eq!(problem.space, lower_store);
        let problem = verdict(&[low_state, full.clone(), lower_store], &w).unwrap();
        assert_eq!((problem.level, problem.space), (Level::Full, full));
    }

    #[test]
    fn paths_on_one_filesystem_are_one_entry_and_missing_paths_count_as_their_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("shards/dev/store");
        let spaces = free_space(&[dir.path(), &store]).unwrap();
        assert_eq!(spaces.len(), 1, "{spaces:?}");
        let s = &spaces[0];
        assert_eq!(s.paths, [dir.path().to_path_buf(), store]);
        assert!(s.total > 0 && s.available <= s.total, "{s:?}");
        assert!(
            dir.path().starts_with(&s.mount_point) || s.mount_point == Path::new("/"),
            "{s:?}"
        );
        // /proc is a filesystem of its own.
        let spaces = free_space(&[dir.path(), Path::new("/proc/self")]).unwrap();
        assert_eq!(spaces.len(), 2, "{spaces:?}");
        assert_eq!(spaces[1].mount_point, Path::new("/proc"));
    }
}
