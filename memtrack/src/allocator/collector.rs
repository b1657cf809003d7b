//! The collector: drains the per-thread rings into an [`Encoder`], in timestamp order.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use super::AllocatorError as Error;
use super::merge::Pending;
use super::{OVERFLOW, RECORDER, REGISTRY, Raw, exclude_current_thread, tsc};
use crate::analysis::Stats;
use crate::artifact::{Metadata, monotonic_ns};
use crate::backend::Recorded;
use crate::encode::{Encoder, EncoderOptions, Snapshot, Written};
use crate::event::RawRecord;
use crate::modules::ModuleMap;
use crate::scope::Scope;
use crate::tracker::{Defined, SentStacks};

type Result<T, E = Error> = std::result::Result<T, E>;

/// How often the collector drains the rings, and how far behind "now" it keeps events back
/// so that a producer preempted between its TSC read and its publish is still merged in order.
const TICK: Duration = Duration::from_millis(1);
/// How often the collector looks while nothing can arrive (the switch off, nothing held back,
/// as between the calls of a paused recording); a filling ring or a snapshot wakes it sooner.
const IDLE_TICK: Duration = Duration::from_millis(100);
const LAG_NS: u64 = 2_000_000;

/// TSC → CLOCK_MONOTONIC: an anchor taken once per process, and the rate refined at every
/// tick over the longest baseline available. Kept in the recorder's state between recordings,
/// owned by the collector during one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    tsc0: u64,
    mono0: u64,
    /// Nanoseconds per TSC tick.
    scale: f64,
    /// `scale` in 32.32 fixed point, for the per-event conversion.
    mult: u64,
}

impl Clock {
    fn set_scale(&mut self, scale: f64) {
        self.scale = scale;
        self.mult = (scale * (1u64 << 32) as f64) as u64;
    }

    /// Anchors a clock now and measures the rate over 2 ms.
    fn calibrate() -> Result<Clock> {
        let (t0, m0) = (tsc(), monotonic_ns());
        std::thread::sleep(Duration::from_millis(2));
        let (t1, m1) = (tsc(), monotonic_ns());
        if t1 <= t0 {
            return Err(Error::UnsupportedCpu(
                "the CPU's time-stamp counter does not advance: the allocator recorder needs an \
                 invariant TSC; use the eBPF tracker",
            ));
        }
        let mut clock = Clock {
            tsc0: t0,
            mono0: m0,
            scale: 0.0,
            mult: 0,
        };
        clock.set_scale((m1 - m0) as f64 / (t1 - t0) as f64);
        Ok(clock)
    }

    /// Measures the rate again, over the whole time since the anchor.
    fn refine(&mut self) {
        let (t, m) = (tsc(), monotonic_ns());
        if m > self.mono0 + 10_000_000 && t > self.tsc0 {
            self.set_scale((m - self.mono0) as f64 / (t - self.tsc0) as f64);
        }
    }

    #[cfg(test)]
    pub(super) fn for_test(tsc0: u64) -> Clock {
        Clock {
            tsc0,
            mono0: 1_000,
            scale: 1.0,
            mult: 1 << 32,
        }
    }

    #[cfg(test)]
    pub(super) fn tsc0(&self) -> u64 {
        self.tsc0
    }
}

#[inline]
fn to_ns(c: &Clock, t: u64) -> u64 {
    // TSC values before the anchor (none: it is taken before any recording) would wrap.
    let ticks = t.saturating_sub(c.tsc0) as u128;
    c.mono0 + ((ticks * c.mult as u128) >> 32) as u64
}

/// Whether the CPU's TSC is invariant (constant rate, not stopped in idle states).
fn invariant_tsc() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
            s.lines()
                .find(|l| l.starts_with("flags"))
                .is_some_and(|l| l.contains(" constant_tsc") && l.contains(" nonstop_tsc"))
        })
    })
}

/// Every stack the threads sent (they remember what they sent for their whole life, across
/// recordings), resolved against this process's module map: kept between recordings, owned
/// by the collector during one.
static STACKS: Mutex<Option<SentStacks>> = Mutex::new(None);

