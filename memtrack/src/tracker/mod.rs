//! The eBPF tracker: loads memtrack-bpf's program, attaches it to one process, and streams
//! what it records into an [`Encoder`].
//!
//! ```text
//! Tracker::attach(pid)            load (BTF, CO-RE); find the allocator probe sites (kept)
//!   └─ start(out, meta, opts) ──▶ attach the uprobes (pid-scoped; libc's mmap/munmap/
//!        │                        mremap/brk too), tp_btf sys_exit only for raw syscalls,
//!        │                        sched_process_exec (an exec ends the image's heap),
//!        │                        sched_process_fork for a thread scope; switch on;
//!        │                        poller thread: poll(10 ms)+consume()
//!        └─ stop() ───────────▶ switch off; drain the tail; Encoder::finish(lost);
//!                                 detach everything; Recorded
//! drop(Tracker)                   unload
//! ```
//!
//! Nothing stays attached between recordings (or [`Counting`] guards): an attached uprobe
//! traps into the kernel on every call even when its program returns at once, so a process
//! that kept its probes would pay for them for the rest of its life (`tests/after_session`).
//! The loaded object, the probe sites and the ring buffer's mapping are kept.
//!
//! Uprobes are attached with the target's pid, never -1: other processes pay nothing for them.
//! mmap, munmap, mremap and brk are recorded by default through uprobes on libc's wrappers
//! (the functions malloc itself calls), so a recording costs other processes nothing; the
//! optional raw-syscall tracepoint ([`TrackerOptions::raw_syscalls`]) and the fork
//! tracepoint of a thread scope are global: while attached, every syscall (or fork) of every
//! process takes the kernel's slow path, and the program returns after one comparison for
//! other processes.
//! In-process, memtrack's own threads (the poller, the encoder's writer and workers) are
//! excluded in BPF by tid, so the numbers are the user's code alone.

mod bpf;
mod command;
mod error;
mod follow;
mod kernel;
mod poll;
mod stacks;
mod unwind;

use std::io::Write;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use once_cell::sync::OnceCell;

// `Tracker::start`'s encoder settings (the `encode` module is the CLI's, not documented).
pub use crate::encode::EncoderOptions;
pub use error::TrackerError;
pub use kernel::{Feature, Kernel};
// `memtrack record`'s engine: public for memtrack-cli, not a user's API.
#[doc(hidden)]
pub use command::{CommandOptions, RecordOutcome, record_command, record_command_with};

use crate::analysis::Stats;
use crate::artifact::{Metadata, ProcessInfo};
use crate::backend::Recorded;
use crate::encode::{Encoder, Snapshot};
use crate::lifecycle::Stage;
use crate::modules::ModuleMap;
use crate::scope::Scope;
use bpf::{Bpf, Syscalls, exclude_tid, gettid, mapped_objects};
use memtrack_bpf::RawSwitch;
pub(crate) use poll::record_to_event;
use poll::{Marks, Poller, PollerRecording, monotonic_ns};
pub(crate) use stacks::{Defined, SentStacks};

/// Whether this process may load the eBPF tracker: root, or both CAP_BPF (39) and
/// CAP_PERFMON (38) in its effective capabilities. `BackendChoice::Auto` picks eBPF then.
pub fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 39) != 0 && caps & (1 << 38) != 0)
}

/// How long a paused recording (a session accumulating calls, between two calls) keeps its
/// probes attached for the next call: after this, and at most 50 ms later, they are
/// detached (an attached uprobe slows every call of its function even when nothing records),
/// and the next call attaches them again.
pub const IDLE_GRACE: Duration = Duration::from_millis(150);
/// How often the idle watcher of a paused recording looks at it.
const IDLE_CHECK: Duration = Duration::from_millis(50);

/// Default ring buffer: 8 MiB (128 Ki events of 64 bytes in flight), some 18 drain periods
/// at the probes' ceiling rate on two cores: room for a poller delayed by a busy machine. Its
/// pages are mapped twice and all resident, so a larger default costs every recording memory.
pub const DEFAULT_RINGBUF_BYTES: u64 = 8 << 20;

/// Settings fixed when a [`Tracker`] loads.
#[derive(Debug, Clone)]
pub struct TrackerOptions {
    ringbuf_bytes: u64,
    syscalls: bool,
    raw_syscalls: bool,
    stack_depth: u32,
}

/// The default [`TrackerOptions::stack_depth`]: 64 frames.
pub const DEFAULT_STACK_DEPTH: u32 = memtrack_bpf::DEFAULT_STACK_DEPTH;

