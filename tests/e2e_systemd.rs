//! End to end under a real systemd (252, Debian bookworm, booted in systemd-nspawn: see
//! tests/e2e/machine.rs): kcpshard installed from its Debian package as docs/how-to/install.md
//! says (`cargo deb`'s package around the binary under test: the shipped unit
//! manifests/systemd/kcpshard.service, the user, lingering), serve running as user `kcpshard`,
//! every process it starts a transient unit of that user's manager. One machine, one shard (manifests/dev.yaml), the steps
//! in sequence, each under a `/readyz` poller through the front on a new connection every 20 ms:
//!
//! 0. Before, for the record: a plain unit (serve with detached processes, systemd's defaults)
//!    restarted once takes the shard down with it.
//! 1. `systemctl start kcpshard`, apply dev.yaml: Ready; the slot, kine and front are units, and
//!    serve's own cgroup holds serve alone.
//! 2. 10 `systemctl restart kcpshard`: 0 failed polls, nothing restarted but serve.
//! 3. `systemctl stop kcpshard`: the shard serves 30 s on (0 failed); start: adopted, no roll.
//! 4. A version roll: preflighted first by a kcp in a unit of its own; 0 failed; each slot's
//!    output is in the journal under its unit.
//! 5. SIGKILL of the kine: the controller starts its unit again; 0 failed. SIGKILL of the front:
//!    systemd restarts it on the stored socket; 0 polls refused (those in flight through the
//!    killed front are cut: counted apart).
//! 6. SIGSTOP of serve: its watchdog restarts it; 0 failed.
//! 7. A newer package (`apt-get install` of the next package version): it restarts serve, and the
//!    front hands its socket to a front of the new binary, which becomes the unit's main process
//!    (a SIGKILL of it is restarted by systemd too); 0 failed.
//! 8. Deleting the KcpShard stops and removes its units.
//!
//! About 3 minutes (and about 4 more the first time, to build the root file system). A missing
//! component fails,
//! never skips.
//!
//! Longer than 600 lines on purpose: one machine booted once, one shard, the steps in sequence.
//! Each tests/*.rs file is a test binary of its own (40-60 MB, linked again on every change of the
//! crate): one concern, one file.
mod e2e;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::machine::{Bind, Machine};
use e2e::*;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

const SHARD: &str = "dev";
const FRONT: &str = "127.0.0.1:6443";
const API: &str = "127.0.0.1:6440";
const STATE: &str = "/var/lib/kcpshard";
const READY_TIMEOUT: Duration = Duration::from_secs(240);
const POLL_EVERY: Duration = Duration::from_millis(20);

/// A plain unit, as a new user would write one: serve with the detached runtime (what it ran before
/// it knew systemd), every other setting systemd's default.
const PLAIN_UNIT: &str = "set -e
printf '%s\\n' '[Service]' 'User=kcpshard' 'StateDirectory=kcpshard-plain' 'WorkingDirectory=/opt/kcpshard' \
  'ExecStart=/usr/bin/kcpshard serve --runtime process --state-dir /var/lib/kcpshard-plain --kine-binary /opt/kcpshard/bin/kine' \
  > /etc/systemd/system/kcpshard-plain.service
systemctl daemon-reload
systemctl start kcpshard-plain";
const PLAIN_STATE: &str = "/var/lib/kcpshard-plain";

/// The package, as docs/how-to/install.md ("From the package") installs it (its dependencies are in
/// the machine: dpkg), kcp and kine already in /opt/kcpshard/bin. It makes the user and the unit;
/// the unit stays disabled.
const INSTALL_PACKAGE: &str = "set -e
dpkg -i /opt/kcpshard/dist/kcpshard_0.1.0-1_*.deb
systemd-analyze verify \"$(systemctl show --property FragmentPath --value kcpshard)\"
test \"$(systemctl is-enabled kcpshard)\" = disabled
test -e /var/lib/systemd/linger/kcpshard
id kcpshard";

