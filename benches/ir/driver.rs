//! `hotpaths`: the driver of the hot-path gate (`ir-gate`, CONTRIBUTING.md "The ir-gate"). One
//! operation per hot path of memtrack, run deterministically: one measured thread, fixed seeds,
//! no clock read inside the measured function.
//!
//! ```text
//! hotpaths list              one line per operation: name scope unit small large description
//! hotpaths run NAME OPS      runs NAME for OPS operations (a multiple of its unit)
//! hotpaths time NAME OPS     the same, and prints wall-clock ns per operation (ABBA runs)
//! hotpaths cpu               the CPU features this process sees (under valgrind: valgrind's)
//! ```
//!
//! Every operation builds its input once, of a size that does not depend on OPS, then repeats
//! the measured work OPS / unit times: set-up costs the same at every size, so the gate's
//! difference of two sizes cancels it. The work runs inside [`memtrack_ir_measured`]: for
//! operations of scope `thread`, callgrind collects only inside that function, on the thread
//! that calls it (`--collect-atstart=no --toggle-collect=memtrack_ir_measured`); for scope
//! `process` it counts every thread of the process (memtrack's own threads do part of the work).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use memtrack::__private::active_session;
use memtrack::__private::hotpath::{FrameEncoder, alloc_undrained, bpf_record_to_event};
use memtrack::{
    Allocator, BackendChoice, SessionBuilder, analysis::Analyzer, analysis::SizeHistogram,
    artifact::Backend, artifact::Metadata, artifact::Reader, encode::Encoder,
    encode::EncoderOptions, event::Event, event::EventKind, synth::Synth, synth::SynthOptions,
};
use memtrack_bpf::{RawEvent, kind};

#[global_allocator]
static GLOBAL: Allocator = Allocator::system();

/// Events per frame: the encoder's default.
const FRAME: usize = 32 * 1024;
/// The codec operations' input: two frames of the synthetic trace.
const TRACE: usize = 2 * FRAME;
/// Alloc+free pairs per burst of `alloc_record`: 4,096 events, a quarter of a thread's ring, so
/// the measured thread never waits for room nor wakes the collector.
const BURST: usize = 2048;

/// One hot path.
struct Op {
    name: &'static str,
    /// `thread`: only the measured function on the measured thread counts; `process`: all.
    scope: &'static str,
    /// OPS must be a multiple of this (the operations of one repetition of the measured work).
    unit: u64,
    /// The sizes the gate measures (multiples of `unit`, near 200 k and 600 k operations or
    /// fewer where an operation is slow under callgrind).
    small: u64,
    large: u64,
    about: &'static str,
    /// Runs `reps` repetitions of the measured work through `m`; returns a checksum.
    run: fn(reps: u64, m: &mut Measure) -> u64,
}

