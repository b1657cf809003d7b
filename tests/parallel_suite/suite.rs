// Twenty tests with exact allocation counts, run in parallel as libtest runs `#[test]`s (a pool
// of runner threads, one thread of its own per test, named after it): exact limits and exact
// counts must hold while other tests of the process allocate, and threads start and exit, at
// the same time (each session counts its own thread and the threads it spawns, and sessions
// take turns). A spawn's count has a part the test cannot fix, decided by the other tests'
// threads: glibc's TLS vector for a new thread stack (none when an exited thread's stack is
// reused) and std's map of live threads' stack guards growing a node; the spawning tests count
// those blocks apart, by call site, and bound them (see `process_dependent`). Included by
// `parallel_limits.rs` (eBPF tracker) and `parallel_limits_alloc.rs` (allocator recorder), each
// defining `BACKEND` and a `main` that runs `TESTS` (`harness = false`: memtrack-test-support's
// runner, so that a test the machine cannot run is reported as ignored, not passed).
//
// Run it 100 times (the rule for every new test): `cargo test --test parallel_limits --no-run`,
// then `for i in $(seq 100); do ./target/debug/deps/parallel_limits-* -q || break; done`.

use std::hint::black_box;
use std::sync::OnceLock;

use memtrack::{Report, SessionBuilder, memtrack};
use memtrack_test_support::process_dependent;

/// `n` allocations of `size` bytes each, all freed.
#[inline(never)]
fn allocate(n: usize, size: usize) {
    for _ in 0..n {
        black_box(Vec::<u8>::with_capacity(size));
    }
}

/// A session of this test, waiting for its turn; the body runs inside it.
fn session(name: &str, body: impl FnOnce()) -> Report {
    let s = SessionBuilder::new(name)
        .backend(BACKEND)
        // Cargo's scratch directory, not a fixed name in the shared /tmp; one per binary, since
        // the spawning tests read their artifacts back and both binaries name sessions alike.
        .output_dir(
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(concat!("parallel-suite-", env!("CARGO_CRATE_NAME"))),
        )
        .quiet(true)
        .start_waiting()
        .expect("session starts");
    body();
    s.finish().expect("session finishes")
}

/// Spawns `threads` threads (as the documented helper says: through `memtrack::in_session`,
/// which the eBPF tracker does not need) that each make `n` allocations of `size` bytes.
fn spawn_allocating(threads: usize, n: usize, size: usize) {
    std::thread::scope(|s| {
        for _ in 0..threads {
            let work = memtrack::in_session(move || allocate(n, size));
            s.spawn(work);
        }
    });
}

/// A session's allocations apart from those the process's other threads decide: what the
/// session's code determines.
fn determined(r: &Report) -> u64 {
    r.allocations() - process_dependent(r).allocations()
}

/// What `spawn_allocating(threads, 0, 0)` allocates by itself (`std::thread::scope` and each
/// spawn and join) apart from what other threads decide, measured in sessions of its own:
/// `(per scope, per thread)`, from 1 and 3 threads, and checked against 2 threads (repeated
/// until two rounds agree: the first spawns of a process make lazy one-time allocations).
fn spawn_cost() -> (u64, u64) {
    static COST: OnceLock<(u64, u64)> = OnceLock::new();
    *COST.get_or_init(|| {
        let measure = |threads| {
            determined(&session("calibrate", || spawn_allocating(threads, 0, 0)))
        };
        let mut last = None;
        for _ in 0..6 {
            let (one, two, three) = (measure(1), measure(2), measure(3));
            let per_thread = (three - one) / 2;
            let now = (one - per_thread, per_thread);
            if two == now.0 + 2 * now.1 && last == Some(now) {
                return now;
            }
            last = Some(now);
        }
        panic!("spawning threads does not allocate a fixed number of blocks (last {last:?})");
    })
}

/// Runs `test` on a thread of its own named after it, as libtest does, and fails if it panicked.
fn on_own_thread(name: &str, test: fn()) {
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(test)
        .expect("spawn the test's thread");
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Allocates without a session, on its own thread and on threads it spawns, while the other
/// tests record: none of it may reach their counts.
fn noise() {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while std::time::Instant::now() < until {
                    allocate(100, 24);
                }
            });
        }
        while std::time::Instant::now() < until {
            allocate(100, 40);
        }
    });
}

