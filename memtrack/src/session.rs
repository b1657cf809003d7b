//! Sessions: record one stretch of this process's own execution into a named artifact.
//!
//! ```text
//! memtrack::start("parse_json")?          load the tracker once per process (then reuse it),
//!     │                                   exclude memtrack's threads, switch recording on
//!     ├── the code being measured
//!     └── session.finish()? -> Report     switch off, drain, write the artifact atomically,
//!                                         return the totals computed while streaming
//! ```
//! Dropping a [`Session`] without [`Session::finish`] (early return, panic) finishes it too and
//! prints the summary line (or the error) on stderr; `process::exit` and `mem::forget` skip
//! that, leaving only the temporary file `<name>.memtrack.XXXXXX.partial` (random characters,
//! see [`Output`](crate::artifact::Output); [`Session::partial_path`] names it), whose complete frames
//! `memtrack show` recovers.
//!
//! Sessions of one process take turns: `Idle → Recording(name) → HandingOff(probes) → Recording`
//! or `→ Idle`, one state behind one lock, in `session/lifecycle.rs`.

mod calls;
mod lifecycle;
mod parts;

pub(crate) use calls::resume_open;
pub use calls::{Call, finish_calls};

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::allocator::allocator_installed;
use crate::analysis::Stats;
use crate::artifact::{Backend, Metadata, Output, OutputError};
#[cfg(feature = "criterion")]
use crate::backend::Counter;
use crate::backend::{Options, Recorder, Recording};
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::locks::{LockWaits, LockWaitsError};
use crate::report::Report;
use crate::scope::Scope;
use crate::tracker::{ProbeHold, Tracker};
use lifecycle::{Lifecycle, Refused, Turn};
use parts::{Part, PartArtifact};

/// The sessions of this process take turns (each recorder records one session at a time); a
/// session that ends while another waits hands it the attached eBPF probes. See [`lifecycle`].
static SESSIONS: Lifecycle<ProbeHold> = Lifecycle::new();

/// The name of the session running in this process, if any.
pub(crate) fn active_name() -> Option<String> {
    SESSIONS.running()
}

/// Settings of a [`Session`]; [`start`] uses the defaults.
///
/// # Examples
///
/// ```
/// # #[global_allocator]
/// # static ALLOC: memtrack::Allocator = memtrack::Allocator::system();
/// # fn main() -> Result<(), memtrack::Error> {
/// use memtrack::{BackendChoice, Error, SessionBuilder};
///
/// let session = SessionBuilder::new("two_strings")
///     .backend(BackendChoice::Alloc) // no privileges needed
///     .in_memory(true)
///     .quiet(true)
///     .max_allocations(1)
///     .start()?;
/// let (a, b) = (String::from("one"), String::from("two"));
/// match session.finish() {
///     Err(Error::LimitExceeded { report, .. }) => assert_eq!(report.allocations(), 2),
///     other => panic!("expected the limit to be exceeded, got {other:?}"),
/// }
/// # drop((a, b));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SessionBuilder {
    name: String,
    output_dir: Option<PathBuf>,
    ringbuf_bytes: Option<u64>,
    quiet: bool,
    workers: usize,
    limits: Limits,
    backend: Option<BackendChoice>,
    scope: Scope,
    in_memory: bool,
    lock_waits: bool,
    stack_depth: u32,
    /// Started for a recording of calls ([`calls`]): an in-memory one keeps its artifact in
    /// memory, since a call of another name may set it aside to be joined with later parts.
    accumulating: bool,
    /// Whether an artifact already at this session's path is replaced (the default) or an
    /// error ([`NO_REPLACE`]).
    replace: bool,
}

/// The environment variable that makes every session's default [`SessionBuilder::replace`]
/// `false` when set to anything but `0` or nothing: `memtrack bench` sets it, having cleared
/// the artifacts' directory, so that two benchmarks whose names give one file are an error
/// instead of one silently replacing the other.
pub const NO_REPLACE: &str = "MEMTRACK_NO_REPLACE";

/// Which recorder a session uses. A session uses exactly one, so no allocation is ever
/// counted twice; the other recorder stays off while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendChoice {
    /// eBPF when this process is privileged (root, or CAP_BPF + CAP_PERFMON), else the
    /// allocator recorder if [`Allocator`](crate::Allocator) is the global allocator, else an
    /// error that says how to get either. The default.
    Auto,
    /// The eBPF tracker: every allocator (Rust, C, C++) and mmap; needs privileges.
    Ebpf,
    /// The in-process recorder of the Rust global allocator ([`Allocator`](crate::Allocator)):
    /// no privileges; C/libc allocations and mmaps are not covered.
    Alloc,
}

