//! The encoder pipeline: events in, a finished artifact out.
//!
//! ```text
//! producer (push)           writer thread ("memtrack-writer")        rayon pool ("memtrack-enc-N")
//! fills a frame buffer ──▶ bounded channel ──▶ takes up to `window` ──▶ compresses them in parallel
//!        ▲                  frames, analyses them in order           (one zstd context per worker)
//!        └── recycled frame buffers ◀── writes records in input order, then the trailer
//! ```
//! Memory is bounded whatever the run length: at most `queue + window + 1` frame buffers exist,
//! all reused. A writer killed mid-run leaves every complete frame readable (see the reader).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::analysis::{Analyzer, ProcessTotals, SizeClass, SizeHistogram, Stats, Timeline};
use crate::artifact::FormatError;
use crate::artifact::{Definitions, FrameScratch, MAX_FRAME_EVENTS};
use crate::artifact::{Final, FrameWriter, Metadata, ProcessInfo, encode_frame, monotonic_ns};
use crate::event::Event;
use crate::stack::{Module, ModuleId, Stack, StackId};
use crate::totals::Totals;

/// Why the encoder pipeline failed.
///
/// `Debug` prints the same message as `Display` (as the crate-wide `Error` does).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// An [`EncoderOptions`] value is out of range; the message names it and the valid range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The writer thread stopped early (after an error that [`Encoder::finish`] reports).
    #[error("the encoder stopped early; `finish()` reports why")]
    Stopped,
    /// Writing the artifact failed, or its bytes could not be made.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Starting one of the encoder's threads failed.
    #[error("{what}: {source}")]
    Spawn {
        /// Which thread or pool.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The writer thread panicked: a bug in memtrack (the artifact is left unfinished).
    #[error("encoder thread: panicked")]
    Panicked,
    /// A call-stack definition ([`Encoder::define_module`], [`Encoder::define_stack`]) the
    /// format cannot hold; the message names the id and what is wrong.
    #[error("invalid definition: {0}")]
    InvalidDefinition(String),
}

/// The message of `Display`, which `.unwrap()` prints.
impl std::fmt::Debug for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

use EncodeError as Error;
type Result<T, E = EncodeError> = std::result::Result<T, E>;

/// A hook run at the start of every thread the encoder spawns (the tracker uses it to exclude
/// the encoder's own threads from recording).
pub type ThreadHook = Arc<dyn Fn() + Send + Sync>;

/// Settings of an [`Encoder`]; checked by [`Encoder::new`].
#[derive(Clone)]
pub struct EncoderOptions {
    workers: usize,
    frame_events: usize,
    window: usize,
    queue: usize,
    level: i32,
    on_thread_start: Option<ThreadHook>,
}

impl Default for EncoderOptions {
    fn default() -> Self {
        EncoderOptions {
            workers: default_workers(),
            frame_events: 32 * 1024,
            window: 0,
            queue: 0,
            level: 1,
            on_thread_start: None,
        }
    }
}

/// Available cores − 2 (leave room for the measured program and the producer), at least 1.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_sub(2)
        .max(1)
}

impl EncoderOptions {
    /// Default settings: [`default_workers`] workers, 32 Ki events per frame, zstd level 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Compression threads (at least 1; 0 is rejected by [`Encoder::new`]).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// The compression threads asked for.
    pub(crate) fn worker_count(&self) -> usize {
        self.workers
    }

    /// Events per frame (1 ..= 4 Mi). Larger frames compress a little better; a crash loses
    /// at most the frame being written.
    pub fn frame_events(mut self, n: usize) -> Self {
        self.frame_events = n;
        self
    }

    /// Frames compressed together (default and minimum: 2 × workers).
    pub fn window(mut self, n: usize) -> Self {
        self.window = n;
        self
    }

    /// zstd compression level (1 ..= 19). Level 1 is the default: it meets the size target
    /// at the highest speed (FORMAT.md has the measurements).
    pub fn level(mut self, level: i32) -> Self {
        self.level = level;
        self
    }

    /// Runs `hook` at the start of every thread the encoder spawns.
    pub fn on_thread_start(mut self, hook: ThreadHook) -> Self {
        self.on_thread_start = Some(hook);
        self
    }

