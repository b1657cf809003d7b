//! Memory mode's [`Criterion`], [`BenchmarkGroup`] and [`BenchmarkId`]: criterion's API, every
//! public method of criterion 0.5's and 0.8's, so that a suite compiles unchanged. Those that
//! configure timing (sample size, measurement time, plots, baselines, measurements, profilers)
//! are accepted and do nothing: memory mode runs a fixed number of iterations
//! ([`counts`](crate::run::counts)) and records them.

use std::marker::PhantomData;
use std::path::Path;
use std::time::Duration;

use regex::Regex;

use crate::args::Mode;
use crate::bencher::{Bencher, Plan};
use crate::run;
use crate::upstream::measurement::{Measurement, WallTime};
use crate::upstream::profiler::Profiler;
use crate::upstream::{
    BenchmarkFilter, PlotConfiguration, PlottingBackend, SamplingMode, Throughput,
};

/// The benchmark manager, as criterion's: in memory mode it records each benchmark into its
/// own memtrack artifact instead of timing it.
pub struct Criterion<M: Measurement = WallTime> {
    filter: BenchmarkFilter,
    mode: Mode,
    measurement: PhantomData<fn() -> M>,
}

impl Default for Criterion {
    /// Every benchmark, recorded (as criterion's default benchmarks them): the command line is
    /// read by [`Criterion::configure_from_args`].
    fn default() -> Criterion {
        Criterion {
            filter: BenchmarkFilter::AcceptAll,
            mode: Mode::Record,
            measurement: PhantomData,
        }
    }
}

impl<M: Measurement> Criterion<M> {
    /// Criterion's: changes the measurement type; memory mode measures allocations whatever it is.
    pub fn with_measurement<M2: Measurement>(self, _m: M2) -> Criterion<M2> {
        Criterion {
            filter: self.filter,
            mode: self.mode,
            measurement: PhantomData,
        }
    }

    /// Criterion's; ignored in memory mode (which is memtrack's profiler).
    #[must_use]
    pub fn with_profiler<P: Profiler + 'static>(self, _p: P) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (no plots).
    #[must_use]
    pub fn plotting_backend(self, _backend: PlottingBackend) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (`MEMTRACK_ITERATIONS` sets the iterations).
    #[must_use]
    pub fn sample_size(self, _n: usize) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (`MEMTRACK_WARMUP` sets the warm-up iterations).
    #[must_use]
    pub fn warm_up_time(self, _dur: Duration) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (`MEMTRACK_ITERATIONS` sets the iterations).
    #[must_use]
    pub fn measurement_time(self, _dur: Duration) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    #[must_use]
    pub fn nresamples(self, _n: usize) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    #[must_use]
    pub fn noise_threshold(self, _threshold: f64) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    #[must_use]
    pub fn confidence_level(self, _cl: f64) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    #[must_use]
    pub fn significance_level(self, _sl: f64) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (no plots).
    #[must_use]
    pub fn with_plots(self) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (no plots).
    #[must_use]
    pub fn without_plots(self) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (its artifacts are its baselines: `memtrack compare`).
    #[must_use]
    pub fn save_baseline(self, _baseline: String) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (`memtrack compare` compares artifacts).
    #[must_use]
    pub fn retain_baseline(self, _baseline: String, _strict: bool) -> Criterion<M> {
        self
    }

    /// Runs only the benchmarks whose ids match the regex `filter`, as criterion.
    ///
    /// # Panics
    /// If `filter` is not a regex, as criterion.
    #[must_use]
    pub fn with_filter<S: Into<String>>(mut self, filter: S) -> Criterion<M> {
        let filter = filter.into();
        let regex = Regex::new(&filter)
            .unwrap_or_else(|e| panic!("Unable to parse '{filter}' as a regular expression: {e}"));
        self.filter = BenchmarkFilter::Regex(regex);
        self
    }

    /// Runs only the benchmarks `filter` accepts, as criterion.
    pub fn with_benchmark_filter(mut self, filter: BenchmarkFilter) -> Criterion<M> {
        self.filter = filter;
        self
    }