impl std::str::FromStr for BackendChoice {
    type Err = Error;

    /// Parses `auto`, `ebpf` or `alloc` (the `backend` option of `#[memtrack]` and the
    /// `MEMTRACK_BACKEND` variable); blank is `auto`.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" | "" => Ok(BackendChoice::Auto),
            "ebpf" => Ok(BackendChoice::Ebpf),
            "alloc" => Ok(BackendChoice::Alloc),
            other => Err(Error::InvalidOption(format!(
                "unknown backend {other:?}: expected \"auto\", \"ebpf\" or \"alloc\""
            ))),
        }
    }
}

/// The backend a session (or a criterion measurement) uses: `choice`, else
/// `$MEMTRACK_BACKEND`, else `auto`; see [`BackendChoice`].
fn resolve_backend(choice: Option<BackendChoice>) -> Result<Backend> {
    let choice = match choice {
        Some(b) => b,
        None => match std::env::var("MEMTRACK_BACKEND") {
            Ok(v) => v.parse()?,
            Err(_) => BackendChoice::Auto,
        },
    };
    let backend = match choice {
        BackendChoice::Ebpf => Backend::Ebpf,
        BackendChoice::Alloc => Backend::Alloc,
        // A kernel the tracker cannot work on leaves the allocator recorder, if installed.
        BackendChoice::Auto
            if crate::tracker::privileged()
                && (crate::tracker::Kernel::get().check().is_ok() || !allocator_installed()) =>
        {
            Backend::Ebpf
        }
        BackendChoice::Auto if allocator_installed() => Backend::Alloc,
        BackendChoice::Auto => return Err(Error::NoBackend),
    };
    if backend == Backend::Alloc && !allocator_installed() {
        return Err(Error::AllocatorNotInstalled);
    }
    Ok(backend)
}

/// Starts a session named `name` with default settings. See [`SessionBuilder`].
///
/// # Errors
///
/// As [`SessionBuilder::start`].
pub fn start(name: impl Into<String>) -> Result<Session> {
    SessionBuilder::new(name).start()
}

impl SessionBuilder {
    /// A session named `name` (the artifact is `<output dir>/<sanitized name>.memtrack`).
    pub fn new(name: impl Into<String>) -> Self {
        SessionBuilder {
            name: name.into(),
            output_dir: None,
            ringbuf_bytes: None,
            quiet: false,
            workers: 1,
            limits: Limits::new(),
            backend: None,
            scope: Scope::default(),
            in_memory: false,
            lock_waits: false,
            stack_depth: crate::allocator::DEFAULT_STACK_DEPTH,
            accumulating: false,
            replace: std::env::var_os(NO_REPLACE).is_none_or(|v| v.is_empty() || v == "0"),
        }
    }

    /// Frames of call stack recorded per allocation (default 64; at most 127; 0 records no
    /// stacks). A deeper stack keeps its innermost frames and is marked truncated. The eBPF
    /// recorder is loaded once per process: only the first session of a process sets it there.
    pub fn stack_depth(mut self, frames: u32) -> Self {
        self.stack_depth = frames;
        self
    }

    /// Also record lock waits (default: no): every context switch of the recorded threads,
    /// with the stack each thread left the CPU in, for `memtrack::locks::lock_waits` (feature `symbolize`; or
    /// `memtrack locks FILE`). The report carries them ([`Report::lock_waits`]) and the
    /// summary line their totals; computing them reads the session's events again when it
    /// finishes (an in-memory session keeps its compressed artifact in memory for that).
    /// Needs the eBPF tracker: with the allocator recorder,
    /// [`start`](Self::start) fails with [`Error::InvalidOption`]. Its `sched_switch` program
    /// runs for every context switch on the machine while the session records.
    pub fn lock_waits(mut self, on: bool) -> Self {
        self.lock_waits = on;
        self
    }