/// The twenty tests, for the recorder named `$backend` (`BACKEND` must be the same), and
/// `TESTS`, each by name.
macro_rules! suite {
    ($backend:literal) => {
        suite!(@all $backend;
            limited: [
                limited_1: 10 allocations of 100;
                limited_2: 11 allocations of 200;
                limited_3: 12 allocations of 300;
                limited_4: 13 allocations of 400;
                limited_5: 14 allocations of 500;
                limited_6: 15 allocations of 600;
                limited_7: 16 allocations of 700;
                limited_8: 17 allocations of 800;
            ]
            exact: [
                exact_1: 20 allocations of 48;
                exact_2: 21 allocations of 96;
                exact_3: 22 allocations of 144;
                exact_4: 23 allocations of 192;
                exact_5: 1000 allocations of 16;
                exact_6: 2000 allocations of 32;
            ]
            spawning: [
                spawning_1: 1 threads of 50 allocations of 72;
                spawning_2: 2 threads of 60 allocations of 88;
                spawning_3: 3 threads of 70 allocations of 104;
                spawning_4: 4 threads of 80 allocations of 120;
            ]
        );
    };
    (@all $backend:literal;
        limited: [$($ln:ident: $lcount:literal allocations of $lsize:literal;)*]
        exact: [$($en:ident: $ecount:literal allocations of $esize:literal;)*]
        spawning: [$($sn:ident: $threads:literal threads of $scount:literal allocations of $ssize:literal;)*]
    ) => {
        $(
            /// Exactly `$lcount` allocations, all freed: the limit holds at its value.
            #[memtrack(backend = $backend, max_allocations = $lcount, no_leaks)]
            fn $ln() {
                allocate($lcount, $lsize);
            }
        )*
        $(
            fn $en() {
                let r = session(stringify!($en), || allocate($ecount, $esize));
                assert_eq!(
                    (r.allocations(), r.bytes_allocated()),
                    ($ecount, $ecount * $esize),
                    "{}",
                    r.summary_line()
                );
                assert_eq!(r.totals().live_blocks_at_end, 0, "{}", r.summary_line());
                assert_eq!(r.lost_events(), 0);
            }
        )*
        $(
            fn $sn() {
                let (per_scope, per_thread) = spawn_cost();
                let r = session(stringify!($sn), || {
                    allocate(3, 8);
                    spawn_allocating($threads, $scount, $ssize);
                });
                // Per spawn at most one TLS vector (one stack mapped) and two nodes of std's
                // map (an insert splits a leaf, and the root while fewer than 71 threads live);
                // none for the allocator recorder: the TLS vector is glibc's own call, the
                // map's insert precedes the thread's joining the session (`in_session`).
                let dep = process_dependent(&r);
                let most = if BACKEND == BackendChoice::Alloc { 0 } else { $threads };
                assert!(
                    dep.tls <= most && dep.thread_registry <= 2 * most,
                    "{dep:?} of {} spawns: {}",
                    $threads,
                    r.summary_line()
                );
                assert_eq!(
                    r.allocations() - dep.allocations(),
                    3 + per_scope + $threads * ($scount + per_thread),
                    "{} (spawning: {per_scope} per scope, {per_thread} per thread; {dep:?})",
                    r.summary_line()
                );
                // Each spawned thread is recorded as a thread of its own.
                let workers = r
                    .totals()
                    .per_thread
                    .values()
                    .filter(|t| t.allocations >= $scount)
                    .count();
                assert_eq!(workers, $threads, "{:?}", r.totals().per_thread);
                assert_eq!(r.lost_events(), 0);
            }
        )*

        fn noise_1() {
            noise();
        }

        fn noise_2() {
            noise();
        }

        /// Every test of the suite, by name, each run on a thread of its own.
        const TESTS: &[(&str, fn())] = &[
            $((stringify!($ln), || on_own_thread(stringify!($ln), $ln)),)*
            $((stringify!($en), || on_own_thread(stringify!($en), $en)),)*
            $((stringify!($sn), || on_own_thread(stringify!($sn), $sn)),)*
            ("noise_1", || on_own_thread("noise_1", noise_1)),
            ("noise_2", || on_own_thread("noise_2", noise_2)),
        ];
    };
}