/// What a recording learnt of call stacks (see [`Recorded`]).
#[derive(Debug, Default, Clone, Copy)]
struct StackCounts {
    /// Distinct stacks first sent during the recording.
    pub stacks: u64,
    /// Heap allocations whose stack stops early (the trailer's `short_stacks`).
    pub short_stacks: u64,
    /// Stacks first sent during the recording that were cut at the depth cap.
    pub truncated_stacks: u64,
}

/// Moves the stacks the threads sent since the last call into `table` (frames resolved with
/// the module map; a miss rescans it: a library dlopen'ed since), counting them in `counts`.
fn absorb(table: &mut SentStacks, pid: u32, counts: &mut StackCounts) {
    for s in super::walk::take_new_stacks() {
        let header = memtrack_bpf::RawStack {
            ts: monotonic_ns(),
            pid,
            id: s.id,
            record: memtrack_bpf::RECORD_STACK,
            nframes: s.addrs.len() as u32,
            flags: if s.truncated {
                memtrack_bpf::STACK_TRUNCATED
            } else {
                0
            },
            scanned: 0,
        };
        table.add(&header, s.addrs.iter().copied());
        counts.stacks += 1;
        counts.truncated_stacks += s.truncated as u64;
    }
}

/// A recording with the allocator recorder; [`AllocRecording::stop`] finishes the artifact.
pub(crate) struct AllocRecording<W: Write + Send + 'static> {
    stop: Arc<AtomicBool>,
    snapshot: Arc<Snapshot>,
    thread: Option<JoinHandle<Collected<W>>>,
    iterations: Option<u64>,
}

/// What the collector thread returns: the encoder and what it learnt of stacks (or why it
/// failed), and the clock it refined (for the next recording).
type Collected<W> = (Result<(Encoder<W>, StackCounts)>, Clock);

/// Starts recording the Rust allocator into an artifact written to `out`.
pub(crate) fn start_recording<W: Write + Send + 'static>(
    out: W,
    meta: &Metadata,
    workers: usize,
    scope: Scope,
    stack_depth: u32,
) -> Result<AllocRecording<W>> {
    if !invariant_tsc() {
        return Err(Error::UnsupportedCpu(
            "the allocator recorder needs an invariant TSC (cpuinfo flags constant_tsc and \
             nonstop_tsc), which this CPU does not report; use the eBPF tracker",
        ));
    }
    // Idle → Starting: refused while another recording starts, records or stops.
    let claim = RECORDER.claim(scope)?;
    // Read by the recording call only while the switch is on, which this recording turns on
    // after this (with SeqCst).
    super::walk::STACK_DEPTH.store(stack_depth, Ordering::Relaxed);
    let mut clock = claim.clock;
    match start_claimed(
        out,
        meta,
        workers,
        claim.epoch,
        claim.generation,
        &mut clock,
    ) {
        Ok((recording, collector)) => {
            // Starting → Recording: the switch goes on, the last thing done.
            match RECORDER.switch_on(collector) {
                Ok(()) => Ok(recording),
                Err(refused) => {
                    drop(recording);
                    Err(refused.into())
                }
            }
        }
        Err(e) => {
            // Starting → Idle, keeping a calibrated clock for the next recording.
            RECORDER.abandon(clock)?;
            Err(e)
        }
    }
}

