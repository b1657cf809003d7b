//! Marginal cost of the allocator recorder per event, on an allocation-heavy workload: a
//! 64-slot ring of blocks of varying sizes (8..1032 bytes), N = 2,000,000 alloc+free pairs.
//! Five configurations side by side: untracked (`System` directly), `memtrack::Allocator`
//! with no session, with a session recording (the allocator recorder) without call stacks,
//! with a session recording 20-frame call stacks (the workload runs NEST frames deep), and the
//! same with the allocations made through five functions in turn (five stacks in rotation,
//! more than the recorder keeps to find a stack again: every allocation walks and looks up its
//! stack, the recorder's worst case).
//! Targets: ≤ 1 ns/event with no session, ≤ 20 ns/event recording, ≤ 40 ns/event recording
//! 20-frame stacks, end to end. Stacks need frame pointers: run it with
//! `RUSTFLAGS="-C force-frame-pointers=yes"` (it prints the frames the stacks really had).
//!
//! How it avoids flattering itself:
//! - every configuration runs a warm-up burst first (else the first one timed absorbs the cold
//!   start: page faults of a fresh heap, a cold cache after a sleep);
//! - the configurations are interleaved and their order alternates every round (A B C, C B A,
//!   ...), so a slow phase of the machine hits each of them alike; medians of the rounds;
//! - "recording" is timed from the first allocation to the end of `Session::finish` (the
//!   collector's drain, the queued frames, the last compression, the trailer), minus the time
//!   `finish` takes for an empty session in the same round (start-up and shutdown that do not
//!   depend on N);
//! - besides wall time it reports the CPU time of the whole process (every thread: collector,
//!   encoder, compression), per event, over the untracked run's;
//! - a run that lost an event, or did not record every allocation, fails the bench.
//!
//! Run: `cargo bench --bench alloc_overhead` (no privileges needed). Quote the load average.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::{Duration, Instant};

use memtrack::{Allocator, BackendChoice, Session, SessionBuilder};

#[global_allocator]
static GLOBAL: Allocator = Allocator::system();

const N: usize = 2_000_000;
const ROUNDS: usize = 7;
/// The depth at which every configuration runs the workload: frames of `nested` under `main`,
/// so that a recorded stack has 20 frames with the runtime's below `main`, the workload's, its
/// `via_*` call and the wrapper's own frame (checked from the artifact when the bench ends).
const NEST: u32 = 10;

/// Runs `f` under `depth` more frames of its own (frame pointers make each one a frame).
#[inline(never)]
fn nested<R>(depth: u32, f: &mut dyn FnMut() -> R) -> R {
    if black_box(depth) == 0 {
        f()
    } else {
        let r = nested(depth - 1, f);
        black_box(r)
    }
}

/// Functions alike but for their name, that make the workload's allocation: allocations
/// through them in turn have stacks that start at the same frame pointer and differ in one
/// caller. Five in turn are more than the allocator recorder keeps to find a stack again
/// (`allocator/walk.rs`): every allocation walks its stack and looks it up (its worst case).
macro_rules! via {
    ($($name:ident $k:literal),*) => {
        $(
            #[inline(never)]
            fn $name(a: &dyn GlobalAlloc, layout: Layout) -> *mut u8 {
                // A constant of its own, so that the compiler does not merge them into one.
                black_box($k);
                // SAFETY: non-zero size.
                black_box(unsafe { a.alloc(layout) })
            }
        )*
        const VIA: &[fn(&dyn GlobalAlloc, Layout) -> *mut u8] = &[$($name),*];
    };
}
via!(via_0 0, via_1 1, via_2 2, via_3 3, via_4 4);

/// `n` alloc+free pairs through `a`: 2n events, allocated through `via_0`, or through each
/// of [`VIA`] in turn.
fn workload(a: &dyn GlobalAlloc, n: usize, in_turn: bool) {
    let mut ring: [(*mut u8, Layout); 64] = [(std::ptr::null_mut(), Layout::new::<u8>()); 64];
    let mut x: u32 = 12345;
    for i in 0..n {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let size = 8 + (x >> 22) as usize; // 8..1032
        let slot = &mut ring[i % 64];
        if !slot.0.is_null() {
            // SAFETY: allocated below with this layout by the same allocator.
            unsafe { a.dealloc(slot.0, slot.1) };
        }
        let layout = Layout::from_size_align(size, 8).expect("layout");
        let via = if in_turn { VIA[i % VIA.len()] } else { VIA[0] };
        let p = black_box(via)(a, layout);
        *slot = (p, layout);
    }
    for (p, l) in ring {
        if !p.is_null() {
            // SAFETY: as above.
            unsafe { a.dealloc(p, l) };
        }
    }
}

