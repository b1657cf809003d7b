//! `#[memtrack]` and sessions against the real tracker.
//!
//! `harness = false`: the tracker records the whole process, and libtest's threads (its main
//! thread prints results while the next test already runs) would add allocations to the exact
//! counts asserted here; this binary runs its tests one after another on the main thread.
//! Most tests need CAP_BPF + CAP_PERFMON: without them each is reported as ignored, with why.

use std::hint::black_box;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use memtrack::{artifact::Reader, event::Event, event::EventKind, memtrack, totals::Totals};
use memtrack_test_support::{Cap, Need, TRACKER, requires, test, three_blocks};

fn dir() -> PathBuf {
    PathBuf::from(std::env::var_os("MEMTRACK_DIR").expect("set by main"))
}

/// The artifact of `name` once its recording is finished (`#[memtrack]` functions accumulate
/// their calls until then).
fn read(name: &str) -> (Reader, Vec<Event>) {
    memtrack::finish_calls().expect("finishing the calls' recording");
    memtrack_test_support::read_complete(&dir().join(format!("{name}.memtrack")))
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
    drop(three_blocks());
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
    assert_eq!(t.kinds.get(memtrack::event::KindTag::Calloc), 1);
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
    memtrack_test_support::check_sequential_sessions(|name| {
        memtrack::SessionBuilder::new(name)
            .quiet(true)
            .start()
            .unwrap()
    });
}

/// Sessions back to back: each starts while the previous one's probes are still being closed
/// in the background (a close waits tens of ms for the kernel's grace period), so both links probe
/// the same sites for a while; only the newest may record, each call exactly once.
fn back_to_back_sessions_count_each_call_once() {
    for round in 0..5u64 {
        let name = format!("b2b_{round}");
        let s = memtrack::SessionBuilder::new(&name)
            .quiet(true)
            .start()
            .unwrap();
        for i in 0..100 {
            black_box(Vec::<u8>::with_capacity(1000 + i));
        }
        let report = s.finish().expect("finish");
        assert_eq!(
            (report.allocations(), report.bytes_allocated()),
            (100, (1000..1100).sum::<u64>()),
            "{name}: {}",
            report.summary_line()
        );
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
    assert!(err.to_string().contains("take turns"), "{err}");
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
    memtrack_test_support::assert_one_thread_per_size(&evs, 4, 10_000, 50);
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

/// `exact`'s body under limits equal to its numbers (3 allocations, 1,164 bytes, peak 1,164):
/// each limit passes at its boundary.
#[memtrack(
    name = "limits_at_boundary",
    max_allocations = 3,
    max_bytes = 1_164,
    max_peak = 1164,
    no_leaks
)]
fn limits_at_boundary() {
    drop(three_blocks());
}

/// The same allocations, one under every limit, and the 1,000-byte block returned (so live at
/// the end of the session).
#[memtrack(
    name = "limits_over",
    max_allocations = 2,
    max_bytes = 1_163,
    max_peak = 1_163,
    no_leaks
)]
fn limits_over() -> Vec<u8> {
    let (a, b, c) = three_blocks();
    drop((a, b));
    c
}

/// Runs `f` with the panic hook silenced; the panic message, if it panicked.
fn panic_message<R>(f: impl FnOnce() -> R) -> Option<String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    let payload = r.err()?;
    Some(match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p.downcast::<&str>().map(|s| s.to_string()).expect("text"),
    })
}

fn attribute_limits_pass_at_the_boundary() {
    assert_eq!(panic_message(limits_at_boundary), None);
    let t = totals("limits_at_boundary");
    assert_eq!(
        (
            t.allocations,
            t.bytes_allocated,
            t.peak_live_bytes,
            t.live_blocks_at_end
        ),
        (3, 1164, 1164, 0),
        "the limits are exactly the numbers"
    );
}