    fn validate(&mut self) -> Result<()> {
        if self.workers == 0 {
            return Err(Error::InvalidOption(
                "workers must be at least 1 (got 0)".into(),
            ));
        }
        if self.frame_events == 0 || self.frame_events > MAX_FRAME_EVENTS as usize {
            return Err(Error::InvalidOption(format!(
                "frame_events must be between 1 and {MAX_FRAME_EVENTS} (got {})",
                self.frame_events
            )));
        }
        if !(1..=19).contains(&self.level) {
            return Err(Error::InvalidOption(format!(
                "level must be between 1 and 19 (got {})",
                self.level
            )));
        }
        self.window = self.window.max(2 * self.workers);
        self.queue = self.queue.max(self.window);
        Ok(())
    }
}

/// What the encoder wrote ([`Encoder::finish`]): the artifact's size and the numbers computed
/// while streaming. What a recorder returns holds it (its `written`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Written {
    /// Frames written.
    pub frames: u64,
    /// Events written.
    pub events: u64,
    /// Length of the artifact in bytes.
    pub bytes: u64,
    /// Totals over every event, computed while streaming (also stored in the trailer).
    pub totals: Totals,
    /// Allocations by size class (the non-empty classes), computed while streaming.
    pub sizes: Vec<SizeClass>,
    /// Live heap and mapped bytes over time in [`TIMELINE_COLUMNS`] columns (a
    /// [`Timeline::growing`] from the first event), computed while streaming.
    pub timeline: Timeline,
    /// Totals of each process (by pid), computed while streaming: one row for a
    /// single-process recording.
    pub per_process: BTreeMap<u32, ProcessTotals>,
}

/// Columns of the [`Written::timeline`] (and a session report's): enough for a terminal-wide
/// chart; a plot at full resolution reads the artifact (`memtrack plot`).
pub const TIMELINE_COLUMNS: usize = 256;

/// The final metadata the producer knows: lost events, end time, iterations, processes.
#[derive(Clone)]
struct Trailer {
    lost_events: u64,
    end_monotonic_ns: u64,
    iterations: Option<u64>,
    processes: Vec<ProcessInfo>,
    unfollowed_processes: u64,
    short_stacks: u64,
    short_stacks_in_libc: u64,
}

struct WriterResult<W> {
    out: W,
    written: Written,
}

/// Where a mid-recording snapshot is asked for and answered: made before recording starts and
/// shared by the measured thread, the thread feeding the encoder and the encoder's writer, so
/// that asking allocates nothing on the measured thread (a mutex and a condition variable).
#[derive(Default)]
pub(crate) struct Snapshot {
    /// Set by the asking thread; the feeding thread takes it.
    requested: AtomicBool,
    answer: Mutex<Option<Stats>>,
    answered: Condvar,
}

impl Snapshot {
    /// Asks for a snapshot and waits for it (the feeding thread must call
    /// [`Snapshot::take_request`] and [`Encoder::snapshot`]); `None` after `timeout`.
    pub(crate) fn ask(&self, timeout: Duration) -> Option<Stats> {
        let mut answer = self.answer.lock().unwrap_or_else(|e| e.into_inner());
        *answer = None;
        self.requested.store(true, Ordering::Release);
        let deadline = Instant::now() + timeout;
        while answer.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            answer = self
                .answered
                .wait_timeout(answer, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        answer.take()
    }

    /// Whether a snapshot was asked for since the last call (for the feeding thread).
    pub(crate) fn take_request(&self) -> bool {
        self.requested.swap(false, Ordering::AcqRel)
    }

    fn answer(&self, stats: Stats) {
        *self.answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
        self.answered.notify_all();
    }
}

/// Streams events into an artifact; see the module docs for the pipeline.
///
/// Call stacks: an event's [`Event::stack`] names a stack given to [`Encoder::define_stack`]
/// before the event is pushed, and a stack's frames name modules given to
/// [`Encoder::define_module`] before it. Each definition is written in the frame being filled
/// when it is given, so it precedes (or shares a frame with) every event that uses it: a prefix
/// of whole frames (a writer killed mid-run) holds every stack its events name.
pub struct Encoder<W: Write + Send + 'static> {
    current: Vec<Event>,
    /// Definitions given since the last frame was shipped: they go with the next frame.
    defs: Definitions,
    /// The ids defined so far (a definition is checked once, not per event).
    modules_defined: rustc_hash::FxHashSet<ModuleId>,
    stacks_defined: rustc_hash::FxHashSet<StackId>,
    end_ns: Option<u64>,
    iterations: Option<u64>,
    processes: Vec<ProcessInfo>,
    unfollowed_processes: u64,
    short_stacks: u64,
    short_stacks_in_libc: u64,
    frame_events: usize,
    tx: Option<SyncSender<Msg>>,
    recycle: Receiver<Vec<Event>>,
    thread: Option<JoinHandle<Result<WriterResult<W>>>>,
}