const OPS: &[Op] = &[
    Op {
        name: "encode",
        scope: "thread",
        unit: TRACE as u64,
        small: 4 * TRACE as u64,
        large: 10 * TRACE as u64,
        about: "events to finished frame records (columns, zstd level 1, header, CRC); per event",
        run: encode,
    },
    Op {
        name: "decode",
        scope: "thread",
        unit: TRACE as u64,
        small: 4 * TRACE as u64,
        large: 10 * TRACE as u64,
        about: "Reader::decode_frame: CRC, zstd, columns to events; per event",
        run: decode,
    },
    Op {
        name: "decode_analyze",
        scope: "thread",
        unit: TRACE as u64,
        small: 4 * TRACE as u64,
        large: 10 * TRACE as u64,
        about: "decode + Analyzer + SizeHistogram (`memtrack show`'s pass), fresh per pass; per event",
        run: decode_analyze,
    },
    Op {
        name: "bpf_convert",
        scope: "thread",
        unit: TRACE as u64,
        small: 4 * TRACE as u64,
        large: 10 * TRACE as u64,
        about: "the eBPF poller's ring-buffer record to Event conversion; per record",
        run: bpf_convert,
    },
    Op {
        name: "alloc_record",
        scope: "thread",
        unit: BURST as u64,
        small: 98 * BURST as u64,
        large: 293 * BURST as u64,
        about: "alloc + free through memtrack::Allocator, session recording: the measured thread's work; per pair",
        run: alloc_record,
    },
    Op {
        name: "alloc_record_stacks",
        scope: "thread",
        unit: BURST as u64,
        small: 98 * BURST as u64,
        large: 293 * BURST as u64,
        about: "alloc_record with 20-frame call stacks (one call site): the measured thread's work; per pair",
        run: alloc_record_stacks,
    },
    Op {
        name: "alloc_idle",
        scope: "thread",
        unit: BURST as u64,
        small: 98 * BURST as u64,
        large: 293 * BURST as u64,
        about: "alloc + free through memtrack::Allocator, no session: what the wrapper adds when idle is this minus alloc_system; per pair",
        run: alloc_idle,
    },
    Op {
        name: "alloc_system",
        scope: "thread",
        unit: BURST as u64,
        small: 98 * BURST as u64,
        large: 293 * BURST as u64,
        about: "alloc + free through std's System directly, alloc_idle's loop: the baseline of the wrapper's idle cost; per pair",
        run: alloc_system,
    },
    Op {
        name: "alloc_session",
        scope: "process",
        unit: BURST as u64,
        small: 49 * BURST as u64,
        large: 147 * BURST as u64,
        about: "alloc + free through memtrack::Allocator, session recording: every thread (collector, encoder); per pair",
        run: alloc_session,
    },
    Op {
        name: "alloc_session_stacks",
        scope: "process",
        unit: BURST as u64,
        small: 49 * BURST as u64,
        large: 147 * BURST as u64,
        about: "alloc_session with the session's default call stacks (64 frames; this driver's are shallower): every thread; per pair",
        run: alloc_session_stacks,
    },
    Op {
        name: "encode_pipeline",
        scope: "process",
        unit: TRACE as u64,
        small: 4 * TRACE as u64,
        large: 10 * TRACE as u64,
        about: "Encoder (1 worker): push, writer thread, analysis, compression, trailer; per event",
        run: encode_pipeline,
    },
];

/// The boundary of what the gate counts. `no_mangle` so callgrind's `--toggle-collect` finds
/// it by a name that does not depend on the compiler's mangling.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "Rust" fn memtrack_ir_measured(work: &mut dyn FnMut()) {
    work();
}

/// Runs measured work, and with `time` adds up its wall-clock duration (read outside the
/// measured function).
struct Measure {
    time: bool,
    elapsed: Duration,
}

impl Measure {
    fn call(&mut self, mut work: impl FnMut()) {
        let t = self.time.then(Instant::now);
        memtrack_ir_measured(&mut work);
        if let Some(t) = t {
            self.elapsed += t.elapsed();
        }
    }
}

fn trace() -> Vec<Event> {
    Synth::new(SynthOptions {
        seed: 1,
        threads: 4,
    })
    .take(TRACE)
    .collect()
}

/// An artifact of [`trace`] in frames of [`FRAME`] events, in memory.
fn artifact() -> Reader {
    let meta = Metadata::now(1, Backend::Synth);
    let opts = EncoderOptions::new().workers(1).frame_events(FRAME);
    let mut enc = Encoder::new(Vec::new(), &meta, opts).expect("encoder");
    enc.set_end_time(0);
    enc.extend(trace()).expect("push");
    let (bytes, _) = enc.finish_into(0).expect("finish");
    Reader::from_bytes(bytes).expect("reader")
}

fn encode(reps: u64, m: &mut Measure) -> u64 {
    let events = trace();
    let mut enc = FrameEncoder::new(1).expect("zstd");
    let mut out = Vec::new();
    let mut sum = 0u64;
    m.call(|| {
        for _ in 0..reps {
            for frame in events.chunks(FRAME) {
                enc.encode(frame, &mut out).expect("encode");
                sum += black_box(&out).len() as u64;
            }
        }
    });
    sum
}

fn decode(reps: u64, m: &mut Measure) -> u64 {
    let reader = artifact();
    let mut buf = Vec::with_capacity(FRAME);
    let mut sum = 0u64;
    m.call(|| {
        for _ in 0..reps {
            for i in 0..reader.frames().len() {
                buf.clear();
                reader.decode_frame(i, &mut buf).expect("decode");
                sum += black_box(&buf).len() as u64;
            }
        }
    });
    sum
}

