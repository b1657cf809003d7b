//! `record_command`'s forked command never outlives an error: when recording fails after the
//! fork (the tracker cannot load or attach, or the artifact's writer fails), the command is
//! killed before it runs and reaped, leaving no process and no zombie behind.
//!
//! Its own test binary, `harness = false` with one test at a time: the oracle is that this
//! process has no child at all afterwards (`waitpid(-1, WNOHANG)` fails with ECHILD), which
//! only holds if nothing else in the process forks meanwhile.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use memtrack::{tracker::CommandOptions, tracker::TrackerOptions, tracker::record_command_with};
use memtrack_test_support::{TRACKER, missing, test};

/// An artifact writer that refuses every write, as a full disk does: the encoder fails on the
/// header, after the fork.
struct Refuses;

impl Write for Refuses {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("this writer refuses every write"))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// This process's children that are still running or not reaped (zombies), from
/// `/proc/*/stat` (for the message; `waitpid` is the oracle).
fn children() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(1) == Some(&me.as_str()) {
            found.push(format!("{head}) state {}", f[0]));
        }
    }
    found
}

/// Whether this process has no child at all, running or zombie.
fn no_child() -> bool {
    let mut status = 0;
    // SAFETY: a non-blocking wait for any child into a valid int.
    let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD)
}

fn an_error_after_the_fork_leaves_no_child_running_and_no_zombie() {
    let privileged = missing(&[TRACKER]).is_none();
    let dir = tempfile::tempdir().unwrap();
    for follow in [true, false] {
        assert!(no_child(), "a child before the test: {:?}", children());
        let marker = dir.path().join(format!("ran-{follow}"));
        let command: Vec<OsString> = vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("touch '{}'; sleep 30", marker.display()).into(),
        ];
        let t = Instant::now();
        let r = record_command_with(
            &command,
            Refuses,
            &TrackerOptions::new(),
            &CommandOptions::new().follow(follow),
        );
        let e = r.expect_err("recording into a writer that refuses every write");
        // Privileged, the tracker attaches and the encoder fails on the header; unprivileged,
        // loading the tracker fails first. Both happen after the fork.
        if privileged {
            assert!(e.to_string().contains("refuses every write"), "{e}");
        }
        assert!(
            no_child(),
            "follow {follow}: `{e}` left a child behind: {:?}",
            children()
        );
        assert!(
            !Path::new(&marker).exists(),
            "follow {follow}: the command ran although recording failed"
        );
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }
}

fn main() {
    memtrack_test_support::run(vec![test(
        "an_error_after_the_fork_leaves_no_child_running_and_no_zombie",
        an_error_after_the_fork_leaves_no_child_running_and_no_zombie,
    )]);
}
