//! A process pays nothing for memtrack once its sessions are over: the eBPF probes are attached
//! only while a session records (or a criterion counter counts), because an attached uprobe
//! traps into the kernel on every allocator call even when its program returns at once.
//!
//! `harness = false`: "before any session" must really be before any session of the process.
//! Compares a malloc/free loop's time before any session, after a finished session, after a
//! nested pair, and after a counting guard, in the same run (a uprobe's absolute cost varies
//! from day to day: only ratios within one run mean anything), each against [`MAX_RATIO`].
//! Needs CAP_BPF + CAP_PERFMON: without them the tests are reported as ignored, with why.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// How much slower than before any session the loop may be after one: attached probes make
/// it 25–100× slower, noise on a shared machine makes the same loop without probes up to ~3×.
const MAX_RATIO: f64 = 5.0;

/// Runs of the loop, and its malloc(64)+free pairs per run.
const RUNS: u64 = 15;
const PAIRS: u64 = 20_000;

/// The fastest of [`RUNS`] runs of [`PAIRS`] malloc(64)+free pairs.
fn malloc_loop() -> Duration {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..PAIRS {
                black_box(Vec::<u8>::with_capacity(black_box(64)));
            }
            t.elapsed()
        })
        .min()
        .expect("RUNS > 0")
}

/// The loop's time before any session of the process (set by the first test, which runs first).
static PRISTINE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// The loop's time before any session: later tests compare with it, not with a time taken
/// after earlier sessions (which would be slow too if probes stayed attached).
fn pristine() -> Duration {
    *PRISTINE.get().expect("no_cost_after_a_session runs first")
}

fn ratio(after: Duration, before: Duration) -> f64 {
    after.as_secs_f64() / before.as_secs_f64()
}

fn no_cost_after_a_session() {
    malloc_loop(); // warm-up: the first runs of a process fault in the allocator's pages
    let before = malloc_loop();
    PRISTINE.set(before).expect("set once");
    let s = memtrack::SessionBuilder::new("one")
        .quiet(true)
        .start()
        .expect("session");
    let during = malloc_loop();
    let report = s.finish().expect("finish");
    // RUNS × PAIRS in the measured loop, plus whatever the timing itself allocates (nothing).
    assert_eq!(
        report.allocations(),
        RUNS * PAIRS,
        "{}",
        report.summary_line()
    );
    let after = malloc_loop();
    println!(
        "malloc+free loop: before {before:?}, during {during:?} ({:.1}×), after {after:?} ({:.2}×)",
        ratio(during, before),
        ratio(after, before)
    );
    // The loop is measurably slower while recording: the measurement can see probes.
    assert!(
        ratio(during, before) > 2.0 * MAX_RATIO,
        "recording should cost this loop (before {before:?}, during {during:?})"
    );
    assert!(
        ratio(after, before) < MAX_RATIO,
        "after the session the loop takes {after:?}, before it {before:?}: the probes stayed attached"
    );
    // Still true a while later (nothing re-attaches in the background).
    std::thread::sleep(Duration::from_millis(200));
    let later = malloc_loop();
    assert!(
        ratio(later, before) < MAX_RATIO,
        "later {later:?}, before {before:?}"
    );
}

fn no_cost_after_back_to_back_sessions() {
    let before = pristine();
    for i in 0..3 {
        memtrack::SessionBuilder::new(format!("b2b-{i}"))
            .quiet(true)
            .start()
            .and_then(|s| s.finish())
            .expect("session");
    }
    let after = malloc_loop();
    println!("after 3 back-to-back sessions: {after:?} vs {before:?}");
    assert!(
        ratio(after, before) < MAX_RATIO,
        "after {after:?}, before {before:?}"
    );
}

fn no_cost_after_counting() {
    let before = pristine();
    let tracker = memtrack::tracker::Tracker::global(&memtrack::tracker::TrackerOptions::new())
        .expect("tracker");
    let c0 = tracker.counters().expect("counters");
    {
        let _counting = tracker.counting().expect("counting");
        black_box(Vec::<u8>::with_capacity(black_box(10)));
    }
    let c1 = tracker.counters().expect("counters");
    assert_eq!(c1.allocations - c0.allocations, 1, "the counter counted");
    let after = malloc_loop();
    println!("after a counting guard: {after:?} vs {before:?}");
    assert!(
        ratio(after, before) < MAX_RATIO,
        "after {after:?}, before {before:?}"
    );
}

#[memtrack::memtrack(name = "after_calls")]
fn tracked_call() {
    black_box(Vec::<u8>::with_capacity(black_box(64)));
}

/// A `#[memtrack]` function's recording stays open between its calls (its probes too, for
/// the next call), and its probes are detached once it has had no call for the idle grace:
/// the process pays nothing once the calls stop, while the recording is still open.
fn no_cost_once_calls_stop() {
    let before = pristine();
    for _ in 0..50 {
        tracked_call();
    }
    let grace = memtrack::tracker::IDLE_GRACE;
    std::thread::sleep(grace * 2);
    let mut after = malloc_loop();
    // Without uprobe.multi links (an older kernel, or MEMTRACK_KERNEL_WITHOUT) every site has
    // a link of its own and the kernel closes them one after another, a grace period each:
    // the probes go away over seconds (the guide's "what each kernel gets").
    let multi = memtrack::tracker::Kernel::get().has(memtrack::tracker::Feature::UprobeMulti);
    let deadline = Instant::now() + Duration::from_secs(if multi { 0 } else { 15 });
    while ratio(after, before) >= MAX_RATIO && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        after = malloc_loop();
    }
    println!("{grace:?} after the last of 50 calls: {after:?} vs {before:?}");
    assert!(
        ratio(after, before) < MAX_RATIO,
        "after {after:?}, before {before:?}: the probes stayed attached after the calls stopped"
    );
    let report = memtrack::finish_calls().unwrap().expect("still open");
    assert_eq!((report.iterations, report.allocations()), (Some(50), 50));
}

fn main() {
    use memtrack_test_support::{TRACKER, requires};
    // In this order: the first measures the loop before any session of the process.
    memtrack_test_support::run_sequential(vec![
        requires(
            "no_cost_after_a_session",
            &[TRACKER],
            no_cost_after_a_session,
        ),
        requires(
            "no_cost_after_back_to_back_sessions",
            &[TRACKER],
            no_cost_after_back_to_back_sessions,
        ),
        requires("no_cost_after_counting", &[TRACKER], no_cost_after_counting),
        requires(
            "no_cost_once_calls_stop",
            &[TRACKER],
            no_cost_once_calls_stop,
        ),
    ]);
}
