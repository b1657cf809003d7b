//! The allocator recorder: `memtrack::Allocator` as the global allocator, no privileges needed.
//!
//! `harness = false`: the recorder sees every thread of the process, so these exact counts
//! need libtest's threads out of the way; the tests run one after another on the main thread.
//! CI runs this binary twice: as root (where `auto` picks eBPF) and as an unprivileged user
//! (where `auto` picks this backend and the eBPF tracker must be refused with its fix).

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};
use std::hint::black_box;

use memtrack::{
    BackendChoice, SessionBuilder, artifact::Backend, artifact::Reader, event::Event,
    event::EventKind, memtrack,
};
use memtrack_test_support::{TRACKER, lacking, test, three_blocks};

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

fn session(name: &str) -> memtrack::Session {
    SessionBuilder::new(name)
        .backend(BackendChoice::Alloc)
        .quiet(true)
        .start()
        .expect("allocator recorder session")
}

fn events(report: &memtrack::Report) -> Vec<Event> {
    let r = Reader::open(report.path.as_ref().expect("a file")).expect("artifact");
    assert_eq!(r.metadata().backend, Backend::Alloc);
    r.events().collect::<Result<_, _>>().expect("decode")
}

fn exact_counts() {
    black_box(vec![0u8; 77]); // before: not counted
    let s = session("alloc_exact");
    drop(three_blocks());
    let r = s.finish().unwrap();
    black_box(vec![0u8; 77]); // after: not counted
    let t = &r.totals();
    assert_eq!((t.allocations, t.bytes_allocated), (3, 1164), "{t:?}");
    assert_eq!((t.frees, t.bytes_freed, t.live_blocks_at_end), (3, 1164, 0));
    assert_eq!(t.kinds.get(memtrack::event::KindTag::Calloc), 1);
    assert_eq!((r.lost_events(), r.backend), (0, Backend::Alloc));
    // The report carries the size histogram and the timeline, computed while streaming.
    let sizes: Vec<(u64, u64, u64, u64)> = r
        .sizes()
        .iter()
        .map(|c| (c.min, c.max, c.allocations, c.bytes))
        .collect();
    assert_eq!(
        sizes,
        vec![(33, 64, 1, 64), (65, 128, 1, 100), (513, 1024, 1, 1000)]
    );
    let cols: Vec<_> = r.timeline().columns().collect();
    assert_eq!(cols.iter().map(|c| c.events).sum::<u64>(), 6);
    assert_eq!(cols.iter().map(|c| c.heap.max).max(), Some(1164));
    assert_eq!(cols.last().map(|c| c.heap.last), Some(0));
    assert_eq!(r.timeline().first_ts(), t.first_ts);
    assert!(
        r.summary_line().contains("Rust allocator only"),
        "{}",
        r.summary_line()
    );
}

/// Every kind, with call stacks (the full recording call) and without (the fast path, after the
/// thread's first call).
fn realloc_aligned_and_zeroed_paths() {
    for depth in [64, 0] {
        paths_recorded(depth);
    }
}

fn paths_recorded(depth: u32) {
    let s = SessionBuilder::new("alloc_paths")
        .backend(BackendChoice::Alloc)
        .stack_depth(depth)
        .quiet(true)
        .start()
        .expect("allocator recorder session");
    let mut v: Vec<u8> = Vec::with_capacity(10);
    v.reserve_exact(90);
    v.shrink_to_fit();
    let l64 = Layout::from_size_align(256, 64).unwrap();
    let l8 = Layout::from_size_align(32, 8).unwrap();
    // SAFETY: non-zero sizes; each block is freed once with its layout.
    unsafe {
        let p = alloc(l64);
        let z = alloc_zeroed(l8);
        dealloc(black_box(p), l64);
        dealloc(black_box(z), l8);
    }
    let r = s.finish().unwrap();
    let kinds: Vec<EventKind> = events(&r).into_iter().map(|e| e.kind).collect();
    let [
        EventKind::Malloc { addr: m, size: 10 },
        EventKind::Realloc {
            old_addr,
            new_addr,
            size: 90,
        },
        EventKind::Free { addr: f },
        EventKind::AlignedAlloc {
            addr: p,
            size: 256,
            align: 64,
        },
        EventKind::Calloc { addr: z, size: 32 },
        EventKind::Free { addr: fp },
        EventKind::Free { addr: fz },
    ] = kinds[..]
    else {
        panic!("depth {depth}: unexpected events: {kinds:?}");
    };
    assert_eq!((old_addr, f, fp, fz), (m, new_addr, p, z));
    assert_eq!(r.totals().allocations, 4);
    assert_eq!(r.totals().live_blocks_at_end, 0);
}