    /// Criterion's; ignored in memory mode (its table has no colours).
    #[must_use]
    pub fn with_output_color(self, _enabled: bool) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode (`MEMTRACK_DIR` names the artifacts' directory).
    #[must_use]
    #[doc(hidden)]
    pub fn output_directory(self, _path: &Path) -> Criterion<M> {
        self
    }

    /// Criterion's; ignored in memory mode.
    #[must_use]
    #[doc(hidden)]
    pub fn profile_time(self, _profile_time: Option<Duration>) -> Criterion<M> {
        self
    }

    /// The end of the run (`criterion_main!` calls it): prints the table of every benchmark
    /// recorded in this process, once, and ends the process with status 1 if one failed.
    #[doc(hidden)]
    pub fn final_summary(&self) {
        run::summarize(self.mode == Mode::Record);
    }

    /// Reads criterion's command line: the filter (a regex, or the whole id with `--exact`),
    /// `--list`, `--test` (and `--bench`: without it, as under `cargo test --benches`, each
    /// benchmark runs once, recording nothing), `--ignored`; criterion's other options are
    /// accepted and ignored, anything else ends the process with status 2.
    #[must_use]
    pub fn configure_from_args(mut self) -> Criterion<M> {
        let args = run::args();
        self.mode = args.mode();
        self.filter = if args.ignored {
            BenchmarkFilter::RejectAll
        } else {
            match &args.filter {
                None => BenchmarkFilter::AcceptAll,
                Some(f) if args.exact => BenchmarkFilter::Exact(f.clone()),
                Some(f) => match Regex::new(f) {
                    Ok(r) => BenchmarkFilter::Regex(r),
                    Err(e) => {
                        eprintln!("memtrack: the filter `{f}` is not a regex: {e}");
                        std::process::exit(2)
                    }
                },
            }
        };
        self
    }

    fn filter_matches(&self, id: &str) -> bool {
        run::chosen(id)
            && match &self.filter {
                BenchmarkFilter::AcceptAll => true,
                BenchmarkFilter::Regex(r) => r.is_match(id),
                BenchmarkFilter::Exact(e) => id == e,
                BenchmarkFilter::RejectAll => false,
            }
    }

    /// A group of benchmarks, whose ids begin with `group_name`.
    ///
    /// # Panics
    /// If the name is empty, as criterion.
    pub fn benchmark_group<S: Into<String>>(&mut self, group_name: S) -> BenchmarkGroup<'_, M> {
        let name = group_name.into();
        assert!(!name.is_empty(), "Group name must not be empty.");
        BenchmarkGroup {
            criterion: self,
            name,
            ids: Vec::new(),
            any_matched: false,
        }
    }
}

impl<M: Measurement + 'static> Criterion<M> {
    /// Records benchmark `id` (see [`Bencher`] for what runs).
    pub fn bench_function<F>(&mut self, id: &str, f: F) -> &mut Criterion<M>
    where
        F: FnMut(&mut Bencher<'_, M>),
    {
        self.benchmark_group(id)
            .bench_function(BenchmarkId::none(), f);
        self
    }

    /// Records benchmark `function/parameter` of `id` with `input`.
    ///
    /// # Panics
    /// If `id` has no function name ([`BenchmarkId::from_parameter`]), as criterion.
    pub fn bench_with_input<F, I>(&mut self, id: BenchmarkId, input: &I, f: F) -> &mut Criterion<M>
    where
        F: FnMut(&mut Bencher<'_, M>, &I),
    {
        let group = id.function_name.expect(
            "Cannot use BenchmarkId::from_parameter with Criterion::bench_with_input. \
             Consider using a BenchmarkGroup or BenchmarkId::new instead.",
        );
        let parameter = BenchmarkId {
            function_name: None,
            parameter: id.parameter,
        };
        self.benchmark_group(group)
            .bench_with_input(parameter, input, f);
        self
    }
}

/// A group of related benchmarks, as criterion's. Its settings are criterion's timing ones,
/// accepted and ignored in memory mode.
pub struct BenchmarkGroup<'a, M: Measurement> {
    criterion: &'a mut Criterion<M>,
    name: String,
    /// The ids of this group so far: criterion refuses a repeated one.
    ids: Vec<String>,
    /// Whether the filter let one of them run.
    any_matched: bool,
}