impl Default for TrackerOptions {
    fn default() -> Self {
        Self {
            ringbuf_bytes: DEFAULT_RINGBUF_BYTES,
            syscalls: true,
            raw_syscalls: false,
            stack_depth: DEFAULT_STACK_DEPTH,
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

    /// Whether to record mmap, munmap, mremap and brk (default: yes). They are recorded
    /// through uprobes on libc's wrappers for the target's pid only, which cost other
    /// processes nothing; calls that bypass libc's wrappers are missed (see
    /// [`TrackerOptions::raw_syscalls`]).
    pub fn syscalls(mut self, on: bool) -> Self {
        self.syscalls = on;
        self
    }

    /// Record mmap, munmap, mremap and brk as raw syscalls (default: no): also those that
    /// bypass libc's wrappers (the dynamic loader mapping libraries, `syscall(2)`, static or
    /// non-glibc code). Its `tp_btf/sys_exit` program runs for every syscall of every process
    /// on the machine while recording, slowing other processes (the guide's performance
    /// page measures it). Needs [`TrackerOptions::syscalls`] on.
    pub fn raw_syscalls(mut self, on: bool) -> Self {
        self.raw_syscalls = on;
        self
    }

    /// Frames kept of each allocation's call stack (default [`DEFAULT_STACK_DEPTH`], at most
    /// 127, the kernel's `perf_event_max_stack`); 0 records no stacks. A deeper stack is cut
    /// and marked [`Stack::truncated`](crate::stack::Stack::truncated). Stacks are walked by frame
    /// pointers: code built without them (Rust's default for your crates: build with
    /// `RUSTFLAGS="-C force-frame-pointers=yes"`) gives stacks that stop early, counted in
    /// [`Recorded::short_stacks`].
    pub fn stack_depth(mut self, frames: u32) -> Self {
        self.stack_depth = frames;
        self
    }

    fn syscall_mode(&self) -> Syscalls {
        match (self.syscalls, self.raw_syscalls) {
            (false, _) => Syscalls::Off,
            (true, false) => Syscalls::Wrappers,
            (true, true) => Syscalls::Raw,
        }
    }

    fn validate(&self) -> Result<(), TrackerError> {
        let b = self.ringbuf_bytes;
        if !b.is_power_of_two() || !(4096..=1 << 30).contains(&b) {
            return Err(TrackerError::InvalidOption(format!(
                "the ring buffer size must be a power of two between 4 KiB and 1 GiB (got {b} bytes)"
            )));
        }
        if self.stack_depth > memtrack_bpf::STACK_MAX {
            return Err(TrackerError::InvalidOption(format!(
                "the stack depth is at most {} frames (the kernel's perf_event_max_stack), got {}",
                memtrack_bpf::STACK_MAX,
                self.stack_depth
            )));
        }
        if self.raw_syscalls && !self.syscalls {
            return Err(TrackerError::InvalidOption(
                "raw syscalls are a way of recording syscalls, which are switched off: drop one of the two options"
                    .into(),
            ));
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
    /// Allocation and free calls of this process's threads outside a thread-scoped
    /// recording's scope, not recorded (since load).
    pub out_of_scope: u64,
}

/// The eBPF program loaded and attached to one process.
pub struct Tracker {
    bpf: Bpf,
    in_process: bool,
    /// The `.bss` switch as last written, and what needs the probes attached.
    switch: Mutex<SwitchState>,
    /// Started by the first recording; kept (ring buffer mapped) for the tracker's lifetime.
    poller: OnceCell<Poller>,
    /// The code mappings of the recorded processes, for their stacks: read by the poller,
    /// updated by the tracer of a following tracker at each exec and dlopen.
    modules: Arc<Mutex<ModuleMap>>,
    /// Wall clock of finding the probe sites at load, over how many files.
    scan: (Duration, usize),
}

/// Where a tracker's start-up time went, wall clock ([`Tracker::startup_times`]): what the
/// first eBPF session of a process pays before it records, phase by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StartupTimes {
    /// Opening memtrack's embedded BPF object: libbpf parses its ELF and BTF.
    pub open: Duration,
    /// Loading it: the kernel's BTF read for CO-RE, every map created (the ring buffer's
    /// pages among them), every program verified and loaded.
    pub load: Duration,
    /// Finding the probe sites: each mapped ELF file's symbol tables read, each probe placed
    /// past its entry point's prologue.
    pub scan: Duration,
    /// Files examined by `scan` (each executable mapping of the process).
    pub files: usize,
    /// Probe sites found.
    pub sites: usize,
    /// The last time the probes were attached (a recording or a [`Counting`] guard starting):
    /// waiting for the previous probes to finish detaching in the background.
    pub attach_wait: Duration,
    /// The same attach: creating the uprobe links (two per file with sites).
    pub attach: Duration,
}

/// The tracker's one lifecycle, behind one lock: the probes are attached exactly while a
/// recording runs, a [`Counting`] guard or a [`ProbeHold`] lives, and the switch says what the
/// program does with a hit.
struct SwitchState {
    sw: RawSwitch,
    /// [`Counting`] guards alive.
    counting: usize,
    /// [`ProbeHold`] guards alive.
    holds: usize,
    /// The one recording a tracker runs at a time.
    stage: Stage,
    /// When the recording last paused (while [`Stage::Paused`]).
    paused_at: Option<Instant>,
    /// Whether a paused recording's probes were detached for being idle (the next call
    /// attaches them again).
    idle_detached: bool,
    /// Whether an idle watcher thread runs (one per tracker at most).
    watched: bool,
}

impl SwitchState {
    /// Nothing attached, nothing counted, no recording.
    fn new() -> Self {
        SwitchState {
            sw: RawSwitch::default(),
            counting: 0,
            holds: 0,
            stage: Stage::Idle,
            paused_at: None,
            idle_detached: false,
            watched: false,
        }
    }

    fn needs_probes(&self) -> bool {
        self.counting > 0
            || self.holds > 0
            || self.stage == Stage::Recording
            || (self.stage == Stage::Paused && !self.idle_detached)
    }

    /// Recording → Paused (the stream bit is off), now.
    fn pause(&mut self) -> Result<(), TrackerError> {
        self.stage
            .step("pause", &[Stage::Recording], Stage::Paused)?;
        self.paused_at = Some(Instant::now());
        Ok(())
    }

    /// Paused → Recording (the switch `sw` written: the stream bit on).
    fn resume(&mut self, sw: RawSwitch) -> Result<(), TrackerError> {
        self.stage
            .step("resume", &[Stage::Paused], Stage::Recording)?;
        self.paused_at = None;
        self.sw = sw;
        Ok(())
    }

    /// Whether a paused recording has been idle long enough to detach its probes.
    fn idle_expired(&self, now: Instant) -> bool {
        self.stage == Stage::Paused
            && !self.idle_detached
            && self
                .paused_at
                .is_some_and(|t| now.duration_since(t) >= IDLE_GRACE)
    }

    /// Idle → Starting; a second recording (another caller of [`Tracker::start_with`]) is
    /// refused.
    fn claim(&mut self) -> Result<(), TrackerError> {
        self.stage
            .step("claim", &[Stage::Idle], Stage::Starting)
            .map_err(|_| TrackerError::AlreadyRecording)
    }

    /// Starting → Recording, with the switch `sw` written.
    fn started(&mut self, sw: RawSwitch) -> Result<(), TrackerError> {
        self.stage
            .step("started", &[Stage::Starting], Stage::Recording)?;
        self.sw = sw;
        Ok(())
    }

    /// Recording or Paused → Stopping (the switch's stream bit is off, or failed to go off).
    fn stop(&mut self) -> Result<(), TrackerError> {
        self.paused_at = None;
        Ok(self
            .stage
            .step("stop", &[Stage::Recording, Stage::Paused], Stage::Stopping)?)
    }

    /// Starting (a failed start) or Stopping (a finished stop) → Idle.
    fn finish(&mut self) -> Result<(), TrackerError> {
        self.idle_detached = false;
        Ok(self
            .stage
            .step("finish", &[Stage::Starting, Stage::Stopping], Stage::Idle)?)
    }
}

static GLOBAL: OnceCell<Tracker> = OnceCell::new();

impl Tracker {
    /// The tracker of this process, loaded and attached on first use (later calls ignore
    /// `opts`). Loading takes tens of milliseconds; sessions reuse it for the process's
    /// lifetime. One recording at a time: [`Tracker::start`] refuses a second.
    pub fn global(opts: &TrackerOptions) -> Result<&'static Tracker, TrackerError> {
        GLOBAL.get_or_try_init(|| Tracker::attach(std::process::id(), opts))
    }

    /// The tracker of this process if [`Tracker::global`] loaded it.
    pub(crate) fn loaded() -> Option<&'static Tracker> {
        GLOBAL.get()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SwitchState> {
        self.switch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the BPF program counting allocations, frees and bytes ([`Tracker::counters`])
    /// while the guard lives, without recording events: a couple of syscalls per read, no
    /// ring buffer traffic. The probes are attached while a guard lives. Guards nest;
    /// recording counts too.
    pub fn counting(&self) -> Result<Counting<'_>, TrackerError> {
        let mut st = self.state();
        if st.counting == 0 {
            self.bpf.attach_probes()?;
            // Counting covers the whole process, not the scope a finished recording left.
            let scope = match st.stage {
                Stage::Idle => memtrack_bpf::SCOPE_PROCESS,
                _ => st.sw.scope,
            };
            let sw = RawSwitch {
                enabled: st.sw.enabled | memtrack_bpf::SWITCH_COUNT,
                scope,
                ..st.sw
            };
            if let Err(e) = self.bpf.set_switch(sw) {
                if !st.needs_probes() {
                    self.bpf.detach_probes();
                }
                return Err(e);
            }
            st.sw = sw;
        }
        st.counting += 1;
        Ok(Counting { tracker: self })
    }

    /// Keeps the probes attached (doing nothing while no recording or counting runs) until
    /// the guard is dropped: a session that ends while the next one waits hands the attached
    /// probes over instead of detaching and attaching them again.
    pub(crate) fn hold(&'static self) -> Result<ProbeHold, TrackerError> {
        let mut st = self.state();
        self.bpf.attach_probes()?;
        st.holds += 1;
        Ok(ProbeHold { tracker: self })
    }

    /// Starts the thread that detaches a paused recording's probes once it has been idle for
    /// [`IDLE_GRACE`]; it ends when the recording stops. Called while the recording is paused,
    /// it returns once the thread has excluded itself from recording (its start-up
    /// allocations happen before: none is seen, not even as another thread's); it allocates
    /// nothing while it runs.
    fn watch_idle(&'static self) -> Result<(), TrackerError> {
        let excluded = self.in_process.then(|| Arc::clone(&self.bpf.excluded));
        let (ready, started) = std::sync::mpsc::sync_channel::<bool>(1);
        let spawned = std::thread::Builder::new()
            .name("memtrack-idle".into())
            .spawn(move || {
                // Not excluded, its rare allocations would be the user's: then it stops.
                let excluded = excluded.is_none_or(|ex| exclude_tid(&ex, gettid()).is_ok());
                let _ = ready.send(excluded);
                if !excluded {
                    return;
                }
                loop {
                    std::thread::sleep(IDLE_CHECK);
                    let mut st = self.state();
                    match st.stage {
                        Stage::Paused | Stage::Recording => {}
                        Stage::Idle | Stage::Starting | Stage::Stopping => {
                            st.watched = false;
                            return;
                        }
                    }
                    if st.idle_expired(Instant::now()) {
                        st.idle_detached = true;
                        self.detach_after_recording(&st);
                    }
                }
            })
            .map_err(|source| TrackerError::Io {
                what: "starting the idle watcher".into(),
                source,
            })?;
        match started.recv() {
            Ok(true) => Ok(()),
            _ => {
                let _ = spawned.join();
                Err(TrackerError::Io {
                    what: "excluding the idle watcher from recording".into(),
                    source: std::io::Error::other("its per-thread state could not be written"),
                })
            }
        }
    }

    /// Whether the calling thread is in the scope of the recording running now (always, for
    /// a process-wide one; `false` if none runs).
    pub(crate) fn current_thread_in_scope(&self) -> Result<bool, TrackerError> {
        let st = self.state();
        if st.stage != Stage::Recording {
            return Ok(false);
        }
        let tid = gettid();
        if st.sw.scope == memtrack_bpf::SCOPE_PROCESS || st.sw.caller == tid {
            return Ok(true);
        }
        bpf::in_scope(&self.bpf.excluded, tid, st.sw.generation)
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
        // Another process (`record --no-follow`): the processes it starts are counted.
        let follow = if pid == std::process::id() {
            memtrack_bpf::FOLLOW_NONE
        } else {
            memtrack_bpf::FOLLOW_COUNT
        };
        let bpf = Bpf::load(
            pid,
            opts.ringbuf_bytes,
            opts.syscall_mode(),
            follow,
            opts.stack_depth,
        )?;
        let t = Instant::now();
        for f in files {
            // A file that vanished or is not ELF (a font, a locale archive) is not an error.
            match bpf.add_file(f) {
                Ok(_) | Err(TrackerError::Elf(_) | TrackerError::Io { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let scan = t.elapsed();
        if bpf.sites() == 0 {
            return Err(TrackerError::NoAllocatorSymbols {
                program: None,
                files: files.to_vec(),
            });
        }
        Ok(Self {
            bpf,
            in_process: pid == std::process::id(),
            switch: Mutex::new(SwitchState::new()),
            poller: OnceCell::new(),
            modules: Arc::default(),
            scan: (scan, files.len()),
        })
    }

    /// Loads the program to record a tree of processes that a tracer follows (`record`'s
    /// default): nothing is recorded until [`Tracker::follow_process`] adds a process, whose
    /// probes [`Tracker::attach_process_files`] attaches (pid-scoped, one set per process).
    pub(crate) fn following(first: u32, opts: &TrackerOptions) -> Result<Self, TrackerError> {
        opts.validate()?;
        let _log = error::LibbpfLog::capture();
        let bpf = Bpf::load(
            first,
            opts.ringbuf_bytes,
            opts.syscall_mode(),
            memtrack_bpf::FOLLOW_TREE,
            opts.stack_depth,
        )?;
        Ok(Self {
            bpf,
            in_process: false,
            switch: Mutex::new(SwitchState::new()),
            poller: OnceCell::new(),
            modules: Arc::default(),
            scan: (Duration::ZERO, 0),
        })
    }

    /// Where this tracker's start-up time went, and its last attach's.
    pub fn startup_times(&self) -> StartupTimes {
        let (open, load) = self.bpf.load_times;
        let (attach_wait, attach) = *self
            .bpf
            .attach_times
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        StartupTimes {
            open,
            load,
            scan: self.scan.0,
            files: self.scan.1,
            sites: self.bpf.sites(),
            attach_wait,
            attach,
        }
    }

    /// Reads process `pid`'s code mappings for its stacks (a tracer, with `pid` stopped after
    /// a fork or a dlopen: its new mappings hold the code it runs from now on). A process
    /// that is gone has nothing to read.
    pub(crate) fn scan_modules(&self, pid: u32) {
        let mut m = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let _ = m.scan(pid, crate::artifact::monotonic_ns());
    }

    /// Process `pid` executed a program (a tracer at its exec stop): its stacks from now on
    /// are resolved against the new image's mappings, read now.
    pub(crate) fn exec_modules(&self, pid: u32) {
        let mut m = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let now = crate::artifact::monotonic_ns();
        m.exec(pid, now);
        let _ = m.scan(pid, now);
    }

    /// Records process `pid` from now on (a following tracker).
    pub(crate) fn follow_process(&self, pid: u32) -> Result<(), TrackerError> {
        self.bpf.follow_process(pid)
    }

    /// Stops recording process `pid` at once; its probes are detached in the background.
    pub(crate) fn unfollow_process(&self, pid: u32) {
        self.bpf.unfollow_process(pid)
    }

    /// Detaches process `pid`'s probes and waits until they are gone (before attaching new
    /// ones after its image changed under a thread that no longer exists).
    pub(crate) fn relink_process(&self, pid: u32) -> Result<(), TrackerError> {
        self.bpf.relink_process(pid)
    }

    /// Attaches process `pid`'s probes on `files` (those it has none on yet). Returns the
    /// files whose allocator could not be probed, and why.
    pub(crate) fn attach_process_files(
        &self,
        pid: u32,
        files: &[PathBuf],
    ) -> Result<Vec<(PathBuf, String)>, TrackerError> {
        let _log = error::LibbpfLog::capture();
        self.bpf.attach_process_files(pid, files)
    }

    /// Whether any of `files` (attached with [`Tracker::attach_process_files`]) defines an
    /// allocator entry point.
    pub(crate) fn any_allocator(&self, files: &[PathBuf]) -> bool {
        self.bpf.any_allocator(files)
    }

    /// Number of probe sites found (attached while recording or counting).
    pub fn probe_sites(&self) -> usize {
        self.bpf.sites()
    }

    /// Probes the ELF objects the target has mapped since the last call (libraries it
    /// `dlopen`ed that define their own allocator). Returns the number of new sites. Calls
    /// made before this runs are not seen.
    pub(crate) fn attach_new_objects(&self) -> Result<usize, TrackerError> {
        let mut n = 0;
        for f in mapped_objects(self.bpf.target)? {
            match self.bpf.add_file(&f) {
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
            out_of_scope: s.out_of_scope,
        })
    }

    /// Starts recording every thread of the target (but memtrack's own) into a new artifact
    /// written to `out`, compressed by `workers` threads (this sets `opts`'s `workers`).
    /// In-process, the poller and the encoder's threads are excluded from recording before
    /// the switch goes on (`opts`'s `on_thread_start` hook is replaced to do that); a second
    /// concurrent recording is refused with [`TrackerError::AlreadyRecording`].
    pub fn start<W: Write + Send + 'static>(
        &self,
        out: W,
        meta: &Metadata,
        opts: EncoderOptions,
        workers: usize,
    ) -> Result<Recording<'_, W>, TrackerError> {
        self.start_scoped(out, meta, opts, workers, Scope::Process)
    }

    /// [`Tracker::start`] recording only `scope`: with [`Scope::Threads`] (in-process only),
    /// the calling thread and the threads spawned from it (or from them) while recording.
    pub fn start_scoped<W: Write + Send + 'static>(
        &self,
        out: W,
        meta: &Metadata,
        opts: EncoderOptions,
        workers: usize,
        scope: Scope,
    ) -> Result<Recording<'_, W>, TrackerError> {
        self.start_with(out, meta, opts, workers, Capture::new(scope))
    }

    /// [`Tracker::start`] recording what `capture` asks for: its scope, and with
    /// [`Capture::lock_waits`] every context switch of the recorded threads.
    pub fn start_with<W: Write + Send + 'static>(
        &self,
        out: W,
        meta: &Metadata,
        opts: EncoderOptions,
        workers: usize,
        capture: Capture,
    ) -> Result<Recording<'_, W>, TrackerError> {
        let scope = capture.scope;
        if scope == Scope::Threads && !self.in_process {
            return Err(TrackerError::InvalidOption(
                "a thread scope needs the tracker of this process (Tracker::global); \
                 a tracker attached to another process records all of it"
                    .into(),
            ));
        }
        self.state().claim()?;
        let result = self.start_claimed(out, meta, opts, workers, capture);
        if result.is_err() {
            // Starting → Idle cannot be refused: the claim above holds the stage.
            let _ = self.state().finish();
        }
        result
    }

