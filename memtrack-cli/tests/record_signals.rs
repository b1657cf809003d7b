//! `memtrack record` under TERM, HUP, `timeout` and SIGKILL: the signal goes
//! to the command, the artifact is finished whole, memtrack exits with the command's code; a
//! killed memtrack never leaves its command running untracked.
//!
//! `harness = false` (memtrack-test-support's runner): every test needs the tracker (CAP_BPF +
//! CAP_PERFMON) and without it is reported as ignored with what is missing, never as passed;
//! CI runs them as root and fails if one was not run.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memtrack_test_support::{Need, TRACKER, requires};

fn memtrack() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memtrack"))
}

fn verified(artifact: &Path) {
    let v = memtrack().arg("verify").arg(artifact).output().unwrap();
    assert!(
        v.status.success(),
        "{}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
}

/// Waits until `pid` has written its pid to `file` (the command is running).
fn pid_in(file: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(p) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` runs (a zombie waiting for its reaper has ended).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()))
        .flatten()
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// The command `sh -c 'echo $$ > PIDFILE; exec sleep 30'`: its pid is known once it runs.
///
/// memtrack and the command start with TERM and HUP at their default disposition, whatever
/// this test process inherited: under `nohup` HUP is ignored, an ignored signal stays ignored
/// across exec, and memtrack rightly keeps it ignored for the command (`nohup memtrack record`
/// is a legitimate use), so a forwarded HUP would do nothing.
fn sleeper(dir: &Path, out: &Path) -> (Command, std::path::PathBuf) {
    let pidfile = dir.join("child.pid");
    let mut c = memtrack();
    // SAFETY: the closure runs in the forked child before exec and calls only signal(2),
    // which is async-signal-safe; it touches no memory of the parent.
    unsafe {
        c.pre_exec(|| {
            for sig in [libc::SIGTERM, libc::SIGHUP] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    c.arg("record")
        .arg("-o")
        .arg(out)
        .args(["--", "/bin/sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 30", pidfile.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    (c, pidfile)
}

fn term_and_hup_go_to_the_command_and_the_artifact_is_whole() {
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("t.memtrack");
        let (mut cmd, pidfile) = sleeper(dir.path(), &out);
        let started = Instant::now();
        let m = cmd.spawn().unwrap();
        let child = pid_in(&pidfile);
        // SAFETY: signalling the memtrack we started.
        unsafe { libc::kill(m.id() as i32, sig) };
        let o = m.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "signal {sig}: {err}");
        assert!(started.elapsed() < Duration::from_secs(20));
        assert!(!running(child), "signal {sig}: the command still runs");
        assert!(err.contains("0 events lost"), "{err}");
        verified(&out);
    }
}

fn timeout_ends_the_recording_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.memtrack");
    let started = Instant::now();
    let o = Command::new("timeout")
        .args(["-s", "TERM", "1"])
        .arg(env!("CARGO_BIN_EXE_memtrack"))
        .arg("record")
        .arg("-o")
        .arg(&out)
        .args(["--", "sleep", "30"])
        .output()
        .unwrap();
    // timeout's own code for "timed out".
    assert_eq!(
        o.status.code(),
        Some(124),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    verified(&out);
}

fn a_killed_memtrack_takes_its_command_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.memtrack");
    let (mut cmd, pidfile) = sleeper(dir.path(), &out);
    let mut m = cmd.spawn().unwrap();
    let child = pid_in(&pidfile);
    m.kill().unwrap();
    m.wait().unwrap();
    let start = Instant::now();
    while running(child) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the command {child} outlived memtrack"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    memtrack_test_support::run(vec![
        requires(
            "term_and_hup_go_to_the_command_and_the_artifact_is_whole",
            &[TRACKER],
            term_and_hup_go_to_the_command_and_the_artifact_is_whole,
        ),
        requires(
            "timeout_ends_the_recording_whole",
            &[TRACKER, Need::Tool("timeout")],
            timeout_ends_the_recording_whole,
        ),
        requires(
            "a_killed_memtrack_takes_its_command_with_it",
            &[TRACKER],
            a_killed_memtrack_takes_its_command_with_it,
        ),
    ]);
}