    /// Which threads to record (default [`Scope::Threads`]: the thread that calls `start` and
    /// the threads spawned from it while recording; see [`Scope`]).
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Which recorder to use. Default: `$MEMTRACK_BACKEND` (`auto`, `ebpf` or `alloc`) if set,
    /// else [`BackendChoice::Auto`].
    pub fn backend(mut self, backend: BackendChoice) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Directory of the artifact. Default: `$MEMTRACK_DIR` if set, else `memtrack/` in the
    /// cargo target directory (`$CARGO_TARGET_DIR`, or the `target` the running binary is in).
    pub fn output_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.output_dir = Some(dir.into());
        self
    }

    /// Ring buffer size in MiB, a power of two (default 8:
    /// [`DEFAULT_RINGBUF_BYTES`](crate::tracker::DEFAULT_RINGBUF_BYTES)). Only the first session of a
    /// process sets it: the tracker is loaded once.
    pub fn ringbuf_mib(mut self, mib: u64) -> Self {
        self.ringbuf_bytes = Some(mib << 20);
        self
    }

    /// Write no artifact: the events are analysed as they stream and then dropped, and the
    /// [`Report`] (and the limits checked against it) is all that remains; its
    /// [`Report::path`] is `None` and the summary line says "not written (in-memory
    /// session)". For tests that only assert: nothing to clean up, no output directory needed.
    pub fn in_memory(mut self, in_memory: bool) -> Self {
        self.in_memory = in_memory;
        self
    }

    /// Whether an artifact already at this session's path is replaced when the session
    /// finishes (the default, unless [`NO_REPLACE`] is set). With `false`, such a file makes
    /// [`start`](Self::start), or the finish of a session that raced another for the path, fail
    /// with [`Error::ArtifactTaken`] naming what it holds.
    pub fn replace(mut self, replace: bool) -> Self {
        self.replace = replace;
        self
    }

    /// Do not print the summary line when the session ends.
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// Compression threads (default 1: the measured program keeps the other cores).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Fail [`Session::finish`] if the session makes more than `n` allocations
    /// ([`Totals::allocations`](crate::totals::Totals::allocations); `n` passes).
    /// Limits are for tests; see [`Limits`] for what each number means. A session that lost
    /// events fails any limit (its numbers are incomplete), and every violated limit is
    /// reported in [`Error::LimitExceeded`], which keeps the [`Report`].
    pub fn max_allocations(mut self, n: u64) -> Self {
        self.limits = self.limits.max_allocations(n);
        self
    }

    /// Fail [`Session::finish`] if more than `bytes` bytes are allocated in total (the sum of
    /// the sizes of all allocations, not net of frees; see [`SessionBuilder::max_allocations`]).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.limits = self.limits.max_bytes(bytes);
        self
    }

    /// Fail [`Session::finish`] if live heap bytes ever exceed `bytes`: checks the peak,
    /// [`Totals::peak_live_bytes`](crate::totals::Totals::peak_live_bytes) (see
    /// [`SessionBuilder::max_allocations`]).
    pub fn max_peak(mut self, bytes: u64) -> Self {
        self.limits = self.limits.max_peak(bytes);
        self
    }

    /// Fail [`Session::finish`] unless the session makes exactly `n` allocations
    /// ([`Totals::allocations`](crate::totals::Totals::allocations); `allocations = N` on
    /// `#[memtrack]`): for tests that pin a count. Cannot be combined with [`SessionBuilder::max_allocations`] or
    /// [`SessionBuilder::min_allocations`] ([`SessionBuilder::start`] says so).
    pub fn expect_allocations(mut self, n: u64) -> Self {
        self.limits = self.limits.expect_allocations(n);
        self
    }

    /// Fail [`Session::finish`] if the session makes fewer than `n` allocations (`n` passes).
    pub fn min_allocations(mut self, n: u64) -> Self {
        self.limits = self.limits.min_allocations(n);
        self
    }

    /// Fail [`Session::finish`] if more than `n` heap blocks are ever live at once (the peak
    /// of live blocks, [`Totals::peak_live_blocks`](crate::totals::Totals::peak_live_blocks); see
    /// [`SessionBuilder::max_allocations`]).
    pub fn max_blocks(mut self, n: u64) -> Self {
        self.limits = self.limits.max_blocks(n);
        self
    }

    /// Fail [`Session::finish`] if a heap block allocated during the session is still live at
    /// its end (heap only: mappings are not counted; see [`SessionBuilder::max_allocations`]).
    pub fn no_leaks(mut self) -> Self {
        self.limits = self.limits.no_leaks();
        self
    }

    /// Replaces all limits at once.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Starts recording.
    ///
    /// # Errors
    ///
    /// - [`Error::SessionActive`]: another session of this process is running;
    /// - [`Error::InvalidOption`]: an empty name, `workers(0)`, a stack depth above 127,
    ///   contradictory limits, lock waits with the allocator recorder;
    /// - [`Error::NoBackend`], [`Error::AllocatorNotInstalled`], [`Error::Tracker`]: no
    ///   recorder can record here (the message says what is missing and how to fix it);
    /// - [`Error::Output`]: the artifact cannot be created.
    pub fn start(self) -> Result<Session> {
        self.start_with(false)
    }

    /// Like [`SessionBuilder::start`], but waits for a running session of this process to end
    /// instead of refusing it (as `#[memtrack]` functions do): parallel tests take turns, and
    /// with the default [`Scope::Threads`] each counts only its own threads. Called from a
    /// thread that the running session records (a nested start), it returns
    /// [`Error::NestedSession`] instead of waiting for itself.
    ///
    /// # Errors
    ///
    /// As [`SessionBuilder::start`], except that it waits instead of returning
    /// [`Error::SessionActive`]; [`Error::NestedSession`] as above.
    pub fn start_waiting(self) -> Result<Session> {
        self.start_with(true)
    }

    /// Begins a call of this name in a recording that accumulates calls: the first call
    /// starts it, later calls of the same name (on any thread, one at a time) resume it, and
    /// each call ends with [`Call::end`]. The recording writes one artifact holding every
    /// call, its iterations the calls ([`IterationSpread`](crate::totals::IterationSpread) in its
    /// totals gives each call's spread), and prints one summary line when finished: at
    /// [`finish_calls`] or when the process exits. A call of another name or a session started
    /// by hand sets the recording aside, and the next call records its next part: the artifact
    /// holds every call. This is what `#[memtrack]` does. Limits are checked
    /// per call. The first call's options hold for the whole recording.
    ///
    /// # Errors
    ///
    /// As [`SessionBuilder::start`] for the call that starts the recording.
    pub fn call(self) -> Result<Call> {
        self.validate()?;
        calls::call(self)
    }

    /// Starts the session of an accumulating recording ([`calls`]), waiting for its turn.
    fn start_accumulating(mut self) -> Result<Session> {
        self.accumulating = true;
        self.start_turn(true)
    }

    fn start_with(self, wait: bool) -> Result<Session> {
        self.validate()?;
        calls::make_way(wait, &self.name)?;
        self.start_turn(wait)
    }

    fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::InvalidOption(
                "a session name must not be empty".into(),
            ));
        }
        if self.workers == 0 {
            return Err(Error::InvalidOption(
                "workers must be at least 1 (got 0)".into(),
            ));
        }
        if self.stack_depth > crate::allocator::STACK_MAX {
            return Err(Error::InvalidOption(format!(
                "the stack depth is at most {} frames, got {}",
                crate::allocator::STACK_MAX,
                self.stack_depth
            )));
        }
        Ok(self.limits.validate()?)
    }

    fn start_turn(self, wait: bool) -> Result<Session> {
        let (turn, handed_over) = SESSIONS
            .begin(&self.name, wait, current_thread_recorded)
            .map_err(|refused| match refused {
                Refused::Active(active) => Error::SessionActive {
                    requested: self.name.clone(),
                    active,
                },
                Refused::Nested(active) => Error::NestedSession {
                    requested: self.name.clone(),
                    active,
                },
            })?;
        // Probes handed over by the previous session stay attached until this one has started,
        // or failed to: then they go before the turn ends, so that they are not detached under
        // the next session's start.
        match self.start_recording() {
            Ok(mut session) => {
                session.turn = Some(turn);
                drop(handed_over);
                Ok(session)
            }
            Err(e) => {
                drop(handed_over);
                turn.end(None);
                Err(e)
            }
        }
    }

    fn start_recording(self) -> Result<Session> {
        let backend = resolve_backend(self.backend);
        // Said before "the allocator recorder is not installed": lock waits need eBPF anyway.
        let not_ebpf = matches!(
            backend,
            Ok(Backend::Alloc) | Err(Error::AllocatorNotInstalled)
        );
        if self.lock_waits && not_ebpf {
            return Err(Error::InvalidOption(
                "lock waits need the eBPF tracker (they are context switches the kernel \
                 reports, which the allocator recorder cannot see): run with root or \
                 CAP_BPF + CAP_PERFMON and the eBPF tracker, or drop lock_waits(true)"
                    .into(),
            ));
        }
        let backend = backend?;
        let options = Options {
            scope: self.scope,
            stack_depth: self.stack_depth,
            workers: self.workers,
            lock_waits: self.lock_waits,
            ringbuf_bytes: self.ringbuf_bytes,
        };
        let recorder = Recorder::ready(backend, &options)?;
        // An in-memory session that records lock waits keeps its artifact in memory until it
        // finishes: the waits are computed from it, as from a file; so does one of a
        // recording of calls, whose parts may be joined.
        let memory = (self.in_memory && (self.lock_waits || self.accumulating))
            .then(|| Arc::new(Mutex::new(Vec::new())));
        let (path, output, file) = if let Some(m) = &memory {
            (None, None, Out::Memory(Arc::clone(m)))
        } else if self.in_memory {
            (None, None, Out::Discard)
        } else {
            let dir = match self.output_dir {
                Some(d) => d,
                None => default_output_dir(),
            };
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            let file_name = sanitize(&self.name);
            let target = dir.join(format!("{file_name}.memtrack"));
            if !self.replace && std::fs::symlink_metadata(&target).is_ok() {
                return Err(taken(target, &self.name));
            }
            let output = Output::create(target)?;
            let path = output.path().to_path_buf();
            let file = output.writer()?;
            drop((dir, file_name));
            (Some(path), Some(output), Out::File(file))
        };
        let meta = Metadata::now(std::process::id(), backend).with_name(&self.name);
        let mut session = Session {
            name: self.name,
            path,
            output,
            quiet: self.quiet,
            limits: self.limits,
            scope: self.scope,
            started: Instant::now(),
            recording: None,
            meta,
            iterations: None,
            turn: None,
            lock_waits: self.lock_waits,
            memory,
            replace: self.replace,
        };
        // Recording starts last: nothing here may allocate or free after it (the metadata is
        // kept in the session and freed after recording stops). On error, dropping the
        // session's `Output` removes the temporary file.
        session.recording = Some(recorder.start(file, &session.meta, &options)?);
        session.started = Instant::now();
        Ok(session)
    }
}

