//! `memtrack bench [--base REF | --chain BASE..HEAD] -- <cargo bench args>`: a criterion suite
//! on memtrack-criterion, run in memory mode and reported per benchmark; with `--base`, also
//! run at REF (a git worktree) and gated as `memtrack compare` gates; with `--chain`, the
//! commits of a range that made each regressed benchmark change (memory, instructions or
//! both); with `--measure time --base REF`, both sides' wall-clock times in alternating order
//! instead (`time`); with `--measure all --base REF`, every measure and one triage table, a
//! class per benchmark (`triage`). Beside its artifacts each run keeps a copy of the
//! executables they recorded (`.build-id/`), so that they stay named after the suite is
//! rebuilt. Exit 0: done, no regression; 1: a regression; 2: bad usage, a failed build or run,
//! or an artifact refused.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use memtrack::{
    BackendChoice, analysis::Benchmark, analysis::Metric, analysis::Threshold, artifact::Backend,
    artifact::Reader,
};

use crate::compare::{self, Format};
use crate::error::Error;

mod chain;
mod instructions;
mod render;
mod suite;
mod time;
mod triage;

use suite::{Lock, Repo, Suite, Worktree};

/// The target directories (under the suite's) of timing mode's builds, the head's and the
/// base's; instructions mode builds there too, sharing their dependency builds.
const TIME_TARGET: &str = "memtrack-time";
const TIME_BASE_TARGET: &str = "memtrack-time-base";

/// `--backend`: a [`BackendChoice`] by its name, each value with its help line.
fn backend_choice() -> impl clap::builder::TypedValueParser<Value = BackendChoice> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("auto").help(
            "The eBPF tracker when memtrack may load it (root, or CAP_BPF + CAP_PERFMON), else \
             the allocator recorder",
        ),
        PossibleValue::new("ebpf")
            .help("The eBPF tracker (`--cfg memtrack_bench`): every allocator, C's too"),
        PossibleValue::new("alloc").help(
            "The allocator recorder as the global allocator (`--cfg memtrack_bench=\"alloc\"`): \
             Rust's allocations only, no privileges needed",
        ),
    ])
    .try_map(|s| s.parse::<BackendChoice>().map_err(|e| e.to_string()))
}

/// `--measure`'s choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Measure {
    /// Allocations, bytes and peak per iteration (memory mode).
    Memory,
    /// Instructions per iteration under callgrind (instructions mode; needs valgrind).
    Instructions,
    /// Wall-clock time, base and head in alternating order (needs --base; with another
    /// measure, the triage table).
    Time,
    /// Time, instructions and memory, with --base: one triage table, a class per benchmark.
    All,
}

/// `--gate`'s choices: measures that are reported, and gate only when named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GateArg {
    /// A time regression (`--measure time`) makes the exit code 1.
    Time,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// What to measure, comma-separated: `memory` (the default), `instructions`, `time` (with
    /// --base); `all`, or time with another, prints one triage table (with --base).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "memory")]
    measure: Vec<Measure>,
    /// Instructions: runs of the suite under callgrind; the median is the figure and the
    /// spread decides whether a benchmark is gated.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// The artifacts' directory (default: `memtrack/bench` in the target directory), its
    /// previous run's files of each measure run (`*.memtrack`, `*.instructions.json`) removed
    /// first, the other measures' kept. With --base: DIR/base and DIR/head; with
    /// --chain, DIR/NN-COMMIT per commit.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Also run the suite at this git revision, in a worktree (removed afterwards), and compare
    /// per iteration: exit 1 on a regression.
    #[arg(long, value_name = "REF")]
    base: Option<String>,
    /// Which commit of BASE..HEAD made each benchmark that regressed from BASE to HEAD grow,
    /// in memory, instructions or time (--measure): runs them at every commit of HEAD's
    /// first-parent line between (time: each commit timed against the one before) and names
    /// each step with its call sites or the functions that grew. Exit 1 when one regressed in
    /// a gated measure.
    #[arg(long, value_name = "BASE..HEAD", conflicts_with = "base")]
    chain: Option<String>,
    /// Growth allowed before a metric counts as regressed, with its % sign (as `compare`'s).
    #[arg(long, default_value = "3%", value_parser = |s: &str| s.parse::<Threshold>())]
    threshold: Threshold,
    /// Output format (markdown is ready for a CI job summary; it is also appended to
    /// $GITHUB_STEP_SUMMARY when that is set).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// The recorder the suite is built for.
    #[arg(long, value_parser = backend_choice(), default_value = "auto")]
    backend: BackendChoice,
    /// Measures whose regression makes the exit code 1 beside memory's and instructions',
    /// comma-separated (time is reported, not gated, unless named: it moves with the
    /// machine's load).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "MEASURES")]
    gate: Vec<GateArg>,
    #[command(flatten)]
    time: time::TimeArgs,
    /// `cargo bench`'s arguments (packages, `--bench NAME`, `--profile`, features; criterion's
    /// filter after another `--`).
    #[arg(last = true, value_name = "CARGO_BENCH_ARGS")]
    cargo: Vec<OsString>,
}

