//! The collector: drains the per-thread rings into an [`Encoder`], in timestamp order.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use super::RecorderError as Error;
use super::merge::Pending;
use super::{OVERFLOW, REGISTRY, Raw, STREAM, SWITCH, exclude_current_thread, tsc};
use crate::analysis::Stats;
use crate::artifact::{Metadata, monotonic_ns};
use crate::encode::{Encoder, EncoderOptions, Snapshot, Written};
use crate::event::RawRecord;
use crate::scope::Scope;

type Result<T, E = Error> = std::result::Result<T, E>;

/// How often the collector drains the rings, and how far behind "now" it keeps events back
/// so that a producer preempted between its TSC read and its publish is still merged in order.
const TICK: Duration = Duration::from_millis(1);
const LAG_NS: u64 = 2_000_000;

/// The collector thread, to wake when a ring fills up.
static COLLECTOR: Mutex<Option<Thread>> = Mutex::new(None);

pub(super) fn wake() {
    if let Ok(c) = COLLECTOR.try_lock()
        && let Some(t) = c.as_ref()
    {
        t.unpark();
    }
}

/// TSC → CLOCK_MONOTONIC: an anchor taken once per process, and the rate refined at every
/// tick over the longest baseline available.
struct Clock {
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
}

static CLOCK: Mutex<Option<Clock>> = Mutex::new(None);

fn calibrate() -> Result<()> {
    let mut c = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
    if c.is_none() {
        let (t0, m0) = (tsc(), monotonic_ns());
        std::thread::sleep(Duration::from_millis(2));
        let (t1, m1) = (tsc(), monotonic_ns());
        if t1 <= t0 {
            return Err(Error::UnsupportedCpu(
                "the CPU's time-stamp counter does not advance: the allocator backend needs an \
                 invariant TSC; use the eBPF backend",
            ));
        }
        let mut clock = Clock {
            tsc0: t0,
            mono0: m0,
            scale: 0.0,
            mult: 0,
        };
        clock.set_scale((m1 - m0) as f64 / (t1 - t0) as f64);
        *c = Some(clock);
    }
    Ok(())
}

fn refine() {
    let mut c = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = c.as_mut() {
        let (t, m) = (tsc(), monotonic_ns());
        if m > c.mono0 + 10_000_000 && t > c.tsc0 {
            c.set_scale((m - c.mono0) as f64 / (t - c.tsc0) as f64);
        }
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

/// A recording with the allocator backend; [`AllocRecording::stop`] finishes the artifact.
pub(crate) struct AllocRecording<W: Write + Send + 'static> {
    stop: Arc<AtomicBool>,
    snapshot: Arc<Snapshot>,
    thread: Option<JoinHandle<Result<Encoder<W>>>>,
    iterations: Option<u64>,
}

/// Starts recording the Rust allocator into an artifact written to `out`.
pub(crate) fn start_recording<W: Write + Send + 'static>(
    out: W,
    meta: &Metadata,
    workers: usize,
    scope: Scope,
) -> Result<AllocRecording<W>> {
    if !invariant_tsc() {
        return Err(Error::UnsupportedCpu(
            "the allocator backend needs an invariant TSC (cpuinfo flags constant_tsc and \
             nonstop_tsc), which this CPU does not report; use the eBPF backend",
        ));
    }
    if SWITCH.load(Ordering::Relaxed) & STREAM != 0 {
        return Err(Error::AlreadyRecording);
    }
    calibrate()?;
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
    // A new epoch and scope; whatever an earlier session left in the rings is dropped.
    super::begin_session(scope);
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
            let r = collect(encoder, &stop2, &snapshot2);
            if r.is_err() {
                // Producers waiting for room must not wait for a collector that is gone.
                SWITCH.fetch_and(!STREAM, Ordering::SeqCst);
            }
            r
        })
        .map_err(|source| Error::Io {
            what: "starting the collector thread",
            source,
        })?;
    *COLLECTOR.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread.thread().clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while started.load(Ordering::Acquire) < workers + 2 {
        if std::time::Instant::now() > deadline {
            return Err(Error::Io {
                what: "starting the allocator recorder",
                source: std::io::Error::other("memtrack's threads did not start within 5 s"),
            });
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    SWITCH.fetch_or(STREAM, Ordering::SeqCst);
    Ok(AllocRecording {
        stop,
        snapshot,
        thread: Some(thread),
        iterations: None,
    })
}

impl<W: Write + Send + 'static> AllocRecording<W> {
    /// The numbers so far: every event recorded before the call, merged and analysed (the
    /// collector keeps the newest 2 ms back to merge them in order, so this takes 2–3 ms).
    /// Allocates nothing on the calling thread.
    pub(crate) fn stats(&self) -> Result<Stats> {
        wake();
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

    /// Stores in the artifact's trailer that it covers `n` iterations of a measured routine.
    pub(crate) fn set_iterations(&mut self, n: u64) {
        self.iterations = Some(n);
    }

    /// Stops recording, drains every ring and finishes the artifact; also returns the number
    /// of events lost (only if the collector failed while a thread waited for room).
    pub(crate) fn stop(mut self) -> Result<(Written, u64)> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(Written, u64)> {
        SWITCH.fetch_and(!STREAM, Ordering::SeqCst);
        let Some(thread) = self.thread.take() else {
            return Err(Error::Internal("the recording was already stopped"));
        };
        self.stop.store(true, Ordering::Release);
        thread.thread().unpark();
        let joined = thread.join().map_err(|_| Error::Io {
            what: "collector thread",
            source: std::io::Error::other("panicked"),
        });
        *COLLECTOR.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let lost = super::LOST.load(Ordering::Relaxed);
        let mut encoder = joined??;
        if let Some(n) = self.iterations {
            encoder.set_iterations(n);
        }
        Ok((encoder.finish(lost)?, lost))
    }
}

impl<W: Write + Send + 'static> Drop for AllocRecording<W> {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop_inner();
        }
    }
}

