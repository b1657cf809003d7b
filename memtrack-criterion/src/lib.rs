#![doc = include_str!("../README.md")]
//!
//! ## This crate's layout
//! ```text
//! timing mode (no cfg)        pub use criterion::*            criterion itself, nothing added
//! memory mode (--cfg memtrack_bench, or memtrack_bench="alloc")
//!   bench       Criterion, BenchmarkGroup, BenchmarkId: ids, the filter, which mode runs
//!   bencher     Bencher: warm-up, then N iterations in one memtrack::Session per benchmark
//! instructions mode (feature `instructions`, or --cfg memtrack_bench="instructions"): the same
//! modules, and
//!   instructions  the window of N iterations: callgrind's counters zeroed, then dumped
//!   run         the process's run: settings (env, arguments), results, the final table
//!   args        criterion's command line, as memory mode reads it
//!   macros      criterion_group!, criterion_main!
//! ```
//! Everything else (`black_box`, `BatchSize`, `Throughput`, `measurement`, `profiler`, …) is
//! criterion's, re-exported in both modes.

#[cfg(all(feature = "criterion-0_5", feature = "criterion-0_8"))]
compile_error!(
    "memtrack-criterion: features `criterion-0_5` and `criterion-0_8` are both on: for criterion \
     0.5 write `default-features = false, features = [\"criterion-0_5\"]`"
);
#[cfg(not(any(feature = "criterion-0_5", feature = "criterion-0_8")))]
compile_error!(
    "memtrack-criterion: no criterion version: with `default-features = false`, add feature \
     `criterion-0_8` or `criterion-0_5`"
);

#[cfg(all(feature = "criterion-0_5", not(feature = "criterion-0_8")))]
use criterion_0_5 as upstream;
#[cfg(feature = "criterion-0_8")]
use criterion_0_8 as upstream;

// build.rs derives `memtrack_measured` (memory or instructions mode) and
// `memtrack_instructions` from the feature and the cfgs.
#[cfg(all(memtrack_instructions, any(memtrack_bench, memtrack_bench = "alloc")))]
compile_error!(
    "memtrack-criterion: instructions mode (feature `instructions`) and memory mode (`--cfg \
     memtrack_bench`) are both on: build for one"
);

// Timing mode is criterion itself; memory mode's own items below shadow these names.
#[cfg(any(feature = "criterion-0_5", feature = "criterion-0_8"))]
pub use upstream::*;

// Reads no memtrack: its unit tests run in the timing-mode `cargo test` too.
#[cfg(any(memtrack_measured, test))]
mod args;
#[cfg(memtrack_measured)]
mod bench;
#[cfg(memtrack_measured)]
mod bencher;
#[cfg(memtrack_instructions)]
mod instructions;
#[cfg(memtrack_measured)]
mod macros;
#[cfg(memtrack_measured)]
mod run;

#[cfg(memtrack_measured)]
pub use bench::{BenchmarkGroup, BenchmarkId, Criterion, runner};
#[cfg(memtrack_measured)]
pub use bencher::Bencher;

/// The allocator recorder, without a source edit: `--cfg memtrack_bench="alloc"`.
#[cfg(memtrack_bench = "alloc")]
#[global_allocator]
static ALLOCATOR: memtrack::Allocator = memtrack::Allocator::system();
