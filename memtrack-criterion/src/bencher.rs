//! Memory mode's [`Bencher`]: what each of criterion's `iter` methods runs, and what of it
//! one memtrack session records.

use std::hint::black_box;
use std::marker::PhantomData;

#[cfg(not(memtrack_instructions))]
use memtrack::{Scope, Session, SessionBuilder};

#[cfg(memtrack_instructions)]
use crate::instructions::Window as Session;

use crate::run::{Counts, Figures};
use crate::upstream::BatchSize;
use crate::upstream::measurement::{Measurement, WallTime};

/// Why `iter_custom` fails the benchmark.
#[cfg(not(memtrack_instructions))]
const ITER_CUSTOM: &str = "iter_custom is refused in memory mode: its routine runs and times the \
     iterations itself, so memtrack cannot tell their allocations from its own (use iter or \
     iter_batched)";
#[cfg(memtrack_instructions)]
const ITER_CUSTOM: &str = "iter_custom is refused in instructions mode: its routine runs and \
     times the iterations itself, so memtrack cannot tell their instructions from its own (use \
     iter or iter_batched)";

/// How a benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Once, recording nothing (`--test`).
    Once,
    /// Warm-up, then the recorded iterations in one session.
    Record(Counts),
}

/// A benchmark's progress: its routine has not run yet, or it has, with this outcome.
enum State {
    Pending,
    /// Its figures (`None` when it ran once, unrecorded), or why it failed.
    Done(Result<Option<Figures>, String>),
}

/// Runs a benchmark's routine, as criterion's `Bencher`; in memory mode, for each benchmark:
///
/// 1. `MEMTRACK_WARMUP` warm-up iterations (default 2), not recorded: setup, routine and drops;
/// 2. for [`iter_batched`](Bencher::iter_batched) and its kin, the setup of every recorded
///    iteration, not recorded either: all of their inputs exist before recording starts;
/// 3. `MEMTRACK_ITERATIONS` iterations (default 10) in one memtrack session named by the
///    benchmark's id, which writes its artifact with the call stacks of its allocations and
///    stores the number of iterations, so figures are per iteration. Each iteration drops its
///    output (and its input, for the `iter_batched` kin) before the next begins: those frees are
///    recorded, which changes no allocation or byte count and keeps the peak to what one
///    iteration holds (with what earlier iterations kept).
///
/// In instructions mode, step 3 is a callgrind window instead of a session: its counters are
/// set to zero before the iterations and dumped after them, named by the benchmark's id and
/// iterations (`memtrack::instructions::Dump`).
///
/// [`iter_custom`](Bencher::iter_custom) is refused: its routine runs and times the
/// iterations itself.
pub struct Bencher<'a, M: Measurement = WallTime> {
    id: &'a str,
    plan: Plan,
    state: State,
    measurement: PhantomData<fn() -> M>,
}

impl<'a, M: Measurement> Bencher<'a, M> {
    pub(crate) fn new(id: &'a str, plan: Plan) -> Self {
        Bencher {
            id,
            plan,
            state: State::Pending,
            measurement: PhantomData,
        }
    }

    /// What the benchmark measured, or why not.
    pub(crate) fn outcome(self) -> Result<Option<Figures>, String> {
        match self.state {
            State::Pending => {
                Err("it called no Bencher::iter method (criterion requires one)".to_string())
            }
            State::Done(outcome) => outcome,
        }
    }

    /// The plan, for the first `iter` call of the benchmark; `None` for a later one, which is
    /// not run (criterion keeps only the last call's measurement; memory mode the first).
    fn begin(&self, method: &str) -> Option<Plan> {
        match self.state {
            State::Pending => Some(self.plan),
            State::Done(_) => {
                eprintln!(
                    "memtrack: {}: its second Bencher call ({method}) is not run: one per benchmark",
                    self.id
                );
                None
            }
        }
    }

    /// Starts the benchmark's session: recording starts when this returns.
    #[cfg(not(memtrack_instructions))]
    fn start(&self, _counts: Counts) -> Result<Session, String> {
        start(self.id).map_err(|e| format!("not recorded: {e}"))
    }

    /// Ends the benchmark's session of `counts.iterations` iterations, if it started.
    #[cfg(not(memtrack_instructions))]
    fn finish(&mut self, session: Result<Session, String>, counts: Counts) {
        let outcome = session.and_then(|mut session| {
            session.set_iterations(counts.iterations);
            let report = session.finish().map_err(|e| e.to_string())?;
            Ok(Some(Figures::of(&report, counts.iterations)))
        });
        self.state = State::Done(outcome);
    }

    /// Opens the benchmark's window: callgrind counts from when this returns.
    #[cfg(memtrack_instructions)]
    #[inline(always)]
    fn start(&self, counts: Counts) -> Result<Session, String> {
        Ok(Session::open(self.id, counts.iterations))
    }

    /// Closes the benchmark's window: callgrind writes its counts.
    #[cfg(memtrack_instructions)]
    #[inline(always)]
    fn finish(&mut self, session: Result<Session, String>, _counts: Counts) {
        let outcome = session.map(|window| {
            window.close();
            Some(Figures)
        });
        self.state = State::Done(outcome);
    }

