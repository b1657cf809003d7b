//! The run of this process in memory mode, in one place: its settings (read once from the
//! environment and the command line), the ids given so far, what each benchmark measured or
//! why it failed, and the one table printed at the end.

use std::collections::BTreeSet;
#[cfg(not(memtrack_instructions))]
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

#[cfg(not(memtrack_instructions))]
use memtrack::Report;
#[cfg(not(memtrack_instructions))]
use memtrack::analysis::Benchmark;
use memtrack::human;
#[cfg(not(memtrack_instructions))]
use memtrack::render::{self, BenchmarkRow};

use crate::args::{Args, HELP};

/// Warm-up iterations before the recorded ones (`MEMTRACK_WARMUP`): two, so that what the
/// first call of a routine sets up once (lazy statics, caches, a buffer grown to size) is
/// there before recording starts.
pub(crate) const DEFAULT_WARMUP: u64 = 2;

/// Recorded iterations (`MEMTRACK_ITERATIONS`): allocation counts do not vary as timings do,
/// so a few are enough; ten spread a buffer's amortized growth over several.
pub(crate) const DEFAULT_ITERATIONS: u64 = 10;

/// How many iterations each benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) warmup: u64,
    pub(crate) iterations: u64,
}

/// `MEMTRACK_WARMUP` and `MEMTRACK_ITERATIONS`, else the defaults; read once. An invalid
/// value ends the process (status 2) with a one-line message, before any benchmark runs (so
/// does an invalid `MEMTRACK_SUMMARY`, read here too).
pub(crate) fn counts() -> Counts {
    static COUNTS: OnceLock<Counts> = OnceLock::new();
    *COUNTS.get_or_init(|| {
        summary_table();
        let read = |var: &str, default: u64, min: u64| match std::env::var(var) {
            Err(_) => default,
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(n) if n >= min => n,
                _ => exit_with(&format!(
                    "memtrack: {var}={v:?} is not a whole number of at least {min}"
                )),
            },
        };
        Counts {
            warmup: read("MEMTRACK_WARMUP", DEFAULT_WARMUP, 0),
            iterations: read("MEMTRACK_ITERATIONS", DEFAULT_ITERATIONS, 1),
        }
    })
}

/// This process's arguments, parsed once (`--help` prints the help and exits, an error ends
/// the process with status 2, as criterion's parser does).
pub(crate) fn args() -> &'static Args {
    static ARGS: OnceLock<Args> = OnceLock::new();
    ARGS.get_or_init(|| match Args::parse(std::env::args().skip(1)) {
        Ok(a) if a.help => {
            println!("{HELP}");
            std::process::exit(0)
        }
        Ok(a) => a,
        Err(e) => exit_with(&e),
    })
}

/// Whether benchmark `id` is among those `MEMTRACK_BENCHMARKS` names (all when it is unset):
/// one id per line, as [`human::escape_line`] writes it. `memtrack bench
/// --chain` sets it to the benchmarks it follows along a range of commits. An id made unique
/// with ` #2` is named by its first id. Read once.
pub(crate) fn chosen(id: &str) -> bool {
    static CHOSEN: OnceLock<Option<BTreeSet<String>>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let list = std::env::var_os("MEMTRACK_BENCHMARKS")?;
        Some(chosen_ids(&list.to_string_lossy()))
    });
    chosen.as_ref().is_none_or(|set| set.contains(id))
}

/// The ids a `MEMTRACK_BENCHMARKS` value names: each line as it is, and one that ends in ` #N`
/// also as the first id it may have been made unique from (an id may end in ` #N` of its own).
fn chosen_ids(list: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in list.lines().filter(|l| !l.is_empty()) {
        let line = human::unescape_line(line);
        if let Some((head, n)) = line.rsplit_once(" #") {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                out.insert(head.to_string());
            }
        }
        out.insert(line);
    }
    out
}

fn exit_with(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(2)
}

/// What one benchmark's window measured: instructions mode's counts are in callgrind's dump,
/// read by whoever ran the process under callgrind.
#[cfg(memtrack_instructions)]
#[derive(Debug, Clone)]
pub(crate) struct Figures;

/// What one benchmark's session measured, per its `iterations`.
#[cfg(not(memtrack_instructions))]
#[derive(Debug, Clone)]
pub(crate) struct Figures {
    pub(crate) iterations: u64,
    pub(crate) allocations: u64,
    pub(crate) bytes: u64,
    pub(crate) peak_live_bytes: u64,
    pub(crate) live_blocks_at_end: u64,
    pub(crate) live_bytes_at_end: u64,
    pub(crate) lost_events: u64,
    pub(crate) path: Option<PathBuf>,
}

