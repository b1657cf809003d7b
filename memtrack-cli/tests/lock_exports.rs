//! `memtrack flamegraph --locks` and `memtrack export --format folded --locks`: the lock waits'
//! contended call sites as folded stacks weighted by microseconds and as a flame graph, checked
//! against `memtrack locks --json` of the same recording.
//!
//! The recording is this test's own: threads contending on one `std::sync::Mutex`, recorded by
//! an eBPF session with lock waits. `harness = false` (memtrack-test-support's runner): the
//! tests need CAP_BPF + CAP_PERFMON, and without them are reported as ignored with what is
//! missing; they run one at a time (a session records this process's threads).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{memtrack, s, svg_doc, text};
use memtrack_test_support::{TRACKER, requires, run_sequential};
use serde_json::Value;

/// Records `threads` threads taking turns on one mutex, each holding it 10 × 2 ms, into
/// `dir/contended.memtrack`; `memtrack locks` refusing it fails the test.
fn contended(dir: &Path, threads: usize) -> PathBuf {
    let session = memtrack::SessionBuilder::new("contended")
        .output_dir(dir)
        .quiet(true)
        .lock_waits(true)
        .start()
        .expect("an eBPF session with lock waits");
    memtrack_test_support::take_turns(threads, 10, Duration::from_millis(2));
    let report = session.finish().unwrap();
    assert_eq!(report.lost_events(), 0);
    let path = report.path.clone().unwrap();
    let out = memtrack(&["locks", s(&path), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    path
}

/// The sum of `locks --json`'s per-thread `keys`, ns.
fn total(v: &Value, keys: &[&str]) -> u64 {
    v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| keys.iter().map(|k| t[*k].as_u64().unwrap()).sum::<u64>())
        .sum()
}

const LOCK_KEYS: &[&str] = &[
    "mutex_wait_ns",
    "rwlock_wait_ns",
    "condvar_wait_ns",
    "barrier_wait_ns",
    "glibc_lock_wait_ns",
];

/// `(path, µs)` of each folded line.
fn parse_folded(folded: &str) -> Vec<(String, u64)> {
    folded
        .lines()
        .map(|l| {
            let (path, w) = l.rsplit_once(' ').expect("`path weight`");
            (path.to_string(), w.parse().expect("an integer weight"))
        })
        .collect()
}

/// The folded stacks add up to `locks --json`'s lock waits (ns / 1,000, rounded), every line
/// ends in its class's frame above the code that wanted the lock (this test's closure, no
/// frame of std's lock), and `--class` selects: `mutex` alone gives the mutex lines (the
/// threads' `Barrier` is a condvar), `rwlock` none.
fn folded_waits_sum_to_the_analysis() {
    let dir = tempfile::tempdir().unwrap();
    let file = contended(dir.path(), 4);
    let v: Value =
        serde_json::from_slice(&memtrack(&["locks", s(&file), "--json"]).stdout).unwrap();
    let mutex_ns = total(&v, &["mutex_wait_ns"]);
    let lock_ns = total(&v, LOCK_KEYS);
    assert!(
        mutex_ns >= 10 * 2_000_000,
        "4 threads × 10 holds of 2 ms: {v}"
    );
    let folded = dir.path().join("waits.folded");
    let out = memtrack(&[
        "export",
        s(&file),
        "--format",
        "folded",
        "--locks",
        "-o",
        s(&folded),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let all = std::fs::read_to_string(&folded).unwrap();
    let lines = parse_folded(&all);
    assert!(!lines.is_empty());
    let sum: u64 = lines.iter().map(|l| l.1).sum();
    assert_eq!(sum, (lock_ns + 500) / 1_000, "{all}");
    // The sites' waits are the threads' waits: `locks --json`'s sites sum to the same.
    let sites_ns: u64 = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["wait_ns"].as_u64().unwrap())
        .sum();
    assert_eq!(sites_ns, lock_ns);
    let test_fn = "memtrack_test_support::take_turns";
    for (path, _) in &lines {
        let frames: Vec<&str> = path.split(';').collect();
        assert!(
            frames.last().unwrap().starts_with('[') && frames.last().unwrap().ends_with(']'),
            "{path}"
        );
        assert!(
            !frames.iter().any(|f| f.contains("lock_contended")),
            "{path}"
        );
    }
    let mutex_lines: Vec<_> = lines.iter().filter(|l| l.0.ends_with(";[mutex]")).collect();
    assert!(
        mutex_lines.iter().any(|l| l.0.contains(test_fn)),
        "the code that wanted the lock is the workload's: {all}"
    );
    let by_mutex: u64 = mutex_lines.iter().map(|l| l.1).sum();
    assert!(
        by_mutex.abs_diff(mutex_ns / 1_000) <= mutex_lines.len() as u64,
        "{all}"
    );

    let only = dir.path().join("mutex.folded");
    let out = memtrack(&[
        "export",
        s(&file),
        "--format",
        "folded",
        "--locks",
        "--class",
        "mutex",
        "-o",
        s(&only),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let only = parse_folded(&std::fs::read_to_string(&only).unwrap());
    assert!(only.iter().all(|l| l.0.ends_with(";[mutex]")));
    assert_eq!(
        only.iter().map(|l| l.1).sum::<u64>(),
        (mutex_ns + 500) / 1_000
    );

    let none = dir.path().join("rwlock.folded");
    let out = memtrack(&[
        "export",
        s(&file),
        "--format",
        "folded",
        "--locks",
        "--class",
        "rwlock",
        "-o",
        s(&none),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&none).unwrap(), "");

    // The other formats are of allocations: refused with what to use.
    let out = memtrack(&[
        "export",
        s(&file),
        "--format",
        "pprof",
        "--locks",
        "-o",
        s(&none),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--format folded"), "{}", text(&out));
}

/// The flame graph of the waits is well-formed SVG (roxmltree), titled with the lock waits,
/// its frames as wide as the folded stacks say (inferno's tooltips: `NAME (N µs, P%)`), the
/// class frame drawn; a class nobody waited for gives a well-formed image that says so.
fn flamegraph_of_waits() {
    let dir = tempfile::tempdir().unwrap();
    let file = contended(dir.path(), 3);
    let svg_path = dir.path().join("waits.svg");
    let out = memtrack(&["flamegraph", s(&file), "--locks", "-o", s(&svg_path)]);
    assert!(out.status.success(), "{}", text(&out));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = svg_doc(&svg);
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(svg.contains("lock waits (mutex, rwlock, condvar, barrier, glibc_lock)"));
    let folded = dir.path().join("waits.folded");
    let out = memtrack(&[
        "export",
        s(&file),
        "--format",
        "folded",
        "--locks",
        "-o",
        s(&folded),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let lines = parse_folded(&std::fs::read_to_string(&folded).unwrap());
    let mutex_us: u64 = lines
        .iter()
        .filter(|l| l.0.ends_with(";[mutex]"))
        .map(|l| l.1)
        .sum();
    // The `[mutex]` frames' titles, summed, are the folded stacks' mutex waits.
    let drawn: u64 = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .filter(|t| t.starts_with("[mutex] ("))
        .map(|t| {
            let n = t["[mutex] (".len()..].split(' ').next().unwrap();
            n.replace(',', "").parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(drawn, mutex_us, "{svg}");

    let empty = dir.path().join("rwlock.svg");
    let out = memtrack(&[
        "flamegraph",
        s(&file),
        "--locks",
        "--class",
        "rwlock",
        "-o",
        s(&empty),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let svg = std::fs::read_to_string(&empty).unwrap();
    svg_doc(&svg);
    assert!(
        svg.contains("no thread waited for a lock of these classes"),
        "{svg}"
    );
}

fn main() {
    run_sequential(vec![
        requires(
            "folded_waits_sum_to_the_analysis",
            &[TRACKER],
            folded_waits_sum_to_the_analysis,
        ),
        requires("flamegraph_of_waits", &[TRACKER], flamegraph_of_waits),
    ]);
}