/// CPU time of the whole process (all threads), ns.
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall and process-CPU nanoseconds of `f`.
fn timed(f: impl FnOnce()) -> (f64, f64) {
    let (c, t) = (process_cpu_ns(), Instant::now());
    f();
    let wall = t.elapsed().as_nanos() as f64;
    (wall, (process_cpu_ns() - c) as f64)
}

fn session(dir: &std::path::Path, name: &str) -> Session {
    session_with(dir, name, 0)
}

/// A session recording `stack_depth` frames of stack per allocation (0: none).
fn session_with(dir: &std::path::Path, name: &str, stack_depth: u32) -> Session {
    SessionBuilder::new(name)
        .backend(BackendChoice::Alloc)
        .output_dir(dir)
        .stack_depth(stack_depth)
        .quiet(true)
        .start()
        .expect("allocator recorder session")
}

/// A session around `workload(n)`, timed from the first allocation to the end of `finish`;
/// fails on a lost event or a missed allocation.
fn recorded(dir: &std::path::Path, wrapper: &Allocator, n: usize, stacks: u32) -> (f64, f64) {
    recorded_with(dir, wrapper, n, stacks, false)
}

/// [`recorded`], the workload allocating through the functions of [`VIA`] in turn if `in_turn`.
fn recorded_with(
    dir: &std::path::Path,
    wrapper: &Allocator,
    n: usize,
    stacks: u32,
    in_turn: bool,
) -> (f64, f64) {
    let s = session_with(dir, "alloc_overhead", stacks);
    let mut report = None;
    let t = timed(|| {
        nested(NEST, &mut || workload(wrapper, n, in_turn));
        report = Some(s.finish().expect("finish"));
    });
    let r = report.expect("finished");
    assert_eq!(
        r.lost_events(),
        0,
        "a run lost events: its figure would be wrong"
    );
    assert_eq!(
        r.totals().allocations,
        n as u64,
        "every allocation recorded"
    );
    t
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let wrapper = Allocator::system();
    let dir = tempfile::tempdir().expect("tempdir");
    // Warm-up: a heap grown to the workload's size, the session machinery loaded once.
    workload(&System, N / 10, false);
    workload(&wrapper, N / 10, false);
    recorded(dir.path(), &wrapper, N / 10, 0);
    recorded(dir.path(), &wrapper, N / 10, 64);
    recorded_with(dir.path(), &wrapper, N / 10, 64, true);
    // Sized up front: the vectors must not grow while a session records.
    let mut wall: [Vec<f64>; 6] = std::array::from_fn(|_| Vec::with_capacity(ROUNDS));
    let mut cpu: [Vec<f64>; 6] = std::array::from_fn(|_| Vec::with_capacity(ROUNDS));
    for round in 0..ROUNDS {
        let mut order = [0, 1, 2, 3, 4, 5];
        if round % 2 == 1 {
            order.reverse();
        }
        for config in order {
            let (w, c) = match config {
                0 => timed(|| nested(NEST, &mut || workload(&System, N, false))),
                1 => timed(|| nested(NEST, &mut || workload(&wrapper, N, false))),
                2 => recorded(dir.path(), &wrapper, N, 0),
                3 => recorded(dir.path(), &wrapper, N, 64),
                4 => recorded_with(dir.path(), &wrapper, N, 64, true),
                // The fixed cost of a session's `finish` (no events), subtracted from 2's.
                _ => recorded(dir.path(), &wrapper, 0, 0),
            };
            wall[config].push(w);
            cpu[config].push(c);
        }
    }
    let [u, i, r, rs, rt, e] = wall.map(median);
    let [cu, ci, cr, crs, crt, ce] = cpu.map(median);
    let pairs = N as f64;
    let events = 2.0 * pairs;
    println!(
        "alloc_overhead: N = {N} alloc+free pairs (2 events each), medians of {ROUNDS} \
         interleaved rounds (order alternating), warmed up"
    );
    println!(
        "                                wall ns/pair   marginal ns/event   CPU ns/event over untracked"
    );
    println!("  untracked (System)            {:12.2}", u / pairs);
    println!(
        "  Allocator, no session         {:12.2}   {:+17.2}   {:+.2}",
        i / pairs,
        (i - u) / events,
        (ci - cu) / events
    );
    println!(
        "  Allocator, session, to finish {:12.2}   {:+17.2}   {:+.2}",
        (r - e) / pairs,
        (r - e - u) / events,
        (cr - ce - cu) / events
    );
    println!(
        "  + call stacks, to finish       {:12.2}   {:+17.2}   {:+.2}",
        (rs - e) / pairs,
        (rs - e - u) / events,
        (crs - ce - cu) / events
    );
    println!(
        "  + call stacks, five in turn    {:12.2}   {:+17.2}   {:+.2}",
        (rt - e) / pairs,
        (rt - e - u) / events,
        (crt - ce - cu) / events
    );
    println!(
        "  call stacks' marginal cost: {:+.2} ns/event wall, {:+.2} ns/event CPU ({}); five \
         stacks in turn (every allocation walks its stack): {:+.2} wall, {:+.2} CPU",
        (rs - r) / events,
        (crs - cr) / events,
        stack_shape(dir.path(), &wrapper),
        (rt - r) / events,
        (crt - cr) / events,
    );
    println!(
        "  (an empty session's finish: {:.2} ms wall, {:.2} ms CPU, subtracted above)",
        e / 1e6,
        ce / 1e6
    );
    burst(dir.path(), &wrapper);
    tsc_read();
}

