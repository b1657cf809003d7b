//! Criterion integration (feature `criterion`).
//!
//! - [`Profiler`]: `cargo bench -- --profile-time 5` writes one artifact per benchmark
//!   (`<target>/memtrack/<benchmark id>.memtrack`) and prints its summary line. Wrap the
//!   routine in [`iteration`] (`b.iter(|| iteration(|| parse(input)))`) so that the artifact
//!   stores how many iterations it covers and is compared per iteration: criterion picks the
//!   number of iterations from timings, so totals of two runs of the same code differ.
//! - [`Allocations`] and [`BytesAllocated`]: measurements, so criterion reports, compares and
//!   plots **allocations per iteration** or **bytes allocated per iteration** instead of time.
//!   They read two counters (no event stream): the BPF program's (a couple of syscalls per
//!   sample), or, with the allocator recorder, two atomics the wrapper increments.
//!
//! ```ignore
//! use memtrack::criterion::Allocations;
//! criterion_group!(name = benches; config = Allocations::criterion().unwrap(); targets = bench_parse);
//! ```
//! Their results go to a folder of their own ([`results_dir`]), so that criterion compares
//! allocations with allocations, never with the timings it saved for the same benchmarks.
//! Counting covers every thread of the process except memtrack's own: run benchmarks that
//! spawn no unrelated threads, as criterion does.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ::criterion::Throughput;
use ::criterion::measurement::{Measurement, ValueFormatter};

use crate::backend::Counter;
use crate::error::Result;
use crate::human;
use crate::session::{Session, SessionBuilder, counter};

/// Calls of [`iteration`] since the profiler last started a benchmark.
static ITERATIONS: AtomicU64 = AtomicU64::new(0);

/// Runs one iteration of a benchmark's routine and counts it for the [`Profiler`]:
/// `b.iter(|| memtrack::criterion::iteration(|| parse(black_box(input))))`.
///
/// Criterion's `Profiler` hooks are told neither how many iterations criterion runs nor when
/// it runs them (under `--profile-time` it warms up for a second, doubling the iterations per
/// batch, then runs as many as its timing estimate fits in the profile time; see
/// `criterion::routine::Routine::profile` in criterion 0.8), and `Bencher` keeps its
/// iteration count private. So the routine counts itself: one relaxed atomic add per
/// iteration, which allocates nothing. The [`Profiler`] stores the count in the artifact, and
/// `memtrack show` and `memtrack compare` then give allocations and bytes per iteration.
/// Allocations made outside the wrapped routine while profiling (setup in the benchmark
/// closure, criterion's bookkeeping: about one per batch) are spread over the iterations.
#[inline]
pub fn iteration<O>(routine: impl FnOnce() -> O) -> O {
    ITERATIONS.fetch_add(1, Ordering::Relaxed);
    routine()
}

/// A criterion profiler that records each benchmark into its own artifact while criterion
/// runs it with `--profile-time`. Install with `Criterion::default().with_profiler(Profiler::new())`.
///
/// If the routine counts its iterations with [`iteration`], the artifact stores their number
/// and is compared per iteration; otherwise it holds totals over however many iterations
/// criterion chose, which differ from run to run (the profiler says so on stderr).
#[derive(Default)]
pub struct Profiler {
    session: Option<Session>,
}

impl Profiler {
    /// A profiler writing artifacts to the default directory (see [`SessionBuilder::output_dir`]).
    pub fn new() -> Self {
        Self::default()
    }
}

impl ::criterion::profiler::Profiler for Profiler {
    fn start_profiling(&mut self, benchmark_id: &str, _benchmark_dir: &Path) {
        ITERATIONS.store(0, Ordering::Relaxed);
        match SessionBuilder::new(benchmark_id).start() {
            Ok(s) => self.session = Some(s),
            Err(e) => eprintln!("memtrack: {benchmark_id}: not recorded: {e}"),
        }
    }

    fn stop_profiling(&mut self, benchmark_id: &str, _benchmark_dir: &Path) {
        let iterations = ITERATIONS.swap(0, Ordering::Relaxed);
        let Some(mut s) = self.session.take() else {
            return;
        };
        if iterations > 0 {
            s.set_iterations(iterations);
        }
        if let Err(e) = s.finish() {
            eprintln!("memtrack: {benchmark_id}: {e}");
        } else if iterations == 0 {
            eprintln!(
                "memtrack: {benchmark_id}: the artifact holds totals over criterion's \
                 iterations, whose number varies from run to run, so two runs do not compare: \
                 wrap the routine in `memtrack::criterion::iteration(|| …)` to store per-iteration \
                 figures"
            );
        }
    }
}