/// The start of a claimed recording: the clock, the encoder's threads, the epoch's clean slate
/// and the collector thread; returns the recording and the collector (for
/// [`Lifecycle::switch_on`](super::lifecycle::Lifecycle::switch_on)) once every thread runs.
/// On error, every thread it started is gone and `clock` holds the clock to keep.
fn start_claimed<W: Write + Send + 'static>(
    out: W,
    meta: &Metadata,
    workers: usize,
    epoch: u32,
    generation: u32,
    clock: &mut Option<Clock>,
) -> Result<(AllocRecording<W>, std::thread::Thread)> {
    let c = match *clock {
        Some(c) => c,
        None => *clock.insert(Clock::calibrate()?),
    };
    // memtrack's threads mark themselves as its own when they start; recording is switched on
    // only once all of them (encoder writer and workers, collector) have, so that none of
    // their start-up allocations is recorded.
    let started = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&started);
    let hook: crate::encode::ThreadHook = Arc::new(move || {
        exclude_current_thread();
        counted.fetch_add(1, Ordering::Release);
    });
    let encoder = Encoder::new(
        out,
        meta,
        EncoderOptions::new().workers(workers).on_thread_start(hook),
    )?;
    // The new epoch and scope are in the session word already: the calling thread joins the
    // scope, and whatever an earlier session left in the rings is dropped.
    super::OUT_OF_SCOPE.store(0, Ordering::Relaxed);
    super::join_scope(generation);
    drain_all(|_, _| {});
    super::LOST.store(0, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let snapshot = Arc::new(Snapshot::default());
    let (stop2, counted, snapshot2) = (
        Arc::clone(&stop),
        Arc::clone(&started),
        Arc::clone(&snapshot),
    );
    let thread = std::thread::Builder::new()
        .name("memtrack-collect".into())
        .spawn(move || {
            exclude_current_thread();
            counted.fetch_add(1, Ordering::Release);
            let mut clock = c;
            let r = collect(encoder, &stop2, &snapshot2, epoch as u8, &mut clock);
            if r.is_err() {
                // Producers waiting for room must not wait for a collector that is gone.
                // Refused only before the switch went on, when no producer records.
                let _ = RECORDER.collector_failed();
            }
            (r, clock)
        })
        .map_err(|source| Error::Io {
            what: "starting the collector thread",
            source,
        })?;
    let collector = thread.thread().clone();
    let mut recording = AllocRecording {
        stop,
        snapshot,
        thread: Some(thread),
        iterations: None,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while started.load(Ordering::Acquire) < workers + 2 {
        if std::time::Instant::now() > deadline {
            // The collector ends (and the encoder's threads with it) before the claim is
            // abandoned.
            let (_, refined) = recording.join_collector();
            *clock = refined.or(*clock);
            return Err(Error::Io {
                what: "starting the allocator recorder",
                source: std::io::Error::other("memtrack's threads did not start within 5 s"),
            });
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok((recording, collector))
}

impl<W: Write + Send + 'static> AllocRecording<W> {
    /// The numbers so far: every event recorded before the call, merged and analysed (the
    /// collector keeps the newest 2 ms back to merge them in order, so this takes 2–3 ms).
    /// Allocates nothing on the calling thread.
    pub(crate) fn stats(&self) -> Result<Stats> {
        RECORDER.wake_collector();
        self.snapshot
            .ask(Duration::from_secs(10))
            .ok_or_else(|| Error::Io {
                what: "taking a snapshot",
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "memtrack's collector thread did not answer within 10 s",
                ),
            })
    }

    /// Recording → Paused, after an `IterationEnd` mark if `end_iteration` (the call has
    /// returned): nothing more is recorded until [`AllocRecording::resume`].
    pub(crate) fn pause(&self, end_iteration: bool) -> Result<()> {
        if end_iteration {
            super::mark(crate::event::KindTag::IterationEnd);
        }
        RECORDER.pause()?;
        // The calling thread leaves the scope until its next call: between calls it is not
        // the function's (another thread's call may run meanwhile).
        super::leave_scope();
        Ok(())
    }

    /// Paused → Recording for the next call, made on the calling thread (which joins the
    /// recording's scope), which an `IterationStart` mark begins.
    pub(crate) fn resume(&self) -> Result<()> {
        let generation = RECORDER.resume()?;
        super::join_scope(generation);
        super::mark(crate::event::KindTag::IterationStart);
        Ok(())
    }

    /// Stores in the artifact's trailer that it covers `n` iterations of a measured routine.
    pub(crate) fn set_iterations(&mut self, n: u64) {
        self.iterations = Some(n);
    }

    /// Stops recording, drains every ring and finishes the artifact. Events are lost only if
    /// the collector failed while a thread waited for room (the recorder waits for room
    /// instead of dropping events).
    pub(crate) fn stop(mut self) -> Result<Recorded> {
        let (written, lost_events, counts) = self.drain_and_finish()?;
        Ok(Recorded {
            written,
            lost_events,
            out_of_scope: super::OUT_OF_SCOPE.load(Ordering::Relaxed),
            unfollowed_processes: 0,
            stacks: counts.stacks,
            short_stacks: counts.short_stacks,
            // The Rust allocator's callers are Rust code, never the C library.
            short_stacks_in_libc: 0,
            truncated_stacks: counts.truncated_stacks,
            // Stacks are told apart by their whole addresses, each thread remembering every
            // one it sent: no collisions, nothing sent twice.
            stack_collisions: 0,
            stacks_not_remembered: 0,
        })
    }

    /// Tells the collector to drain what is left and end, and joins it: its encoder (or why
    /// it failed) and its clock (`None` if it panicked). `(Internal, None)` if it was joined.
    fn join_collector(&mut self) -> (Result<(Encoder<W>, StackCounts)>, Option<Clock>) {
        let Some(thread) = self.thread.take() else {
            return (
                Err(Error::Internal("the recording was already stopped")),
                None,
            );
        };
        self.stop.store(true, Ordering::Release);
        thread.thread().unpark();
        match thread.join() {
            Ok((encoder, clock)) => (encoder, Some(clock)),
            Err(_) => (
                Err(Error::Io {
                    what: "collector thread",
                    source: std::io::Error::other("panicked"),
                }),
                None,
            ),
        }
    }

    fn drain_and_finish(&mut self) -> Result<(Written, u64, StackCounts)> {
        // Recording → Stopping: the switch is off before the collector drains the last events.
        let stopped = RECORDER.stop();
        let (joined, clock) = self.join_collector();
        // Stopping → Idle, whatever the collector returned.
        let finished = stopped.and_then(|()| RECORDER.finish(clock));
        let lost = super::LOST.load(Ordering::Relaxed);
        let (mut encoder, counts) = joined?;
        finished?;
        if let Some(n) = self.iterations {
            encoder.set_iterations(n);
        }
        encoder.set_short_stacks(counts.short_stacks, 0);
        Ok((encoder.finish(lost)?, lost, counts))
    }
}

impl<W: Write + Send + 'static> Drop for AllocRecording<W> {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.drain_and_finish();
        }
    }
}