fn attribute_limits_fail_with_every_measured_number() {
    let msg = panic_message(limits_over).expect("limits_over must panic");
    let path = dir().join("limits_over.memtrack");
    assert_eq!(
        msg,
        format!(
            "memtrack: limits_over — call 1: allocations 3 > max_allocations 2; \
             bytes allocated 1,164 B > max_bytes 1,163 B; peak 1,164 B > max_peak 1,163 B; \
             live at end 1 block (1,000 B) with no_leaks → {}",
            path.display()
        )
    );
    // The artifact is written all the same.
    let t = totals("limits_over");
    assert_eq!((t.allocations, t.live_bytes_at_end), (3, 1000));
}

fn builder_limits_return_the_report_and_every_violation() {
    use memtrack::Violation;
    let start = |name: &str, allocs: u64, bytes: u64| {
        memtrack::SessionBuilder::new(name)
            .quiet(true)
            .max_allocations(allocs)
            .max_bytes(bytes)
            .max_peak(bytes)
            .no_leaks()
            .start()
            .unwrap()
    };
    let s = start("builder_boundary", 3, 1164);
    drop(three_blocks());
    let report = s.finish().expect("limits equal to the numbers pass");
    assert_eq!((report.allocations(), report.bytes_allocated()), (3, 1164));

    let s = start("builder_over", 2, 1163);
    let (a, b, c) = three_blocks();
    drop((a, b));
    let err = s.finish().expect_err("limits exceeded");
    drop(c);
    let text = err.to_string();
    let memtrack::Error::LimitExceeded { report, violations } = err else {
        panic!("{text}");
    };
    assert_eq!(
        violations,
        vec![
            Violation::Allocations {
                measured: 3,
                limit: 2
            },
            Violation::Bytes {
                measured: 1164,
                limit: 1163
            },
            Violation::Peak {
                measured: 1164,
                limit: 1163
            },
            Violation::Leaks {
                blocks: 1,
                bytes: 1000
            },
        ]
    );
    assert_eq!(
        text,
        "session \"builder_over\" exceeded its limits: allocations 3 > max_allocations 2; \
         bytes allocated 1,164 B > max_bytes 1,163 B; peak 1,164 B > max_peak 1,163 B; \
         live at end 1 block (1,000 B) with no_leaks"
    );
    assert_eq!(
        (report.allocations(), report.totals().live_bytes_at_end),
        (3, 1000)
    );
    // The artifact, counted from its events by the test: the same three blocks, one still live.
    let (_, evs) = read("builder_over");
    let c = memtrack_test_support::count(&evs);
    assert_eq!(
        (
            c.allocations,
            c.bytes_allocated,
            c.live_blocks_at_end,
            c.live_bytes_at_end
        ),
        (3, 1164, 1, 1000),
        "{evs:?}"
    );
}

#[memtrack(name = "limits_panicking", max_allocations = 0)]
fn limits_panicking() {
    let v = black_box(vec![1u8; 333]);
    if v.len() == 333 {
        panic!("boom");
    }
}

/// Runs `f` with this process's stderr (fd 2) sent to a file; what was written there.
fn capture_stderr<R>(f: impl FnOnce() -> R) -> (R, String) {
    use std::os::fd::AsRawFd;
    let file = tempfile::tempfile().expect("tempfile");
    // SAFETY: dup of fd 2, which is open for the whole process.
    let saved = unsafe { libc::dup(2) };
    assert!(saved >= 0);
    // SAFETY: both descriptors are open; fd 2 is restored below before `file` is dropped.
    assert!(unsafe { libc::dup2(file.as_raw_fd(), 2) } >= 0);
    let r = f();
    // SAFETY: `saved` is the duplicate of the original fd 2, closed once here.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let mut file = file;
    use std::io::{Read, Seek};
    file.rewind().expect("rewind");
    let mut out = String::new();
    file.read_to_string(&mut out).expect("read");
    (r, out)
}

