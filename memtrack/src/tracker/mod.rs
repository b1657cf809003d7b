//! The eBPF tracker: loads memtrack-bpf's program, attaches it to one process, and streams
//! what it records into an [`Encoder`].
//!
//! ```text
//! Tracker::attach(pid)            load (BTF, CO-RE) ─ tp_btf sys_exit ─ uprobes (pid-scoped)
//!   └─ start(out, meta, opts) ──▶ Recording: switch on; poller thread: poll(10 ms)+consume()
//!        └─ stop() ───────────▶ switch off; drain the tail; Encoder::finish(lost); Recorded
//! drop(Tracker)                   detach the uprobes in parallel
//! ```
//!
//! Uprobes are attached with the target's pid, never -1: other processes pay nothing for them.
//! The syscall tracepoint is global: with it attached, every syscall of every process takes
//! the kernel's slow path; the program returns after one comparison for other processes.
//! Allocation probes cost other processes nothing.
//! In-process, memtrack's own threads (the poller, the encoder's writer and workers) are
//! excluded in BPF by tid, so the numbers are the user's code alone.

mod bpf;
mod error;
mod poll;
mod record;

use std::io::Write;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use once_cell::sync::OnceCell;

pub use error::TrackerError;
pub use record::{RecordOutcome, record_command};

use crate::artifact::Metadata;
use crate::encode::{Encoder, EncoderOptions, Written};
use bpf::{Bpf, exclude_tid, gettid, mapped_objects};
pub(crate) use poll::record_to_event;
use poll::{Poller, PollerRecording};

/// Default ring buffer: 256 MiB (4 Mi events of 64 bytes in flight).
pub const DEFAULT_RINGBUF_BYTES: u64 = 256 << 20;

/// Settings fixed when a [`Tracker`] loads.
#[derive(Debug, Clone)]
pub struct TrackerOptions {
    ringbuf_bytes: u64,
    syscalls: bool,
}

impl Default for TrackerOptions {
    fn default() -> Self {
        Self {
            ringbuf_bytes: DEFAULT_RINGBUF_BYTES,
            syscalls: true,
        }
    }
}

impl TrackerOptions {
    /// Defaults: a [`DEFAULT_RINGBUF_BYTES`] ring buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ring buffer size in bytes: a power of two from 4 KiB to 1 GiB. Events that find it
    /// full are lost and counted (see [`Recorded::lost_events`]).
    pub fn ringbuf_bytes(mut self, bytes: u64) -> Self {
        self.ringbuf_bytes = bytes;
        self
    }

    /// Whether to record mmap, munmap, mremap and brk (default: yes). Their tracepoint slows
    /// every syscall of every process on the machine while attached (getppid: 124 → 209 ns,
    /// measured here); without it the tracker costs other processes nothing.
    pub fn syscalls(mut self, on: bool) -> Self {
        self.syscalls = on;
        self
    }

    fn validate(&self) -> Result<(), TrackerError> {
        let b = self.ringbuf_bytes;
        if !b.is_power_of_two() || !(4096..=1 << 30).contains(&b) {
            return Err(TrackerError::InvalidOption(format!(
                "the ring buffer size must be a power of two between 4 KiB and 1 GiB (got {b} bytes)"
            )));
        }
        Ok(())
    }
}

/// Cheap counters kept by the BPF program, readable at any time without the event stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Counters {
    /// Allocation events (malloc, calloc, realloc, aligned family) since load.
    pub allocations: u64,
    /// Their requested sizes, in bytes.
    pub bytes_allocated: u64,
    /// Free events since load.
    pub frees: u64,
    /// Events lost since load because the ring buffer was full.
    pub lost_events: u64,
}

/// The eBPF program loaded and attached to one process.
pub struct Tracker {
    bpf: Bpf,
    recording: Arc<AtomicBool>,
    in_process: bool,
    /// The `.bss` switch's bits and the number of [`Counting`] guards alive.
    switch: Mutex<(u32, usize)>,
    /// Started by the first recording; kept (ring buffer mapped) for the tracker's lifetime.
    poller: OnceCell<Poller>,
}

static GLOBAL: OnceCell<Tracker> = OnceCell::new();

