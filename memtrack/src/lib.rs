//! # memtrack: exact memory profiling for Rust benchmarks
//!
//! How many allocations your code makes, how many bytes, the peak, what it leaves live, and the
//! call sites behind each: every allocation recorded, none sampled, so the numbers are the same
//! from run to run and can fail a test or a CI job when they grow.
//!
//! ## A function with limits: `#[memtrack]`
//!
//! ```
//! // The allocator recorder needs no privileges; without it (and `backend = "alloc"`), as root
//! // or with CAP_BPF + CAP_PERFMON, the eBPF tracker records every allocator, C's too.
//! #[global_allocator]
//! static ALLOC: memtrack::Allocator = memtrack::Allocator::system();
//!
//! #[memtrack::memtrack(backend = "alloc", in_memory, max_allocations = 1, no_leaks)]
//! fn checksum(data: &[u8]) -> u64 {
//!     let copy = data.to_vec(); // one allocation, freed before the function returns
//!     copy.iter().map(|&b| u64::from(b)).sum()
//! }
//!
//! fn main() {
//!     for n in 1..=3u8 {
//!         assert_eq!(checksum(&vec![n; 4]), 4 * u64::from(n));
//!     }
//!     // The three calls are one recording; finishing it prints its summary line.
//!     let report = memtrack::finish_calls().unwrap().expect("checksum was called");
//!     assert_eq!(report.allocations(), 3);
//! }
//! ```
//!
//! [`#[memtrack]`](macro@memtrack) records each call of the function; its limits hold per call, and a call that
//! breaks one panics with the measured numbers, failing the `#[test]` it is in. The calls of one
//! function in a process are one recording (an artifact under `target/memtrack/`, unless
//! `in_memory`), whose summary line is printed when [`finish_calls`] or the end of the process
//! finishes it. The limits: [`Limits`].
//!
//! ## A session by hand: [`SessionBuilder`]
//!
//! ```
//! # #[global_allocator]
//! # static ALLOC: memtrack::Allocator = memtrack::Allocator::system();
//! # fn main() -> Result<(), memtrack::Error> {
//! let session = memtrack::SessionBuilder::new("build_table")
//!     .backend(memtrack::BackendChoice::Alloc)
//!     .in_memory(true)
//!     .quiet(true)
//!     .max_bytes(64 * 1024)
//!     .start()?;
//! let table: Vec<u64> = (0..1_000).collect();
//! let report = session.finish()?; // Err(Error::LimitExceeded) if a limit was broken
//! assert_eq!(report.allocations(), 1);
//! assert_eq!(report.bytes_allocated(), 8_000);
//! # drop(table);
//! # Ok(())
//! # }
//! ```
//!
//! [`Session::finish`] returns a [`Report`]: the totals, sizes by class, the live heap over
//! time, lost events, where the artifact went. [`Session::stats`] gives the numbers so far
//! ([`Stats`]). A report's numbers nest: it holds what the recorder returned ([`Recorded`]),
//! which holds what the encoder wrote ([`Written`]), which holds the [`Totals`](totals::Totals).
//!
//! ## Recorders
//!
//! A session uses one of two: the eBPF tracker ([`tracker`]: every allocator of the process and
//! its mappings; Linux 5.15+ with BTF, and root or `CAP_BPF` + `CAP_PERFMON`), or the allocator
//! recorder ([`Allocator`] as the global allocator: Rust's allocations, no privileges).
//! [`BackendChoice`] says which; `auto`, the default, takes the tracker when the process may
//! load it. Threads a session records: [`Scope`]; the allocator recorder sees a spawned thread
//! when it is spawned through [`in_session`].
//!
//! ## Modules
//!
//! The front door above is all most users name. The public modules, lowest layer first:
//!
//! - [`event`], [`stack`], [`totals`]: what a recording holds (events, call stacks) and what
//!   it adds up to;
//! - [`artifact`]: the file format, its [`Reader`](artifact::Reader) and safe file output;
//! - [`analysis`]: recordings to numbers (totals, size classes, timeline, call sites,
//!   comparisons), with the accounting rules;
//! - [`tracker`], [`allocator`]: the two recorders, the eBPF tracker and the allocator
//!   recorder; [`limits`]: limits checked against the numbers;
//! - `symbolize` (feature `symbolize`): frames to functions and lines; [`locks`]: lock waits;
//! - `criterion` (feature `criterion`): criterion measurements and profiler;
//!   `synth` (feature `synth`): a seeded model trace.
//!
//! Features: `macros` (default: the attribute), `criterion`, `symbolize`, `synth`, and
//! `system-zstd` (link the system's libzstd). The guide (`docs/` in the repository) covers
//! criterion suites, CI, `memtrack record`, the numbers' definitions and the command line; the
//! architecture and the layers are in its `ARCHITECTURE.md`.

// The recorders read the TSC (`rdtsc`), attach uprobes by x86-64 register conventions and
// find the dynamic loader at its Linux x86-64 path: nothing else is supported yet.
#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!(
    "memtrack supports Linux on x86-64 only (its recorders use rdtsc, x86-64 uprobe registers \
     and Linux's eBPF); build it on such a machine"
);

#[doc(hidden)]
pub mod __private;
pub mod allocator;
pub mod analysis;
pub mod artifact;
mod backend;
#[cfg(feature = "callgrind")]
pub mod callgrind;
#[cfg(feature = "criterion")]
pub mod criterion;
// Public for memtrack-cli and memtrack-criterion only, not a user's API.
#[doc(hidden)]
pub mod encode;
mod error;
pub mod event;
// The guide's pages as doctests (see the module).
#[cfg(doctest)]
mod guide;
// Public for memtrack-cli and memtrack-criterion only, not a user's API.
#[doc(hidden)]
pub mod human;
#[cfg(feature = "callgrind")]
pub mod instructions;
mod lifecycle;
pub mod limits;
pub mod locks;
// Public for memtrack-cli and memtrack-criterion only, not a user's API.
#[doc(hidden)]
pub mod modules;
pub mod render;
mod report;
mod scope;
mod session;
pub mod stack;
#[cfg(feature = "symbolize")]
pub mod symbolize;
#[cfg(feature = "synth")]
pub mod synth;
pub mod totals;
pub mod tracker;

// The front door: what a user of the attribute and of sessions names. Everything else is in
// the public modules above, one per layer.
pub use allocator::{Allocator, in_session};
pub use analysis::Stats;
pub use backend::Recorded;
pub use encode::{EncodeError, Written};
pub use error::{Error, Result};
pub use limits::{Limits, Violation};
#[cfg(feature = "macros")]
pub use memtrack_macros::memtrack;
pub use report::Report;
pub use scope::{InvalidScope, Scope};
pub use session::{BackendChoice, Call, NO_REPLACE, Session, SessionBuilder, finish_calls, start};
