//! Criterion integration (feature `criterion`).
//!
//! - [`Profiler`]: `cargo bench -- --profile-time 5` writes one artifact per benchmark
//!   (`<target>/memtrack/<benchmark id>.memtrack`) and prints its summary line.
//! - [`Allocations`] and [`BytesAllocated`]: measurements, so criterion reports, compares and
//!   plots **allocations per iteration** or **bytes allocated per iteration** instead of time.
//!   They read two counters (no event stream): the BPF program's (a couple of syscalls per
//!   sample), or, with the allocator backend, two atomics the wrapper increments.
//!
//! ```ignore
//! fn config() -> Criterion<memtrack::criterion::Allocations> {
//!     Criterion::default().with_measurement(memtrack::criterion::Allocations::new().unwrap())
//! }
//! criterion_group!(name = benches; config = config(); targets = bench_parse);
//! ```
//! Counting covers every thread of the process except memtrack's own: run benchmarks that
//! spawn no unrelated threads, as criterion does.

use std::path::Path;

use ::criterion::Throughput;
use ::criterion::measurement::{Measurement, ValueFormatter};

use crate::error::Result;
use crate::human;
use crate::session::{Session, SessionBuilder};
use crate::tracker::{Counting, Tracker, TrackerOptions};

/// A criterion profiler that records each benchmark into its own artifact while criterion
/// runs it with `--profile-time`. Install with `Criterion::default().with_profiler(Profiler::new())`.
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
        match SessionBuilder::new(benchmark_id).start() {
            Ok(s) => self.session = Some(s),
            Err(e) => eprintln!("memtrack: {benchmark_id}: not recorded: {e}"),
        }
    }

    fn stop_profiling(&mut self, benchmark_id: &str, _benchmark_dir: &Path) {
        if let Some(s) = self.session.take()
            && let Err(e) = s.finish()
        {
            eprintln!("memtrack: {benchmark_id}: {e}");
        }
    }
}

/// Keeps a backend counting while a measurement exists: the BPF program's counters, or the
/// allocator backend's (chosen as for sessions: `$MEMTRACK_BACKEND`, else `auto`).
enum Counter {
    Ebpf {
        tracker: &'static Tracker,
        _counting: Counting<'static>,
    },
    Alloc(crate::recorder::CountingGuard),
}

impl Counter {
    fn new() -> Result<Self> {
        Ok(match crate::session::resolve_backend(None)? {
            crate::Backend::Alloc => Counter::Alloc(crate::recorder::start_counting()),
            _ => {
                let tracker = Tracker::global(&TrackerOptions::new())?;
                Counter::Ebpf {
                    tracker,
                    _counting: tracker.counting()?,
                }
            }
        })
    }

    /// (allocations, bytes allocated) so far.
    fn read(&self) -> (u64, u64) {
        match self {
            // A failed map read is a broken BPF setup, not a measurement: there is no sane
            // value to return, and criterion's trait has no error path.
            Counter::Ebpf { tracker, .. } => {
                let c = tracker.counters().expect("reading memtrack's BPF counters");
                (c.allocations, c.bytes_allocated)
            }
            Counter::Alloc(_) => {
                let (allocs, bytes, _) = crate::recorder::counters();
                (allocs, bytes)
            }
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
        Counter::new().map(Allocations)
    }
}

impl BytesAllocated {
    /// Starts counting with the backend sessions would use (the error says what is missing).
    pub fn new() -> Result<Self> {
        Counter::new().map(BytesAllocated)
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