#[cfg(not(memtrack_instructions))]
impl Figures {
    /// The benchmark `id` with these figures, for the table.
    fn benchmark(&self, id: &str) -> Benchmark {
        let totals = render::totals(
            self.allocations,
            self.bytes,
            self.peak_live_bytes,
            self.live_blocks_at_end,
            self.live_bytes_at_end,
        );
        Benchmark::new(id, self.path.clone().unwrap_or_default(), totals)
            .with_iterations(Some(self.iterations))
    }

    /// The figures of a finished session of `iterations`: the one place that reads a
    /// [`Report`]'s fields.
    pub(crate) fn of(report: &Report, iterations: u64) -> Figures {
        Figures {
            iterations,
            allocations: report.allocations(),
            bytes: report.bytes_allocated(),
            peak_live_bytes: report.peak_live_bytes(),
            live_blocks_at_end: report.totals().live_blocks_at_end,
            live_bytes_at_end: report.totals().live_bytes_at_end,
            lost_events: report.lost_events(),
            path: report.path.clone(),
        }
    }
}

/// The run so far: benchmarks in the order they ran.
struct Run {
    /// Every id given so far (criterion's title, made unique with ` #2`, …).
    ids: BTreeSet<String>,
    /// Each benchmark that ran: its figures (`None` when run once, unrecorded), or why it failed.
    outcomes: Vec<(String, Result<Option<Figures>, String>)>,
    /// The table was printed: a second `final_summary` prints nothing.
    summarized: bool,
}

static RUN: Mutex<Run> = Mutex::new(Run {
    ids: BTreeSet::new(),
    outcomes: Vec::new(),
    summarized: false,
});

fn run() -> MutexGuard<'static, Run> {
    // A benchmark that panicked did so outside this lock: its state is whole.
    RUN.lock().unwrap_or_else(|e| e.into_inner())
}

/// `id`, or `id #2`, `id #3`, … if it was given before in this process (criterion does the
/// same within one `Criterion`; here across groups too, since each artifact is named by it).
pub(crate) fn unique_id(id: String) -> String {
    let mut run = run();
    let mut unique = id.clone();
    let mut n = 2;
    while run.ids.contains(&unique) {
        unique = format!("{id} #{n}");
        n += 1;
    }
    run.ids.insert(unique.clone());
    unique
}

/// Records what benchmark `id` measured, or why it failed (said now, on one line of stderr).
pub(crate) fn record(id: &str, outcome: Result<Option<Figures>, String>) {
    let mut run = run();
    #[cfg(not(memtrack_instructions))]
    let outcome = outcome.and_then(|figures| {
        let Some(f) = figures else { return Ok(None) };
        if f.lost_events > 0 {
            return Err(format!(
                "{} events lost: its numbers are incomplete",
                human::count(f.lost_events)
            ));
        }
        let same = |o: &Result<Option<Figures>, String>| {
            matches!(o, Ok(Some(g)) if g.path.is_some() && g.path == f.path)
        };
        match run.outcomes.iter().find(|(_, o)| same(o)) {
            Some((other, _)) => Err(format!(
                "its artifact has the file name of {other}'s, which it replaced: rename one"
            )),
            None => Ok(Some(f)),
        }
    });
    if let Err(why) = &outcome {
        eprintln!("memtrack: {id}: {why}");
    }
    run.outcomes.push((id.to_string(), outcome));
}

/// How the run ends its output (`MEMTRACK_SUMMARY`): the table of its benchmarks on stdout
/// (`table`, the default), or one line on stderr (`line`: `memtrack bench` prints one table
/// for all the suite's binaries). Instructions mode prints its line in both, naming
/// `memtrack bench` as the dumps' reader only in `table`. Another value ends the process
/// (status 2).
fn summary_table() -> bool {
    static TABLE: OnceLock<bool> = OnceLock::new();
    *TABLE.get_or_init(|| match std::env::var("MEMTRACK_SUMMARY") {
        Err(_) => true,
        Ok(v) if v == "table" => true,
        Ok(v) if v == "line" => false,
        Ok(v) => exit_with(&format!(
            "memtrack: MEMTRACK_SUMMARY={v:?} is neither \"table\" nor \"line\""
        )),
    })
}

