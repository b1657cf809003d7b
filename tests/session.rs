//! `#[memtrack]` and sessions against the real tracker.
//!
//! `harness = false`: the tracker records the whole process, and libtest's threads (its main
//! thread prints results while the next test already runs) would add allocations to the exact
//! counts asserted here; this binary runs its tests one after another on the main thread.
//! Needs root (or CAP_BPF + CAP_PERFMON): without it every test says it is skipped and why.

use std::hint::black_box;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use memtrack::{Event, EventKind, Reader, Totals, memtrack};

fn dir() -> PathBuf {
    PathBuf::from(std::env::var_os("MEMTRACK_DIR").expect("set by main"))
}

fn read(name: &str) -> (Reader, Vec<Event>) {
    let r = Reader::open(dir().join(format!("{name}.memtrack"))).expect("artifact");
    assert_eq!(r.completeness(), &memtrack::Completeness::Complete);
    let evs = r.events().collect::<Result<_, _>>().expect("decode");
    (r, evs)
}

fn totals(name: &str) -> Totals {
    let (r, _) = read(name);
    r.final_metadata().expect("trailer").totals.clone()
}

/// Allocations right outside the guard, which must not be counted.
fn noise() {
    for n in [24usize, 4000, 70_000] {
        black_box(Vec::<u8>::with_capacity(n));
    }
}

/// Exactly 3 allocations (100 + 64 + 1000 bytes: malloc, malloc, calloc) and 3 frees.
#[memtrack(name = "exact")]
fn exact() {
    let a: Vec<u8> = black_box(Vec::with_capacity(100));
    let b = black_box(Box::new([7u64; 8]));
    let c = black_box(vec![0u8; 1000]);
    drop((a, b, c));
}

fn exact_counts_and_nothing_outside() {
    noise();
    exact();
    noise();
    let t = totals("exact");
    assert_eq!(t.allocations, 3, "{t:?}");
    assert_eq!(t.bytes_allocated, 1164);
    assert_eq!((t.frees, t.bytes_freed), (3, 1164));
    assert_eq!((t.live_blocks_at_end, t.peak_live_bytes), (0, 1164));
    assert_eq!(t.kinds.get(memtrack::KindTag::Calloc), 1);
}

/// The returned block is allocated inside and freed by the caller, outside.
#[memtrack(name = "returns")]
fn returns(n: usize) -> Vec<u32> {
    (0..n as u32).collect()
}

fn returned_value_stays_live() {
    let v = returns(1000);
    drop(black_box(v));
    let t = totals("returns");
    assert_eq!((t.allocations, t.bytes_allocated), (1, 4000));
    assert_eq!(
        (t.live_blocks_at_end, t.live_bytes_at_end, t.frees),
        (1, 4000, 0)
    );
}

#[memtrack(name = "panics")]
fn panics() {
    let v = black_box(vec![1u8; 333]);
    if v.len() == 333 {
        panic!("boom");
    }
}

fn panic_still_writes_a_complete_artifact() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(AssertUnwindSafe(panics));
    std::panic::set_hook(hook);
    assert!(r.is_err());
    let (_, evs) = read("panics");
    let ours = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Malloc { size: 333, .. }))
        .count();
    assert_eq!(ours, 1, "{evs:?}");
}

fn sequential_sessions_are_independent() {
    for (name, n) in [("seq_a", 5u64), ("seq_b", 9)] {
        let s = memtrack::SessionBuilder::new(name)
            .quiet(true)
            .start()
            .unwrap();
        for i in 0..n {
            black_box(Vec::<u8>::with_capacity(10 + i as usize));
        }
        let report = s.finish().unwrap();
        assert_eq!(report.allocations(), n, "{name}");
        assert_eq!(
            report.bytes_allocated(),
            (0..n).map(|i| 10 + i).sum::<u64>()
        );
        assert_eq!(report.lost_events, 0);
        assert_eq!(totals(name), report.totals, "report = artifact's trailer");
    }
}