    fn start_claimed<W: Write + Send + 'static>(
        &self,
        out: W,
        meta: &Metadata,
        opts: EncoderOptions,
        workers: usize,
        capture: Capture,
    ) -> Result<Recording<'_, W>, TrackerError> {
        let scope = capture.scope;
        let exclude = self.in_process.then(|| Arc::clone(&self.bpf.excluded));
        let encoder = Self::encoder(out, meta, opts.workers(workers), exclude.as_ref())?;
        let at_start = self.bpf.stats()?;
        let poller = self.poller.get_or_try_init(|| {
            // A tracer updates the module map at each exec of a followed process; without
            // one (in-process, `--no-follow`), the stream's exec events do.
            let table = SentStacks::new(Arc::clone(&self.modules), !self.bpf.follows());
            Poller::spawn(Arc::clone(&self.bpf.events), exclude, table)
        })?;
        let mut st = self.state();
        let attached = self.attach_for_recording(&st, capture);
        let snapshot = Arc::new(Snapshot::default());
        let marks = Arc::new(Marks::default());
        let recorded = attached.and_then(|()| {
            poller.record(Box::new(encoder), Arc::clone(&snapshot), Arc::clone(&marks))
        });
        let poller = match recorded {
            Ok(p) => p,
            Err(e) => {
                self.detach_after_recording(&st);
                return Err(e);
            }
        };
        let sw = RawSwitch {
            enabled: st.sw.enabled | memtrack_bpf::SWITCH_STREAM,
            scope: match scope {
                Scope::Process => memtrack_bpf::SCOPE_PROCESS,
                Scope::Threads => memtrack_bpf::SCOPE_THREADS,
            },
            generation: st.sw.generation.wrapping_add(1),
            // A thread scope covers the calling thread (by this field) and the threads it
            // spawns (marked by the fork program).
            caller: match scope {
                Scope::Process => 0,
                Scope::Threads => gettid(),
            },
        };
        // Recording starts last: the new scope, generation and caller, then the switch goes
        // on. The program may read the switch while user space writes it (a plain copy, not
        // atomic): writing the rest first means a torn read mixes only the `enabled` bits,
        // never an old generation or caller with the stream on.
        let on = self
            .bpf
            .set_switch(RawSwitch {
                enabled: st.sw.enabled,
                ..sw
            })
            .and_then(|()| self.bpf.set_switch(sw));
        if let Err(e) = on {
            drop(poller.finish());
            self.detach_after_recording(&st);
            return Err(e);
        }
        st.started(sw)?;
        Ok(Recording {
            tracker: self,
            poller: Some(poller),
            snapshot,
            marks,
            capture,
            drops_at_start: at_start.drops,
            out_of_scope_at_start: at_start.out_of_scope,
            unfollowed_at_start: at_start.unfollowed,
            stats_at_start: at_start,
            iterations: None,
            processes: Vec::new(),
            _out: PhantomData,
        })
    }

    /// The recording's encoder; in-process (`exclude`), once its writer and compression
    /// threads have excluded themselves from recording, so that none of their allocations is
    /// the user's.
    fn encoder<W: Write + Send + 'static>(
        out: W,
        meta: &Metadata,
        opts: EncoderOptions,
        exclude: Option<&Arc<bpf::ThreadStates>>,
    ) -> Result<Encoder<W>, TrackerError> {
        let Some(ex) = exclude else {
            return Ok(Encoder::new(out, meta, opts)?);
        };
        let threads = opts.worker_count() + 1;
        let registered = Arc::new(AtomicUsize::new(0));
        let (ex, reg) = (Arc::clone(ex), Arc::clone(&registered));
        let encoder = Encoder::new(
            out,
            meta,
            opts.on_thread_start(Arc::new(move || {
                if exclude_tid(&ex, gettid()).is_ok() {
                    reg.fetch_add(1, Ordering::AcqRel);
                }
            })),
        )?;
        // The threads run the hook as they start: wait for them.
        let deadline = Instant::now() + Duration::from_secs(2);
        while registered.load(Ordering::Acquire) < threads && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        let got = registered.load(Ordering::Acquire);
        if got < threads {
            return Err(TrackerError::Io {
                what: format!(
                    "excluding memtrack's encoder threads from recording ({got} of {threads} \
                     registered)"
                ),
                source: std::io::Error::from(std::io::ErrorKind::TimedOut),
            });
        }
        Ok(encoder)
    }

    /// Attaches what a recording needs: the probes, the raw-syscall tracepoint if asked for,
    /// the fork tracepoint for a thread scope, the context-switch tracepoint for lock waits.
    fn attach_for_recording(&self, st: &SwitchState, capture: Capture) -> Result<(), TrackerError> {
        let attached = (|| {
            self.bpf.attach_probes()?;
            self.bpf.attach_syscalls()?;
            self.bpf.attach_exec()?;
            if capture.scope == Scope::Threads || self.bpf.counts_children() {
                self.bpf.attach_fork()?;
            }
            if capture.lock_waits {
                self.bpf.attach_switch()?;
            }
            Ok::<_, TrackerError>(())
        })();
        if attached.is_err() {
            self.detach_after_recording(st);
        }
        attached
    }

    /// Detaches what only a recording needs (the probes stay while counting).
    fn detach_after_recording(&self, st: &SwitchState) {
        self.bpf.detach_syscalls();
        self.bpf.detach_fork();
        self.bpf.detach_exec();
        self.bpf.detach_switch();
        if !st.needs_probes() {
            self.bpf.detach_probes_in_background();
        }
    }
}