fn threads_that_exit_before_the_end() {
    let s = session("alloc_threads");
    for i in 0..3usize {
        // The allocator recorder cannot see a spawn: the documented helper puts the thread in
        // the session's scope.
        std::thread::spawn(memtrack::in_session(move || {
            for _ in 0..10 {
                black_box(Vec::<u8>::with_capacity(500 + i));
            }
        }))
        .join()
        .unwrap();
    }
    let r = s.finish().unwrap();
    let evs = events(&r);
    memtrack_test_support::assert_one_thread_per_size(&evs, 3, 500, 10);
    let per_thread: u64 = r.totals().per_thread.values().map(|p| p.allocations).sum();
    assert_eq!(per_thread, r.totals().allocations);
}

struct AllocatesOnDrop;

impl Drop for AllocatesOnDrop {
    fn drop(&mut self) {
        black_box(Vec::<u8>::with_capacity(4321));
    }
}

thread_local! {
    static LATE: AllocatesOnDrop = const { AllocatesOnDrop };
}

fn allocation_during_thread_local_destruction() {
    let s = session("alloc_tls");
    let tid = std::thread::spawn(memtrack::in_session(|| {
        // Registered before the recorder's own thread-local: destroyed after it.
        LATE.with(|_| {});
        black_box(Vec::<u8>::with_capacity(1234));
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    }))
    .join()
    .unwrap();
    let r = s.finish().unwrap();
    let evs = events(&r);
    for size in [1234, 4321] {
        let n = evs
            .iter()
            .filter(|e| {
                e.tid == tid && matches!(e.kind, EventKind::Malloc { size: s, .. } if s == size)
            })
            .count();
        assert_eq!(n, 1, "size {size}: {evs:?}");
    }
}

/// Spawns a thread without `in_session` that makes 10 allocations of 777 bytes.
fn spawn_unscoped() {
    std::thread::spawn(|| {
        for _ in 0..10 {
            black_box(Vec::<u8>::with_capacity(777));
        }
    })
    .join()
    .unwrap();
}

fn threads_outside_the_scope_are_counted_apart() {
    let s = session("alloc_unscoped");
    black_box(Vec::<u8>::with_capacity(776));
    spawn_unscoped();
    let r = s.finish().unwrap();
    let sized = |size| {
        events(&r)
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { size: s, .. } if s == size))
            .count()
    };
    assert_eq!((sized(776), sized(777)), (1, 0), "{}", r.summary_line());
    // Its 10 allocations and 10 frees, and whatever starting the thread allocated in it.
    assert!(r.out_of_scope() >= 20, "{}", r.summary_line());
    assert!(
        r.summary_line()
            .contains("allocator calls of other threads not counted"),
        "{}",
        r.summary_line()
    );
    // The whole process, as a benchmark on a thread pool wants it.
    let s = SessionBuilder::new("alloc_process")
        .backend(BackendChoice::Alloc)
        .scope(memtrack::Scope::Process)
        .quiet(true)
        .start()
        .unwrap();
    spawn_unscoped();
    let r = s.finish().unwrap();
    assert_eq!(r.out_of_scope(), 0);
    assert!(
        r.summary_line().contains("scope: whole process"),
        "{}",
        r.summary_line()
    );
    assert_eq!(
        events(&r)
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { size: 777, .. }))
            .count(),
        10
    );
}

