//! One interface over the two recorders, the eBPF tracker and the allocator recorder: a
//! [`Recorder`] (a backend made ready) starts a [`Recording`], which gives the numbers so far
//! and stops into one result type, [`Recorded`]; [`Counter`] is the one counting guard.
//! Sessions and the criterion measurements use only this.
//!
//! ```text
//! Recorder::ready(backend, options) ─▶ Recorder ─start(out, meta)─▶ Recording ─stop─▶ Recorded
//!                                                                    ├ stats() (numbers so far)
//!                                                                    └ set_iterations(n)
//! ```

use std::io::Write;

use crate::allocator::{AllocRecording, AllocatorError};
use crate::analysis::Stats;
use crate::artifact::{Backend, Metadata};
use crate::encode::{EncoderOptions, Written};
use crate::scope::Scope;
use crate::tracker::{Capture, Tracker, TrackerError, TrackerOptions};

/// Why a recorder could not be made ready, start, answer or stop: the failing backend's own
/// error (composed into the crate's `Error` as it is).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordingError {
    /// The eBPF tracker's.
    #[error(transparent)]
    Tracker(#[from] TrackerError),
    /// The allocator recorder's.
    #[error(transparent)]
    Allocator(#[from] AllocatorError),
}

/// What a recording captures and how, for either backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// Which threads are recorded.
    pub scope: Scope,
    /// Frames per call stack (0: none).
    pub stack_depth: u32,
    /// Compression threads.
    pub workers: usize,
    /// Context switches too (eBPF only; the caller refuses them for the other backend).
    pub lock_waits: bool,
    /// The eBPF ring buffer's size, if not the default.
    pub ringbuf_bytes: Option<u64>,
}

/// A backend made ready to record: the loaded tracker, or the installed allocator recorder.
#[derive(Clone, Copy)]
pub(crate) enum Recorder {
    /// The eBPF tracker of this process.
    Ebpf(&'static Tracker),
    /// The allocator recorder ([`Allocator`](crate::allocator::Allocator) is the global
    /// allocator).
    Alloc,
}

impl Recorder {
    /// `backend` made ready: the tracker is loaded once per process (with `options`' stack
    /// depth and ring buffer); the allocator recorder needs nothing.
    pub(crate) fn ready(backend: Backend, options: &Options) -> Result<Self, RecordingError> {
        if backend != Backend::Ebpf {
            return Ok(Recorder::Alloc);
        }
        let mut topts = TrackerOptions::new().stack_depth(options.stack_depth);
        if let Some(b) = options.ringbuf_bytes {
            topts = topts.ringbuf_bytes(b);
        }
        Ok(Recorder::Ebpf(Tracker::global(&topts)?))
    }

    /// Starts recording into `out`, whose artifact begins with `meta`. Recording starts last:
    /// the caller must allocate and free nothing it does not mean to record after this.
    pub(crate) fn start<W: Write + Send + 'static>(
        self,
        out: W,
        meta: &Metadata,
        options: &Options,
    ) -> Result<Recording<W>, RecordingError> {
        Ok(match self {
            Recorder::Ebpf(t) => {
                let capture = Capture::new(options.scope).lock_waits(options.lock_waits);
                let r = t.start_with(out, meta, EncoderOptions::new(), options.workers, capture)?;
                Recording::Ebpf(r)
            }
            Recorder::Alloc => Recording::Alloc(crate::allocator::start_recording(
                out,
                meta,
                options.workers,
                options.scope,
                options.stack_depth,
            )?),
        })
    }
}

/// A recording in progress, of either backend.
pub(crate) enum Recording<W: Write + Send + 'static> {
    /// The eBPF tracker's.
    Ebpf(crate::tracker::Recording<'static, W>),
    /// The allocator recorder's.
    Alloc(AllocRecording<W>),
}

impl<W: Write + Send + 'static> Recording<W> {
    /// The numbers so far: every event recorded before the call, drained and analysed.
    /// Allocates nothing on the calling thread.
    pub(crate) fn stats(&self) -> Result<Stats, RecordingError> {
        Ok(match self {
            Recording::Ebpf(r) => r.stats()?,
            Recording::Alloc(r) => r.stats()?,
        })
    }

    /// Stores in the artifact's trailer that it covers `n` iterations of a measured routine.
    pub(crate) fn set_iterations(&mut self, n: u64) {
        match self {
            Recording::Ebpf(r) => r.set_iterations(n),
            Recording::Alloc(r) => r.set_iterations(n),
        }
    }

    /// Recording → Paused: nothing is recorded until [`Recording::resume`], the artifact
    /// stays open. With `end_iteration`, the calling thread's iteration ends first (an
    /// `IterationEnd` mark).
    pub(crate) fn pause(&self, end_iteration: bool) -> Result<(), RecordingError> {
        match self {
            Recording::Ebpf(r) => r.pause(end_iteration)?,
            Recording::Alloc(r) => r.pause(end_iteration)?,
        }
        Ok(())
    }

    /// Paused → Recording: the next iteration, on the calling thread, which joins the
    /// recording's scope (with [`Scope::Threads`], so do the threads it starts; threads that
    /// earlier iterations started stay in it).
    pub(crate) fn resume(&self) -> Result<(), RecordingError> {
        match self {
            Recording::Ebpf(r) => r.resume()?,
            Recording::Alloc(r) => r.resume()?,
        }
        Ok(())
    }

    /// Events lost so far (the ring buffer or a ring was full).
    pub(crate) fn lost_so_far(&self) -> Result<u64, RecordingError> {
        Ok(match self {
            Recording::Ebpf(r) => r.lost_so_far()?,
            Recording::Alloc(_) => crate::allocator::lost_so_far(),
        })
    }

    /// Whether the eBPF tracker records it (its probes can be handed to the next session).
    pub(crate) fn is_ebpf(&self) -> bool {
        matches!(self, Recording::Ebpf(_))
    }

    /// Stops recording and finishes the artifact.
    pub(crate) fn stop(self) -> Result<Recorded, RecordingError> {
        Ok(match self {
            Recording::Ebpf(r) => r.stop()?,
            Recording::Alloc(r) => r.stop()?,
        })
    }
}