/// What a recording captures besides allocations ([`Tracker::start_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capture {
    /// Which threads are recorded.
    pub scope: Scope,
    /// Whether every context switch of the recorded threads is recorded
    /// ([`EventKind::SwitchOut`](crate::event::EventKind::SwitchOut) with the leaving thread's stack,
    /// [`EventKind::SwitchIn`](crate::event::EventKind::SwitchIn)), for lock waits. Its
    /// `tp_btf/sched_switch` program runs for every context switch on the machine while
    /// such a recording runs, and is detached when it stops.
    pub lock_waits: bool,
}

impl Capture {
    /// Allocations of `scope`, no context switches.
    pub fn new(scope: Scope) -> Self {
        Self {
            scope,
            lock_waits: false,
        }
    }

    /// Also record the context switches of the recorded threads (lock waits).
    pub fn lock_waits(mut self, on: bool) -> Self {
        self.lock_waits = on;
        self
    }
}

/// Keeps the probes attached; see [`Tracker::hold`].
pub(crate) struct ProbeHold {
    tracker: &'static Tracker,
}

impl Drop for ProbeHold {
    fn drop(&mut self) {
        let t = self.tracker;
        let mut st = t.state();
        st.holds -= 1;
        if !st.needs_probes() {
            t.bpf.detach_probes_in_background();
        }
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
        let mut st = t.state();
        st.counting -= 1;
        if st.counting == 0 {
            let sw = RawSwitch {
                enabled: st.sw.enabled & !memtrack_bpf::SWITCH_COUNT,
                ..st.sw
            };
            // Failing to switch counting off costs only the counting: nothing to report.
            if t.bpf.set_switch(sw).is_ok() {
                st.sw = sw;
            }
            if !st.needs_probes() {
                t.bpf.detach_probes_in_background();
            }
        }
    }
}