enum Msg {
    /// A frame's events and the definitions to write with them.
    Frame(Vec<Event>, Option<Box<Definitions>>),
    /// Answer with the analysis of every event sent before this.
    Snapshot(Arc<Snapshot>),
    /// What the trailer needs besides the totals.
    Finish(Trailer),
}

impl<W: Write + Send + 'static> Encoder<W> {
    /// Starts an encoder writing to `out` (wrap files in a `BufWriter` is not needed: whole
    /// frames are written at once). Writes the header for `meta` before returning.
    pub fn new(out: W, meta: &Metadata, mut opts: EncoderOptions) -> Result<Self> {
        opts.validate()?;
        let frames = FrameWriter::new(out, meta)?;
        let hook = opts.on_thread_start.clone();
        let mut pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.workers)
            .thread_name(|i| format!("memtrack-enc-{i}"));
        if let Some(h) = hook.clone() {
            pool = pool.start_handler(move |_| h());
        }
        let pool = pool.build().map_err(|e| Error::Spawn {
            what: "starting the encoder pool",
            source: std::io::Error::other(e),
        })?;
        let (tx, rx) = sync_channel(opts.queue);
        let (recycle_tx, recycle) = sync_channel(opts.queue + opts.window + 1);
        let (window, level) = (opts.window, opts.level);
        let thread = std::thread::Builder::new()
            .name("memtrack-writer".into())
            .spawn(move || {
                if let Some(h) = hook {
                    h();
                }
                writer_loop(frames, pool, rx, recycle_tx, window, level)
            })
            .map_err(|source| Error::Spawn {
                what: "starting the encoder thread",
                source,
            })?;
        Ok(Encoder {
            current: Vec::with_capacity(opts.frame_events),
            defs: Definitions::default(),
            modules_defined: Default::default(),
            stacks_defined: Default::default(),
            end_ns: None,
            iterations: None,
            processes: Vec::new(),
            unfollowed_processes: 0,
            short_stacks: 0,
            short_stacks_in_libc: 0,
            frame_events: opts.frame_events,
            tx: Some(tx),
            recycle,
            thread: Some(thread),
        })
    }

    /// Appends one event. Blocks when the writer is `queue` frames behind (backpressure).
    /// Returns [`EncodeError::Stopped`] if the writer stopped; [`Encoder::finish`] says why.
    #[inline]
    pub fn push(&mut self, ev: Event) -> Result<()> {
        self.current.push(ev);
        if self.current.len() == self.frame_events {
            self.ship()?;
        }
        Ok(())
    }

    /// Appends the events `f` makes of `events`, a frame's room at a time: one check of
    /// the frame's length per slice instead of per event (the allocator recorder's collector).
    #[inline]
    pub(crate) fn extend_mapped<T>(
        &mut self,
        mut events: &[T],
        f: impl Fn(&T) -> Event,
    ) -> Result<()> {
        while !events.is_empty() {
            let room = self.frame_events - self.current.len();
            let (now, rest) = events.split_at(room.min(events.len()));
            self.current.extend(now.iter().map(&f));
            if self.current.len() == self.frame_events {
                self.ship()?;
            }
            events = rest;
        }
        Ok(())
    }

    /// Appends every event of `events`.
    pub fn extend<I: IntoIterator<Item = Event>>(&mut self, events: I) -> Result<()> {
        for ev in events {
            self.push(ev)?;
        }
        Ok(())
    }

    /// Defines module `id` (a file whose code appears in stacks) for the stacks defined after
    /// it. Ids are the caller's (≥ 1; [`ModuleId::UNKNOWN`] needs no definition); defining an
    /// id a second time is an error.
    pub fn define_module(&mut self, id: ModuleId, module: Module) -> Result<()> {
        if id == ModuleId::UNKNOWN {
            return Err(Error::InvalidDefinition(
                "module id 0 is ModuleId::UNKNOWN (an address outside any file), not definable"
                    .into(),
            ));
        }
        if !self.modules_defined.insert(id) {
            return Err(Error::InvalidDefinition(format!(
                "module {} ({}) is already defined",
                id.0, module.path
            )));
        }
        self.defs.modules.push((id, module));
        Ok(())
    }

    /// Defines stack `id` for the events pushed after it. Ids are the caller's (≥ 1: 0 is
    /// [`StackId::NONE`]); each is defined once, and its frames' modules must be defined
    /// before it (or be [`ModuleId::UNKNOWN`]). Definitions given after the last event are not
    /// written (no event can name them). Events are not checked against the definitions (that
    /// would cost a lookup per event): a reader reports a stack id it finds no definition for.
    pub fn define_stack(&mut self, id: StackId, stack: Stack) -> Result<()> {
        if id.is_none() {
            return Err(Error::InvalidDefinition(
                "stack id 0 is StackId::NONE (no stack), not definable".into(),
            ));
        }
        if let Some(f) = stack
            .frames
            .iter()
            .find(|f| f.module != ModuleId::UNKNOWN && !self.modules_defined.contains(&f.module))
        {
            return Err(Error::InvalidDefinition(format!(
                "stack {} has a frame in module {}, which is not defined: define it first",
                id.0, f.module.0
            )));
        }
        if !self.stacks_defined.insert(id) {
            return Err(Error::InvalidDefinition(format!(
                "stack {} is already defined",
                id.0
            )));
        }
        self.defs.stacks.push((id, stack));
        Ok(())
    }

    fn ship(&mut self) -> Result<()> {
        let next = match self.recycle.try_recv() {
            Ok(mut v) => {
                v.clear();
                v
            }
            Err(_) => Vec::with_capacity(self.frame_events),
        };
        let full = std::mem::replace(&mut self.current, next);
        let defs = (!self.defs.is_empty()).then(|| Box::new(std::mem::take(&mut self.defs)));
        let tx = self.tx.as_ref().ok_or(Error::Stopped)?;
        tx.send(Msg::Frame(full, defs)).map_err(|_| Error::Stopped)
    }

    /// Answers `snapshot` with the analysis of every event pushed so far, once the writer has
    /// analysed them (the events pushed so far end the current frame).
    pub(crate) fn snapshot(&mut self, snapshot: &Arc<Snapshot>) -> Result<()> {
        if !self.current.is_empty() {
            self.ship()?;
        }
        let tx = self.tx.as_ref().ok_or(Error::Stopped)?;
        tx.send(Msg::Snapshot(Arc::clone(snapshot)))
            .map_err(|_| Error::Stopped)
    }

    /// Sets the end time stored in the trailer (ns, CLOCK_MONOTONIC); by default it is the time
    /// [`Encoder::finish`] is called. Re-encoding a file with its own end time is byte-identical.
    pub fn set_end_time(&mut self, end_monotonic_ns: u64) {
        self.end_ns = Some(end_monotonic_ns);
    }

    /// Stores in the trailer that the recording covers `n` iterations of a measured routine
    /// (see [`Final::iterations`]).
    pub fn set_iterations(&mut self, n: u64) {
        self.iterations = Some(n);
    }

    /// Stores in the trailer the processes a recording followed, and how many processes it
    /// did not follow at all (see [`Final::processes`], [`Final::unfollowed_processes`]).
    pub fn set_processes(&mut self, processes: Vec<ProcessInfo>, unfollowed: u64) {
        self.processes = processes;
        self.unfollowed_processes = unfollowed;
    }

    /// Stores in the trailer how many events have a call stack that stops early, and how many
    /// of those the C library made (see [`Final::short_stacks`]).
    pub fn set_short_stacks(&mut self, n: u64, in_libc: u64) {
        self.short_stacks = n;
        self.short_stacks_in_libc = in_libc;
    }

    /// Writes the last partial frame and the trailer (with `lost_events`, the number of events
    /// the recorder dropped), waits for the writer and returns what was written.
    pub fn finish(self, lost_events: u64) -> Result<Written> {
        self.finish_into(lost_events).map(|(_, w)| w)
    }

    /// Like [`Encoder::finish`], also giving back the output (e.g. a `Vec<u8>` or a `File`).
    pub fn finish_into(mut self, lost_events: u64) -> Result<(W, Written)> {
        let sent = if self.current.is_empty() {
            Ok(())
        } else {
            self.ship()
        };
        let tx = self.tx.take().ok_or(Error::Stopped)?;
        let sent = sent.and_then(|()| {
            tx.send(Msg::Finish(Trailer {
                lost_events,
                end_monotonic_ns: self.end_ns.unwrap_or_else(monotonic_ns),
                iterations: self.iterations,
                processes: std::mem::take(&mut self.processes),
                unfollowed_processes: self.unfollowed_processes,
                short_stacks: self.short_stacks,
                short_stacks_in_libc: self.short_stacks_in_libc,
            }))
            .map_err(|_| Error::Stopped)
        });
        drop(tx);
        let res = self
            .thread
            .take()
            .expect("thread present until finish")
            .join()
            .map_err(|_| Error::Panicked)?;
        let r = res?;
        sent?;
        Ok((r.out, r.written))
    }
}