/// A recording of this process in progress; see the module docs.
#[must_use = "the session records until it is finished or dropped"]
pub struct Session {
    name: String,
    /// The artifact's path; `None` for an in-memory session (then there is no `output`).
    path: Option<PathBuf>,
    /// The artifact being written, put in place by `finish`.
    output: Option<Output>,
    quiet: bool,
    limits: Limits,
    scope: Scope,
    started: Instant,
    recording: Option<Recording<Out>>,
    meta: Metadata,
    iterations: Option<u64>,
    /// This session's turn in [`SESSIONS`]; ended when the recording has stopped.
    turn: Option<Turn<'static, ProbeHold>>,
    /// Whether it records lock waits.
    lock_waits: bool,
    /// The artifact of an in-memory session that keeps it (one recording lock waits, or
    /// calls).
    memory: Option<Arc<Mutex<Vec<u8>>>>,
    /// Whether its artifact may replace a file at its path.
    replace: bool,
}

/// Where a session's events go once encoded: its temporary file, nowhere (in memory), or into
/// memory (in memory, with lock waits to compute at the end).
enum Out {
    File(File),
    Discard,
    Memory(Arc<Mutex<Vec<u8>>>),
}

impl Out {
    fn memory(m: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Write for Out {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Out::File(f) => f.write(buf),
            Out::Discard => Ok(buf.len()),
            Out::Memory(m) => Out::memory(m).write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Out::File(f) => f.write_all(buf),
            Out::Discard => Ok(()),
            Out::Memory(m) => Out::memory(m).write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Out::File(f) => f.flush(),
            Out::Discard | Out::Memory(_) => Ok(()),
        }
    }
}