/// A recording in progress; [`Recording::stop`] finishes the artifact. Dropping it without
/// `stop` stops and finishes too, but the result (and any error) is lost.
pub struct Recording<'t, W: Write + Send + 'static> {
    tracker: &'t Tracker,
    poller: Option<PollerRecording>,
    snapshot: Arc<Snapshot>,
    /// Iteration marks, put among the events by the poller.
    marks: Arc<Marks>,
    /// What it captures, to attach again after an idle pause.
    capture: Capture,
    drops_at_start: u64,
    out_of_scope_at_start: u64,
    unfollowed_at_start: u64,
    stats_at_start: memtrack_bpf::RawStats,
    iterations: Option<u64>,
    processes: Vec<ProcessInfo>,
    _out: PhantomData<fn() -> W>,
}

impl<W: Write + Send + 'static> Recording<'_, W> {
    /// The numbers so far: everything submitted before the call, drained and analysed (within
    /// the poller's 10 ms drain period). Allocates nothing on the calling thread.
    pub fn stats(&self) -> Result<Stats, TrackerError> {
        if let Some(p) = &self.poller {
            p.wake();
        }
        self.snapshot
            .ask(Duration::from_secs(10))
            .ok_or_else(|| TrackerError::Io {
                what: "taking a snapshot: memtrack's poller thread did not answer within 10 s"
                    .into(),
                source: std::io::Error::from(std::io::ErrorKind::TimedOut),
            })
    }

