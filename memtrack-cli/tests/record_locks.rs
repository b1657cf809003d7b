//! `memtrack record --locks` and `memtrack locks` against the real kernel and real programs.
//!
//! `harness = false` (memtrack-test-support's runner): every test needs CAP_BPF +
//! CAP_PERFMON, and without them is reported as ignored with what is missing.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use memtrack_test_support::{Need, TRACKER, record_lost_switches, requires, run};

fn memtrack() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memtrack"))
}

/// `memtrack locks FILE --json`, which must succeed, parsed.
fn locks_json(file: &Path) -> serde_json::Value {
    let out = memtrack()
        .arg("locks")
        .arg(file)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `memtrack record --locks -o FILE -- COMMAND…`, which must succeed.
fn record_locks(file: &Path, command: &[&OsStr]) {
    let st = memtrack()
        .args(["record", "--locks", "-o"])
        .arg(file)
        .arg("--")
        .args(command)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
}

/// `sleep 0.2` recorded with `--locks`: `locks --json` gives its one thread 200 ms of sleep
/// (at least, and at most the window), no lock wait, and the table names it.
fn a_sleeping_command_sleeps() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sleep.memtrack");
    record_locks(&file, &["sleep".as_ref(), "0.2".as_ref()]);
    let v = locks_json(&file);
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{v}");
    let t = &threads[0];
    let sleep = t["sleep_ns"].as_u64().unwrap();
    let window = v["window_ns"].as_u64().unwrap();
    assert!(sleep >= 200_000_000 && sleep <= window, "{v}");
    assert_eq!(t["mutex_wait_ns"].as_u64(), Some(0));
    assert_eq!(t["idle"].as_bool(), Some(false));
    let text = memtrack().arg("locks").arg(&file).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("no thread waited for a lock"), "{text}");
}

/// A C program's pthread locks (`pthread_locks.c`, `-O2 -fomit-frame-pointer`) recorded with
/// `--locks`: `memtrack locks` names its contended sites by class (mutex, rwlock, condvar,
/// barrier), `--json` gives each worker a row of its own life (`start_ns` after 0, `end_ns`
/// before the window's end, the times adding up to it), and `export --locks --class barrier`
/// writes only the barrier's waits.
fn a_c_programs_pthread_locks_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    let exe = memtrack_test_support::fixtures::pthread_locks(dir.path(), "pthread_locks");
    let file = dir.path().join("c.memtrack");
    let measured = dir.path().join("measured.txt");
    record_locks(
        &file,
        &[
            exe.as_os_str(),
            measured.as_os_str(),
            "4".as_ref(),
            "10".as_ref(),
            "2000".as_ref(),
        ],
    );
    let text = memtrack().arg("locks").arg(&file).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    for class in ["mutex", "rwlock", "condvar", "barrier"] {
        assert!(
            text.contains(&format!(" {class} ")),
            "no {class} site: {text}"
        );
    }
    let v = locks_json(&file);
    let window = v["window_ns"].as_u64().unwrap();
    let workers: Vec<&serde_json::Value> = v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tid"] != t["pid"])
        .collect();
    assert_eq!(workers.len(), 4, "{v}");
    for t in workers {
        let (start, end) = (
            t["start_ns"].as_u64().unwrap(),
            t["end_ns"].as_u64().unwrap(),
        );
        assert!(0 < start && start < end && end < window, "{t}");
        let times: u64 = t
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.ends_with("_ns") && !["start_ns", "end_ns"].contains(&k.as_str()))
            .map(|(_, n)| n.as_u64().unwrap())
            .sum();
        assert_eq!(times, end - start, "{t}");
        assert!(t["mutex_wait_ns"].as_u64().unwrap() > 0, "{t}");
    }
    let folded = dir.path().join("barrier.folded");
    let st = memtrack()
        .arg("export")
        .arg(&file)
        .args(["--format", "folded", "--locks", "--class", "barrier", "-o"])
        .arg(&folded)
        .status()
        .unwrap();
    assert!(st.success());
    let lines = std::fs::read_to_string(&folded).unwrap();
    assert!(!lines.is_empty());
    for l in lines.lines() {
        assert!(l.rsplit_once(' ').unwrap().0.ends_with("[barrier]"), "{l}");
    }
}

/// A recording made without `--locks` is refused with how to make one.
fn a_recording_without_switches_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("true.memtrack");
    let st = memtrack()
        .args(["record", "-o"])
        .arg(&file)
        .args(["--", "true"])
        .status()
        .unwrap();
    assert!(st.success());
    let out = memtrack().arg("locks").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("record --locks"), "{err}");
}

/// A lock-wait recording that lost events (a 4 KiB ring buffer, drained every 10 ms, under
/// thousands of switches): `memtrack locks` refuses it (exit 1) and so does `memtrack compare`
/// (exit 2), each saying events were lost.
fn a_recording_that_lost_switches_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lost.memtrack");
    record_lost_switches(&file);

    let out = memtrack().arg("locks").arg(&file).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("lost"), "{err}");
    let out = memtrack()
        .arg("compare")
        .arg(&file)
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("lost"), "{err}");
}

fn main() {
    run(vec![
        requires(
            "a_sleeping_command_sleeps",
            &[TRACKER],
            a_sleeping_command_sleeps,
        ),
        requires(
            "a_c_programs_pthread_locks_are_classified",
            &[TRACKER, Need::Tool("cc")],
            a_c_programs_pthread_locks_are_classified,
        ),
        requires(
            "a_recording_without_switches_is_refused",
            &[TRACKER],
            a_recording_without_switches_is_refused,
        ),
        requires(
            "a_recording_that_lost_switches_is_refused",
            &[TRACKER],
            a_recording_that_lost_switches_is_refused,
        ),
    ]);
}