/// Drains every ring and the overflow, calling `f(tid, run)` with runs of slots in the order
/// each thread wrote them (slots of other epochs than the caller's included: `f` filters);
/// forgets closed rings once drained.
fn drain_all(mut f: impl FnMut(u32, &[Raw])) {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|ring| {
        // Read `closed` first: a ring seen closed has no write after this drain.
        let closed = ring.closed.load(Ordering::Acquire);
        let f = &mut f;
        ring.drain(|run| f(ring.tid, run));
        if ring.waiting.swap(false, Ordering::SeqCst)
            && let Some(t) = ring.thread.get()
        {
            t.unpark();
        }
        !closed
    });
    drop(reg);
    let overflow = std::mem::take(&mut *OVERFLOW.lock().unwrap_or_else(|e| e.into_inner()));
    for (tid, r) in &overflow {
        f(*tid, std::slice::from_ref(r));
    }
}

/// A slot as the kind table reads it: a realloc's old block is `addr2`.
impl RawRecord for Raw {
    #[inline(always)]
    fn addr(&self) -> u64 {
        self.addr
    }
    #[inline(always)]
    fn old_addr(&self) -> u64 {
        self.addr2
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline(always)]
    fn align(&self) -> u64 {
        match self.align_log {
            0 => 0,
            l => 1 << (l - 1),
        }
    }
}