/// The upgrade to the next package, under a serving shard.
const UPGRADE_PACKAGE: &str = "dpkg -i /opt/kcpshard/dist/kcpshard_0.1.0-2_*.deb";

struct Host<'a> {
    m: &'a Machine,
    started: Instant,
}

impl Host<'_> {
    fn log(&self, line: &str) {
        println!("{} {line}", stamp(self.started));
    }

    /// `systemctl --user` of the kcpshard user's manager.
    fn user_systemctl(&self, args: &str) -> String {
        self.m.sh_ok(&format!(
            "runuser -u kcpshard -- env XDG_RUNTIME_DIR=/run/user/$(id -u kcpshard) systemctl --user {args}"
        ))
    }

    fn user_unit(&self, unit: &str, property: &str) -> String {
        self.user_systemctl(&format!("show {unit} --property {property} --value"))
            .trim()
            .to_string()
    }

    fn serve(&self, property: &str) -> String {
        self.m
            .sh_ok(&format!("systemctl show kcpshard --property {property} --value"))
            .trim()
            .to_string()
    }

    fn kcpshard(&self, args: &str) -> String {
        self.m.sh_ok(&format!(
            "cd /opt/kcpshard && runuser -u kcpshard -- env KCPSHARD_STATE_DIR={STATE} kcpshard {args}"
        ))
    }

    /// The front's pid (inside the machine) as the front itself records it.
    fn front_pid(&self) -> Option<u32> {
        let path = self.m.path(&format!("{STATE}/shards/{SHARD}/front/front.pid.json"));
        let record: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        record["pid"].as_u64().map(|p| p as u32)
    }

    /// Our units, `name state` per line.
    fn units(&self) -> Vec<String> {
        self.user_systemctl("list-units 'kcpshard-*' --all --no-legend --plain")
            .lines()
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
            .filter(|l| !l.is_empty())
            .collect()
    }

    async fn shards(&self) -> Api<DynamicObject> {
        let client = api_client(&self.m.path(&format!("{STATE}/kubeconfig")))
            .await
            .expect("the API's kubeconfig");
        Api::all_with(client, &kcpshard_resource())
    }

    /// serve's `/metrics`, through the API.
    async fn metrics(&self) -> String {
        let client = api_client(&self.m.path(&format!("{STATE}/kubeconfig")))
            .await
            .expect("the API's kubeconfig");
        client
            .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
            .await
            .expect("GET /metrics")
    }

    async fn object(&self) -> Option<Value> {
        for _ in 0..50 {
            match self.shards().await.get_opt(SHARD).await {
                Ok(o) => return o.map(|o| serde_json::to_value(o).unwrap()),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        panic!("cannot read KcpShard {SHARD}: {}", self.journal("kcpshard.service"));
    }

    async fn until(&self, what: &str, timeout: Duration, mut check: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let object = self.object().await.unwrap_or(Value::Null);
            if check(&object) {
                return object;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; status:\n{}\nserve's journal:\n{}",
                serde_json::to_string_pretty(&object["status"]).unwrap(),
                self.journal("kcpshard.service")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Ready and settled at the current generation.
    async fn settled(&self, what: &str) -> Value {
        self.until(what, READY_TIMEOUT, |o| {
            ready_now(o) && condition_is(o, "Progressing", "False")
        })
        .await
    }

    fn journal(&self, unit: &str) -> String {
        let field = if unit == "kcpshard.service" {
            "_SYSTEMD_UNIT"
        } else {
            "_SYSTEMD_USER_UNIT"
        };
        let out = self
            .m
            .sh(&format!("journalctl --no-pager --output=cat --lines=40 {field}={unit}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn poller(&self) -> Poller {
        let kubeconfig = self.m.path(&format!("{STATE}/shards/{SHARD}/shared/admin.kubeconfig"));
        Poller::start_every(
            config_for(&kubeconfig, "shard-base", &format!("https://{FRONT}")).await,
            POLL_EVERY,
        )
    }
}

/// A machine with kcp and kine in /opt/kcpshard/bin, kcpshard's packages in /opt/kcpshard/dist,
/// and the repository's manifests.
fn boot(dir: &Path, bin: &Path, dist: &Path) -> Machine {
    Machine::boot(
        &[
            Bind {
                host: bin,
                inside: "/opt/kcpshard/bin",
                writable: false,
            },
            Bind {
                host: dist,
                inside: "/opt/kcpshard/dist",
                writable: false,
            },
            Bind {
                host: &repo_root().join("manifests"),
                inside: "/opt/kcpshard/manifests",
                writable: false,
            },
        ],
        &dir.join("machine.log"),
    )
}

/// The plain unit's shard, once Ready and settled (with an active slot other than `not`).
async fn plain_ready(m: &Machine, not: Option<i32>) -> Value {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(client) = api_client(&m.path(&format!("{PLAIN_STATE}/kubeconfig"))).await {
            let api: Api<DynamicObject> = Api::all_with(client, &kcpshard_resource());
            if let Ok(Some(o)) = api.get_opt(SHARD).await {
                let o = serde_json::to_value(o).unwrap();
                if ready_now(&o) && condition_is(&o, "Progressing", "False") && (not.is_none() || active_pid(&o) != not)
                {
                    return o;
                }
            }
        }
        assert!(Instant::now() < deadline, "the plain unit's shard did not get Ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn assert_no_failures(what: &str, stats: &PollStats) {
    assert!(
        stats.failures.is_empty(),
        "{what}: {} of {} polls through the front failed:\n{}",
        stats.failures.len(),
        stats.polls,
        describe_failures(stats)
    );
}

/// Links (or copies) what /opt/kcpshard/bin holds: both kcp releases, kine.
fn opt_bin(dir: &Path, versions: &[&str]) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let mut components: Vec<String> = versions.iter().map(|v| format!("kcp-{v}")).collect();
    components.push("kine".into());
    for component in components {
        let from = std::fs::canonicalize(require(&component)).unwrap();
        let to = bin.join(&component);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    bin
}

/// Installs the package (INSTALL_PACKAGE): the binary, the user, lingering, the unit (disabled).
fn install_package(m: &Machine) {
    let install = m.sh(INSTALL_PACKAGE);
    assert!(
        install.status.success(),
        "the package's install failed: {}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
    let verify = String::from_utf8_lossy(&install.stderr).into_owned();
    assert!(
        !verify.contains("kcpshard.service:"),
        "systemd-analyze verify complains about the unit: {verify}"
    );
}

/// kcpshard's Debian package around the binary under test, as `cargo deb` packs a release build
/// (Cargo.toml's package.metadata.deb), once as version 0.1.0-1 and once as the next, 0.1.0-2:
/// cargo-deb takes the binary from `<target dir>/release/`, so a scratch target dir holds it there.
fn packages(dir: &Path) -> PathBuf {
    let release = dir.join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::fs::copy(kcpshard_bin(), release.join("kcpshard")).unwrap();
    let dist = dir.join("dist");
    std::fs::create_dir_all(&dist).unwrap();
    for revision in ["1", "2"] {
        let out = std::process::Command::new(require("cargo-deb"))
            .args(["--no-build", "--no-strip", "--deb-revision", revision, "--output"])
            .arg(&dist)
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .current_dir(repo_root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cargo-deb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dist
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn under_systemd_the_shard_serves_through_restarts_stops_a_roll_a_front_crash_and_a_stuck_serve() {
    let _serial = serial();
    let (newer, older) = (kcp_newer(), kcp_older());
    require_components(&[&newer, &older]);
    for address in [FRONT, API] {
        assert!(
            std::net::TcpListener::bind(address).is_ok(),
            "{address} is taken on this machine: the systemd test's machine shares the host's network and runs manifests/dev.yaml, which listens there"
        );
    }
    let tmp = tempfile::Builder::new().prefix("kcpshard-systemd-").tempdir().unwrap();
    let bin = opt_bin(tmp.path(), &[&newer, &older]);
    let dist = packages(tmp.path());
    let started = Instant::now();
    let m = boot(tmp.path(), &bin, &dist);
    let h = Host { m: &m, started };
    let mut report = Report::default();
    h.log(&format!(
        "booted systemd {}",
        m.sh_ok("systemctl --version | head -1").trim()
    ));

    install_package(&m);

    // 0. Before: a plain unit (serve with detached processes, everything else default), restarted
    // once. systemd stops every process of the unit's cgroup, the shard's with serve.
    m.sh_ok(PLAIN_UNIT);
    // Type=simple: started before its API listens.
    m.sh_ok(&format!(
        "cd /opt/kcpshard && for i in $(seq 100); do runuser -u kcpshard -- env KCPSHARD_STATE_DIR={PLAIN_STATE} kcpshard apply -f /opt/kcpshard/manifests/dev.yaml && exit 0; sleep 0.3; done; exit 1"
    ));
    let before = plain_ready(&m, None).await;
    let poller = Poller::start_every(
        config_for(
            &m.path(&format!("{PLAIN_STATE}/shards/{SHARD}/shared/admin.kubeconfig")),
            "shard-base",
            &format!("https://{FRONT}"),
        )
        .await,
        POLL_EVERY,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    m.sh_ok("systemctl restart kcpshard-plain");
    let after_plain = plain_ready(&m, active_pid(&before)).await;
    let stats = poller.finish().await;
    assert_ne!(
        active_pid(&after_plain),
        active_pid(&before),
        "a plain unit's restart kept the slot: then it is not the failure the units avoid"
    );
    let outage = match (stats.failures.first(), stats.failures.last()) {
        (Some((first, _)), Some((last, _))) => (*last - *first).num_milliseconds() as f64 / 1000.0,
        _ => 0.0,
    };
    report.add(format!(
        "before, a plain unit (serve --runtime process, systemd's defaults): 1 x systemctl restart: {} failed of {} polls over {outage:.1} s ({} refused), the slot killed and started again",
        stats.failures.len(),
        stats.polls,
        stats.refused()
    ));
    m.sh_ok("systemctl disable --now kcpshard-plain && rm /etc/systemd/system/kcpshard-plain.service && systemctl daemon-reload");

    // 1. Enable and start the packaged unit, apply dev.yaml.
    m.sh_ok("systemctl enable --now kcpshard");
    h.kcpshard("apply -f /opt/kcpshard/manifests/dev.yaml");
    let ready = h.settled("the shard to get Ready").await;
    let slot_pid = active_pid(&ready).expect("an active slot");
    let front_pid = h.front_pid().expect("a front");
    h.log(&format!("Ready: slot a pid {slot_pid}, front pid {front_pid}"));
    let units = h.units();
    for unit in [
        "kcpshard-dev-slot-a.service",
        "kcpshard-dev-kine.service",
        "kcpshard-dev-front.service",
    ] {
        assert!(
            units.iter().any(|u| u == &format!("{unit} loaded active running")),
            "{unit} is not a running unit of the kcpshard user: {units:?}"
        );
    }
    assert_eq!(
        h.user_unit("kcpshard-dev-front.service", "MainPID"),
        front_pid.to_string()
    );
    let cgroup = h.serve("ControlGroup");
    // The unified hierarchy, or systemd's own on a host with the hybrid one.
    let in_serve = m.sh_ok(&format!(
        "for d in /sys/fs/cgroup /sys/fs/cgroup/unified /sys/fs/cgroup/systemd; do if [ -f $d{cgroup}/cgroup.procs ]; then cat $d{cgroup}/cgroup.procs; break; fi; done"
    ));
    assert_eq!(
        in_serve.split_whitespace().collect::<Vec<_>>(),
        [h.serve("MainPID").as_str()],
        "serve's cgroup {cgroup} holds more than serve"
    );

    // 2. Ten restarts of serve.
    let poller = h.poller().await;
    let mut took = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        m.sh_ok("systemctl restart kcpshard");
        took.push(t.elapsed().as_secs_f64());
    }
    h.settled("the shard after 10 restarts").await;
    let stats = poller.finish().await;
    assert_no_failures("10 systemctl restart kcpshard", &stats);
    let after = h.object().await.unwrap();
    assert_eq!(
        active_pid(&after),
        Some(slot_pid),
        "a restart of serve restarted the slot"
    );
    assert_eq!(h.front_pid(), Some(front_pid), "a restart of serve restarted the front");
    report.add(format!(
        "10 x systemctl restart kcpshard: 0 failed of {} polls (every 20 ms through the front); each restart returned (READY=1) in {:.2}-{:.2} s; slot and front untouched",
        stats.polls,
        took.iter().cloned().fold(f64::MAX, f64::min),
        took.iter().cloned().fold(0.0, f64::max)
    ));

    // 3. Stopped serve, 30 s; started again: adopted.
    let last_roll = after["status"]["lastRoll"]["startedAt"].clone();
    let poller = h.poller().await;
    m.sh_ok("systemctl stop kcpshard");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let stopped = poller.finish().await;
    assert_no_failures("30 s with kcpshard.service stopped", &stopped);
    assert_eq!(h.serve("ActiveState"), "inactive");
    assert!(h.units().iter().filter(|u| u.ends_with("active running")).count() >= 3);
    let poller = h.poller().await;
    m.sh_ok("systemctl start kcpshard");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let adopted = h.settled("the shard after serve started again").await;
    let stats = poller.finish().await;
    assert_no_failures("systemctl start kcpshard", &stats);
    assert_eq!(active_pid(&adopted), Some(slot_pid), "the slot was not adopted");
    assert_eq!(
        adopted["status"]["lastRoll"]["startedAt"], last_roll,
        "a start of serve rolled"
    );
    report.add(format!(
        "systemctl stop kcpshard for 30 s: 0 failed of {} polls; start: adopted (same slot pid, no roll), 0 failed of {}",
        stopped.polls, stats.polls
    ));

    // 4. A version roll; the journal has each slot's output.
    let poller = h.poller().await;
    let roll_started = Instant::now();
    let patch = json!({ "spec": { "version": older, "rollout": { "allowDowngrade": true } } });
    h.shards()
        .await
        .patch(SHARD, &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();
    let rolled = h
        .until("the roll to the older release", READY_TIMEOUT, |o| {
            ready_now(o)
                && condition_is(o, "Progressing", "False")
                && o["status"]["lastRoll"]["toVersion"] == older.as_str()
                && o["status"]["lastRoll"]["completedAt"].is_string()
        })
        .await;
    let stats = poller.finish().await;
    assert_no_failures("a version roll", &stats);
    let active = active_slot(&rolled).unwrap();
    assert_eq!(active, "b");
    // The version change was preflighted first, by a kcp that ran as a unit of its own.
    let preflight = &rolled["status"]["preflight"];
    assert_eq!(preflight["version"], older.as_str(), "{preflight}");
    assert!(
        preflight["result"] == "Compatible" || preflight["result"] == "SchemaChanged",
        "{preflight}"
    );
    let preflight_lines = m.sh_ok(&format!(
        "journalctl --no-pager --output=cat _SYSTEMD_USER_UNIT=kcpshard-{SHARD}-preflight.service | grep -c 'Serving securely on' || true"
    ));
    assert_ne!(
        preflight_lines.trim(),
        "0",
        "the preflight's kcp logs to the journal under its unit"
    );
    report.add(format!("preflight of {older} under systemd: {}", preflight["result"]));
    report.add(format!(
        "version roll {newer} -> {older}: 0 failed of {} polls; {:.1} s from the patch to Ready",
        stats.polls,
        roll_started.elapsed().as_secs_f64()
    ));
    for slot in ["a", "b"] {
        let unit = format!("kcpshard-{SHARD}-slot-{slot}.service");
        let lines = m.sh_ok(&format!(
            "journalctl --no-pager --output=cat _SYSTEMD_USER_UNIT={unit} | grep -c 'Serving securely on\\|kcp' || true"
        ));
        assert!(
            lines.trim().parse::<u32>().unwrap_or(0) >= 10,
            "the journal has no kcp output under {unit} ({} matching lines)",
            lines.trim()
        );
    }
    let units = h.units();
    assert!(
        !units.iter().any(|u| u.starts_with("kcpshard-dev-slot-a.service")),
        "the stopped slot's unit is still listed: {units:?}"
    );
    // A step that starts a unit returns once systemd ran its program (its main pid, bounded at
    // 10 s): measured here, over the roll and the preflight, as serve's step durations.
    let metrics = h.metrics().await;
    for step in ["StartSlot", "LaunchPreflight"] {
        let counted = format!("kcpshard_controller_step_duration_seconds_count{{shard=\"{SHARD}\",step=\"{step}\"}}");
        assert!(metrics.contains(&counted), "serve measured no {step}:\n{metrics}");
    }
    let over = |seconds| steps_over(&metrics, SHARD, seconds).unwrap_or_else(|e| panic!("{e}"));
    let starts_units = |step: &str| ["StartSlot", "LaunchPreflight", "EnsureStore", "StartInterim"].contains(&step);
    let slow_starts: Vec<_> = over("0.1")
        .into_iter()
        .filter(|(step, ..)| starts_units(step))
        .collect();
    report.add(format!(
        "steps that start a unit, over 0.1 s in the roll (step, how many, of): {slow_starts:?}"
    ));
    let very_slow: Vec<_> = over("1.0")
        .into_iter()
        .filter(|(step, ..)| starts_units(step))
        .collect();
    assert!(very_slow.is_empty(), "steps that start a unit over 1 s: {very_slow:?}");

    // 5a. SIGKILL of the kine: the controller starts its unit again, on the same socket.
    let kine_record: Value =
        serde_json::from_slice(&std::fs::read(m.path(&format!("{STATE}/shards/{SHARD}/store/kine.json"))).unwrap())
            .unwrap();
    let kine_pid = kine_record["pid"].as_u64().unwrap().to_string();
    assert_eq!(kine_record["unit"], "kcpshard-dev-kine.service");
    let poller = h.poller().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    m.sh_ok(&format!("kill -KILL {kine_pid}"));
    support::poll(Duration::from_secs(30), Duration::from_millis(20), || {
        let pid = h.user_unit("kcpshard-dev-kine.service", "MainPID");
        (pid != kine_pid && pid != "0").then_some(())
    })
    .unwrap_or_else(|| panic!("the kine's unit was not started again: {:?}", h.units()));
    let kine_back = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.settled("the shard after the kine's SIGKILL").await;
    let stats = poller.finish().await;
    assert_no_failures("SIGKILL of the kine", &stats);
    report.add(format!(
        "SIGKILL of the kine: its unit started again by the controller {:.2} s later; 0 failed of {} polls",
        kine_back.as_secs_f64(),
        stats.polls
    ));

    // 5. SIGKILL of the front.
    let front_pid = h.front_pid().unwrap();
    let restarts = h.user_unit("kcpshard-dev-front.service", "NRestarts");
    let poller = h.poller().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    m.sh_ok(&format!("kill -KILL {front_pid}"));
    let back = support::poll(Duration::from_secs(20), Duration::from_millis(20), || {
        h.front_pid().filter(|pid| *pid != front_pid)
    })
    .expect("the front was not restarted");
    let back_after = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = poller.finish().await;
    assert_eq!(
        stats.refused(),
        0,
        "polls refused while the front was down:\n{}",
        describe_failures(&stats)
    );
    assert_ne!(
        h.user_unit("kcpshard-dev-front.service", "NRestarts"),
        restarts,
        "systemd did not restart it"
    );
    assert_eq!(h.user_unit("kcpshard-dev-front.service", "MainPID"), back.to_string());
    report.add(format!(
        "SIGKILL of the front: 0 refused of {} polls, {} cut in flight; back (restarted by systemd on the stored socket) in {:.2} s",
        stats.polls,
        stats.failures.len(),
        back_after.as_secs_f64()
    ));

    // 6. A stuck serve: the watchdog restarts it.
    let serve_pid = h.serve("MainPID");
    let poller = h.poller().await;
    let stuck = Instant::now();
    m.sh_ok(&format!("kill -STOP {serve_pid}"));
    support::poll(Duration::from_secs(120), Duration::from_millis(200), || {
        let pid = h.serve("MainPID");
        (pid != serve_pid && pid != "0" && h.serve("ActiveState") == "active").then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the watchdog did not restart the stopped serve: {}",
            h.journal("kcpshard.service")
        )
    });
    let restarted_after = stuck.elapsed();
    let journal = m.sh_ok("journalctl --no-pager -u kcpshard --output=cat | grep -c 'Watchdog timeout' || true");
    assert!(journal.trim() != "0", "no watchdog timeout in the journal");
    h.settled("the shard after the watchdog restart").await;
    let stats = poller.finish().await;
    assert_no_failures("serve stopped (SIGSTOP) until the watchdog restarted it", &stats);
    report.add(format!(
        "SIGSTOP of serve: the watchdog (WatchdogSec=30s) had it restarted {:.1} s later; 0 failed of {} polls",
        restarted_after.as_secs_f64(),
        stats.polls
    ));

    // 7. The next package: it restarts serve, the front hands its socket over to a front of the
    // new binary, and that stays the unit's.
    let front_pid = h.front_pid().unwrap();
    let poller = h.poller().await;
    let serve_before = h.serve("MainPID");
    m.sh_ok(UPGRADE_PACKAGE);
    assert_ne!(
        h.serve("MainPID"),
        serve_before,
        "the package's upgrade did not restart serve"
    );
    let inode = m.sh_ok("stat -c %i /usr/bin/kcpshard").trim().to_string();
    let successor = support::poll(Duration::from_secs(60), Duration::from_millis(50), || {
        let pid = h.front_pid().filter(|pid| *pid != front_pid)?;
        let runs = m.sh(&format!("stat -L -c %i /proc/{pid}/exe"));
        (String::from_utf8_lossy(&runs.stdout).trim() == inode).then_some(pid)
    })
    .unwrap_or_else(|| panic!("the front was not upgraded: {}", h.journal("kcpshard.service")));
    support::poll(Duration::from_secs(10), Duration::from_millis(50), || {
        (h.user_unit("kcpshard-dev-front.service", "MainPID") == successor.to_string()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the upgraded front is not the unit's main process ({}): {}",
            h.user_unit("kcpshard-dev-front.service", "MainPID"),
            h.journal("kcpshard-dev-front.service")
        )
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    m.sh_ok(&format!("kill -KILL {successor}"));
    support::poll(Duration::from_secs(20), Duration::from_millis(20), || {
        h.front_pid().filter(|pid| *pid != successor)
    })
    .expect("the upgraded front was not restarted by systemd");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = poller.finish().await;
    assert_eq!(stats.refused(), 0, "refused:\n{}", describe_failures(&stats));
    report.add(format!(
        "the next package: serve restarted by it, the front handed its socket to one of the new binary, the unit's main process from then on; with a SIGKILL of it: 0 refused of {} polls, {} cut in flight",
        stats.polls,
        stats.failures.len()
    ));

    // 8. Delete: the units go.
    h.kcpshard(&format!("delete {SHARD}"));
    let left = support::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let units = h.units();
        units.is_empty().then_some(())
    });
    assert!(left.is_some(), "units left after the delete: {:?}", h.units());
    report.add("deleting the KcpShard stopped and removed its units");
    report.print(&format!(
        "kcpshard under systemd ({:.0} s)",
        started.elapsed().as_secs_f64()
    ));
}

/// A managed PostgreSQL under systemd: `postgres` itself is the main process of
/// `kcpshard-<shard>-postgres.service` (no pg_ctl), its output in the journal; a postmaster that
/// dies is started again as that unit; deleting the shard stops it. No kcp runs (the shard's
/// version has no binary: the store comes first, and is all this needs), so no real-kcp lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // serial(): one real-kcp scenario at a time, for the whole test
async fn under_systemd_a_managed_postgres_is_a_unit_of_its_own() {
    let _serial = serial();
    let tmp = tempfile::Builder::new()
        .prefix("kcpshard-systemd-pg-")
        .tempdir()
        .unwrap();
    let bin = opt_bin(tmp.path(), &[]);
    let port = test_port();
    let front = format!("127.0.0.1:{}", test_port());
    std::fs::write(
        bin.join("pg.yaml"),
        format!(
            "apiVersion: kcpshard.io/v1alpha1
kind: KcpShard
metadata:
  name: pg
spec:
  version: v0.0.1
  store:
    type: KinePostgres
    kinePostgres: {{ host: 127.0.0.1, port: {port}, managed: true }}
  front:
    type: Tcp
    listen: {front}
"
        ),
    )
    .unwrap();
    assert!(
        std::net::TcpListener::bind(API).is_ok(),
        "{API} is taken on this machine: the systemd test's machine shares the host's network"
    );
    let dist = packages(tmp.path());
    let started = Instant::now();
    let m = boot(tmp.path(), &bin, &dist);
    let h = Host { m: &m, started };
    install_package(&m);
    m.sh_ok("systemctl enable --now kcpshard");
    h.kcpshard("apply -f /opt/kcpshard/bin/pg.yaml");
    let object = |h: &Host<'_>| {
        let path = h.m.path(&format!("{STATE}/kubeconfig"));
        async move {
            let api: Api<DynamicObject> = Api::all_with(api_client(&path).await.ok()?, &kcpshard_resource());
            api.get_opt("pg").await.ok()?.map(|o| serde_json::to_value(o).unwrap())
        }
    };
    let unit = "kcpshard-pg-postgres.service";
    let deadline = Instant::now() + Duration::from_secs(120);
    while !object(&h).await.is_some_and(|o| condition_is(&o, "StoreReady", "True")) {
        assert!(
            Instant::now() < deadline,
            "StoreReady=True did not come: {}\n{}",
            h.journal("kcpshard.service"),
            h.journal(unit)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let record: Value = serde_json::from_slice(
        &std::fs::read(m.path(&format!("{STATE}/shards/pg/store/postgres/postgres.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(record["unit"], unit);
    let postmaster = record["pid"].as_u64().unwrap().to_string();
    assert_eq!(
        h.user_unit(unit, "MainPID"),
        postmaster,
        "postgres is the unit's main process"
    );
    assert!(
        h.journal(unit)
            .contains("database system is ready to accept connections"),
        "PostgreSQL's output is not in the journal under {unit}: {}",
        h.journal(unit)
    );

    // Its postmaster dies (SIGQUIT: an immediate shutdown): the controller starts the unit again.
    let killed = Instant::now();
    m.sh_ok(&format!("kill -QUIT {postmaster}"));
    let back = support::poll(Duration::from_secs(60), Duration::from_millis(50), || {
        let pid = h.user_unit(unit, "MainPID");
        (pid != postmaster && pid != "0" && support::port_accepts(port)).then_some(killed.elapsed())
    })
    .unwrap_or_else(|| panic!("the managed PostgreSQL did not come back: {:?}", h.units()));
    println!(
        "{} managed PostgreSQL under systemd: SIGQUIT of the postmaster, its unit started again and accepting {:.2} s later",
        stamp(started),
        back.as_secs_f64()
    );

    h.kcpshard("delete pg");
    support::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        h.units().is_empty().then_some(())
    })
    .unwrap_or_else(|| panic!("units left after the delete: {:?}", h.units()));
    assert!(!support::port_accepts(port), "deleting the shard stops its PostgreSQL");
}