impl Tracker {
    /// The tracker of this process, loaded and attached on first use (later calls ignore
    /// `opts`). Loading takes tens of milliseconds; sessions reuse it for the process's
    /// lifetime. One recording at a time: [`Tracker::start`] refuses a second.
    pub fn global(opts: &TrackerOptions) -> Result<&'static Tracker, TrackerError> {
        GLOBAL.get_or_try_init(|| Tracker::attach(std::process::id(), opts))
    }

    fn set_switch_bit(&self, bit: u32, on: bool) -> Result<(), TrackerError> {
        let mut sw = self.switch.lock().unwrap_or_else(|e| e.into_inner());
        let bits = if on { sw.0 | bit } else { sw.0 & !bit };
        self.bpf.set_switch(bits)?;
        sw.0 = bits;
        Ok(())
    }

    /// Keeps the BPF program counting allocations, frees and bytes ([`Tracker::counters`])
    /// while the guard lives, without recording events: a couple of syscalls per read, no
    /// ring buffer traffic. Guards nest; recording counts too.
    pub fn counting(&self) -> Result<Counting<'_>, TrackerError> {
        let mut sw = self.switch.lock().unwrap_or_else(|e| e.into_inner());
        if sw.1 == 0 {
            let bits = sw.0 | memtrack_bpf::SWITCH_COUNT;
            self.bpf.set_switch(bits)?;
            sw.0 = bits;
        }
        sw.1 += 1;
        Ok(Counting { tracker: self })
    }

    /// Loads the program for process `pid` and attaches to every ELF object it has mapped
    /// now that defines allocator entry points (libraries it loads later are probed too if
    /// they are among those files, e.g. libc).
    pub fn attach(pid: u32, opts: &TrackerOptions) -> Result<Self, TrackerError> {
        let files = mapped_objects(pid)?;
        Self::attach_files(pid, &files, opts)
    }

    /// Loads the program for `pid` and attaches to the given ELF files (which the process
    /// may map later: uprobes follow the file).
    pub fn attach_files(
        pid: u32,
        files: &[PathBuf],
        opts: &TrackerOptions,
    ) -> Result<Self, TrackerError> {
        opts.validate()?;
        let _log = error::LibbpfLog::capture();
        let bpf = Bpf::load(pid, opts.ringbuf_bytes, opts.syscalls)?;
        for f in files {
            // A file that vanished or is not ELF (a font, a locale archive) is not an error.
            match bpf.attach_file(f) {
                Ok(_) | Err(TrackerError::Elf(_) | TrackerError::Io { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if bpf.sites() == 0 {
            return Err(TrackerError::NoAllocatorSymbols {
                files: files.to_vec(),
            });
        }
        Ok(Self {
            bpf,
            recording: Arc::new(AtomicBool::new(false)),
            in_process: pid == std::process::id(),
            switch: Mutex::new((0, 0)),
            poller: OnceCell::new(),
        })
    }

    /// Number of probe sites attached.
    pub fn probe_sites(&self) -> usize {
        self.bpf.sites()
    }

    /// Probes the ELF objects the target has mapped since the last call (libraries it
    /// `dlopen`ed that define their own allocator). Returns the number of new sites. Calls
    /// made before this runs are not seen.
    pub(crate) fn attach_new_objects(&self) -> Result<usize, TrackerError> {
        let mut n = 0;
        for f in mapped_objects(self.bpf.target)? {
            match self.bpf.attach_file(&f) {
                Ok(k) => n += k,
                Err(TrackerError::Elf(_) | TrackerError::Io { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// The BPF program's counters (since load).
    pub fn counters(&self) -> Result<Counters, TrackerError> {
        let s = self.bpf.stats()?;
        Ok(Counters {
            allocations: s.allocs,
            bytes_allocated: s.alloc_bytes,
            frees: s.frees,
            lost_events: s.drops,
        })
    }

    /// Starts recording into a new artifact written to `out`, compressed by `workers`
    /// threads (this sets `opts`'s `workers`). In-process, the poller and the encoder's
    /// threads are excluded from recording before the switch goes on (`opts`'s
    /// `on_thread_start` hook is replaced to do that); a second concurrent recording is
    /// refused with [`TrackerError::AlreadyRecording`].
    pub fn start<W: Write + Send + 'static>(
        &self,
        out: W,
        meta: &Metadata,
        opts: EncoderOptions,
        workers: usize,
    ) -> crate::Result<Recording<'_, W>> {
        if self.recording.swap(true, Ordering::AcqRel) {
            return Err(TrackerError::AlreadyRecording.into());
        }
        let result = self.start_inner(out, meta, opts, workers);
        if result.is_err() {
            self.recording.store(false, Ordering::Release);
        }
        result
    }

    fn start_inner<W: Write + Send + 'static>(
        &self,
        out: W,
        meta: &Metadata,
        opts: EncoderOptions,
        workers: usize,
    ) -> crate::Result<Recording<'_, W>> {
        let exclude = self.in_process.then(|| Arc::clone(&self.bpf.excluded));
        let registered = Arc::new(AtomicUsize::new(0));
        let opts = match &exclude {
            Some(ex) => {
                let (ex, reg) = (Arc::clone(ex), Arc::clone(&registered));
                opts.workers(workers).on_thread_start(Arc::new(move || {
                    if exclude_tid(&ex, gettid()).is_ok() {
                        reg.fetch_add(1, Ordering::AcqRel);
                    }
                }))
            }
            None => opts.workers(workers),
        };
        let encoder = Encoder::new(out, meta, opts)?;
        if exclude.is_some() {
            // The writer thread and `workers` compression threads run the hook as they start:
            // wait for them so none of their first allocations is recorded.
            let deadline = Instant::now() + Duration::from_secs(2);
            while registered.load(Ordering::Acquire) < workers + 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(200));
            }
            let got = registered.load(Ordering::Acquire);
            if got < workers + 1 {
                // Recording now would mix memtrack's own allocations into the user's numbers.
                return Err(TrackerError::Io {
                    what: format!(
                        "excluding memtrack's encoder threads from recording ({got} of {} \
                         registered; pidfd_open(PIDFD_THREAD) needs Linux 6.9+)",
                        workers + 1
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                }
                .into());
            }
        }
        let drops_at_start = self.bpf.stats()?.drops;
        let poller = self
            .poller
            .get_or_try_init(|| Poller::spawn(Arc::clone(&self.bpf.events), exclude))?;
        self.bpf.attach_syscalls()?;
        let poller = match poller.record(Box::new(encoder)) {
            Ok(p) => p,
            Err(e) => {
                self.bpf.detach_syscalls();
                return Err(e.into());
            }
        };
        self.set_switch_bit(memtrack_bpf::SWITCH_STREAM, true)?;
        Ok(Recording {
            tracker: self,
            poller: Some(poller),
            drops_at_start,
            _out: PhantomData,
        })
    }
}

/// Keeps the tracker counting; see [`Tracker::counting`].
#[must_use = "counting stops when the guard is dropped"]
pub struct Counting<'t> {
    tracker: &'t Tracker,
}

impl Drop for Counting<'_> {
    fn drop(&mut self) {
        let t = self.tracker;
        let mut sw = t.switch.lock().unwrap_or_else(|e| e.into_inner());
        sw.1 -= 1;
        if sw.1 == 0 {
            let bits = sw.0 & !memtrack_bpf::SWITCH_COUNT;
            // Failing to switch counting off costs only the counting: nothing to report.
            if t.bpf.set_switch(bits).is_ok() {
                sw.0 = bits;
            }
        }
    }
}

/// A recording in progress; [`Recording::stop`] finishes the artifact. Dropping it without
/// `stop` stops and finishes too, but the result (and any error) is lost.
pub struct Recording<'t, W: Write + Send + 'static> {
    tracker: &'t Tracker,
    poller: Option<PollerRecording>,
    drops_at_start: u64,
    _out: PhantomData<fn() -> W>,
}

/// What a recording wrote.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Recorded {
    /// The artifact's frames, events, bytes and totals.
    pub written: Written,
    /// Events lost because the ring buffer was full (also in the artifact's trailer).
    pub lost_events: u64,
}

