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
//! use memtrack::{artifact::Backend, encode::Encoder, encode::EncoderOptions, event::Event, event::EventKind, artifact::Metadata, artifact::Reader};
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
//! the peak is) are in [`analysis`](analysis::Analyzer).
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
pub mod analysis;
pub mod artifact;
#[cfg(feature = "criterion")]
pub mod criterion;
pub mod encode;
mod error;
pub mod event;
pub mod human;
mod lifecycle;
pub mod limits;
pub mod locks;
pub mod modules;
mod recorded;
pub mod recorder;
mod recording;
mod report;
mod scope;
mod session;
pub mod stack;
#[cfg(feature = "symbolize")]
pub mod symbolize;
#[cfg(feature = "synth")]
pub mod synth;
mod totals;
pub mod tracker;

// The front door: what a user of the attribute and of sessions names. Everything else is in
// the public modules above, one per layer.
pub use analysis::Stats;
pub use error::{Error, Result};
pub use limits::{Limits, Violation};
#[cfg(feature = "macros")]
pub use memtrack_macros::memtrack;
pub use recorder::{Allocator, in_session};
pub use report::Report;
pub use scope::{InvalidScope, Scope};
pub use session::{BackendChoice, Call, Session, SessionBuilder, finish_calls, start};
