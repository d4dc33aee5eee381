//! The process runtime with small helper processes (`sh`, `sleep`): detached start, records,
//! pid-reuse detection, reaping, termination with and without SIGKILL, survival of the starter's
//! death, finding processes by argv. Every process a test starts is SIGKILLed at its end.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kcpshard::process::{ProcessRecord, ProcessSpec, Runtime, UnitName, procfs};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// SIGKILLs the process groups of the records it holds (when they still are the same processes).
#[derive(Default)]
struct Reaper(Vec<ProcessRecord>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for rec in &self.0 {
            if procfs::stat(rec.pid).is_some_and(|s| s.start_time == rec.start_time) {
                let _ = kill(Pid::from_raw(-(rec.pid as i32)), Signal::SIGKILL);
                let _ = kill(Pid::from_raw(rec.pid as i32), Signal::SIGKILL);
            }
        }
    }
}

fn spec(dir: &Path, name: &str, program: &str, args: &[&str]) -> ProcessSpec {
    let mut spec = ProcessSpec::new(
        name,
        UnitName::other(name),
        PathBuf::from(program),
        args.iter().map(|s| s.to_string()).collect(),
        dir.join(name).join("out.log"),
        dir.join(name).join("process.json"),
    );
    spec.env = vec![("KCPSHARD_TEST_VAR".into(), "from-spec".into())];
    spec
}

/// A `sleep` argument no other process has, to find this test's process by argv.
fn unique_sleep() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("60.{nanos:09}{}", std::process::id())
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn log_has(spec: &ProcessSpec, text: &str) -> bool {
    std::fs::read_to_string(&spec.log).unwrap_or_default().contains(text)
}