impl<W: Write + Send + 'static> Drop for Encoder<W> {
    fn drop(&mut self) {
        // Dropped without `finish`: stop the writer without a trailer (the file then reads as
        // unfinished, which it is) and wait for it so no thread outlives the encoder.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Option<(i32, FrameScratch)>> = const { RefCell::new(None) };
}

fn compress(
    events: &[Event],
    defs: Option<&Definitions>,
    level: i32,
    out: &mut Vec<u8>,
) -> Result<()> {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.as_ref().is_none_or(|(l, _)| *l != level) {
            *s = Some((level, FrameScratch::new(level)?));
        }
        let (_, scratch) = s.as_mut().expect("just set");
        Ok(encode_frame(events, defs, scratch, out)?)
    })
}

fn writer_loop<W: Write + Send>(
    mut frames: FrameWriter<W>,
    pool: rayon::ThreadPool,
    rx: Receiver<Msg>,
    recycle: SyncSender<Vec<Event>>,
    window: usize,
    level: i32,
) -> Result<WriterResult<W>> {
    let mut batch = Batch::new(window);
    let mut outs: Vec<Vec<u8>> = (0..window).map(|_| Vec::new()).collect();
    let mut figures = StreamAnalysis::new();
    loop {
        batch.receive(&rx, window);
        if batch.frames.is_empty() {
            if batch.snapshots.is_empty() {
                break;
            }
            figures.answer(&mut batch.snapshots);
            if batch.trailer.is_some() {
                break;
            }
            continue;
        }
        let outs = &mut outs[..batch.frames.len()];
        compress_and_count(&pool, &batch, outs, level, &mut figures)?;
        for out in outs.iter() {
            frames.write_frame(out)?;
        }
        for f in batch.frames.drain(..) {
            let _ = recycle.try_send(f);
        }
        batch.defs.clear();
        figures.answer(&mut batch.snapshots);
        if batch.trailer.is_some() {
            break;
        }
    }
    // No `Finish` means the encoder was dropped: leave the file without a trailer.
    let Some(trailer) = batch.trailer else {
        return Err(Error::Stopped);
    };
    figures.finish(frames, trailer)
}