/// The lock waits of a finished session that recorded them, from its artifact (the file at
/// `path`, or the bytes kept in `memory`): the same computation as `memtrack locks FILE`.
fn session_lock_waits(
    path: Option<&Path>,
    memory: Option<&Mutex<Vec<u8>>>,
) -> std::result::Result<LockWaits, Arc<LockWaitsError>> {
    #[cfg(feature = "symbolize")]
    {
        let reader = match (path, memory) {
            (Some(p), _) => crate::artifact::Reader::open(p),
            (None, Some(m)) => {
                crate::artifact::Reader::from_bytes(std::mem::take(&mut *Out::memory(m)))
            }
            (None, None) => unreachable!("a session with lock waits keeps its artifact"),
        };
        let reader = reader.map_err(|e| Arc::new(LockWaitsError::from(e)))?;
        crate::locks::lock_waits_of(&reader, &mut crate::symbolize::Symbolizer::new(), true)
            .map_err(Arc::new)
    }
    #[cfg(not(feature = "symbolize"))]
    {
        let _ = (path, memory);
        Err(Arc::new(LockWaitsError::NoSymbolizer))
    }
}

/// Whether a session is running and records the calling thread (a nested start). Allocates
/// nothing: a nested `#[memtrack]` function asks this inside the session that counts it.
pub(crate) fn recorded_here() -> bool {
    SESSIONS.is_running() && current_thread_recorded()
}