/// Runs the suite (twice with `--base`) and reports; see the module docs for the exit codes.
pub(crate) fn run(args: Args) -> Result<ExitCode, Error> {
    let here =
        std::env::current_dir().map_err(|e| crate::error::io("no current directory".into(), e))?;
    let target = suite::target_dir(&here)?;
    // Where the user typed it: cargo runs each side's bench binaries in its package's root.
    let out = args
        .out
        .as_ref()
        .map_or_else(|| target.join("memtrack/bench"), |o| here.join(o));
    if std::fs::metadata(&out).is_ok_and(|m| !m.is_dir()) {
        return Err(Error::Usage(format!(
            "--out {}: it is a file, and bench writes a directory of artifacts: name a directory",
            out.display()
        )));
    }
    let _lock = Lock::take(&target)?;
    if args.gate.contains(&GateArg::Time) && !triage::Asked::of(&args.measure).time {
        return Err(Error::Usage(
            "--gate time gates --measure time: add --measure time".into(),
        ));
    }
    if let Some(spec) = &args.chain {
        return chained(&args, (&here, &target, &out), spec);
    }
    if triage::asked(&args.measure) {
        return triage::run(&args, &here, &target, &out);
    }
    if args.measure.contains(&Measure::Time) {
        return timed(&args, &here, &target, &out);
    }
    let suite = memory_suite(&args, &target, &out);
    // Timing mode's target directory: instructions mode builds the same dependencies.
    let counting = args.measure.contains(&Measure::Instructions).then(|| {
        instructions::Counting::new(&args.cargo, args.runs as usize, target.join(TIME_TARGET))
    });
    // With --format json, one document: memory's, the instruction rows added to it.
    let json = matches!(args.format, Format::Json);
    let mut doc = serde_json::json!({});
    let code = match &args.base {
        None => {
            measure_here(&args, &here, &out, &suite, counting.as_ref(), &mut doc)?;
            ExitCode::SUCCESS
        }
        Some(reference) => {
            let sides = Sides {
                here: &here,
                target: &target,
                out: &out,
                reference,
            };
            measure_both(&args, &sides, suite, counting.as_ref(), &mut doc)?
        }
    };
    if json {
        crate::out(&(serde_json::to_string_pretty(&doc).expect("json values serialize") + "\n"))?;
    }
    Ok(code)
}

/// The suite as memory mode builds it: for the recorder `--backend` resolves to here, not by
/// each bench binary (a suite is built for one recorder).
fn memory_suite(args: &Args, target: &Path, out: &Path) -> Suite {
    let backend = match args.backend {
        BackendChoice::Ebpf => Backend::Ebpf,
        BackendChoice::Auto if memtrack::tracker::privileged() => Backend::Ebpf,
        _ => Backend::Alloc,
    };
    Suite {
        backend,
        args: args.cargo.clone(),
        target: target.join("memtrack-bench"),
        only: None,
        store: out.join(crate::BUILD_IDS),
    }
}

/// What `--measure time` (alone or in the triage) is asked, from bench's arguments.
fn time_request<'a>(
    args: &'a Args,
    here: &'a Path,
    target: &'a Path,
    out: &'a Path,
    reference: &'a str,
) -> time::Request<'a> {
    time::Request {
        here,
        target,
        out,
        reference,
        cargo: &args.cargo,
        threshold: args.threshold,
        format: args.format,
        gate: args.gate.contains(&GateArg::Time),
        time: &args.time,
    }
}

/// `--measure time` alone, with `--base` (the A/B needs two builds).
fn timed(args: &Args, here: &Path, target: &Path, out: &Path) -> Result<ExitCode, Error> {
    match &args.base {
        Some(reference) => time::run(&time_request(args, here, target, out, reference)),
        None => Err(Error::Usage(
            "--measure time compares two builds run in alternating order: give --base REF".into(),
        )),
    }
}