fn concurrent_session_is_refused() {
    let first = memtrack::SessionBuilder::new("first")
        .quiet(true)
        .start()
        .unwrap();
    let err = memtrack::start("second").err().expect("refused");
    assert!(
        matches!(err, memtrack::Error::SessionActive { ref active, .. } if active == "first"),
        "{err}"
    );
    assert!(err.to_string().contains("may not overlap"), "{err}");
    first.finish().unwrap();
    memtrack::SessionBuilder::new("after")
        .quiet(true)
        .start()
        .unwrap()
        .finish()
        .unwrap();
}

/// Four threads, each making 50 allocations of a size no one else uses.
#[memtrack(name = "threads")]
fn threads() {
    std::thread::scope(|s| {
        for i in 0..4usize {
            s.spawn(move || {
                for _ in 0..50 {
                    black_box(Vec::<u8>::with_capacity(10_000 + i));
                }
            });
        }
    });
}

fn per_thread_totals_add_up() {
    threads();
    let (r, evs) = read("threads");
    let t = &r.final_metadata().unwrap().totals;
    let sum: u64 = t.per_thread.values().map(|p| p.allocations).sum();
    let bytes: u64 = t.per_thread.values().map(|p| p.bytes_allocated).sum();
    assert_eq!((sum, bytes), (t.allocations, t.bytes_allocated));
    let main_tid = std::process::id();
    let mut worker_tids = std::collections::BTreeSet::new();
    for i in 0..4u64 {
        let of_size: Vec<&Event> = evs
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { size, .. } if size == 10_000 + i))
            .collect();
        assert_eq!(of_size.len(), 50, "thread {i}");
        assert!(
            of_size
                .iter()
                .all(|e| e.tid == of_size[0].tid && e.tid != main_tid)
        );
        worker_tids.insert(of_size[0].tid);
    }
    assert_eq!(worker_tids.len(), 4);
}

fn criterion_measurement_counts_per_iteration() {
    use criterion::measurement::Measurement;
    let m = memtrack::criterion::Allocations::new().unwrap();
    let b = memtrack::criterion::BytesAllocated::new().unwrap();
    let (s, sb) = (m.start(), b.start());
    for i in 0..100usize {
        black_box(Vec::<u8>::with_capacity(64 + i % 2));
        black_box(Box::new(i));
        black_box(String::with_capacity(3));
    }
    let (allocs, bytes) = (m.end(s), b.end(sb));
    assert_eq!(allocs, 300);
    assert_eq!(bytes, 50 * 64 + 50 * 65 + 100 * 8 + 100 * 3);
}

fn privileged() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    (unsafe { libc::geteuid() } != 0)
        .then(|| "not root (the eBPF tracker needs CAP_BPF + CAP_PERFMON)".to_string())
}

fn main() {
    let tests: &[(&str, fn())] = &[
        (
            "exact_counts_and_nothing_outside",
            exact_counts_and_nothing_outside,
        ),
        ("returned_value_stays_live", returned_value_stays_live),
        (
            "panic_still_writes_a_complete_artifact",
            panic_still_writes_a_complete_artifact,
        ),
        (
            "sequential_sessions_are_independent",
            sequential_sessions_are_independent,
        ),
        (
            "concurrent_session_is_refused",
            concurrent_session_is_refused,
        ),
        ("per_thread_totals_add_up", per_thread_totals_add_up),
        (
            "criterion_measurement_counts_per_iteration",
            criterion_measurement_counts_per_iteration,
        ),
    ];
    let tmp = tempfile::tempdir().expect("tempdir");
    // SAFETY: no other thread exists yet.
    unsafe { std::env::set_var("MEMTRACK_DIR", tmp.path()) };
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let skip = privileged();
    for (name, test) in tests {
        if let Some(why) = &skip {
            println!("test {name} ... SKIPPED: {why}");
            skipped += 1;
            continue;
        }
        match std::panic::catch_unwind(test) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!("\n{passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        std::process::exit(1);
    }
}