    /// Stores in the artifact's trailer that it covers `n` iterations of a measured routine
    /// (see [`Final::iterations`](crate::artifact::Final::iterations)).
    pub fn set_iterations(&mut self, n: u64) {
        self.iterations = Some(n);
    }

    /// Events the program dropped since the recording started (the ring buffer was full).
    pub(crate) fn lost_so_far(&self) -> Result<u64, TrackerError> {
        Ok(self
            .tracker
            .bpf
            .stats()?
            .drops
            .wrapping_sub(self.drops_at_start))
    }

    fn mark(&self, kind: crate::event::EventKind) {
        let pid = std::process::id();
        self.marks.push(crate::event::Event::new(
            monotonic_ns(),
            pid,
            gettid(),
            kind,
        ));
    }

    /// Ends the calling thread's iteration (`IterationEnd`, if `end_iteration`) and pauses: the
    /// stream bit goes off, the probes stay attached for [`IDLE_GRACE`] (then a watcher thread
    /// detaches them), the poller and the artifact stay for the next call
    /// ([`Recording::resume`]).
    pub(crate) fn pause(&self, end_iteration: bool) -> Result<(), TrackerError> {
        let t = self.tracker;
        let mut st = t.state();
        // The calling thread leaves the scope with the stream, until its next call: between
        // calls it is not the function's (another thread's call may run meanwhile). One write:
        // a torn read sees the stream on with no caller, or off with the caller, both nothing.
        let sw = RawSwitch {
            enabled: st.sw.enabled & !memtrack_bpf::SWITCH_STREAM,
            caller: 0,
            ..st.sw
        };
        t.bpf.set_switch(sw)?;
        st.sw = sw;
        if end_iteration {
            self.mark(crate::event::EventKind::IterationEnd);
        }
        st.pause()?;
        if !st.watched
            && let Some(global) = Tracker::loaded().filter(|g| std::ptr::eq(*g, t))
        {
            st.watched = global.watch_idle().is_ok();
        }
        Ok(())
    }

