//! # memtrack: exact memory profiling for Rust benchmarks
//!
//! memtrack records every allocation, free, reallocation and mapping of a process, stores them
//! in a compact artifact, and turns them into the numbers a performance engineer acts on:
//! allocations, bytes, peak live heap, what is still live at the end, per thread.
//!
//! ```text
//!  recorder (eBPF tracker, or   ──▶  Encoder  ──▶  artifact file  ──▶  Reader  ──▶  Analyzer
//!  `synth` for a model trace)        (rayon:        (FORMAT.md)        (stream or    (Totals)
//!                                     zstd frames)                      parallel)
//! ```
//!
//! ## Writing and reading an artifact
//! ```
//! use memtrack::{Backend, Encoder, EncoderOptions, Event, EventKind, Metadata, Reader};
//!
//! let meta = Metadata::now(42, Backend::Other).with_name("example");
//! let mut enc = Encoder::new(Vec::new(), &meta, EncoderOptions::new().workers(1))?;
//! enc.push(Event::new(1_000, 42, 42, EventKind::Malloc { addr: 0x1000, size: 64 }))?;
//! enc.push(Event::new(1_500, 42, 42, EventKind::Free { addr: 0x1000 }))?;
//! let (bytes, written) = enc.finish_into(0)?;
//! assert_eq!(written.totals.allocations, 1);
//!
//! let reader = Reader::from_bytes(bytes)?;
//! let events: Vec<Event> = reader.events().collect::<Result<_, _>>()?;
//! assert_eq!(events.len(), 2);
//! # Ok::<(), memtrack::Error>(())
//! ```
//!
//! The accounting rules of the totals (what counts as an allocation, how `realloc` counts, what
//! the peak is) are in [`analysis`](Analyzer).
//!
//! ## Layers
//! The modules form layers that point one way: each names only its own layer and those below
//! it (`memtrack/tests/layers.rs` checks every `crate::` path and doc link against this
//! table), and each layer has its own error type, composed upward with `#[from]`.
//! ```text
//! presentation   memtrack-cli (the `memtrack` command): tables, JSON, SVG  uses the public API
//!      ▲
//! runtime        criterion, __private (the macro's expansion)
//!                session             SessionBuilder, Session, turns         ─┐
//!                error               the crate-wide Error: composes these  │ Error
//!                report              Report, its summary line              │
//!                locks               lock waits: off-CPU intervals by      │ LockWaitsError
//!                                    their symbolized stacks               │
//!                symbolize           Symbolizer: reads the recorded files, │ (never fails:
//!                                    frames to names (feature `symbolize`) │  falls back)
//!                tracker, recorder,  eBPF tracker, allocator recorder,     │ TrackerError,
//!                limits              Limits checked against plain numbers   │ RecorderError
//!                encode, scope,      the rayon frame pipeline, Scope,      │ EncodeError
//!                synth               the model trace (feature `synth`)     ─┘
//!      ▲
//! analysis       Analyzer, SizeHistogram, Timeline, Comparison, Sites:       InvalidTimeline
//!                numbers only
//!      ▲
//! artifact       the format: codec, Reader, frame writer, Output           FormatError,
//!      ▲                                                                   OutputError
//! event model    Event, EventKind, KindTag; Stack, StackId, Module, Frame (call stacks);
//!                Totals (what a trailer stores); human (numbers as text)
//! ```

// The recorders read the TSC (`rdtsc`), attach uprobes by x86-64 register conventions and
// find the dynamic loader at its Linux x86-64 path: nothing else is supported yet.
#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!(
    "memtrack supports Linux on x86-64 only (its recorders use rdtsc, x86-64 uprobe registers \
     and Linux's eBPF); build it on such a machine"
);

#[doc(hidden)]
pub mod __private;
mod analysis;
mod artifact;
#[cfg(feature = "criterion")]
pub mod criterion;
mod encode;
mod error;
mod event;
pub mod human;
mod limits;
mod locks;
mod modules;
mod recorder;
mod report;
mod scope;
mod session;
mod stack;
#[cfg(feature = "symbolize")]
mod symbolize;
#[cfg(feature = "synth")]
mod synth;
mod totals;
mod tracker;

pub use analysis::{Analyzer, KindCounts, ProcessTotals, Stats, ThreadTotals, Totals};
pub use analysis::{Attribution, SiteDelta, attribute};
pub use analysis::{Benchmark, Comparison, Metric, Row, Threshold, Verdict};
pub use analysis::{Column, Extremes, InvalidTimeline, SizeClass, SizeHistogram, Timeline};
pub use analysis::{Interval, OffCpu, OffCpuBuilder, ThreadTime};
pub use analysis::{Site, SiteAnalyzer, SiteOrder, Sites};
pub use artifact::{Backend, Completeness, Final, FrameInfo, Metadata, ProcessInfo, Reader};
pub use artifact::{Definitions, StackTable};
pub use artifact::{FormatError, Output, OutputError};
pub use artifact::{VERSION_MAJOR, VERSION_MINOR, monotonic_ns};
pub use encode::default_workers;
pub use encode::{EncodeError, Encoder, EncoderOptions, TIMELINE_COLUMNS, ThreadHook, Written};
pub use error::{Error, Result};
pub use event::{Event, EventKind, Heap, KindTag};
pub use limits::{InvalidLimits, Limits, Violation};
pub use locks::classify;
#[cfg(feature = "symbolize")]
pub use locks::lock_waits;
pub use locks::{
    LockWaits, LockWaitsError, Pattern, RULES, Rule, ThreadWaits, WaitClass, WaitSite, WaitTimes,
    WaitTotals,
};
#[cfg(feature = "macros")]
pub use memtrack_macros::memtrack;
pub use modules::{ModuleMap, StackInterner};
pub use recorder::{Allocator, RecorderError, allocator_installed, in_session};
pub use report::Report;
pub use scope::Scope;
pub use session::{BackendChoice, Session, SessionBuilder, start};
pub use stack::{Frame, Module, ModuleId, Stack, StackId};
#[cfg(feature = "symbolize")]
pub use symbolize::{
    KeyFrame, KeyedSites, ModuleStatus, SiteComparison, SiteKey, SymFrame, Symbolizer, site_keys,
};
#[cfg(feature = "synth")]
pub use synth::{Synth, SynthOptions};
pub use tracker::DEFAULT_STACK_DEPTH;
pub use tracker::{
    Capture, Counters, Counting, DEFAULT_RINGBUF_BYTES, Recorded, Recording, StartupTimes, Tracker,
};
pub use tracker::{CommandOptions, RecordOutcome, record_command, record_command_with};
pub use tracker::{TrackerError, TrackerOptions};
