//! A kcp as users run it before kcpshard: `kcp start` from its own root directory with its
//! embedded etcd, on loopback ports of its own (docs/how-to/adopt.md, "Adopt a running kcp").
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::ports::test_port;
use super::{Proc, kcp_bin, poll, require, run};

pub struct EmbeddedKcp {
    pub proc: Proc,
    pub root: PathBuf,
    /// Its secure port, on 127.0.0.1.
    pub port: u16,
    /// Its embedded etcd's client port, on localhost.
    pub etcd_port: u16,
}

impl EmbeddedKcp {
    /// Starts kcp `version` with root directory `root` (its log beside it) and `extra` flags, and
    /// returns once its /readyz says ok (through its own admin kubeconfig).
    pub fn start(version: &str, root: &Path, extra: &[&str]) -> EmbeddedKcp {
        let (port, etcd_port, peer_port) = (test_port(), test_port(), test_port());
        let mut cmd = Command::new(kcp_bin(version));
        cmd.arg("start")
            .arg(format!("--root-directory={}", root.display()))
            .args(["--bind-address", "127.0.0.1"])
            .arg(format!("--secure-port={port}"))
            .arg(format!("--embedded-etcd-client-port={etcd_port}"))
            .arg(format!("--embedded-etcd-peer-port={peer_port}"))
            .args(extra);
        let log = root.with_extension("log");
        let kcp = EmbeddedKcp {
            proc: Proc::spawn("kcp", cmd, &log),
            root: root.to_path_buf(),
            port,
            etcd_port,
        };
        poll(Duration::from_secs(120), Duration::from_millis(500), || {
            kcp.kubectl(&["get", "--raw", "/readyz"])
                .filter(|body| body.trim() == "ok")
        })
        .unwrap_or_else(|| kcp.proc.fail("kcp did not get ready within 120s"));
        kcp
    }

    /// `kubectl` with its admin kubeconfig: its stdout, or None when it failed.
    pub fn kubectl(&self, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new(require("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(self.root.join("admin.kubeconfig"))
            .args(args);
        let out = run(cmd, Duration::from_secs(30));
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