/// Whether the calling thread is recorded by the session running now (its scope includes it).
fn current_thread_recorded() -> bool {
    crate::allocator::current_thread_in_scope()
        || Tracker::loaded().is_some_and(|t| t.current_thread_in_scope().unwrap_or(false))
}

impl Session {
    /// The session's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the artifact will be once the session is finished; `None` for an in-memory
    /// session ([`SessionBuilder::in_memory`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Declares that the session covers `n` iterations of a measured routine: the artifact
    /// stores `n` ([`Final::iterations`](crate::artifact::Final::iterations)), and the summary line,
    /// `memtrack show` and `memtrack compare` give allocations and bytes per iteration, which
    /// stay comparable when the number of iterations varies from run to run (criterion's
    /// `memtrack::criterion::Profiler` does this). Call it before
    /// [`Session::finish`]; the last call counts.
    pub fn set_iterations(&mut self, n: u64) {
        self.iterations = Some(n);
    }

    /// The recording while the session is not finished.
    fn recording(&self) -> Result<&Recording<Out>> {
        self.recording.as_ref().ok_or(Error::SessionFinished)
    }

    /// Recording → Paused: a call of an accumulating recording ended (`end_iteration`), or
    /// its session has just started.
    fn pause(&self, end_iteration: bool) -> Result<()> {
        Ok(self.recording()?.pause(end_iteration)?)
    }

    /// Paused → Recording (the next call, on the calling thread).
    fn resume(&self) -> Result<()> {
        Ok(self.recording()?.resume()?)
    }

    /// Whether the eBPF tracker records it.
    fn records_with_ebpf(&self) -> bool {
        self.recording.as_ref().is_some_and(Recording::is_ebpf)
    }

    /// Events lost so far.
    fn lost_events_so_far(&self) -> Result<u64> {
        Ok(self.recording()?.lost_so_far()?)
    }

    /// Where the artifact is while the session runs: a temporary file beside
    /// [`Session::path`], renamed to it by [`Session::finish`]. A process that ends without
    /// finishing the session (`process::exit`, a crash) leaves it, readable up to its last
    /// complete frame. `None` once finished, or when the path is a device written in place.
    pub fn partial_path(&self) -> Option<&Path> {
        self.output.as_ref().and_then(Output::partial_path)
    }

    /// The numbers so far (allocations, bytes, live now, peak so far), like dhat-rs's
    /// `HeapStats::get()`: every allocation and free made before the call (by the threads in
    /// the session's scope) is counted. It waits for the recorder to drain and analyse them:
    /// up to the eBPF poller's 10 ms drain period, or the allocator recorder's 2 ms merge
    /// window. It allocates nothing on the calling thread, so calling it changes no number;
    /// each call ends the artifact's current frame, so call it between phases, not per event.
    ///
    /// # Errors
    ///
    /// The recorder's error if it failed while recording ([`Error::Tracker`],
    /// [`Error::Allocator`]).
    pub fn stats(&self) -> Result<Stats> {
        Ok(self.recording()?.stats()?)
    }

    /// Stops recording, finishes the artifact (replacing any file of the same name
    /// atomically) and returns the report. Prints the summary line unless quiet. With limits
    /// (see [`SessionBuilder::max_allocations`]) that the report violates, returns
    /// [`Error::LimitExceeded`] with the report and every violation; the artifact is kept.
    /// A dropped session only prints that error: call `finish` to fail on limits.
    ///
    /// # Errors
    ///
    /// - [`Error::LimitExceeded`]: a limit was broken, or events were lost while limits were
    ///   set; it holds the [`Report`] and the violations;
    /// - the recorder's or the encoder's error if recording failed, [`Error::Output`] if the
    ///   artifact could not be put in place (the temporary file is then removed).
    pub fn finish(mut self) -> Result<Report> {
        self.finish_and_enforce()
    }

    fn finish_and_enforce(&mut self) -> Result<Report> {
        let (report, _) = self.stop(true)?;
        if !self.quiet {
            report.announce();
        }
        enforce(&self.limits, report)
    }

    /// Finishes the session as a part of a recording of calls that is set aside: its artifact
    /// finished but not put in place, no summary line, no lock waits (both come when the parts
    /// are joined).
    fn finish_part(mut self) -> Result<Part> {
        let (report, output) = self.stop(false)?;
        let artifact = match (output, self.memory.take()) {
            (Some(output), _) => PartArtifact::File(output),
            (None, Some(memory)) => PartArtifact::Memory(memory),
            (None, None) => unreachable!("a session of calls keeps its artifact"),
        };
        Ok(Part {
            artifact,
            report,
            quiet: self.quiet,
            lock_waits: self.lock_waits,
        })
    }