/// A recorded thread's calls take the fast path once its first call found it in the scope;
/// leaving the scope (running a closure wrapped outside any session) must end that, for its
/// frees and (without call stacks: with them, allocations always take the full call) its
/// allocations.
fn a_thread_that_leaves_the_scope_is_no_longer_recorded() {
    for depth in [0, 8] {
        let leave = memtrack::in_session(|| ());
        let s = SessionBuilder::new("alloc_leave_scope")
            .backend(BackendChoice::Alloc)
            .stack_depth(depth)
            .quiet(true)
            .start()
            .unwrap();
        std::thread::spawn(memtrack::in_session(move || {
            let mut held = Vec::with_capacity(10);
            for _ in 0..10 {
                held.push(black_box(Vec::<u8>::with_capacity(778)));
            }
            leave();
            drop(held);
            for _ in 0..10 {
                black_box(Vec::<u8>::with_capacity(779));
            }
        }))
        .join()
        .unwrap();
        let r = s.finish().unwrap();
        let evs = events(&r);
        let sized = |size| {
            evs.iter()
                .filter(|e| matches!(e.kind, EventKind::Malloc { size: s, .. } if s == size))
                .count()
        };
        assert_eq!((sized(778), sized(779)), (10, 0), "depth {depth}");
        assert!(r.out_of_scope() >= 20, "{}", r.summary_line());
        // The thread freed its blocks only after it left.
        let tid = evs
            .iter()
            .find(|e| matches!(e.kind, EventKind::Malloc { size: 778, .. }))
            .map(|e| e.tid);
        let frees = evs
            .iter()
            .filter(|e| Some(e.tid) == tid && matches!(e.kind, EventKind::Free { .. }))
            .count();
        assert_eq!(frees, 0, "depth {depth}");
    }
}

fn sequential_sessions_are_independent() {
    memtrack_test_support::check_sequential_sessions(session);
}

fn criterion_measurement_counts() {
    use criterion::measurement::Measurement;
    // SAFETY: the environment is only read by this single thread.
    unsafe { std::env::set_var("MEMTRACK_BACKEND", "alloc") };
    let m = memtrack::criterion::Allocations::new().unwrap();
    let b = memtrack::criterion::BytesAllocated::new().unwrap();
    let (s, sb) = (m.start(), b.start());
    for i in 0..100usize {
        black_box(Vec::<u8>::with_capacity(64 + i % 2));
        black_box(Box::new(i));
    }
    let (allocs, bytes) = (m.end(s), b.end(sb));
    // SAFETY: as above.
    unsafe { std::env::remove_var("MEMTRACK_BACKEND") };
    assert_eq!(allocs, 200);
    assert_eq!(bytes, 50 * 64 + 50 * 65 + 100 * 8);
}

/// The measurements' criterion keeps its results apart from the timings' (which criterion would
/// compare them with): in `criterion-memtrack-allocations` beside `criterion`, never in it.
fn criterion_measurements_keep_results_of_their_own() {
    use std::time::Duration;
    // SAFETY: the environment is only read by this single thread.
    unsafe { std::env::set_var("MEMTRACK_BACKEND", "alloc") };
    let id = format!("memtrack_results_{}", std::process::id());
    let mut c = memtrack::criterion::Allocations::criterion()
        .unwrap()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(20))
        .measurement_time(Duration::from_millis(50))
        .without_plots();
    c.bench_function(&id, |b| b.iter(|| black_box(vec![0u8; 8])));
    // SAFETY: as above.
    unsafe { std::env::remove_var("MEMTRACK_BACKEND") };
    let ours = memtrack::criterion::results_dir("allocations").join(&id);
    let timings = ours.parent().unwrap().with_file_name("criterion").join(&id);
    let estimates = ours.join("new").join("estimates.json");
    let kept = estimates.is_file();
    let _ = std::fs::remove_dir_all(&ours);
    assert!(kept, "no {}", estimates.display());
    assert!(!timings.exists(), "{} written", timings.display());
}

/// One criterion `--profile-time` run of a routine making exactly one 64-byte allocation per
/// iteration, under memtrack's `Profiler`; returns the artifact's totals and iterations.
fn profile_once(seconds: f64, copy_to: &str) -> (memtrack::totals::Totals, Option<u64>) {
    use memtrack::criterion::{Profiler, iteration};
    let dir = std::path::PathBuf::from(std::env::var_os("MEMTRACK_DIR").unwrap());
    let out = tempfile::tempdir().unwrap();
    let mut c = criterion::Criterion::default()
        .with_profiler(Profiler::new())
        .output_directory(out.path())
        .profile_time(Some(std::time::Duration::from_secs_f64(seconds)));
    c.bench_function("alloc_profiled", |b| {
        b.iter(|| iteration(|| black_box(vec![0u8; 64])))
    });
    let path = dir.join(copy_to);
    std::fs::rename(dir.join("alloc_profiled.memtrack"), &path).unwrap();
    let r = Reader::open(&path).unwrap();
    let fin = r.final_metadata().unwrap();
    assert_eq!(fin.lost_events, 0);
    (fin.totals.clone(), fin.iterations)
}

