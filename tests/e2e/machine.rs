//! A real systemd for end-to-end tests: a Debian root file system (hack/systemd-rootfs.sh, cached)
//! booted with `systemd-nspawn --boot` (these machines' PID 1 is not systemd), driven with
//! `nsenter --target <its systemd> --all`. It shares the host's network, so clients and pollers
//! run outside it; the host reads its files under `/proc/<its systemd>/root`. Its root is a
//! throwaway overlay (`--volatile=overlay`), and it is powered off when the [`Machine`] drops,
//! pass or fail.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::repo_root;
use crate::support;

/// A booted container.
pub struct Machine {
    nspawn: Child,
    /// Its systemd, as the host sees it.
    pub leader: u32,
    log: PathBuf,
}

/// What the host shares with the machine: `host` at `inside`, writable or not.
pub struct Bind<'a> {
    pub host: &'a Path,
    pub inside: &'a str,
    pub writable: bool,
}

impl Machine {
    /// Builds (or finds) the root file system and boots it; returns once systemd reports the
    /// machine running.
    pub fn boot(binds: &[Bind<'_>], log: &Path) -> Machine {
        let rootfs = Command::new(repo_root().join("hack/systemd-rootfs.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run hack/systemd-rootfs.sh");
        assert!(
            rootfs.status.success(),
            "hack/systemd-rootfs.sh failed: the systemd tests need debootstrap and systemd-nspawn (hack/install-deps.sh installs them)"
        );
        let rootfs = String::from_utf8(rootfs.stdout).unwrap().trim().to_string();
        support::require_system("systemd-nspawn");
        support::require_system("nsenter");
        let out = std::fs::File::create(log).unwrap();
        let mut command = Command::new("systemd-nspawn");
        command.args([
            "--directory",
            &rootfs,
            "--volatile=overlay",
            "--boot",
            "--register=no",
            "--keep-unit",
            "--console=passive",
        ]);
        for bind in binds {
            let flag = if bind.writable { "--bind" } else { "--bind-ro" };
            command.arg(format!("{flag}={}:{}", bind.host.display(), bind.inside));
        }
        let nspawn = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn systemd-nspawn");
        let nspawn_pid = nspawn.id();
        let mut machine = Machine {
            nspawn,
            leader: 0,
            log: log.to_path_buf(),
        };
        // nspawn's child becomes the container's PID 1 and execs systemd.
        let leader = support::poll(Duration::from_secs(30), Duration::from_millis(50), || {
            children_of(nspawn_pid)
                .into_iter()
                .find(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "systemd"))
        });
        machine.leader = leader.unwrap_or_else(|| panic!("systemd-nspawn started no systemd: {}", machine.log_text()));
        // Until systemd listens, systemctl says nothing, or "offline" (it cannot reach the
        // manager yet: seen once in CI right after the container started); then `--wait` waits
        // for the boot to end.
        let mut last_error = String::new();
        let state = support::poll(Duration::from_secs(90), Duration::from_millis(100), || {
            let out = machine.sh("systemctl is-system-running --wait");
            let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
            last_error = String::from_utf8_lossy(&out.stderr).trim().to_string();
            (!state.is_empty() && state != "offline").then_some(state)
        })
        .unwrap_or_default();
        assert!(
            state == "running" || state == "degraded",
            "the machine (systemd pid {}) did not boot ({state:?}, last error {last_error:?}): {}\n{}",
            machine.leader,
            String::from_utf8_lossy(&machine.sh("systemctl --failed --no-legend").stdout),
            machine.log_text()
        );
        machine
    }

    /// Runs `script` with sh inside the machine, as root.
    pub fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["--target", &self.leader.to_string(), "--all", "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter")
    }

    /// Runs `script` and returns its stdout; fails the test on a non-zero exit.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "`{script}` in the machine failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A path inside the machine, as the host reaches it.
    pub fn path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{inside}", self.leader))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // poweroff, and SIGKILL for a machine that does not go within its timeout.
        let _ = self.sh("systemctl poweroff --no-block");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("the machine did not power off within 60 s; killing systemd-nspawn");
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}