fn a_violation_while_panicking_is_printed_not_raised() {
    // A second panic during unwinding would abort this process.
    let (msg, stderr) = capture_stderr(|| panic_message(limits_panicking));
    assert_eq!(msg.as_deref(), Some("boom"), "the body's own panic");
    // The vec and what the panic itself allocates (its payload): the artifact's count.
    let allocs = totals("limits_panicking").allocations;
    assert!(allocs >= 1);
    let expected =
        format!("memtrack: limits_panicking — call 1: allocations {allocs} > max_allocations 0");
    assert!(stderr.contains(&expected), "{expected} in {stderr}");
}

static RAN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

// `/dev/null` is a file, so the artifact's directory cannot be created: recording cannot start.
#[memtrack(name = "unrecordable", output = "/dev/null/memtrack")]
fn unrecordable() {
    RAN.store(true, std::sync::atomic::Ordering::SeqCst);
}

#[memtrack(
    name = "unrecordable_limited",
    output = "/dev/null/memtrack",
    max_bytes = 10
)]
fn unrecordable_limited() {
    RAN.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn limits_that_cannot_be_checked_fail() {
    use std::sync::atomic::Ordering::SeqCst;
    let (msg, stderr) = capture_stderr(|| panic_message(unrecordable));
    assert_eq!(msg, None, "without limits the function runs unrecorded");
    assert!(RAN.swap(false, SeqCst));
    assert!(
        stderr.contains("memtrack: unrecordable: not recorded: creating /dev/null/memtrack"),
        "{stderr}"
    );
    let msg = panic_message(unrecordable_limited).expect("must fail");
    assert!(!RAN.load(SeqCst), "the body must not run unrecorded");
    assert!(
        msg.starts_with(
            "memtrack: unrecordable_limited: the limits (max_bytes 10 B) cannot be checked: \
             recording did not start: creating /dev/null/memtrack"
        ),
        "{msg}"
    );
}

/// The child of `limits_fail_without_privileges`: a limited function, as an unprivileged user.
#[memtrack(name = "unprivileged", max_allocations = 5)]
fn unprivileged() {
    RAN.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn limits_fail_without_privileges() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&exe)
        .arg("--unprivileged-child")
        .env("MEMTRACK_DIR", "/tmp")
        .output()
        .expect("setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.starts_with(
            "panicked: memtrack: unprivileged: the limits (max_allocations 5) cannot be checked: \
             recording did not start: "
        ),
        "{stdout}"
    );
    assert!(stdout.contains("CAP_BPF"), "the fix: {stdout}");
    assert!(stdout.contains("body ran: false"), "{stdout}");
}

/// This binary does not install `memtrack::Allocator`: asking for that backend says how to.
fn allocator_backend_without_the_allocator_is_refused() {
    let err = memtrack::SessionBuilder::new("no_allocator")
        .backend(memtrack::BackendChoice::Alloc)
        .start()
        .err()
        .expect("refused");
    assert!(
        matches!(err, memtrack::Error::AllocatorNotInstalled),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("#[global_allocator]") && msg.contains("memtrack::Allocator::system()"),
        "{msg}"
    );
    assert!(!memtrack::allocator::allocator_installed());
}

/// Two allocations, then a `#[memtrack]` function with three: it joins this session.
#[memtrack(name = "outer")]
fn outer() {
    black_box(Vec::<u8>::with_capacity(11));
    black_box(Vec::<u8>::with_capacity(12));
    inner();
}

#[memtrack(name = "inner")]
fn inner() {
    for n in [13usize, 14, 15] {
        black_box(Vec::<u8>::with_capacity(n));
    }
}

fn nested_attribute_joins_the_outer_session() {
    outer();
    let t = totals("outer");
    assert_eq!(
        (t.allocations, t.bytes_allocated),
        (5, 11 + 12 + 13 + 14 + 15)
    );
    assert!(
        !dir().join("inner.memtrack").exists(),
        "the inner function wrote an artifact of its own"
    );
    // Called on its own, the inner function has its session.
    inner_alone();
    let t = totals("inner_alone");
    assert_eq!((t.allocations, t.bytes_allocated), (1, 16));
}