/// Criterion picks a different number of iterations each run, so totals of
/// the same code differ (`-37.50% improved`); per iteration they are the same.
fn profiler_runs_of_the_same_code_compare_unchanged() {
    use memtrack::{
        analysis::Benchmark, analysis::Comparison, analysis::Metric, analysis::Threshold,
        analysis::Verdict,
    };
    // SAFETY: the environment is only read by this single thread.
    unsafe { std::env::set_var("MEMTRACK_BACKEND", "alloc") };
    // Criterion warms up for 1 s (doubling the iterations per batch), then runs one batch of
    // as many iterations as it estimates fit in the rest of the profile time.
    let (short, short_it) = profile_once(2.5, "profiled_base.memtrack");
    let (long, long_it) = profile_once(3.5, "profiled_head.memtrack");
    // SAFETY: as above.
    unsafe { std::env::remove_var("MEMTRACK_BACKEND") };
    let (short_it, long_it) = (short_it.expect("iterations"), long_it.expect("iterations"));
    assert_ne!(short_it, long_it);
    // One 64-byte block per iteration, plus criterion's own `Vec<f64>` of results for the
    // batch after the warm-up (`Routine::bench` collects one value per batch: 8 bytes, live
    // during it). The warm-up ends within about 2 s, so both runs have that batch.
    for (t, it) in [(&short, short_it), (&long, long_it)] {
        assert_eq!(
            (t.allocations, t.bytes_allocated, t.peak_live_bytes),
            (it + 1, 64 * it + 8, 64 + 8)
        );
    }
    let bench = |t: memtrack::totals::Totals, it| {
        Benchmark::new("alloc_profiled", "x.memtrack", t).with_iterations(Some(it))
    };
    let c = Comparison::new(
        &[bench(short, short_it)],
        &[bench(long, long_it)],
        &Metric::ALL,
        Threshold::from_ppm(0),
    );
    let verdicts: Vec<_> = c.rows.iter().map(|r| r.verdict).collect();
    assert_eq!(verdicts, vec![Verdict::Unchanged; 3], "{:#?}", c.rows);
}

/// Exactly 3 allocations: within `max_allocations = 3`.
#[memtrack(name = "alloc_macro", backend = "alloc", max_allocations = 3, no_leaks)]
fn macro_within_limits() {
    drop(three_blocks());
}

#[memtrack(name = "alloc_macro_over", backend = "alloc", max_allocations = 2)]
fn macro_over_limits() {
    three_allocations();
}

fn three_allocations() {
    black_box(Vec::<u8>::with_capacity(100));
    black_box(Vec::<u8>::with_capacity(64));
    black_box(Vec::<u8>::with_capacity(1000));
}

fn attribute_with_the_allocator_backend_and_limits() {
    macro_within_limits();
    memtrack::finish_calls().unwrap();
    let dir = std::path::PathBuf::from(std::env::var_os("MEMTRACK_DIR").unwrap());
    let r = Reader::open(dir.join("alloc_macro.memtrack")).unwrap();
    assert_eq!(r.metadata().backend, Backend::Alloc);
    assert_eq!(r.final_metadata().unwrap().totals.allocations, 3);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let err = std::panic::catch_unwind(macro_over_limits).expect_err("limit exceeded");
    std::panic::set_hook(hook);
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("allocations 3 > max_allocations 2"), "{msg}");
    // The calls' recordings end here, not at the process's exit, when their directory is gone.
    memtrack::finish_calls().expect("finishing the calls");
}

/// The line of `fn located_violation` below (its name is where the failure points).
const LOCATED_LINE: u32 = line!() + 3;

#[memtrack(name = "alloc_located", backend = "alloc", max_allocations = 0)]
fn located_violation() {
    black_box(Vec::<u8>::with_capacity(8));
}

/// A violated limit panics in the guard's `Drop`; the location the panic reports must be the
/// user's function, not memtrack's source.
fn limit_panic_points_at_the_users_function() {
    static SEEN: std::sync::Mutex<Option<(String, u32)>> = std::sync::Mutex::new(None);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| (l.file().to_string(), l.line()));
        *SEEN.lock().unwrap() = at;
    }));
    let err = std::panic::catch_unwind(located_violation).expect_err("1 allocation > 0");
    std::panic::set_hook(hook);
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("allocations 1 > max_allocations 0"), "{msg}");
    let (file, line) = SEEN
        .lock()
        .unwrap()
        .clone()
        .expect("the hook saw the panic");
    assert_eq!(
        (file.as_str(), line),
        ("tests/alloc_backend.rs", LOCATED_LINE)
    );
    // The calls' recordings end here, not at the process's exit, when their directory is gone.
    memtrack::finish_calls().expect("finishing the calls");
}