    /// Stops recording and returns the report: with `commit`, the artifact put in place and
    /// the lock waits computed; without, the finished artifact's [`Output`] handed back.
    fn stop(&mut self, commit: bool) -> Result<(Report, Option<Output>)> {
        let Some(mut recording) = self.recording.take() else {
            return Err(Error::SessionFinished);
        };
        let duration = self.started.elapsed();
        if let Some(n) = self.iterations {
            recording.set_iterations(n);
        }
        // A session waiting for its turn gets the attached probes (kept by `hold`).
        let hold = match &self.turn {
            Some(turn) if recording.is_ebpf() && turn.awaited() => {
                Tracker::loaded().and_then(|t| t.hold().ok())
            }
            _ => None,
        };
        let output = self.output.take();
        let result = recording.stop().map_err(Error::from).and_then(|recorded| {
            let kept = match output {
                Some(output) if commit && !self.replace => {
                    match output.commit_new() {
                        Err(OutputError::Exists { path, .. }) => {
                            return Err(taken(path, &self.name));
                        }
                        r => r?,
                    };
                    None
                }
                Some(output) if commit => {
                    output.commit()?;
                    None
                }
                output => output,
            };
            let lock_waits = (self.lock_waits && commit)
                .then(|| session_lock_waits(self.path.as_deref(), self.memory.as_deref()));
            let report = Report {
                name: self.name.clone(),
                path: self.path.clone(),
                duration,
                backend: self.meta.backend,
                scope: self.scope,
                iterations: self.iterations,
                recorded,
                lock_waits,
            };
            Ok((report, kept))
        });
        if let Some(turn) = self.turn.take() {
            turn.end(hold);
        }
        result
    }
}

/// `Ok(report)` if it keeps `limits`, else [`Error::LimitExceeded`] with it.
fn enforce(limits: &Limits, report: Report) -> Result<Report> {
    let violations = limits.check(report.totals(), report.lost_events());
    if violations.is_empty() {
        Ok(report)
    } else {
        Err(Error::LimitExceeded {
            report: Box::new(report),
            violations,
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.recording.is_some()
            && let Err(e) = self.finish_and_enforce()
        {
            eprintln!("memtrack: {}: {e}", self.name);
        }
    }
}

/// Starts counting with the backend sessions would use (`$MEMTRACK_BACKEND`, else `auto`):
/// what criterion's measurements read. The error says what is missing.
#[cfg(feature = "criterion")]
pub(crate) fn counter() -> Result<Counter> {
    let backend = resolve_backend(None)?;
    let options = Options {
        scope: Scope::Process,
        // The tracker loads once per process: with the defaults, as for a session.
        stack_depth: crate::tracker::DEFAULT_STACK_DEPTH,
        workers: 1,
        lock_waits: false,
        ringbuf_bytes: None,
    };
    Ok(Counter::start(Recorder::ready(backend, &options)?)?)
}

/// [`Error::ArtifactTaken`] for the file at `path`, named after the benchmark it holds.
fn taken(path: PathBuf, name: &str) -> Error {
    let holder = crate::artifact::Reader::open(&path)
        .ok()
        .and_then(|r| r.metadata().name.clone());
    Error::ArtifactTaken {
        path,
        holder,
        name: name.to_string(),
    }
}

/// Longest file name stem [`sanitize`] makes, in bytes (file systems allow 255 for the name).
const MAX_STEM: usize = 200;

/// A file name from a session name, one that no other name gives: `::` becomes `.`; letters,
/// digits, `_` and `-` stay; every other byte (a `.`, a `/`, a space, each byte of a
/// character beyond ASCII) is written `%XX`, so the name can be read back. A name whose
/// escape would be longer than 200 bytes, or an empty one, is cut and ends in `~` and 16 hex
/// digits of a hash of the whole name (a `~` appears nowhere else). Never empty, never hidden.
pub(crate) fn sanitize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    let mut fits = !name.is_empty();
    while let Some(c) = rest.chars().next() {
        let token = if rest.starts_with("::") && !out.is_empty() {
            ".".to_string()
        } else if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            c.to_string()
        } else {
            let mut buf = [0u8; 4];
            c.encode_utf8(&mut buf)
                .bytes()
                .map(|b| format!("%{b:02X}"))
                .collect()
        };
        if out.len() + token.len() > MAX_STEM {
            fits = false;
            break;
        }
        rest = &rest[if token == "." { 2 } else { c.len_utf8() }..];
        out.push_str(&token);
    }
    if !fits {
        // Cut at a token's end: the hash tells the whole name apart.
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        while out.len() > MAX_STEM - 17 {
            let cut = out.rfind(['%', '.']).filter(|&i| out.len() - i <= 3);
            out.truncate(cut.unwrap_or(out.len() - 1));
        }
        out.push_str(&format!("~{hash:016x}"));
    }
    out
}

