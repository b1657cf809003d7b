//! The warm cost of one call of a `#[memtrack]` function whose calls a session accumulates:
//! begin the call, end it (the recording pauses), on each recorder, against the same body called
//! untracked, in the same run.
//!
//! Each round makes `CALLS` calls of the body alone (no probe attached: the previous round's
//! recording finished 0.3 s before), then `CALLS` calls of a `#[memtrack]` function with that
//! body (which allocates nothing: the cost of recording allocations is the recorders' own
//! bench, `recorders`), after a warm-up of 100 calls;
//! the cost per call is the difference over `CALLS`, wall clock and the CPU time of the whole
//! process (every thread: the eBPF poller, the allocator recorder's collector). Rounds
//! alternate the recorders' order (ABBA); medians and ranges of the rounds. The first call of
//! each round (which starts the recording) is in the warm-up, and so is the eBPF tracker's
//! attach.
//!
//! Then the cost of calls of two functions in turn (`a(); b(); a(); …`): each call sets the
//! other's recording aside (its part finished, a session started for the next part), and
//! finishing joins each name's parts into its artifact. It is reported, not gated: it is a
//! session's stop and start per switch, which the docs state.
//!
//! ```text
//! cargo bench --bench calls -- [CALLS] [ROUNDS]
//! ```
//! Defaults: 20,000 calls, 6 rounds. Targets (exit status 1 if a median misses one): 2 µs per
//! call on the allocator recorder, 20 µs on the eBPF tracker (skipped without CAP_BPF +
//! CAP_PERFMON, with a message).

use std::hint::black_box;
use std::time::{Duration, Instant};

use memtrack::memtrack;

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

/// The measured body: a little arithmetic, no allocation.
#[inline(never)]
fn body() {
    black_box(black_box(3u64).wrapping_mul(7));
}

/// CPU time of the whole process (every thread), from `getrusage`.
fn process_cpu() -> Duration {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the one rusage struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Wall clock and process CPU time of `f`.
fn timed(f: impl FnOnce()) -> (Duration, Duration) {
    let (w, c) = (Instant::now(), process_cpu());
    f();
    (w.elapsed(), process_cpu() - c)
}

#[memtrack(backend = "alloc", name = "calls_bench_alloc")]
fn tracked_alloc() {
    body();
}

#[memtrack(backend = "ebpf", name = "calls_bench_ebpf")]
fn tracked_ebpf() {
    body();
}

/// One round of `tracked`: (wall, CPU) per call in ns over the untracked body.
fn round(tracked: fn(), calls: u32) -> (f64, f64) {
    std::thread::sleep(Duration::from_millis(300));
    let (bw, bc) = timed(|| (0..calls).for_each(|_| body()));
    for _ in 0..100 {
        tracked();
    }
    let (tw, tc) = timed(|| (0..calls).for_each(|_| tracked()));
    let report = memtrack::finish_calls()
        .expect("the recording finishes")
        .expect("it was open");
    assert_eq!(report.lost_events(), 0, "{}", report.summary_line());
    assert_eq!(report.iterations, Some(u64::from(calls) + 100));
    assert_eq!(report.allocations(), 0, "{}", report.summary_line());
    let per = |t: Duration, b: Duration| (t.as_nanos() as f64 - b.as_nanos() as f64) / calls as f64;
    (per(tw, bw), per(tc, bc))
}

#[memtrack(backend = "alloc", name = "calls_bench_turn_a_alloc")]
fn turn_a_alloc() {
    body();
}

#[memtrack(backend = "alloc", name = "calls_bench_turn_b_alloc")]
fn turn_b_alloc() {
    body();
}

#[memtrack(backend = "ebpf", name = "calls_bench_turn_a_ebpf")]
fn turn_a_ebpf() {
    body();
}

#[memtrack(backend = "ebpf", name = "calls_bench_turn_b_ebpf")]
fn turn_b_ebpf() {
    body();
}

/// Two functions called in turn on one recorder, `switches` times.
struct Turns {
    label: &'static str,
    a: fn(),
    b: fn(),
    switches: u32,
}

/// `switches` calls alternating between `a` and `b`: (wall µs per switch, wall ms to finish,
/// joining each name's `switches / 2` parts).
fn in_turn(a: fn(), b: fn(), switches: u32) -> (f64, f64) {
    let (w, _) = timed(|| {
        for _ in 0..switches / 2 {
            a();
            b();
        }
    });
    let start = Instant::now();
    let report = memtrack::finish_calls()
        .expect("the recordings finish")
        .expect("one was open");
    let finish = start.elapsed();
    assert_eq!(report.iterations, Some(u64::from(switches / 2)));
    (
        w.as_secs_f64() * 1e6 / f64::from(switches),
        finish.as_secs_f64() * 1e3,
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let calls: u32 = args.first().map_or(20_000, |a| a.parse().expect("CALLS"));
    let rounds: usize = args.get(1).map_or(6, |a| a.parse().expect("ROUNDS"));
    let ebpf = memtrack::tracker::Tracker::global(&memtrack::tracker::TrackerOptions::new())
        .map_err(|e| println!("eBPF tracker skipped: {e}"))
        .is_ok();
    let mut backends: Vec<(&str, fn(), f64)> = vec![("alloc", tracked_alloc, 2_000.0)];
    if ebpf {
        backends.push(("ebpf", tracked_ebpf, 20_000.0));
    }
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); backends.len()];
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 {
            (0..backends.len()).collect()
        } else {
            (0..backends.len()).rev().collect()
        };
        for i in order {
            let (w, c) = round(backends[i].1, calls);
            results[i].0.push(w);
            results[i].1.push(c);
        }
    }
    let mut missed = false;
    println!(
        "warm cost per call (begin + end), {calls} calls × {rounds} rounds, ns; median [range]"
    );
    for ((label, _, target), (wall, cpu)) in backends.iter().zip(results) {
        let (wl, wh) = range(&wall);
        let (cl, ch) = range(&cpu);
        let (mw, mc) = (median(wall), median(cpu));
        let verdict = if mw <= *target { "within" } else { "OVER" };
        missed |= mw > *target;
        println!(
            "  {label:5}  wall {mw:8.0} [{wl:.0}–{wh:.0}]  process CPU {mc:8.0} [{cl:.0}–{ch:.0}]  \
             ({verdict} the {target:.0} ns target)"
        );
    }
    let mut turns = vec![Turns {
        label: "alloc",
        a: turn_a_alloc,
        b: turn_b_alloc,
        switches: 200,
    }];
    if ebpf {
        turns.push(Turns {
            label: "ebpf",
            a: turn_a_ebpf,
            b: turn_b_ebpf,
            switches: 40,
        });
    }
    println!("calls of two functions in turn (each call sets the other's recording aside)");
    for Turns {
        label,
        a,
        b,
        switches,
    } in turns
    {
        let (per, finish) = in_turn(a, b, switches);
        println!(
            "  {label:5}  {per:8.0} µs per switch ({switches} switches); finishing, joining \
             {} parts per name: {finish:.0} ms",
            switches / 2
        );
    }
    if missed {
        std::process::exit(1);
    }
}