impl<M: Measurement> BenchmarkGroup<'_, M> {
    /// Criterion's; ignored in memory mode (`MEMTRACK_ITERATIONS` sets the iterations).
    pub fn sample_size(&mut self, _n: usize) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (`MEMTRACK_WARMUP` sets the warm-up iterations).
    pub fn warm_up_time(&mut self, _dur: Duration) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (`MEMTRACK_ITERATIONS` sets the iterations).
    pub fn measurement_time(&mut self, _dur: Duration) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    pub fn nresamples(&mut self, _n: usize) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    pub fn noise_threshold(&mut self, _threshold: f64) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    pub fn confidence_level(&mut self, _cl: f64) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (no statistics).
    pub fn significance_level(&mut self, _sl: f64) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (no plots).
    pub fn plot_config(&mut self, _new_config: PlotConfiguration) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (figures are per iteration).
    pub fn throughput(&mut self, _throughput: Throughput) -> &mut Self {
        self
    }

    /// Criterion's; ignored in memory mode (every benchmark runs the same iterations).
    pub fn sampling_mode(&mut self, _new_mode: SamplingMode) -> &mut Self {
        self
    }

    /// Records benchmark `group/id` (see [`Bencher`] for what runs).
    pub fn bench_function<ID: IntoBenchmarkId, F>(&mut self, id: ID, mut f: F) -> &mut Self
    where
        F: FnMut(&mut Bencher<'_, M>),
    {
        self.run_bench(id.into_benchmark_id(), &(), |b, _| f(b));
        self
    }

    /// Records benchmark `group/id` with `input` (see [`Bencher`] for what runs).
    pub fn bench_with_input<ID: IntoBenchmarkId, F, I>(
        &mut self,
        id: ID,
        input: &I,
        f: F,
    ) -> &mut Self
    where
        F: FnMut(&mut Bencher<'_, M>, &I),
        I: ?Sized,
    {
        self.run_bench(id.into_benchmark_id(), input, f);
        self
    }

    fn run_bench<F, I>(&mut self, id: BenchmarkId, input: &I, mut f: F)
    where
        F: FnMut(&mut Bencher<'_, M>, &I),
        I: ?Sized,
    {
        let full = id.full(&self.name);
        assert!(
            !self.ids.contains(&full),
            "Benchmark IDs must be unique within a group. Encountered duplicated benchmark ID {full}"
        );
        self.ids.push(full.clone());
        if !self.criterion.filter_matches(&full) {
            return;
        }
        self.any_matched = true;
        let id = run::unique_id(full);
        let plan = match self.criterion.mode {
            Mode::List => {
                println!("{id}: benchmark");
                return;
            }
            Mode::Test => {
                println!("Testing {id}");
                Plan::Once
            }
            Mode::Record => Plan::Record(run::counts()),
        };
        let mut b = Bencher::new(&id, plan);
        // A panicking benchmark fails alone (the default hook has printed its message); its
        // session, if one was recording, finished as it was dropped.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut b, input)));
        let outcome = match ran {
            Ok(()) => b.outcome(),
            Err(_) => Err("panicked".to_string()),
        };
        if plan == Plan::Once && outcome.is_ok() {
            println!("Success");
        }
        run::record(&id, outcome);
    }

    /// Ends the group, as criterion's.
    pub fn finish(self) {}
}

impl<M: Measurement> Drop for BenchmarkGroup<'_, M> {
    /// Criterion's blank line after a group that ran, in `--list` and `--test` output (the
    /// table of a recording run is printed at the end).
    fn drop(&mut self) {
        if self.any_matched && self.criterion.mode != Mode::Record {
            println!();
        }
    }
}

/// A benchmark's id within its group: a function name, a parameter, or both, as criterion's.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BenchmarkId {
    function_name: Option<String>,
    parameter: Option<String>,
}

impl BenchmarkId {
    /// `function_name/parameter`.
    pub fn new<S: Into<String>, P: std::fmt::Display>(function_name: S, parameter: P) -> Self {
        BenchmarkId {
            function_name: Some(function_name.into()),
            parameter: Some(parameter.to_string()),
        }
    }

    /// `parameter` alone, for a group whose benchmarks differ by their input.
    pub fn from_parameter<P: std::fmt::Display>(parameter: P) -> Self {
        BenchmarkId {
            function_name: None,
            parameter: Some(parameter.to_string()),
        }
    }

    /// No function name, no parameter: the id of `Criterion::bench_function` in its group.
    fn none() -> Self {
        BenchmarkId {
            function_name: None,
            parameter: None,
        }
    }

    /// Criterion's full id in `group`: `group/function/parameter`, without the parts absent.
    fn full(&self, group: &str) -> String {
        [
            Some(group),
            self.function_name.as_deref(),
            self.parameter.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("/")
    }
}

mod private {
    pub trait Sealed {}
    impl Sealed for super::BenchmarkId {}
    impl<S: Into<String>> Sealed for S {}
}

/// What names a benchmark in a group: a [`BenchmarkId`], or a function name (`&str`,
/// `String`), as criterion's.
pub trait IntoBenchmarkId: private::Sealed {
    /// The id.
    fn into_benchmark_id(self) -> BenchmarkId;
}

impl IntoBenchmarkId for BenchmarkId {
    fn into_benchmark_id(self) -> BenchmarkId {
        self
    }
}

impl<S: Into<String>> IntoBenchmarkId for S {
    /// # Panics
    /// If the name is empty, as criterion.
    fn into_benchmark_id(self) -> BenchmarkId {
        let function_name = self.into();
        assert!(
            !function_name.is_empty(),
            "Function name must not be empty."
        );
        BenchmarkId {
            function_name: Some(function_name),
            parameter: None,
        }
    }
}

/// Criterion's runner for custom test frameworks: runs `benches`, then the end of the run.
#[doc(hidden)]
pub fn runner(benches: &[&dyn Fn()]) {
    for bench in benches {
        bench();
    }
    Criterion::default().configure_from_args().final_summary();
}