/// Three blocks live at once, all freed: exactly the expectation.
#[memtrack(
    name = "alloc_expect",
    backend = "alloc",
    in_memory,
    allocations = 3,
    max_blocks = 3,
    no_leaks
)]
fn expectation_kept() {
    drop(three_blocks());
}

#[memtrack(
    name = "alloc_expect_off",
    backend = "alloc",
    in_memory,
    allocations = 2,
    max_blocks = 2
)]
fn expectation_missed() {
    expectation_kept_body();
}

fn expectation_kept_body() {
    drop(three_blocks());
}

/// `allocations = N` and `max_blocks` on the attribute and the builder, in memory: no file.
fn expectations_and_in_memory_sessions() {
    let dir = std::path::PathBuf::from(std::env::var_os("MEMTRACK_DIR").unwrap());
    expectation_kept();
    assert!(!dir.join("alloc_expect.memtrack").exists());
    assert!(!dir.join("alloc_expect.memtrack.partial").exists());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let err = std::panic::catch_unwind(expectation_missed).expect_err("3 allocations, not 2");
    std::panic::set_hook(hook);
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(
        msg,
        "memtrack: alloc_expect_off — call 1: allocations 3, expected exactly 2 (allocations = 2); \
         peak live blocks 3 > max_blocks 2 → not written (in-memory session)"
    );

    let builder = || {
        SessionBuilder::new("alloc_builder_expect")
            .backend(BackendChoice::Alloc)
            .in_memory(true)
            .quiet(true)
    };
    let s = builder()
        .expect_allocations(3)
        .max_blocks(3)
        .start()
        .unwrap();
    assert_eq!(s.path(), None);
    expectation_kept_body();
    let r = s.finish().expect("exactly 3 allocations, 3 blocks at once");
    assert_eq!(r.path, None);
    assert_eq!(
        (r.totals().allocations, r.totals().peak_live_blocks),
        (3, 3)
    );
    assert!(!dir.join("alloc_builder_expect.memtrack").exists());

    let s = builder().min_allocations(4).start().unwrap();
    expectation_kept_body();
    match s.finish() {
        Err(memtrack::Error::LimitExceeded { violations, .. }) => assert_eq!(
            violations,
            vec![memtrack::Violation::TooFewAllocations {
                measured: 3,
                min: 4
            }]
        ),
        other => panic!("{other:?}"),
    }
    let err = builder()
        .expect_allocations(3)
        .max_allocations(2)
        .start()
        .err()
        .expect("contradictory limits are refused");
    assert!(err.to_string().contains("keep one"), "{err}");
    // The calls' recordings end here, not at the process's exit, when their directory is gone.
    memtrack::finish_calls().expect("finishing the calls");
}

/// Allocates `size` bytes at one call site, whoever calls it.
#[inline(never)]
fn site(size: usize) {
    black_box(Vec::<u8>::with_capacity(black_box(size)));
}

#[inline(never)]
fn mid(size: usize) {
    site(size);
    black_box(());
}

#[inline(never)]
fn mid2(size: usize) {
    site(size);
    black_box(());
}

#[inline(never)]
fn outer_a(size: usize, second: bool) {
    if black_box(second) {
        mid2(size)
    } else {
        mid(size)
    }
    black_box(());
}

#[inline(never)]
fn outer_b(size: usize) {
    mid(size);
    black_box(());
}