#[tokio::test]
async fn a_started_process_is_detached_logged_and_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = Runtime::new();
    let mut reaper = Reaper::default();
    let s = spec(
        tmp.path(),
        "echo",
        "/bin/sh",
        &[
            "-c",
            "echo hello $KCPSHARD_TEST_VAR; echo oops >&2; read x; exec sleep 60",
        ],
    );
    let rec = rt.start(&s).await.unwrap();
    reaper.0.push(rec.clone());

    assert_eq!(rec.program, PathBuf::from("/bin/sh"));
    assert_eq!(rec.start_time, procfs::stat(rec.pid).unwrap().start_time);
    assert!(
        chrono::DateTime::parse_from_rfc3339(&rec.started_at).is_ok(),
        "{}",
        rec.started_at
    );
    assert_eq!(Runtime::load(&s.record).unwrap(), Some(rec.clone()));
    assert_eq!(
        std::fs::metadata(&s.record).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(std::fs::metadata(&s.log).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(rt.is_running(&rec));

    // Its own session and process group, not ours.
    let stat = procfs::stat(rec.pid).unwrap();
    assert_eq!(stat.session, rec.pid as i32, "session leader");
    assert_eq!(stat.pgrp, rec.pid as i32, "group leader");
    assert_ne!(stat.session, procfs::stat(std::process::id()).unwrap().session);

    // stdout and stderr appended to the log; stdin is /dev/null (read returns at once).
    wait_for("the log", Duration::from_secs(5), || {
        log_has(&s, "hello from-spec") && log_has(&s, "oops")
    });
    wait_for("exec sleep", Duration::from_secs(5), || {
        // Empty while the process is in the middle of its exec.
        procfs::cmdline(rec.pid).is_some_and(|a| a.first().is_some_and(|p| p == "sleep"))
    });

    let t = rt.terminate(&rec, Duration::from_secs(5)).await.unwrap();
    assert!(!t.killed);
    assert!(t.exited_after < Duration::from_secs(5));
    assert!(!rt.is_running(&rec));
    // Reaped: no zombie left behind.
    assert!(
        procfs::stat(rec.pid).is_none(),
        "pid {} left as {:?}",
        rec.pid,
        procfs::stat(rec.pid)
    );
    assert_eq!(
        rt.exit_status(&rec)
            .await
            .and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
        Some(15)
    );

    // A second start appends to the same log.
    let rec2 = rt.start(&s).await.unwrap();
    reaper.0.push(rec2.clone());
    rt.terminate(&rec2, Duration::from_secs(5)).await.unwrap();
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert_eq!(log.matches("--- kcpshard: starting echo").count(), 2, "{log}");
}

#[tokio::test]
async fn a_missing_record_loads_as_none_and_a_missing_program_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(Runtime::load(&tmp.path().join("nope.json")).unwrap(), None);
    std::fs::write(tmp.path().join("bad.json"), "{").unwrap();
    assert!(Runtime::load(&tmp.path().join("bad.json")).is_err());
    let err = Runtime::new()
        .start(&spec(tmp.path(), "missing", "/nonexistent/kcp", &[]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/kcp"), "{err}");
}

#[tokio::test]
async fn a_record_with_the_right_pid_but_another_start_time_is_not_running() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = Runtime::new();
    let mut reaper = Reaper::default();
    let rec = rt.start(&spec(tmp.path(), "sleeper", "sleep", &["60"])).await.unwrap();
    reaper.0.push(rec.clone());
    assert!(rt.is_running(&rec));

    // The pid now belongs to "another" process: the one the record names has gone.
    let reused = ProcessRecord {
        start_time: rec.start_time + 1,
        ..rec.clone()
    };
    assert!(!rt.is_running(&reused));
    assert!(!Runtime::new().is_running(&reused));
    // Terminating the stale record must not touch the live process with that pid.
    let t = rt.terminate(&reused, Duration::from_secs(1)).await.unwrap();
    assert_eq!(t.exited_after, Duration::ZERO);
    assert!(rt.is_running(&rec), "the process that reuses the pid was left alone");

    let gone = ProcessRecord {
        pid: u32::MAX / 2,
        ..rec.clone()
    };
    assert!(!rt.is_running(&gone));
    rt.terminate(&rec, Duration::from_secs(5)).await.unwrap();
}

#[tokio::test]
async fn an_exited_child_is_reaped_and_not_running() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = Runtime::new();
    let rec = rt
        .start(&spec(tmp.path(), "quick", "/bin/sh", &["-c", "exit 3"]))
        .await
        .unwrap();
    wait_for("the exit", Duration::from_secs(5), || !rt.is_running(&rec));
    // A look that finds the child a zombie (it exited after that look's reap) says it does not
    // run; the next look reaps it.
    assert!(!rt.is_running(&rec));
    assert!(procfs::stat(rec.pid).is_none(), "no zombie");
    assert_eq!(rt.exit_status(&rec).await.and_then(|s| s.code()), Some(3));
    let t = rt.terminate(&rec, Duration::from_secs(1)).await.unwrap();
    assert!(!t.killed);
}

#[tokio::test]
async fn sigterm_then_sigkill_when_the_grace_period_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = Runtime::new();
    let mut reaper = Reaper::default();
    let marker = unique_sleep();
    let s = spec(
        tmp.path(),
        "stubborn",
        "/bin/sh",
        &["-c", &format!("trap '' TERM; echo trapped; sleep {marker}; echo done")],
    );
    let rec = rt.start(&s).await.unwrap();
    reaper.0.push(rec.clone());
    wait_for("the trap", Duration::from_secs(5), || log_has(&s, "trapped"));
    wait_for("its sleep", Duration::from_secs(5), || {
        !Runtime::find_by_argument(&marker).is_empty()
    });

    let grace = Duration::from_millis(500);
    let t = rt.terminate(&rec, grace).await.unwrap();
    assert!(t.killed, "SIGTERM was ignored, so SIGKILL followed");
    assert!(t.exited_after >= grace, "{:?}", t.exited_after);
    assert!(t.exited_after < grace + Duration::from_secs(5), "{:?}", t.exited_after);
    assert!(!rt.is_running(&rec));
    // The sleep it forked was in its process group and went with it.
    wait_for("the group", Duration::from_secs(5), || {
        Runtime::find_by_argument(&marker).is_empty()
    });
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(!log.lines().any(|l| l == "done"), "the shell went with SIGKILL: {log}");
}