    /// Paused → Recording for the next call, made on the calling thread: the probes attached
    /// again if they were detached for being idle, an `IterationStart`, then one write of the
    /// switch: the stream bit on and the calling thread the scope's caller (threads that
    /// earlier calls started stay in the scope: a pool a call started does the next calls'
    /// work too). A torn read of that write sees the stream off, or on with no caller.
    pub(crate) fn resume(&self) -> Result<(), TrackerError> {
        let t = self.tracker;
        let mut st = t.state();
        if st.stage != Stage::Paused {
            return Err(crate::lifecycle::WrongStage {
                transition: "resume",
                stage: st.stage,
            }
            .into());
        }
        if st.idle_detached {
            t.attach_for_recording(&st, self.capture)?;
            st.idle_detached = false;
        }
        self.mark(crate::event::EventKind::IterationStart);
        let on = RawSwitch {
            enabled: st.sw.enabled | memtrack_bpf::SWITCH_STREAM,
            caller: match self.capture.scope {
                Scope::Process => 0,
                Scope::Threads => gettid(),
            },
            ..st.sw
        };
        t.bpf.set_switch(on)?;
        st.resume(on)
    }

    /// Stores in the artifact's trailer the processes a recording followed (see
    /// [`Final::processes`](crate::artifact::Final::processes)).
    pub(crate) fn set_processes(&mut self, processes: Vec<ProcessInfo>) {
        self.processes = processes;
    }