/// `--chain`: each measure asked (`all`: every one) followed along the range.
fn chained(
    args: &Args,
    (here, target, out): (&Path, &Path, &Path),
    spec: &str,
) -> Result<ExitCode, Error> {
    let asked = triage::Asked::of(&args.measure);
    if asked.instructions {
        // Before anything is built: without valgrind the chain cannot be whole.
        memtrack::instructions::run::Callgrind::find()?;
    }
    let repo = Repo::find(here, "--chain")?;
    // Timing mode's target directory: instructions mode builds the same dependencies.
    let counting = asked.instructions.then(|| {
        instructions::Counting::new(&args.cargo, args.runs as usize, target.join(TIME_TARGET))
    });
    let measures = chain::Measures {
        memory: asked.memory.then(|| memory_suite(args, target, out)),
        instructions: counting,
        time: asked.time.then(|| chain::Timing {
            cargo: args.cargo.clone(),
            args: args.time.clone(),
            gate: args.gate.contains(&GateArg::Time),
        }),
    };
    let c = chain::Chain {
        repo: &repo,
        target,
        out,
        spec,
        threshold: args.threshold,
        format: args.format,
    };
    chain::run(&c, measures)
}

/// Without `--base`: the suite measured here, its table printed (or added to `doc`).
fn measure_here(
    args: &Args,
    here: &Path,
    out: &Path,
    suite: &Suite,
    counting: Option<&instructions::Counting>,
    doc: &mut serde_json::Value,
) -> Result<(), Error> {
    // Each measure clears only its own files: an instructions run keeps memory's artifacts.
    if args.measure.contains(&Measure::Memory) {
        clear(out)?;
        suite.run(here, out, "head")?;
        report(out, args.format, doc)?;
    }
    if let Some(counting) = counting {
        counting.run(here, out, "head")?;
        let counts = instructions::report(out)?;
        if matches!(args.format, Format::Json) {
            counts.add_to(doc);
        } else {
            crate::out(&counts.render(args.format))?;
        }
        summary(&counts.render(Format::Markdown));
    }
    Ok(())
}

/// Where `--base` measures: the head here, the base in a worktree at `reference`.
struct Sides<'a> {
    here: &'a Path,
    target: &'a Path,
    out: &'a Path,
    reference: &'a str,
}

/// With `--base`: each measure at the head and at the base, then compared; exit 1 when a
/// gated measure regressed.
fn measure_both(
    args: &Args,
    s: &Sides<'_>,
    suite: Suite,
    counting: Option<&instructions::Counting>,
    doc: &mut serde_json::Value,
) -> Result<ExitCode, Error> {
    // The worktree first: a bad REF is refused before anything is built.
    let repo = Repo::find(s.here, "--base")?;
    let tree = Worktree::add(&repo, s.reference, s.target, "--base")?;
    let (base, head) = (s.out.join("base"), s.out.join("head"));
    let side = format!(
        "base {}, {}",
        s.reference,
        &tree.commit[..tree.commit.len().min(12)]
    );
    let memory = args.measure.contains(&Measure::Memory);
    // A base on criterion itself is refused before the head runs, not after.
    let mode = if memory { "memory" } else { "instructions" };
    suite::require_memtrack_criterion(&tree.dir, &args.cargo, &side, mode)?;
    if memory {
        // The build-id store of both sides is --out's. Only memory's files: an instructions
        // run keeps them.
        clear(s.out)?;
        clear(&base)?;
        clear(&head)?;
        suite.run(s.here, &head, "head")?;
        // A target directory of its own: cargo names a workspace's crates the same wherever
        // they are, so in the head's it would take the head's build for the base's.
        let base_suite = Suite {
            target: s.target.join("memtrack-bench-base"),
            ..suite
        };
        base_suite.run(&tree.dir, &base, &side)?;
    }
    if let Some(counting) = counting {
        counting.run(s.here, &head, "head")?;
        let base_counting = instructions::Counting {
            target: s.target.join(TIME_BASE_TARGET),
            ..instructions::Counting::new(&args.cargo, args.runs as usize, PathBuf::new())
        };
        base_counting.run(&tree.dir, &base, &side)?;
    }
    drop(tree);
    let mut code = ExitCode::SUCCESS;
    if memory {
        code = gate(&base, &head, args, doc)?;
    }
    if counting.is_some() {
        let gated = instructions::gate(&base, &head, args.threshold)?;
        if matches!(args.format, Format::Json) {
            gated.add_to(doc);
        } else {
            crate::out(&gated.render(args.format))?;
        }
        summary(&gated.render(Format::Markdown));
        if code == ExitCode::SUCCESS && gated.regressed() {
            code = ExitCode::from(1);
        }
    }
    Ok(code)
}