/// What this machine's time-stamp counter read costs: every event pays one (its timestamp),
/// on the measured thread, and it moves with the machine (7.4 ns back to back on one day's
/// host, 19–21 on another's: benches/NOTES.md), so the figures above are read beside it.
fn tsc_read() {
    const READS: u32 = 1_000_000;
    const RUNS: usize = 21;
    let runs: Vec<f64> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            let mut sum = 0u64;
            for _ in 0..READS {
                // SAFETY: rdtsc exists on every x86-64 CPU.
                sum = sum.wrapping_add(unsafe { core::arch::x86_64::_rdtsc() });
            }
            black_box(sum);
            t.elapsed().as_nanos() as f64 / f64::from(READS)
        })
        .collect();
    println!(
        "  this machine's TSC read (one per event, on the measured thread): {:.2} ns back to back \
         (median of {RUNS} × {READS})",
        median(runs)
    );
}

/// The stacks a recording of the workload at the benched depth really has (from its artifact):
/// without frame pointers they are short, and the figure above is not the 20-frame one.
fn stack_shape(dir: &std::path::Path, wrapper: &Allocator) -> String {
    let s = session_with(dir, "alloc_overhead_stacks", 64);
    nested(NEST, &mut || workload(wrapper, 1000, false));
    let r = s.finish().expect("finish");
    let path = r.path.expect("an artifact");
    let reader = memtrack::artifact::Reader::open(&path).expect("reading the artifact");
    let table = reader.stacks().expect("its stack table");
    let frames: Vec<usize> = table.stacks().map(|(_, s)| s.frames.len()).collect();
    format!(
        "{} distinct stacks of {:?} frames{}",
        frames.len(),
        frames,
        if frames.contains(&20) {
            ""
        } else {
            ": not 20, build with RUSTFLAGS=\"-C force-frame-pointers=yes\""
        }
    )
}

/// The cost on the measured thread alone: bursts that fit the thread's ring, so the producer
/// never waits for the collector and encoder; warmed up, order alternating.
fn burst(dir: &std::path::Path, wrapper: &Allocator) {
    const BURST: usize = 2_000;
    const BURSTS: usize = 200;
    let (mut bu, mut br) = (Vec::with_capacity(BURSTS), Vec::with_capacity(BURSTS));
    let s = session(dir, "alloc_overhead_burst");
    workload(&System, BURST, false);
    workload(wrapper, BURST, false);
    for i in 0..BURSTS {
        // Let the collector drain the ring between bursts, then warm the cache again.
        std::thread::sleep(Duration::from_millis(3));
        workload(&System, BURST, false);
        let one = |a: &dyn GlobalAlloc| timed(|| workload(a, BURST, false)).0;
        if i % 2 == 0 {
            bu.push(one(&System));
            br.push(one(wrapper));
        } else {
            br.push(one(wrapper));
            bu.push(one(&System));
        }
    }
    let r = s.finish().expect("finish");
    assert_eq!(r.lost_events(), 0, "the burst session lost events");
    let (bu, br) = (median(bu), median(br));
    println!(
        "  bursts of {BURST} pairs that fit the thread's ring (the cost on the measured thread): \
         untracked {:.2}, recording {:.2} ns/pair, marginal {:+.2} ns/event (medians of {BURSTS})",
        bu / BURST as f64,
        br / BURST as f64,
        (br - bu) / BURST as f64 / 2.0
    );
}