    /// Runs `routine` once per iteration, dropping its output in the iteration.
    #[inline(never)]
    pub fn iter<O, R>(&mut self, mut routine: R)
    where
        R: FnMut() -> O,
    {
        match self.begin("iter") {
            None => {}
            Some(Plan::Once) => {
                black_box(routine());
                self.state = State::Done(Ok(None));
            }
            Some(Plan::Record(counts)) => {
                for _ in 0..counts.warmup {
                    drop(black_box(routine()));
                }
                let session = self.start(counts);
                if session.is_ok() {
                    for _ in 0..counts.iterations {
                        drop(black_box(routine()));
                    }
                }
                self.finish(session, counts);
            }
        }
    }

    /// Refused in memory mode: `routine` is given the number of iterations and returns their
    /// measurement, so what it allocates to measure cannot be told from what it measures. The
    /// benchmark fails with a message saying so; the other benchmarks run.
    #[inline(never)]
    pub fn iter_custom<R>(&mut self, mut routine: R)
    where
        R: FnMut(u64) -> M::Value,
    {
        match self.begin("iter_custom") {
            None => {}
            Some(Plan::Once) => {
                black_box(routine(1));
                self.state = State::Done(Ok(None));
            }
            Some(Plan::Record(_)) => self.state = State::Done(Err(ITER_CUSTOM.to_string())),
        }
    }

    /// As [`iter_batched`](Bencher::iter_batched) with [`BatchSize::PerIteration`].
    #[doc(hidden)]
    pub fn iter_with_setup<I, O, S, R>(&mut self, setup: S, routine: R)
    where
        S: FnMut() -> I,
        R: FnMut(I) -> O,
    {
        self.iter_batched(setup, routine, BatchSize::PerIteration);
    }

    /// As [`iter`](Bencher::iter) in memory mode: the output is dropped in its iteration
    /// (criterion does not time that drop; memory mode records its frees, which count no
    /// allocation or byte).
    pub fn iter_with_large_drop<O, R>(&mut self, mut routine: R)
    where
        R: FnMut() -> O,
    {
        self.iter_batched(|| (), |_| routine(), BatchSize::SmallInput);
    }

    /// Runs `setup` for every recorded iteration before recording starts (the setup is not
    /// recorded; `size` does not matter here), then `routine` on each input, dropping its
    /// output in the iteration.
    #[inline(never)]
    pub fn iter_batched<I, O, S, R>(&mut self, mut setup: S, mut routine: R, _size: BatchSize)
    where
        S: FnMut() -> I,
        R: FnMut(I) -> O,
    {
        match self.begin("iter_batched") {
            None => {}
            Some(Plan::Once) => {
                drop(black_box(routine(black_box(setup()))));
                self.state = State::Done(Ok(None));
            }
            Some(Plan::Record(counts)) => {
                for _ in 0..counts.warmup {
                    drop(black_box(routine(black_box(setup()))));
                }
                let mut inputs = inputs(counts.iterations, &mut setup);
                let session = self.start(counts);
                if session.is_ok() {
                    for input in &mut inputs {
                        drop(black_box(routine(input)));
                    }
                }
                self.finish(session, counts);
                drop(inputs);
            }
        }
    }

    /// As [`iter_batched`](Bencher::iter_batched), `routine` taking its input by reference;
    /// the input is dropped in its iteration after the output.
    #[inline(never)]
    pub fn iter_batched_ref<I, O, S, R>(&mut self, mut setup: S, mut routine: R, _size: BatchSize)
    where
        S: FnMut() -> I,
        R: FnMut(&mut I) -> O,
    {
        match self.begin("iter_batched_ref") {
            None => {}
            Some(Plan::Once) => {
                let mut input = black_box(setup());
                drop(black_box(routine(&mut input)));
                drop(black_box(input));
                self.state = State::Done(Ok(None));
            }
            Some(Plan::Record(counts)) => {
                for _ in 0..counts.warmup {
                    let mut input = black_box(setup());
                    drop(black_box(routine(&mut input)));
                    drop(black_box(input));
                }
                let mut inputs = inputs(counts.iterations, &mut setup);
                let session = self.start(counts);
                if session.is_ok() {
                    for mut input in &mut inputs {
                        drop(black_box(routine(&mut input)));
                        drop(black_box(input));
                    }
                }
                self.finish(session, counts);
                drop(inputs);
            }
        }
    }
}

/// `n` inputs made by `setup`, to be taken one per iteration: taking one allocates nothing,
/// and the buffer is freed when the iterator is dropped, after the session.
fn inputs<I>(n: u64, setup: impl FnMut() -> I) -> std::vec::IntoIter<I> {
    let mut setup = setup;
    (0..n)
        .map(|_| black_box(setup()))
        .collect::<Vec<I>>()
        .into_iter()
}

#[cfg(not(memtrack_instructions))]
/// Starts the session of benchmark `id`: quiet (the table says its figures), recording the
/// benchmark's thread and the threads it spawns, in `$MEMTRACK_DIR` or `memtrack/` in the
/// target directory. With `memtrack_bench="alloc"` the allocator recorder, unless
/// `$MEMTRACK_BACKEND` says otherwise; else `$MEMTRACK_BACKEND`, or the eBPF tracker when
/// privileged.
fn start(id: &str) -> memtrack::Result<Session> {
    let builder = SessionBuilder::new(id).quiet(true).scope(Scope::Threads);
    #[cfg(memtrack_bench = "alloc")]
    let builder = match std::env::var_os("MEMTRACK_BACKEND") {
        None => builder.backend(memtrack::BackendChoice::Alloc),
        Some(_) => builder,
    };
    builder.start()
}