/// What the writer takes from the queue at once: frames to compress together, the snapshots
/// asked for after them, and the trailer once the encoder finishes.
struct Batch {
    frames: Vec<Vec<Event>>,
    defs: Vec<Option<Box<Definitions>>>,
    snapshots: Vec<Arc<Snapshot>>,
    trailer: Option<Trailer>,
}

impl Batch {
    fn new(window: usize) -> Batch {
        Batch {
            frames: Vec::with_capacity(window),
            defs: Vec::with_capacity(window),
            snapshots: Vec::new(),
            trailer: None,
        }
    }

    /// Blocks for one message, then takes whatever else is already queued, up to `window`
    /// frames, stopping at a snapshot (it is answered once the frames before it are analysed).
    fn receive(&mut self, rx: &Receiver<Msg>, window: usize) {
        if let Ok(m) = rx.recv() {
            self.take(m);
        }
        while self.trailer.is_none() && self.snapshots.is_empty() && self.frames.len() < window {
            match rx.try_recv() {
                Ok(m) => self.take(m),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Frame(f, d) => {
                self.frames.push(f);
                self.defs.push(d);
            }
            Msg::Snapshot(s) => self.snapshots.push(s),
            Msg::Finish(t) => self.trailer = Some(t),
        }
    }
}

/// Compresses the batch's frames on the pool into `outs` while `figures` counts their events
/// on this thread, in order.
fn compress_and_count(
    pool: &rayon::ThreadPool,
    batch: &Batch,
    outs: &mut [Vec<u8>],
    level: i32,
    figures: &mut StreamAnalysis,
) -> Result<()> {
    let mut results: Vec<Result<()>> = (0..batch.frames.len()).map(|_| Ok(())).collect();
    pool.in_place_scope(|s| {
        let frames = batch.frames.iter().zip(&batch.defs);
        for (((f, d), out), r) in frames.zip(outs.iter_mut()).zip(results.iter_mut()) {
            s.spawn(move |_| *r = compress(f, d.as_deref(), level, out));
        }
        figures.count(&batch.frames);
    });
    results.into_iter().collect()
}

/// The figures the writer keeps of every event it writes: the totals, sizes and timeline.
struct StreamAnalysis {
    analyzer: Analyzer,
    sizes: SizeHistogram,
    timeline: Timeline,
}

impl StreamAnalysis {
    fn new() -> StreamAnalysis {
        StreamAnalysis {
            analyzer: Analyzer::new(),
            sizes: SizeHistogram::new(),
            timeline: Timeline::growing(TIMELINE_COLUMNS).expect("a valid column count"),
        }
    }

