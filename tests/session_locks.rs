//! A session's [`Report`](memtrack::Report) and summary line carry its lock waits when it
//! recorded them ([`SessionBuilder::lock_waits`]): the same numbers as `memtrack::locks::lock_waits`
//! of its artifact, and for an in-memory session numbers that add up per thread to the window.
//!
//! Tests run one at a time on the main thread (`harness = false`): the tracker is
//! process-global. Needs CAP_BPF + CAP_PERFMON; without them the tests are reported as
//! ignored, with why.

use std::time::Duration;

use memtrack::{
    Report, SessionBuilder, artifact::Reader, locks::LockWaits, locks::LockWaitsError,
    symbolize::Symbolizer,
};

/// Runs `threads` threads taking turns on one mutex (10 holds of 2 ms each) in a session
/// built by `builder`; any refusal of its lock waits fails the test.
fn contended(builder: impl Fn() -> SessionBuilder, threads: usize) -> Report {
    let session = builder().quiet(true).lock_waits(true).start().unwrap();
    memtrack_test_support::take_turns(threads, 10, Duration::from_millis(2));
    let report = session.finish().unwrap();
    assert_eq!(report.lost_events(), 0);
    if let Err(e) = report.lock_waits().expect("asked for") {
        panic!("lock waits refused: {e}");
    }
    report
}

fn waits(report: &Report) -> &LockWaits {
    report.lock_waits().unwrap().unwrap()
}

/// The report's lock waits are `memtrack::locks::lock_waits` of its artifact, thread for thread and
/// site for site; its totals are their sums; the summary line prints them.
fn the_report_carries_the_artifacts_lock_waits() {
    let dir = tempfile::tempdir().unwrap();
    let report = contended(
        || SessionBuilder::new("contended").output_dir(dir.path()),
        4,
    );
    let w = waits(&report);
    let reader = Reader::open(report.path.as_ref().unwrap()).unwrap();
    let again = memtrack::locks::lock_waits(&reader, &mut Symbolizer::new()).unwrap();
    assert_eq!(*w, again);
    let t = w.totals();
    let sum = |f: fn(&memtrack::locks::ThreadWaits) -> u64| w.threads.iter().map(f).sum::<u64>();
    assert_eq!(t.times.mutex_wait_ns, sum(|t| t.times.mutex_wait_ns));
    assert_eq!(t.times.condvar_wait_ns, sum(|t| t.times.condvar_wait_ns));
    assert_eq!(t.times.sleep_ns, sum(|t| t.times.sleep_ns));
    assert_eq!(t.times.preempted_ns, sum(|t| t.times.preempted_ns));
    assert_eq!(t.times.cpu_ns, sum(|t| t.times.cpu_ns));
    assert_eq!(t.threads, w.threads.len() as u64);
    // 4 threads × 10 holds of 2 ms: the others wait for each.
    assert!(t.times.mutex_wait_ns >= 10 * 2_000_000, "{t:?}");
    let line = report.summary_line();
    let want = format!(
        "; lock waits of {} threads: mutex {:.1} ms, ",
        t.threads,
        t.times.mutex_wait_ns as f64 / 1e6
    );
    assert!(line.contains(&want), "{line}\nwants {want}");
    assert!(
        line.contains(&format!(
            "; on CPU {:.1} ms; scope:",
            t.times.cpu_ns as f64 / 1e6
        )),
        "{line}"
    );
}

/// An in-memory session with lock waits gives them too (it keeps its artifact in memory): each
/// thread's times, every class and the CPU, add up to its row (its life within the window).
fn an_in_memory_session_gives_them_too() {
    let report = contended(|| SessionBuilder::new("in-memory").in_memory(true), 3);
    assert!(report.path.is_none());
    let w = waits(&report);
    assert!(w.totals().times.mutex_wait_ns >= 10 * 2_000_000);
    for t in &w.threads {
        let all: u64 = t.times.by_class().iter().map(|(_, ns)| ns).sum::<u64>() + t.times.cpu_ns;
        assert!(t.start_ns < t.end_ns && t.end_ns <= w.window_ns, "{t:?}");
        assert_eq!(all, t.end_ns - t.start_ns, "{t:?}");
    }
}

/// A session that does not ask for lock waits has none, and its summary line says nothing of
/// them.
fn none_unless_asked_for() {
    let report = SessionBuilder::new("plain")
        .in_memory(true)
        .quiet(true)
        .start()
        .unwrap()
        .finish()
        .unwrap();
    assert!(report.lock_waits().is_none());
    assert!(!report.summary_line().contains("lock waits"));
}

/// `#[memtrack(locks)]` records lock waits (its artifact has the switches `memtrack::locks::lock_waits`
/// reads); the same function without `locks` records none.
fn the_attribute_asks_for_lock_waits() {
    #[memtrack::memtrack(locks, name = "attr-locks", output = "target/session_locks")]
    fn with_locks() {
        std::thread::sleep(Duration::from_millis(5));
    }
    #[memtrack::memtrack(name = "attr-plain", output = "target/session_locks")]
    fn without() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/session_locks");
    let read = |name: &str| {
        memtrack::finish_calls().expect("finishing the recording of calls");
        let reader = Reader::open(dir.join(format!("{name}.memtrack"))).unwrap();
        memtrack::locks::lock_waits(&reader, &mut Symbolizer::new())
    };
    with_locks();
    let w = read("attr-locks").expect("lock waits");
    assert!(w.totals().times.sleep_ns >= 5_000_000, "{:?}", w.totals());
    without();
    assert!(matches!(
        read("attr-plain"),
        Err(LockWaitsError::NotRecorded)
    ));
}

/// `#[memtrack(locks)]` when the allocator recorder is chosen at run time
/// (`MEMTRACK_BACKEND=alloc`): recording does not start, and a function with limits fails with
/// the reason (lock waits need the eBPF tracker) instead of running unrecorded.
fn the_attribute_with_the_allocator_recorder_at_run_time() {
    #[memtrack::memtrack(locks, in_memory, max_allocations = 1_000)]
    fn limited() {}
    // SAFETY: tests run one at a time on this thread and this one has started none; memtrack's
    // threads do not read the environment.
    unsafe { std::env::set_var("MEMTRACK_BACKEND", "alloc") };
    let panic = std::panic::catch_unwind(limited).expect_err("refused");
    // SAFETY: as above.
    unsafe { std::env::remove_var("MEMTRACK_BACKEND") };
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("lock waits need the eBPF tracker"), "{msg}");
}

fn main() {
    use memtrack_test_support::{TRACKER, requires, run_sequential};
    run_sequential(vec![
        requires(
            "the_report_carries_the_artifacts_lock_waits",
            &[TRACKER],
            the_report_carries_the_artifacts_lock_waits,
        ),
        requires(
            "an_in_memory_session_gives_them_too",
            &[TRACKER],
            an_in_memory_session_gives_them_too,
        ),
        requires("none_unless_asked_for", &[TRACKER], none_unless_asked_for),
        requires(
            "the_attribute_asks_for_lock_waits",
            &[TRACKER],
            the_attribute_asks_for_lock_waits,
        ),
        memtrack_test_support::test(
            "the_attribute_with_the_allocator_recorder_at_run_time",
            the_attribute_with_the_allocator_recorder_at_run_time,
        ),
    ]);
}