/// Drains every ring and the overflow, calling `f(tid, raw)` for the current epoch's events;
/// forgets closed rings once drained. Generic, not `dyn`: called once per event, the closure
/// must inline (a dynamic call per event cost the collector ~45 instructions per event).
fn drain_all(mut f: impl FnMut(u32, &Raw)) {
    let epoch = super::epoch();
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|ring| {
        // Read `closed` first: a ring seen closed has no write after this drain.
        let closed = ring.closed.load(Ordering::Acquire);
        let f = &mut f;
        ring.drain(|r| {
            if r.epoch == epoch {
                f(ring.tid, r)
            }
        });
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
        if r.epoch == epoch {
            f(*tid, r);
        }
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
        self.align as u64
    }
}

/// The collector loop: every tick, drain, sort what is older than the lag, encode it.
fn collect<W: Write + Send + 'static>(
    mut enc: Encoder<W>,
    stop: &AtomicBool,
    snapshot: &Arc<Snapshot>,
) -> Result<Encoder<W>> {
    // A snapshot asked for at this TSC: answered once every event before it is encoded.
    let mut snapshot_at: Option<u64> = None;
    let pid = std::process::id();
    // Events drained but younger than the lag, in timestamp order.
    let mut pending = Pending::default();
    loop {
        let last = stop.load(Ordering::Acquire);
        if last {
            // Writers that saw the switch on just before it flipped finish within nanoseconds.
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = tsc();
        if snapshot_at.is_none() && snapshot.take_request() {
            snapshot_at = Some(now);
        }
        let before = pending.len();
        let mut unknown = 0;
        drain_all(|tid, r| {
            if !pending.push(pid, tid, r) {
                unknown += 1;
            }
        });
        // Never silently another kind: the session reports it lost, so its numbers say they
        // are incomplete and cannot serve as a baseline.
        if unknown > 0 {
            super::LOST.fetch_add(unknown, Ordering::Relaxed);
        }
        pending.sort_from(before);
        refine();
        let clock = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
        let c = clock.as_ref().expect("calibrated before recording");
        let horizon = now.saturating_sub((LAG_NS as f64 / c.scale) as u64);
        let ready = if last {
            pending.len()
        } else {
            pending.ready(horizon)
        };
        pending.emit(ready, |t| to_ns(c, t), &mut enc)?;
        drop(clock);
        if let Some(at) = snapshot_at
            && horizon >= at
        {
            enc.snapshot(snapshot)?;
            snapshot_at = None;
        }
        if last {
            return Ok(enc);
        }
        std::thread::park_timeout(TICK);
    }
}

/// Keeps the counters running while alive (criterion measurements); guards nest.
#[cfg(feature = "criterion")]
pub(crate) struct CountingGuard;

#[cfg(feature = "criterion")]
static COUNTING_USERS: Mutex<usize> = Mutex::new(0);

/// Starts counting allocations, frees and bytes (no events).
#[cfg(feature = "criterion")]
pub(crate) fn start_counting() -> CountingGuard {
    let mut u = COUNTING_USERS.lock().unwrap_or_else(|e| e.into_inner());
    *u += 1;
    SWITCH.fetch_or(super::COUNT, Ordering::SeqCst);
    CountingGuard
}

#[cfg(feature = "criterion")]
impl Drop for CountingGuard {
    fn drop(&mut self) {
        let mut u = COUNTING_USERS.lock().unwrap_or_else(|e| e.into_inner());
        *u -= 1;
        if *u == 0 {
            SWITCH.fetch_and(!super::COUNT, Ordering::SeqCst);
        }
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