    /// Counts `frames`' events, in order.
    fn count(&mut self, frames: &[Vec<Event>]) {
        // Sizes and timeline beside the totals, overlapping the compression on the pool, in
        // the analyzer's pass (one match of the kind; runs of one thread's heap events in one
        // step).
        for f in frames {
            self.analyzer
                .update_timed(f, &mut self.sizes, &mut self.timeline);
        }
    }

    /// Answers (and forgets) `snapshots` with the figures so far.
    fn answer(&self, snapshots: &mut Vec<Arc<Snapshot>>) {
        for s in snapshots.drain(..) {
            s.answer(self.analyzer.stats());
        }
    }

    /// Writes the trailer, with the totals, and says what was written.
    fn finish<W: Write + Send>(
        self,
        frames: FrameWriter<W>,
        trailer: Trailer,
    ) -> Result<WriterResult<W>> {
        let totals = self.analyzer.totals();
        let per_process = self.analyzer.per_process();
        let fin = Final {
            lost_events: trailer.lost_events,
            end_monotonic_ns: trailer.end_monotonic_ns,
            totals: totals.clone(),
            iterations: trailer.iterations,
            processes: trailer.processes,
            unfollowed_processes: trailer.unfollowed_processes,
            short_stacks: trailer.short_stacks,
            short_stacks_in_libc: trailer.short_stacks_in_libc,
        };
        let (frame_count, events) = (frames.frames(), frames.events());
        let (out, bytes) = frames.finish(&fin)?;
        Ok(WriterResult {
            out,
            written: Written {
                frames: frame_count,
                events,
                bytes,
                totals,
                sizes: self.sizes.classes(),
                timeline: self.timeline,
                per_process,
            },
        })
    }
}