/// Allocations at one site from three routes in a pseudo-random order, taken again without a
/// walk when a recent one still holds (the recording call's fast path): each route's
/// allocations have one stack, of their own. Routes `outer_a → mid` and `outer_b → mid`
/// differ only in the frame below `mid`, `outer_a → mid` and `outer_a → mid2` in `site`'s
/// caller.
fn allocations_keep_their_stacks_on_the_fast_path() {
    let s = SessionBuilder::new("alloc_fast_stacks")
        .backend(BackendChoice::Alloc)
        .stack_depth(16)
        .quiet(true)
        .start()
        .expect("allocator recorder session");
    let mut x = 12345u32;
    let mut made = [0u64; 3];
    for _ in 0..3000 {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let route = (x >> 28) as usize % 3;
        // Runs of one route (which its recent walk answers) and changes of route.
        for _ in 0..1 + (x >> 24) % 4 {
            match route {
                0 => outer_a(1001, false),
                1 => outer_b(1002),
                _ => outer_a(1003, true),
            }
            made[route] += 1;
        }
    }
    let r = s.finish().unwrap();
    let mut stacks: [std::collections::BTreeSet<u32>; 3] = Default::default();
    let mut count = [0u64; 3];
    for e in events(&r) {
        if let EventKind::Malloc {
            size: size @ 1001..=1003,
            ..
        } = e.kind
        {
            let route = (size - 1001) as usize;
            stacks[route].insert(e.stack.0);
            count[route] += 1;
        }
    }
    assert_eq!(count, made, "every allocation recorded");
    for (route, ids) in stacks.iter().enumerate() {
        assert_eq!(ids.len(), 1, "route {route}: one stack, got {ids:?}");
        assert!(!ids.contains(&0), "route {route}: a stack");
    }
    let ids: std::collections::BTreeSet<u32> = stacks.iter().flatten().copied().collect();
    assert_eq!(ids.len(), 3, "three routes, three stacks: {stacks:?}");
}

/// Whether this process may use the eBPF tracker (what `auto` checks).
fn privileged() -> bool {
    memtrack_test_support::missing(&[TRACKER]).is_none()
}

fn auto_picks_the_right_backend() {
    let r = SessionBuilder::new("alloc_auto")
        .quiet(true)
        .start()
        .unwrap()
        .finish()
        .unwrap();
    let expected = if privileged() {
        Backend::Ebpf
    } else {
        Backend::Alloc
    };
    assert_eq!(r.backend, expected);
}

fn ebpf_is_refused_without_privileges() {
    let err = SessionBuilder::new("alloc_ebpf")
        .backend(BackendChoice::Ebpf)
        .start()
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("CAP_BPF") && msg.contains("CAP_PERFMON"),
        "{msg}"
    );
    assert!(msg.contains("setcap") || msg.contains("sudo"), "{msg}");
}

/// A mid-session snapshot counts what came before it, exactly, and costs no allocation.
fn stats_mid_session() {
    memtrack_test_support::check_stats_mid_session(session("alloc_stats"));
}

fn main() {
    let tests = vec![
        test("exact_counts", exact_counts),
        test("stats_mid_session", stats_mid_session),
        test(
            "realloc_aligned_and_zeroed_paths",
            realloc_aligned_and_zeroed_paths,
        ),
        test(
            "threads_that_exit_before_the_end",
            threads_that_exit_before_the_end,
        ),
        test(
            "allocation_during_thread_local_destruction",
            allocation_during_thread_local_destruction,
        ),
        test(
            "threads_outside_the_scope_are_counted_apart",
            threads_outside_the_scope_are_counted_apart,
        ),
        test(
            "a_thread_that_leaves_the_scope_is_no_longer_recorded",
            a_thread_that_leaves_the_scope_is_no_longer_recorded,
        ),
        test(
            "sequential_sessions_are_independent",
            sequential_sessions_are_independent,
        ),
        test("criterion_measurement_counts", criterion_measurement_counts),
        test(
            "criterion_measurements_keep_results_of_their_own",
            criterion_measurements_keep_results_of_their_own,
        ),
        test(
            "profiler_runs_of_the_same_code_compare_unchanged",
            profiler_runs_of_the_same_code_compare_unchanged,
        ),
        test("auto_picks_the_right_backend", auto_picks_the_right_backend),
        test(
            "attribute_with_the_allocator_backend_and_limits",
            attribute_with_the_allocator_backend_and_limits,
        ),
        test(
            "expectations_and_in_memory_sessions",
            expectations_and_in_memory_sessions,
        ),
        test(
            "allocations_keep_their_stacks_on_the_fast_path",
            allocations_keep_their_stacks_on_the_fast_path,
        ),
        test(
            "limit_panic_points_at_the_users_function",
            limit_panic_points_at_the_users_function,
        ),
        lacking(
            "ebpf_is_refused_without_privileges",
            &[TRACKER],
            ebpf_is_refused_without_privileges,
        ),
    ];
    memtrack_test_support::run_sequential(tests);
}