/// `$MEMTRACK_DIR`, else `<cargo target dir>/memtrack`.
pub(crate) fn default_output_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MEMTRACK_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    target_dir().join("memtrack")
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else the one this test or bench binary runs
/// from, else `target`.
pub(crate) fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    // Test and bench binaries run from `<target>/<profile>/deps/`; cargo marks `<target>`
    // with a CACHEDIR.TAG.
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            if dir.join("CACHEDIR.TAG").is_file() {
                return dir.to_path_buf();
            }
        }
    }
    PathBuf::from("target")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Recorded;

    #[test]
    fn backend_names_parse_and_typos_say_the_choices() {
        assert_eq!(
            "alloc".parse::<BackendChoice>().unwrap(),
            BackendChoice::Alloc
        );
        assert_eq!(
            " ebpf ".parse::<BackendChoice>().unwrap(),
            BackendChoice::Ebpf
        );
        assert_eq!("".parse::<BackendChoice>().unwrap(), BackendChoice::Auto);
        let msg = "dtrace".parse::<BackendChoice>().unwrap_err().to_string();
        assert!(
            msg.contains("\"dtrace\"") && msg.contains("\"alloc\""),
            "{msg}"
        );
    }

    #[test]
    fn enforce_keeps_the_report() {
        let r = Report {
            name: "parse".into(),
            path: None,
            duration: std::time::Duration::ZERO,
            backend: Backend::Ebpf,
            scope: Scope::Threads,
            iterations: None,
            recorded: Recorded::of_totals(crate::totals::Totals {
                allocations: 2,
                ..Default::default()
            }),
            lock_waits: None,
        };
        assert!(enforce(&Limits::new().max_allocations(2), r.clone()).is_ok());
        match enforce(&Limits::new().max_allocations(1), r) {
            Err(Error::LimitExceeded { report, violations }) => {
                assert_eq!(report.allocations(), 2);
                assert_eq!(
                    violations,
                    vec![crate::Violation::Allocations {
                        measured: 2,
                        limit: 1
                    }]
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn names_become_safe_file_names() {
        assert_eq!(sanitize("my_crate::bench::parse"), "my_crate.bench.parse");
        assert_eq!(sanitize("a/b\\c d"), "a%2Fb%5Cc%20d");
        assert_eq!(sanitize("../etc/passwd"), "%2E%2E%2Fetc%2Fpasswd");
        assert_eq!(sanitize("::x"), "%3A%3Ax");
        assert_eq!(sanitize("é"), "%C3%A9");
        assert_eq!(sanitize(&"x".repeat(200)), "x".repeat(200));
        for name in ["", &"x".repeat(201), &"é".repeat(150)] {
            let s = sanitize(name);
            assert!(s.len() <= 200 && s.contains('~'), "{s}");
            assert!(!s.starts_with('.') && !s.contains('/'), "{s}");
        }
    }

    /// Names that used to share a file (`a/b`, `a b`, `a_b`, characters beyond ASCII, long
    /// names alike in their first 200 bytes) each get their own; every name is read back
    /// from its file name unless it was cut.
    #[test]
    fn distinct_names_get_distinct_file_names() {
        let long = "y".repeat(300);
        let names = [
            "a/b".to_string(),
            "a b".into(),
            "a_b".into(),
            "a.b".into(),
            "a::b".into(),
            "a%2Fb".into(),
            "é".into(),
            "ü".into(),
            "".into(),
            "_".into(),
            format!("{long}1"),
            format!("{long}2"),
        ];
        let files: std::collections::BTreeSet<String> = names.iter().map(|n| sanitize(n)).collect();
        assert_eq!(files.len(), names.len(), "{files:?}");
        let unescape = |f: &str| -> String {
            let f = f.replace('.', "::");
            let (mut bytes, b) = (Vec::new(), f.as_bytes());
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                    bytes.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    bytes.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(bytes).unwrap()
        };
        for n in &names[..8] {
            assert_eq!(&unescape(&sanitize(n)), n);
        }
    }
}