/// Criterion measurement: allocations per iteration (malloc, calloc, realloc, aligned family).
pub struct Allocations(Counter);

/// Criterion measurement: bytes allocated per iteration.
pub struct BytesAllocated(Counter);

impl Allocations {
    /// Starts counting with the backend sessions would use (the error says what is missing).
    pub fn new() -> Result<Self> {
        counter().map(Allocations)
    }

    /// Criterion measuring allocations per iteration, with results of their own
    /// ([`results_dir`]`("allocations")`): criterion compares them with earlier allocation runs
    /// only, never with the timings it saved for the same benchmarks.
    /// `criterion_group!(name = benches; config = Allocations::criterion().unwrap(); targets = …)`.
    pub fn criterion() -> Result<::criterion::Criterion<Self>> {
        Ok(::criterion::Criterion::default()
            .with_measurement(Self::new()?)
            .output_directory(&results_dir("allocations")))
    }
}

impl BytesAllocated {
    /// Starts counting with the backend sessions would use (the error says what is missing).
    pub fn new() -> Result<Self> {
        counter().map(BytesAllocated)
    }

    /// Criterion measuring bytes allocated per iteration, with results of their own
    /// ([`results_dir`]`("bytes")`), as [`Allocations::criterion`].
    pub fn criterion() -> Result<::criterion::Criterion<Self>> {
        Ok(::criterion::Criterion::default()
            .with_measurement(Self::new()?)
            .output_directory(&results_dir("bytes")))
    }
}

/// Where criterion keeps the results (and baselines) of a memtrack measurement `metric`:
/// `$CRITERION_HOME-memtrack-<metric>`, else `<target dir>/criterion-memtrack-<metric>`, beside
/// criterion's own `criterion` folder of timings. Criterion compares a benchmark with the
/// baseline of the same name in its results folder, so measurements kept in the timings' folder
/// would be compared with timings (`-99.99 %: Performance has improved`).
pub fn results_dir(metric: &str) -> std::path::PathBuf {
    match std::env::var_os("CRITERION_HOME").filter(|d| !d.is_empty()) {
        Some(home) => {
            let mut dir = home;
            dir.push(format!("-memtrack-{metric}"));
            dir.into()
        }
        None => crate::session::target_dir().join(format!("criterion-memtrack-{metric}")),
    }
}

struct Formatter {
    unit: &'static str,
    bytes: bool,
}

impl ValueFormatter for Formatter {
    fn format_value(&self, value: f64) -> String {
        if self.bytes {
            human::bytes(value.round().max(0.0) as u64)
        } else {
            format!("{value:.2} {}", self.unit)
        }
    }

    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        self.unit
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let (per, unit) = match *throughput {
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => {
                (n as f64, if self.bytes { "B/elem" } else { "allocs/elem" })
            }
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => {
                (n as f64, if self.bytes { "B/B" } else { "allocs/B" })
            }
            Throughput::Bits(n) => (n as f64, if self.bytes { "B/bit" } else { "allocs/bit" }),
        };
        for v in values.iter_mut() {
            *v /= per.max(1.0);
        }
        unit
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        self.unit
    }
}

const ALLOCS: Formatter = Formatter {
    unit: "allocs",
    bytes: false,
};
const BYTES: Formatter = Formatter {
    unit: "B",
    bytes: true,
};

macro_rules! counter_measurement {
    ($t:ty, $field:tt, $fmt:expr) => {
        impl Measurement for $t {
            type Intermediate = u64;
            type Value = u64;

            fn start(&self) -> u64 {
                self.0.read().$field
            }

            fn end(&self, start: u64) -> u64 {
                self.0.read().$field.wrapping_sub(start)
            }

            fn add(&self, a: &u64, b: &u64) -> u64 {
                a + b
            }

            fn zero(&self) -> u64 {
                0
            }

            fn to_f64(&self, v: &u64) -> f64 {
                *v as f64
            }

            fn formatter(&self) -> &dyn ValueFormatter {
                &$fmt
            }
        }
    };
}

counter_measurement!(Allocations, 0, ALLOCS);
counter_measurement!(BytesAllocated, 1, BYTES);