impl<W: Write + Send + 'static> Recording<'_, W> {
    /// Stops recording: switch off, drain the ring buffer's tail, finish the artifact.
    pub fn stop(mut self) -> crate::Result<Recorded> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> crate::Result<Recorded> {
        let Some(poller) = self.poller.take() else {
            return Err(TrackerError::InvalidOption("recording already stopped".into()).into());
        };
        let off = self
            .tracker
            .set_switch_bit(memtrack_bpf::SWITCH_STREAM, false);
        let drained = poller.finish();
        self.tracker.bpf.detach_syscalls();
        self.tracker.recording.store(false, Ordering::Release);
        off?;
        let mut drained = drained?;
        let lost_events = self
            .tracker
            .bpf
            .stats()?
            .drops
            .wrapping_sub(self.drops_at_start)
            // Records the poller could not decode (a mismatched object) are lost too.
            + drained.malformed;
        let push_error = drained.push_error.take();
        let encoder = drained.encoder::<W>().ok_or_else(|| {
            TrackerError::InvalidOption("the poller returned another recording's encoder".into())
        })?;
        let written = encoder.finish(lost_events)?;
        if let Some(e) = push_error {
            return Err(e);
        }
        Ok(Recorded {
            written,
            lost_events,
        })
    }
}

impl<W: Write + Send + 'static> Drop for Recording<'_, W> {
    fn drop(&mut self) {
        if self.poller.is_some() {
            let _ = self.stop_inner();
        }
    }
}