/// Prints the table of the recorded benchmarks on stdout, or one line on stderr (see
/// [`summary_table`]; when `table`, and once), and ends the process with status 1 if any
/// benchmark failed.
pub(crate) fn summarize(table: bool) {
    let mut run = run();
    #[cfg(memtrack_instructions)]
    if table && !run.summarized && !run.outcomes.is_empty() {
        run.summarized = true;
        let counts = counts();
        let counted = run
            .outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Ok(Some(_))))
            .count();
        // Run by hand, the dumps need saying who reads them; `memtrack bench` (`line`) is
        // that reader.
        let reader = if summary_table() {
            ", one callgrind dump each (`memtrack bench --measure instructions` reads them)"
        } else {
            ""
        };
        eprintln!(
            "memtrack: {} counted, {} iterations each after {} of warm-up{reader}",
            human::plural(counted as u64, "benchmark", "benchmarks"),
            counts.iterations,
            counts.warmup,
        );
    }
    #[cfg(not(memtrack_instructions))]
    if table && !run.summarized && !run.outcomes.is_empty() {
        run.summarized = true;
        let counts = counts();
        let dir = run.outcomes.iter().find_map(|(_, o)| {
            let path = o.as_ref().ok()?.as_ref()?.path.as_ref()?;
            Some(path.parent()?.display().to_string())
        });
        let dir = dir
            .map(|d| format!("; artifacts in {d}"))
            .unwrap_or_default();
        if summary_table() {
            print!("{}", render(&run.outcomes));
            eprintln!(
                "memtrack: {} iterations per benchmark, after {} of warm-up{dir}",
                counts.iterations, counts.warmup,
            );
        } else {
            let recorded = run
                .outcomes
                .iter()
                .filter(|(_, o)| matches!(o, Ok(Some(_))))
                .count();
            eprintln!(
                "memtrack: {} recorded, {} iterations each after {} of warm-up{dir}",
                human::plural(recorded as u64, "benchmark", "benchmarks"),
                counts.iterations,
                counts.warmup,
            );
        }
    }
    let failed: Vec<&str> = run
        .outcomes
        .iter()
        .filter(|(_, o)| o.is_err())
        .map(|(id, _)| id.as_str())
        .collect();
    if !failed.is_empty() {
        eprintln!(
            "memtrack: {} of {} benchmarks failed: {}",
            failed.len(),
            run.outcomes.len(),
            failed.join(", ")
        );
        drop(run);
        std::process::exit(1);
    }
}

#[cfg(not(memtrack_instructions))]
/// The table of the benchmarks that ran: the library's table of benchmarks, the one `memtrack
/// bench` prints ([`memtrack::render::benchmarks`]); a failed one's row says so.
fn render(outcomes: &[(String, Result<Option<Figures>, String>)]) -> String {
    let measured: Vec<(&str, Result<Benchmark, ()>)> = outcomes
        .iter()
        .filter_map(|(id, o)| match o {
            Ok(None) => None,
            Ok(Some(f)) => Some((id.as_str(), Ok(f.benchmark(id)))),
            Err(_) => Some((id.as_str(), Err(()))),
        })
        .collect();
    render::text(&render::benchmarks(measured.iter().map(
        |(id, b)| match b {
            Ok(b) => BenchmarkRow::Measured(b),
            Err(()) => BenchmarkRow::Failed(id),
        },
    )))
}

#[cfg(all(test, not(memtrack_instructions)))]
mod tests {
    use super::*;

    fn figures(iterations: u64, allocations: u64, bytes: u64) -> Figures {
        Figures {
            iterations,
            allocations,
            bytes,
            peak_live_bytes: 8192,
            live_blocks_at_end: 1,
            live_bytes_at_end: 24,
            lost_events: 0,
            path: None,
        }
    }

    /// `MEMTRACK_BENCHMARKS`' lines: escapes undone, ` #N` kept and dropped (an id of the
    /// user's may end in it), blank lines skipped.
    #[test]
    fn chosen_ids_undo_the_escapes() {
        let list = "a/b\n\n  group {\\n  /3\nback\\\\slash\nparse #2\nend\\";
        let want = [
            "a/b",
            "  group {\n  /3",
            "back\\slash",
            "parse #2",
            "parse",
            "end\\",
        ];
        assert_eq!(
            chosen_ids(list),
            want.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>()
        );
    }

    #[test]
    fn the_table_gives_per_iteration_figures() {
        let t = render(&[
            ("vec/1024".into(), Ok(Some(figures(10, 10, 81_920)))),
            ("fmt".into(), Ok(Some(figures(4, 5, 50)))),
            ("custom".into(), Err("iter_custom".into())),
        ]);
        assert_eq!(
            t,
            "benchmark  iterations  allocations         bytes     peak     live at end\n\
             vec/1024           10    1.00/iter  8.0 KiB/iter  8.0 KiB  1 block (24 B)\n\
             fmt                 4    1.25/iter  12.50 B/iter  8.0 KiB  1 block (24 B)\n\
             custom         failed\n"
        );
    }
}