/// The collector loop: every tick, drain, sort what is older than the lag, encode it.
fn collect<W: Write + Send + 'static>(
    mut enc: Encoder<W>,
    stop: &AtomicBool,
    snapshot: &Arc<Snapshot>,
    epoch: u8,
    clock: &mut Clock,
) -> Result<(Encoder<W>, StackCounts)> {
    // A snapshot asked for at this TSC: answered once every event before it is encoded.
    let mut snapshot_at: Option<u64> = None;
    let pid = std::process::id();
    let table = STACKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap_or_else(|| SentStacks::new(Arc::new(Mutex::new(ModuleMap::new())), false));
    let mut stacks = (table, Defined::default());
    let mut counts = StackCounts::default();
    let r = collect_with(
        &mut enc,
        stop,
        snapshot,
        epoch,
        clock,
        pid,
        &mut snapshot_at,
        &mut stacks,
        &mut counts,
    );
    let (table, defined) = stacks;
    *STACKS.lock().unwrap_or_else(|e| e.into_inner()) = Some(table);
    counts.short_stacks = defined.short_stacks;
    r.map(|()| (enc, counts))
}

/// The collector loop of [`collect`], which owns the stack table meanwhile.
#[allow(clippy::too_many_arguments)]
fn collect_with<W: Write + Send + 'static>(
    enc: &mut Encoder<W>,
    stop: &AtomicBool,
    snapshot: &Arc<Snapshot>,
    epoch: u8,
    clock: &mut Clock,
    pid: u32,
    snapshot_at: &mut Option<u64>,
    stacks: &mut (SentStacks, Defined),
    counts: &mut StackCounts,
) -> Result<()> {
    // Events drained but younger than the lag, in timestamp order.
    // The depth is set before the collector starts and stays for the whole recording.
    let mut pending = Pending::new(pid, super::walk::STACK_DEPTH.load(Ordering::Relaxed) != 0);
    loop {
        let last = stop.load(Ordering::Acquire);
        if last {
            // Writers that saw the switch on just before it flipped finish within nanoseconds.
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = tsc();
        if snapshot_at.is_none() && snapshot.take_request() {
            *snapshot_at = Some(now);
        }
        let mut unknown = 0;
        drain_all(|tid, run| unknown += pending.push_run(tid, epoch, run));
        // Never silently another kind: the session reports it lost, so its numbers say they
        // are incomplete and cannot serve as a baseline.
        if unknown > 0 {
            super::LOST.fetch_add(unknown, Ordering::Relaxed);
        }
        // After the rings: every stack an event drained above names was sent before it.
        absorb(&mut stacks.0, pid, counts);
        pending.sort();
        clock.refine();
        let c = &*clock;
        let horizon = now.saturating_sub((LAG_NS as f64 / c.scale) as u64);
        let ready = if last {
            pending.len()
        } else {
            pending.ready(horizon)
        };
        pending.emit(ready, |t| to_ns(c, t), enc, stacks)?;
        if let Some(at) = *snapshot_at
            && horizon >= at
        {
            enc.snapshot(snapshot)?;
            *snapshot_at = None;
        }
        if last {
            return Ok(());
        }
        let idle = super::SWITCH.load(Ordering::Relaxed) & super::STREAM == 0 && pending.len() == 0;
        std::thread::park_timeout(if idle { IDLE_TICK } else { TICK });
    }
}

/// Keeps the counters running while alive (criterion measurements); guards nest.
#[cfg(feature = "criterion")]
pub(crate) struct CountingGuard(());

/// Starts counting allocations, frees and bytes (no events).
#[cfg(feature = "criterion")]
pub(crate) fn start_counting() -> CountingGuard {
    RECORDER.count_begin();
    CountingGuard(())
}

#[cfg(feature = "criterion")]
impl Drop for CountingGuard {
    fn drop(&mut self) {
        // Refused only without a matching `count_begin`, which this guard is.
        let ended = RECORDER.count_end();
        debug_assert!(ended.is_ok(), "{ended:?}");
    }
}

#[cfg(feature = "criterion")]
/// The counters: (allocations, bytes allocated, frees) since counting first started.
pub(crate) fn counters() -> (u64, u64, u64) {
    (
        super::COUNT_ALLOCS.load(Ordering::Relaxed),
        super::COUNT_BYTES.load(Ordering::Relaxed),
        super::COUNT_FREES.load(Ordering::Relaxed),
    )
}