fn decode_analyze(reps: u64, m: &mut Measure) -> u64 {
    let reader = artifact();
    let mut buf = Vec::with_capacity(FRAME);
    let mut sum = 0u64;
    m.call(|| {
        for _ in 0..reps {
            let (mut a, mut sizes) = (Analyzer::new(), SizeHistogram::new());
            for i in 0..reader.frames().len() {
                buf.clear();
                reader.decode_frame(i, &mut buf).expect("decode");
                a.update_all(&buf);
                sizes.update_all(&buf);
            }
            sum += black_box(a.totals()).peak_live_bytes;
            sum += black_box(sizes.classes()).len() as u64;
        }
    });
    sum
}

/// The ring-buffer record the BPF program writes for `e`.
fn raw(e: &Event) -> RawEvent {
    let (k, addr, old_addr, size, align) = match e.kind {
        EventKind::Malloc { addr, size } => (kind::MALLOC, addr, 0, size, 0),
        EventKind::Calloc { addr, size } => (kind::CALLOC, addr, 0, size, 0),
        EventKind::Realloc {
            old_addr,
            new_addr,
            size,
        } => (kind::REALLOC, new_addr, old_addr, size, 0),
        EventKind::AlignedAlloc { addr, size, align } => {
            (kind::ALIGNED_ALLOC, addr, 0, size, align)
        }
        EventKind::Free { addr } => (kind::FREE, addr, 0, 0, 0),
        EventKind::Mmap { addr, size } => (kind::MMAP, addr, 0, size, 0),
        EventKind::Munmap { addr, size } => (kind::MUNMAP, addr, 0, size, 0),
        EventKind::Mremap {
            old_addr,
            new_addr,
            size,
        } => (kind::MREMAP, new_addr, old_addr, size, 0),
        EventKind::Brk { addr } => (kind::BRK, addr, 0, 0, 0),
        _ => unreachable!("a kind this driver does not know: add it"),
    };
    RawEvent {
        ts: e.ts,
        pid: e.pid,
        tid: e.tid,
        kind: k,
        stack: 0,
        addr,
        old_addr,
        size,
        align,
    }
}