#[memtrack(name = "inner_alone")]
fn inner_alone() {
    black_box(Vec::<u8>::with_capacity(16));
}

#[memtrack(name = "outer_of_limited")]
fn outer_of_limited() {
    inner_limited();
}

#[memtrack(name = "inner_limited", max_allocations = 10)]
fn inner_limited() {
    black_box(Vec::<u8>::with_capacity(17));
}

fn nested_limits_are_refused_not_deadlocked() {
    let msg = panic_message(outer_of_limited).expect("the nested limits panic");
    assert!(
        msg.contains("inner_limited")
            && msg.contains("runs inside session \"outer_of_limited\"")
            && msg.contains("put the limits on the outer function"),
        "{msg}"
    );
    // The outer recording outlives the panic of its call, and finishes here, in this test's
    // directory, not at exit.
    let report = memtrack::finish_calls().unwrap().expect("open");
    assert_eq!(report.name, "outer_of_limited");
}

fn nested_start_waiting_is_an_error() {
    let outer = memtrack::SessionBuilder::new("outer_api")
        .quiet(true)
        .start()
        .unwrap();
    let err = memtrack::SessionBuilder::new("inner_api")
        .start_waiting()
        .err()
        .expect("refused");
    assert!(
        matches!(err, memtrack::Error::NestedSession { ref active, .. } if active == "outer_api"),
        "{err}"
    );
    // A thread the session spawned is in its scope too.
    let from_child = std::thread::spawn(|| {
        memtrack::SessionBuilder::new("child_api")
            .start_waiting()
            .err()
            .map(|e| e.to_string())
    })
    .join()
    .unwrap();
    assert!(
        from_child
            .as_deref()
            .is_some_and(|m| m.contains("inside session \"outer_api\"")),
        "{from_child:?}"
    );
    outer.finish().unwrap();
}

fn a_thread_outside_the_scope_waits_its_turn() {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let started = std::sync::Arc::clone(&barrier);
    // Started before the session: not in its scope, so it waits instead of being refused.
    let other = std::thread::spawn(move || {
        started.wait();
        let t = std::time::Instant::now();
        let s = memtrack::SessionBuilder::new("waited")
            .quiet(true)
            .start_waiting()
            .expect("its turn comes");
        let waited = t.elapsed();
        black_box(Vec::<u8>::with_capacity(18));
        (waited, s.finish().expect("finish").allocations())
    });
    let s = memtrack::SessionBuilder::new("first_turn")
        .quiet(true)
        .start()
        .unwrap();
    barrier.wait();
    std::thread::sleep(std::time::Duration::from_millis(150));
    let first = s.finish().unwrap();
    let (waited, allocations) = other.join().unwrap();
    assert!(
        waited >= std::time::Duration::from_millis(100),
        "{waited:?}"
    );
    assert_eq!(allocations, 1);
    // The waiting thread's allocations were outside the first session's scope.
    assert_eq!(first.allocations(), 0, "{}", first.summary_line());
}

/// A thread stack of a size no exited thread's stack has (16 MiB: glibc reuses a cached stack
/// up to 4× the size asked for, and every other thread here has std's 2 MiB) is mapped by
/// `pthread_create`, which allocates its TLS vector in the dynamic linker: one block, still
/// live after the join (glibc caches it with the stack). The same spawn again reuses that
/// stack and allocates none. The spawning tests of `parallel_limits` count these apart.
fn a_new_thread_stack_allocates_its_tls_once() {
    let spawn_join = |name: &str| {
        let s = memtrack::SessionBuilder::new(name)
            .quiet(true)
            .start()
            .unwrap();
        std::thread::Builder::new()
            .stack_size(16 << 20)
            .spawn(|| black_box(Vec::<u8>::with_capacity(100)))
            .expect("spawn")
            .join()
            .expect("join");
        s.finish().expect("finish")
    };
    let mapped = spawn_join("tls_new_stack");
    let dep = memtrack_test_support::process_dependent(&mapped);
    assert_eq!((dep.tls, dep.tls_live), (1, 1), "{}", mapped.summary_line());
    let reused = spawn_join("tls_cached_stack");
    let dep = memtrack_test_support::process_dependent(&reused);
    assert_eq!((dep.tls, dep.tls_live), (0, 0), "{}", reused.summary_line());
}