#[tokio::test]
async fn find_by_argument_matches_whole_arguments_only() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = Runtime::new();
    let mut reaper = Reaper::default();
    let marker = unique_sleep();
    let rec = rt
        .start(&spec(tmp.path(), "findme", "sleep", &[&marker]))
        .await
        .unwrap();
    reaper.0.push(rec.clone());
    wait_for("exec", Duration::from_secs(5), || {
        procfs::cmdline(rec.pid).is_some_and(|a| a.contains(&marker))
    });

    assert_eq!(Runtime::find_by_argument(&marker), vec![rec.pid]);
    assert!(Runtime::find_by_argument(&marker[..marker.len() - 1]).is_empty());
    // An unrecorded process can be adopted from what /proc says about it.
    let seen = Runtime::observe(rec.pid).unwrap();
    assert_eq!((seen.pid, seen.start_time), (rec.pid, rec.start_time));
    assert_eq!(seen.args, vec![marker.clone()]);
    assert!(rt.is_running(&seen));
    rt.terminate(&seen, Duration::from_secs(5)).await.unwrap();
    assert!(Runtime::find_by_argument(&marker).is_empty());
}

#[tokio::test]
async fn a_process_whose_record_cannot_be_written_is_not_left_running() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = unique_sleep();
    let mut s = spec(tmp.path(), "unrecorded", "sleep", &[&marker]);
    std::fs::write(tmp.path().join("a-file"), "").unwrap();
    s.record = tmp.path().join("a-file").join("process.json");
    assert!(Runtime::new().start(&s).await.is_err());
    assert!(Runtime::find_by_argument(&marker).is_empty());
}

const HELPER_DIR: &str = "KCPSHARD_TEST_HELPER_DIR";

/// Run as a child of the test below (this test binary, `--exact` on that test, with the directory
/// in `KCPSHARD_TEST_HELPER_DIR`), it is the starter: it starts a process and waits to be killed.
async fn act_as_starter(dir: PathBuf) {
    let marker = std::fs::read_to_string(dir.join("marker")).unwrap();
    let rt = Runtime::new();
    rt.start(&spec(&dir, "survivor", "sleep", &[&marker])).await.unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[tokio::test]
async fn a_started_process_survives_the_death_of_its_starter() {
    if let Some(dir) = std::env::var_os(HELPER_DIR) {
        return act_as_starter(PathBuf::from(dir)).await;
    }
    let tmp = tempfile::tempdir().unwrap();
    let marker = unique_sleep();
    std::fs::write(tmp.path().join("marker"), &marker).unwrap();
    let mut starter = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_started_process_survives_the_death_of_its_starter",
            "--test-threads=1",
        ])
        .env(HELPER_DIR, tmp.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let record_path = tmp.path().join("survivor").join("process.json");
    let mut reaper = Reaper::default();
    wait_for("the record", Duration::from_secs(30), || record_path.exists());
    let rec = Runtime::load(&record_path).unwrap().unwrap();
    reaper.0.push(rec.clone());

    starter.kill().unwrap(); // SIGKILL: no chance to clean up
    starter.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));

    // A new runtime (a restarted serve) adopts it from the record.
    let rt = Runtime::new();
    assert!(rt.is_running(&rec), "the process outlived its starter");
    assert_eq!(Runtime::find_by_argument(&marker), vec![rec.pid]);
    assert_ne!(
        procfs::stat(rec.pid).unwrap().session,
        procfs::stat(std::process::id()).unwrap().session
    );
    let t = rt.terminate(&rec, Duration::from_secs(5)).await.unwrap();
    assert!(!t.killed);
    // Not our child: whoever inherited it reaps it; as a zombie it already counts as stopped.
    assert!(!rt.is_running(&rec));
}