/// Creates `dir` if need be and removes the `*.memtrack` a previous run left in it (saying so
/// when there were some) and the executables kept for them (its build-id directory). Under the rules of artifacts
/// (`memtrack::artifact::Output`): a link on the way to `dir`, or `dir` itself, is followed
/// only if the user or root owns it, and in `dir` only regular files and a real directory are
/// removed (a link there is removed, never followed).
fn clear(dir: &Path) -> Result<(), Error> {
    let fail = |e: std::io::Error| crate::error::io(format!("cannot clear {}", dir.display()), e);
    memtrack::artifact::create_dir_all(dir)?;
    let mut removed = 0u64;
    for entry in std::fs::read_dir(dir).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        let p = entry.path();
        if p.extension().is_some_and(|x| x == "memtrack")
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            std::fs::remove_file(&p).map_err(fail)?;
            removed += 1;
        }
    }
    // The copies of the executables those artifacts recorded go with them.
    let kept = dir.join(crate::BUILD_IDS);
    match std::fs::symlink_metadata(&kept) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&kept).map_err(fail)?,
        Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&kept).map_err(fail)?,
        _ => {}
    }
    if removed > 0 {
        eprintln!(
            "memtrack: removed {} of a previous run from {}",
            memtrack::human::plural(removed, "artifact", "artifacts"),
            dir.display()
        );
    }
    Ok(())
}

/// The table of the artifacts in `dir`, one row per benchmark, printed (JSON: put into `doc`,
/// under `benchmarks`).
fn report(dir: &Path, format: Format, doc: &mut serde_json::Value) -> Result<(), Error> {
    let (mut errors, mut sites) = (Vec::new(), compare::SiteSets::new());
    let set = compare::load_side(dir, "bench", &mut errors, &mut sites);
    if !errors.is_empty() {
        return Err(Error::Refused {
            problems: errors,
            summary: None,
        });
    }
    match format {
        Format::Table => crate::out(&render::table(&set))?,
        Format::Markdown => crate::out(&render::markdown(&set))?,
        Format::Json => doc["benchmarks"] = render::json(&set),
    }
    summary(&render::markdown(&set));
    Ok(())
}

/// Compares base and head as `memtrack compare --threshold` does, both recorded alike; prints
/// the comparison (JSON: makes it `doc`).
fn gate(
    base: &Path,
    head: &Path,
    args: &Args,
    doc: &mut serde_json::Value,
) -> Result<ExitCode, Error> {
    let loaded = compare::load_pair(base, head)?;
    compare::nothing_in_common(&loaded, base, head)?;
    mixed(&loaded.base, &loaded.head)?;
    let judged = compare::judge(&loaded, &Metric::ALL, args.threshold)?;
    match args.format {
        Format::Json => *doc = compare::render::json(&judged.cmp, &judged.attributed),
        format => crate::out(&judged.render(format))?,
    }
    summary(&judged.render(Format::Markdown));
    Ok(judged.exit_code())
}

/// An error when a benchmark was recorded by one recorder in the base and another in the head:
/// the eBPF tracker counts C's allocations, the allocator recorder does not.
fn mixed(base: &[Benchmark], head: &[Benchmark]) -> Result<(), Error> {
    let recorder = |b: &Benchmark| {
        Reader::open(&b.path).map(|r| match r.metadata().backend {
            Backend::Ebpf => "the eBPF tracker",
            Backend::Alloc => "the allocator recorder",
            _ => "another recorder",
        })
    };
    for h in head {
        let Some(b) = base.iter().find(|b| b.name == h.name) else {
            continue;
        };
        let (rb, rh) = (recorder(b)?, recorder(h)?);
        if rb != rh {
            return Err(Error::MixedRecorders(format!(
                "{}: the base ({}) was recorded by {rb} and the head ({}) by {rh}, which count different allocations: record both with one --backend",
                h.name,
                b.path.display(),
                h.path.display()
            )));
        }
    }
    Ok(())
}

/// Appends `markdown` to `$GITHUB_STEP_SUMMARY` when it is set (the file a GitHub Actions
/// step's summary is read from, made by the runner). Called after the result is printed: a
/// summary that cannot be written is a warning, and the exit code stays the result's.
fn summary(markdown: &str) {
    use std::io::Write;
    let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|p| !p.is_empty()) else {
        return;
    };
    let path = PathBuf::from(path);
    let written = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(markdown.as_bytes()));
    if let Err(e) = written {
        eprintln!(
            "memtrack: warning: cannot append to $GITHUB_STEP_SUMMARY ({}): {e}; the job \
             summary lacks this result",
            path.display()
        );
    }
}