/// A mid-session snapshot counts what came before it, exactly, and costs no allocation.
fn stats_mid_session() {
    memtrack_test_support::check_stats_mid_session(
        memtrack::SessionBuilder::new("stats")
            .quiet(true)
            .start()
            .unwrap(),
    );
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--unprivileged-child") {
        let msg = panic_message(unprivileged);
        let ran = RAN.load(std::sync::atomic::Ordering::SeqCst);
        println!("panicked: {}", msg.unwrap_or_default());
        println!("body ran: {ran}");
        return;
    }
    let tests = vec![
        test(
            "allocator_backend_without_the_allocator_is_refused",
            allocator_backend_without_the_allocator_is_refused,
        ),
        requires(
            "exact_counts_and_nothing_outside",
            &[TRACKER],
            exact_counts_and_nothing_outside,
        ),
        requires(
            "returned_value_stays_live",
            &[TRACKER],
            returned_value_stays_live,
        ),
        requires(
            "panic_still_writes_a_complete_artifact",
            &[TRACKER],
            panic_still_writes_a_complete_artifact,
        ),
        requires(
            "sequential_sessions_are_independent",
            &[TRACKER],
            sequential_sessions_are_independent,
        ),
        requires(
            "back_to_back_sessions_count_each_call_once",
            &[TRACKER],
            back_to_back_sessions_count_each_call_once,
        ),
        requires(
            "concurrent_session_is_refused",
            &[TRACKER],
            concurrent_session_is_refused,
        ),
        requires(
            "per_thread_totals_add_up",
            &[TRACKER],
            per_thread_totals_add_up,
        ),
        requires(
            "criterion_measurement_counts_per_iteration",
            &[TRACKER],
            criterion_measurement_counts_per_iteration,
        ),
        requires(
            "attribute_limits_pass_at_the_boundary",
            &[TRACKER],
            attribute_limits_pass_at_the_boundary,
        ),
        requires(
            "attribute_limits_fail_with_every_measured_number",
            &[TRACKER],
            attribute_limits_fail_with_every_measured_number,
        ),
        requires(
            "builder_limits_return_the_report_and_every_violation",
            &[TRACKER],
            builder_limits_return_the_report_and_every_violation,
        ),
        requires(
            "a_violation_while_panicking_is_printed_not_raised",
            &[TRACKER],
            a_violation_while_panicking_is_printed_not_raised,
        ),
        requires(
            "limits_that_cannot_be_checked_fail",
            &[TRACKER],
            limits_that_cannot_be_checked_fail,
        ),
        requires(
            "limits_fail_without_privileges",
            &[
                TRACKER,
                Need::Tool("setpriv"),
                Need::Caps(&[Cap::Setuid, Cap::Setgid]),
            ],
            limits_fail_without_privileges,
        ),
        requires(
            "nested_attribute_joins_the_outer_session",
            &[TRACKER],
            nested_attribute_joins_the_outer_session,
        ),
        requires(
            "nested_limits_are_refused_not_deadlocked",
            &[TRACKER],
            nested_limits_are_refused_not_deadlocked,
        ),
        requires(
            "nested_start_waiting_is_an_error",
            &[TRACKER],
            nested_start_waiting_is_an_error,
        ),
        requires(
            "a_thread_outside_the_scope_waits_its_turn",
            &[TRACKER],
            a_thread_outside_the_scope_waits_its_turn,
        ),
        requires("stats_mid_session", &[TRACKER], stats_mid_session),
        requires(
            "a_new_thread_stack_allocates_its_tls_once",
            &[TRACKER],
            a_new_thread_stack_allocates_its_tls_once,
        ),
    ];
    memtrack_test_support::run_sequential(tests);
}