    /// Stops recording: switch off, drain the ring buffer's tail, finish the artifact.
    pub fn stop(mut self) -> Result<Recorded, TrackerError> {
        self.drain_and_finish()
    }

    fn drain_and_finish(&mut self) -> Result<Recorded, TrackerError> {
        let Some(poller) = self.poller.take() else {
            return Err(TrackerError::Internal("the recording was already stopped"));
        };
        let t = self.tracker;
        let off = {
            let mut st = t.state();
            // Counting that goes on counts the whole process again.
            let scope = match st.counting {
                0 => st.sw.scope,
                _ => memtrack_bpf::SCOPE_PROCESS,
            };
            let sw = RawSwitch {
                enabled: st.sw.enabled & !memtrack_bpf::SWITCH_STREAM,
                scope,
                ..st.sw
            };
            let off = t.bpf.set_switch(sw);
            if off.is_ok() {
                st.sw = sw;
            }
            off.and(st.stop())
        };
        let drained = poller.finish();
        {
            let mut st = t.state();
            t.detach_after_recording(&st);
            st.finish()
        }?;
        off?;
        let mut drained = drained?;
        let stats = t.bpf.stats()?;
        let out_of_scope = stats.out_of_scope.wrapping_sub(self.out_of_scope_at_start);
        let lost_events = stats
            .drops
            .wrapping_sub(self.drops_at_start)
            // Records the poller could not decode (a mismatched object) are lost too.
            + drained.malformed;
        let push_error = drained.push_error.take();
        let (short_stacks, short_stacks_in_libc) =
            (drained.short_stacks, drained.short_stacks_in_libc);
        let encoder = drained.encoder::<W>().ok_or(TrackerError::Internal(
            "the poller returned another recording's encoder",
        ))?;
        let mut encoder = encoder;
        if let Some(n) = self.iterations {
            encoder.set_iterations(n);
        }
        let unfollowed = stats.unfollowed.wrapping_sub(self.unfollowed_at_start);
        encoder.set_processes(std::mem::take(&mut self.processes), unfollowed);
        encoder.set_short_stacks(short_stacks, short_stacks_in_libc);
        let written = encoder.finish(lost_events)?;
        if let Some(e) = push_error {
            return Err(e.into());
        }
        Ok(Recorded {
            written,
            lost_events,
            out_of_scope,
            unfollowed_processes: unfollowed,
            stacks: stats.stacks.wrapping_sub(self.stats_at_start.stacks),
            short_stacks,
            short_stacks_in_libc,
            truncated_stacks: stats
                .stacks_truncated
                .wrapping_sub(self.stats_at_start.stacks_truncated),
            stack_collisions: stats
                .stack_collisions
                .wrapping_sub(self.stats_at_start.stack_collisions),
            stacks_not_remembered: stats
                .stack_map_full
                .wrapping_sub(self.stats_at_start.stack_map_full),
        })
    }
}

impl<W: Write + Send + 'static> Drop for Recording<'_, W> {
    fn drop(&mut self) {
        if self.poller.is_some() {
            let _ = self.drain_and_finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SwitchState {
        SwitchState::new()
    }

    #[test]
    fn one_recording_at_a_time_until_it_has_drained() {
        let mut st = state();
        st.claim().unwrap();
        assert!(matches!(st.claim(), Err(TrackerError::AlreadyRecording)));
        // Setting up records nothing yet: the probes are not needed for it.
        assert!(!st.needs_probes());
        let sw = RawSwitch {
            enabled: memtrack_bpf::SWITCH_STREAM,
            generation: 1,
            ..RawSwitch::default()
        };
        // Stopping or finishing a recording that has not started is refused, and changes nothing.
        assert!(matches!(st.stop(), Err(TrackerError::Internal("stop"))));
        st.started(sw).unwrap();
        assert_eq!(st.sw.generation, 1);
        assert!(st.needs_probes());
        assert!(matches!(st.claim(), Err(TrackerError::AlreadyRecording)));
        assert!(matches!(
            st.started(sw),
            Err(TrackerError::Internal("started"))
        ));
        assert!(matches!(st.finish(), Err(TrackerError::Internal("finish"))));
        st.stop().unwrap();
        // Stopping: the probes may go, but the next recording waits for the tail.
        assert!(!st.needs_probes());
        assert!(matches!(st.claim(), Err(TrackerError::AlreadyRecording)));
        assert!(matches!(st.stop(), Err(TrackerError::Internal("stop"))));
        st.finish().unwrap();
        assert_eq!(st.stage, Stage::Idle);
        st.claim().unwrap();
    }

    #[test]
    fn a_failed_start_frees_the_stream() {
        let mut st = state();
        st.claim().unwrap();
        st.finish().unwrap();
        assert_eq!(st.stage, Stage::Idle);
        st.claim().unwrap();
    }

    #[test]
    fn counting_and_holds_keep_the_probes_without_a_recording() {
        let mut st = state();
        st.counting = 1;
        assert!(st.needs_probes());
        st.counting = 0;
        st.holds = 1;
        assert!(st.needs_probes());
        st.holds = 0;
        assert!(!st.needs_probes());
    }
}