/// Keeps a backend counting while it exists (what criterion's measurements read): the BPF
/// program's counters, or the allocator recorder's. Counts only, records no event.
#[cfg(feature = "criterion")]
pub(crate) enum Counter {
    /// The tracker's counters, with the guard that keeps its probes attached.
    Ebpf {
        tracker: &'static Tracker,
        _counting: crate::tracker::Counting<'static>,
    },
    /// The allocator recorder's counters, kept on by the guard.
    Alloc(crate::allocator::CountingGuard),
}

#[cfg(feature = "criterion")]
impl Counter {
    /// Starts counting with `recorder`.
    pub(crate) fn start(recorder: Recorder) -> Result<Self, RecordingError> {
        Ok(match recorder {
            Recorder::Alloc => Counter::Alloc(crate::allocator::start_counting()),
            Recorder::Ebpf(tracker) => Counter::Ebpf {
                tracker,
                _counting: tracker.counting()?,
            },
        })
    }

    /// (allocations, bytes allocated) so far.
    pub(crate) fn read(&self) -> (u64, u64) {
        match self {
            // A failed map read is a broken BPF setup, not a measurement: there is no sane
            // value to return, and criterion's trait has no error path.
            Counter::Ebpf { tracker, .. } => {
                let c = tracker.counters().expect("reading memtrack's BPF counters");
                (c.allocations, c.bytes_allocated)
            }
            Counter::Alloc(_) => {
                let (allocs, bytes, _) = crate::allocator::counters();
                (allocs, bytes)
            }
        }
    }
}

/// What a recorder returned when its recording stopped, either recorder's: what the encoder
/// wrote ([`Recorded::written`]) and what the recorder counted beside it. A session's report
/// holds it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Recorded {
    /// The artifact's frames, events, bytes and totals.
    pub written: Written,
    /// Events lost because the ring buffer was full (also in the artifact's trailer).
    pub lost_events: u64,
    /// Allocation and free calls of threads outside a thread-scoped recording's scope, not
    /// recorded (0 for a process-wide recording).
    pub out_of_scope: u64,
    /// Processes the recorded process started and that were not followed (`record
    /// --no-follow`; also in the artifact's trailer).
    pub unfollowed_processes: u64,
    /// Distinct call stacks the program sent during the recording.
    pub stacks: u64,
    /// Heap allocations whose call stack stops early: no frame beyond the allocator's caller,
    /// or a frame outside the mapped code (built without frame pointers; also in the
    /// artifact's trailer, [`Final::short_stacks`](crate::artifact::Final::short_stacks)).
    pub short_stacks: u64,
    /// Of [`Recorded::short_stacks`], those whose call site is in the C library (its own
    /// allocations: no rebuild of the program gives them callers).
    pub short_stacks_in_libc: u64,
    /// Stacks cut at [`TrackerOptions::stack_depth`](crate::tracker::TrackerOptions::stack_depth) (or the session's) frames.
    pub truncated_stacks: u64,
    /// Stacks whose first hash matched another stack's: sent again under an id of their own
    /// (never confused with the other; only more ring-buffer traffic).
    pub stack_collisions: u64,
    /// New stacks the program could not remember (its map of sent stacks was full): sent
    /// again each time they recur (nothing lost; more ring-buffer traffic).
    pub stacks_not_remembered: u64,
}

impl Recorded {
    /// A recording of nothing but `totals` (nothing lost, no stacks): for tests of what reads
    /// a result.
    #[cfg(test)]
    pub(crate) fn of_totals(totals: crate::totals::Totals) -> Self {
        Recorded {
            written: Written {
                frames: 0,
                events: 0,
                bytes: 0,
                totals,
                sizes: Vec::new(),
                timeline: crate::analysis::Timeline::growing(1).unwrap(),
                per_process: Default::default(),
            },
            lost_events: 0,
            out_of_scope: 0,
            unfollowed_processes: 0,
            stacks: 0,
            short_stacks: 0,
            short_stacks_in_libc: 0,
            truncated_stacks: 0,
            stack_collisions: 0,
            stacks_not_remembered: 0,
        }
    }
}