fn bpf_convert(reps: u64, m: &mut Measure) -> u64 {
    let mut records = Vec::with_capacity(TRACE * RawEvent::SIZE);
    for e in trace() {
        let r = raw(&e);
        // Native-endian fields in declaration order: `struct memtrack_event` as the ring
        // buffer holds it (RawEvent::from_bytes reads the same layout).
        records.extend_from_slice(&r.ts.to_ne_bytes());
        for v in [r.pid, r.tid, r.kind, r.stack] {
            records.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [r.addr, r.old_addr, r.size, r.align] {
            records.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(
            RawEvent::from_bytes(&records[records.len() - RawEvent::SIZE..]),
            Some(r)
        );
    }
    let mut sum = 0u64;
    m.call(|| {
        for _ in 0..reps {
            for rec in records.chunks_exact(RawEvent::SIZE) {
                let ev = bpf_record_to_event(black_box(rec)).expect("a known kind");
                sum = sum.wrapping_add(black_box(ev).ts);
            }
        }
    });
    sum
}

/// `pairs` alloc+free pairs through `alloc` (sizes 8..1032 bytes, a 64-slot ring of live
/// blocks); the ring is empty again at the end.
fn churn(
    alloc: &impl GlobalAlloc,
    state: &mut (u32, [(*mut u8, Layout); 64], usize),
    pairs: usize,
) {
    let (x, ring, i) = state;
    for _ in 0..pairs {
        *x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let size = 8 + (*x >> 22) as usize;
        let slot = &mut ring[*i % 64];
        *i += 1;
        if !slot.0.is_null() {
            // SAFETY: allocated below with this layout by the same allocator.
            unsafe { alloc.dealloc(slot.0, slot.1) };
        }
        let layout = Layout::from_size_align(size, 8).expect("layout");
        // SAFETY: non-zero size.
        *slot = (unsafe { alloc.alloc(layout) }, layout);
        black_box(slot.0);
    }
}

/// Frees what [`churn`] left in the ring; returns how many blocks it held (non-null: each
/// allocation succeeded).
fn free_all(alloc: &impl GlobalAlloc, ring: &mut [(*mut u8, Layout); 64]) -> u64 {
    let mut held = 0;
    for (p, l) in ring.iter_mut() {
        if !p.is_null() {
            // SAFETY: allocated by `churn` with this layout through `alloc`.
            unsafe { alloc.dealloc(*p, *l) };
            *p = std::ptr::null_mut();
            held += 1;
        }
    }
    held
}

fn churn_state() -> (u32, [(*mut u8, Layout); 64], usize) {
    (
        12345u32,
        [(std::ptr::null_mut(), Layout::new::<u8>()); 64],
        0,
    )
}

fn session(name: &str) -> memtrack::Session {
    session_with(name, Some(0))
}

/// [`session`] recording call stacks of up to `depth` frames (`None`: the session's default).
fn session_with(name: &str, depth: Option<u32>) -> memtrack::Session {
    let mut b = SessionBuilder::new(name)
        .backend(BackendChoice::Alloc)
        .output_dir(std::env::temp_dir().join(format!("memtrack-hotpaths-{}", std::process::id())))
        .workers(1)
        .quiet(true);
    // The gate measures the recording call without call stacks (the default records 64
    // frames) but in `alloc_record_stacks` and `alloc_session_stacks`.
    if let Some(depth) = depth {
        b = b.stack_depth(depth);
    }
    b.start().expect("an allocator recorder session")
}

fn finish(s: memtrack::Session, pairs: u64) -> u64 {
    finish_checked(s, pairs, |_| ())
}

/// [`finish`], with `check` run on the artifact's path before it is removed (`finish` opens
/// nothing: `alloc_session` counts the whole process).
fn finish_checked(s: memtrack::Session, pairs: u64, check: impl FnOnce(&Path)) -> u64 {
    let r = s.finish().expect("finishing the session");
    assert_eq!(r.lost_events(), 0, "events lost");
    assert!(r.totals().allocations >= pairs, "every allocation recorded");
    let path = r.path.as_deref().expect("the session wrote an artifact");
    check(path);
    let _ = std::fs::remove_dir_all(path.parent().expect("a directory"));
    r.totals().allocations
}

fn alloc_record(reps: u64, m: &mut Measure) -> u64 {
    let mut state = churn_state();
    let s = session("hotpaths_alloc_record");
    for _ in 0..reps {
        // The collector drains between bursts: the measured thread never waits for room.
        while alloc_undrained() > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        m.call(|| churn(&GLOBAL, &mut state, BURST));
    }
    free_all(&GLOBAL, &mut state.1);
    finish(s, reps * BURST as u64)
}

/// Frames under the measured work in [`alloc_record_stacks`]: with the runtime's below and the
/// allocator's above, every stack is deeper than the 20 frames recorded.
const NEST: u32 = 20;

/// [`alloc_record`] recording 20-frame call stacks, the bursts run [`NEST`] frames deep.
fn alloc_record_stacks(reps: u64, m: &mut Measure) -> u64 {
    nested(NEST, &mut || {
        let mut state = churn_state();
        let s = session_with("hotpaths_alloc_record_stacks", Some(20));
        for _ in 0..reps {
            while alloc_undrained() > 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
            m.call(|| churn(&GLOBAL, &mut state, BURST));
        }
        free_all(&GLOBAL, &mut state.1);
        finish_checked(s, reps * BURST as u64, |path| {
            let reader = Reader::open(path).expect("the session's artifact");
            let stacks = reader.stacks().expect("its call stacks");
            assert!(stacks.stacks().len() > 0, "stacks recorded");
            for (id, stack) in stacks.stacks() {
                assert_eq!(stack.frames.len(), 20, "stack {id:?} has 20 frames");
            }
        })
    })
}

/// Runs `f` `n` frames deeper than the caller.
#[inline(never)]
fn nested(n: u32, f: &mut dyn FnMut() -> u64) -> u64 {
    if n == 0 {
        f()
    } else {
        // Used after the call: not a tail call, so every level keeps its frame.
        black_box(nested(n - 1, f)) + black_box(0)
    }
}

/// `alloc_record`'s bursts with no session: the wrapper's one relaxed load per call over
/// `alloc_system`.
fn alloc_idle(reps: u64, m: &mut Measure) -> u64 {
    if let Some(name) = active_session() {
        panic!("alloc_idle measures the allocator with no session, and {name:?} runs");
    }
    bursts(&GLOBAL, reps, m)
}

/// `alloc_idle`'s bursts through std's `System`, which the wrapper forwards to.
fn alloc_system(reps: u64, m: &mut Measure) -> u64 {
    bursts(&System, reps, m)
}

/// `reps` measured bursts of [`churn`] through `alloc`, back to back; returns what
/// [`free_all`] freed.
fn bursts(alloc: &impl GlobalAlloc, reps: u64, m: &mut Measure) -> u64 {
    let mut state = churn_state();
    for _ in 0..reps {
        m.call(|| churn(alloc, &mut state, BURST));
    }
    free_all(alloc, &mut state.1)
}

fn alloc_session(reps: u64, m: &mut Measure) -> u64 {
    whole_session("hotpaths_alloc_session", Some(0), reps, m)
}

/// [`alloc_session`] as a session records by default: with call stacks.
fn alloc_session_stacks(reps: u64, m: &mut Measure) -> u64 {
    whole_session("hotpaths_alloc_session_stacks", None, reps, m)
}

/// `reps` bursts in one measured call, in a session of stack depth `depth` (see
/// [`session_with`]): the process's every thread counts.
fn whole_session(name: &str, depth: Option<u32>, reps: u64, m: &mut Measure) -> u64 {
    let mut state = churn_state();
    let s = session_with(name, depth);
    m.call(|| churn(&GLOBAL, &mut state, reps as usize * BURST));
    free_all(&GLOBAL, &mut state.1);
    finish(s, reps * BURST as u64)
}

fn encode_pipeline(reps: u64, m: &mut Measure) -> u64 {
    let events = trace();
    let meta = Metadata::now(1, Backend::Synth);
    let mut sum = 0u64;
    m.call(|| {
        for _ in 0..reps {
            let opts = EncoderOptions::new().workers(1).frame_events(FRAME);
            let mut enc = Encoder::new(Vec::new(), &meta, opts).expect("encoder");
            enc.set_end_time(0);
            enc.extend(events.iter().copied()).expect("push");
            let (bytes, _) = enc.finish_into(0).expect("finish");
            sum += black_box(bytes).len() as u64;
        }
    });
    sum
}

/// CPU features that pick code paths in what the operations run (glibc's string functions,
/// zstd, crc32fast): counts taken with different ones do not compare.
fn cpu_features() -> String {
    let mut f = Vec::new();
    macro_rules! detect {
        ($($name:tt),*) => {$(
            if std::arch::is_x86_feature_detected!($name) {
                f.push($name);
            }
        )*};
    }
    detect!(
        "sse4.1",
        "sse4.2",
        "popcnt",
        "pclmulqdq",
        "avx",
        "avx2",
        "bmi1",
        "bmi2",
        "lzcnt",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512vl"
    );
    f.join(" ")
}

fn find(name: &str) -> Result<&'static Op, String> {
    OPS.iter().find(|o| o.name == name).ok_or_else(|| {
        let names: Vec<_> = OPS.iter().map(|o| o.name).collect();
        format!(
            "unknown operation {name:?}; the operations are: {}",
            names.join(", ")
        )
    })
}

/// `OPS` as a count of repetitions of `op`'s unit.
fn repetitions(op: &Op, ops: &str) -> Result<u64, String> {
    let n: u64 = ops
        .parse()
        .map_err(|_| format!("OPS must be a whole number of operations, not {ops:?}"))?;
    if n == 0 || n % op.unit != 0 {
        return Err(format!(
            "{} runs in units of {} operations: OPS = {n} does not divide (try {})",
            op.name,
            op.unit,
            n.div_ceil(op.unit).max(1) * op.unit
        ));
    }
    Ok(n / op.unit)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let usage =
        "usage: hotpaths list | hotpaths run NAME OPS | hotpaths time NAME OPS | hotpaths cpu";
    let result = match args[..] {
        ["list"] => {
            for o in OPS {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    o.name, o.scope, o.unit, o.small, o.large, o.about
                );
            }
            Ok(())
        }
        ["cpu"] => {
            println!("{}", cpu_features());
            Ok(())
        }
        [cmd @ ("run" | "time"), name, ops] => find(name).and_then(|op| {
            let reps = repetitions(op, ops)?;
            let mut m = Measure {
                time: cmd == "time",
                elapsed: Duration::ZERO,
            };
            let sum = (op.run)(reps, &mut m);
            let n = reps * op.unit;
            if m.time {
                println!(
                    "{} {n} {:.3} ns/op",
                    op.name,
                    m.elapsed.as_nanos() as f64 / n as f64
                );
            } else {
                println!("{} {n} ok {sum}", op.name);
            }
            Ok(())
        }),
        _ => Err(usage.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hotpaths: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
