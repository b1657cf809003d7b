//! `memtrack bench --measure time --base REF`: the suite's wall-clock times at REF (the base)
//! and in the checkout (the head), run in alternating order so that the machine's load hits
//! both sides alike. Both sides are built in timing mode (no memtrack cfg: memtrack-criterion
//! is criterion itself), each in a target directory of its own, apart from memory mode's so
//! that neither build invalidates the other. Then, per benchmark, R rounds of base, head, head,
//! base (A B B A), each run criterion's own measurement of that one benchmark
//! (`<bench binary> --bench --exact ID`), with a private `CRITERION_HOME` from which its
//! `estimates.json` is read. The runs are pinned to one CPU when the machine allows. A change
//! is called only when the medians moved beyond the threshold and the two sides' ranges do not
//! overlap; anything else is within noise. Every run is logged, in order, in
//! `--out`/time/runs.jsonl.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use memtrack::analysis::Threshold;

use super::suite::{Repo, Worktree};
use crate::compare::Format;
use crate::error::Error;

pub(crate) mod render;

/// `--measure time`'s settings of each criterion run.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct TimeArgs {
    /// With --measure time: rounds per benchmark, each running base, head, head, base.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// With --measure time: criterion's warm-up per run, in seconds (its --warm-up-time).
    #[arg(long, value_name = "SECS", default_value = "0.5", value_parser = seconds)]
    pub warm_up_time: f64,
    /// With --measure time: criterion's measurement per run, in seconds (its
    /// --measurement-time).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = seconds)]
    pub measurement_time: f64,
    /// With --measure time: criterion's samples per run (its --sample-size, at least 10;
    /// default: the suite's own).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(10..))]
    pub sample_size: Option<u32>,
}

/// A positive, finite number of seconds.
fn seconds(s: &str) -> crate::error::Result<f64> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(Error::Usage(format!(
            "{s:?} is not a number of seconds between 0 and 3600 (e.g. 0.5)"
        ))),
    }
}

/// Which build a run timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// REF's (A).
    Base,
    /// The checkout's (B).
    Head,
}

impl Side {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Side::Base => "base",
            Side::Head => "head",
        }
    }
}

/// The order of one benchmark's runs: A B B A per round, base being A. Each side runs twice a
/// round, once on either side of the other's pair, so a load that rises or falls steadily
/// over a round weighs on both alike.
pub(crate) fn order(rounds: u32) -> Vec<Side> {
    let round = [Side::Base, Side::Head, Side::Head, Side::Base];
    (0..rounds).flat_map(|_| round).collect()
}

/// A time row's verdict: the comparisons' own, [`Verdict::WithinNoise`] when no change is
/// called.
pub(crate) use memtrack::analysis::Verdict;

/// One side's runs of a benchmark: criterion's median time per iteration of each run, in ns.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Runs(pub Vec<f64>);

impl Runs {
    /// The median of the runs (the mean of the middle two for an even count).
    pub(crate) fn median(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub(crate) fn min(&self) -> f64 {
        self.0.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub(crate) fn max(&self) -> f64 {
        self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

/// The change of the medians in percent, and the verdict: a change is called only when it is
/// beyond `threshold` and the ranges (min–max) do not overlap.
pub(crate) fn judge(base: &Runs, head: &Runs, threshold: Threshold) -> (f64, Verdict) {
    let (b, h) = (base.median(), head.median());
    let change = (h - b) / b * 100.0;
    let beyond = change.abs() > threshold.percent();
    let verdict = if beyond && change > 0.0 && head.min() > base.max() {
        Verdict::Regressed
    } else if beyond && change < 0.0 && head.max() < base.min() {
        Verdict::Improved
    } else {
        Verdict::WithinNoise
    };
    (change, verdict)
}

/// One benchmark compared.
#[derive(Clone)]
pub(crate) struct Row {
    pub benchmark: String,
    pub base: Runs,
    pub head: Runs,
    pub change_percent: f64,
    pub verdict: Verdict,
}

/// Something that kept part of the suite from being compared: a side's build or listing, or a
/// benchmark's run.
#[derive(Clone)]
pub(crate) struct Failure {
    pub side: Side,
    /// The benchmark, when one run failed; `None` for a build or a listing.
    pub benchmark: Option<String>,
    pub error: String,
}

/// The whole result.
pub(crate) struct Report {
    pub threshold: Threshold,
    pub rounds: u32,
    /// The base's commit.
    pub base_commit: String,
    /// The CPU the runs were pinned to, if they could be.
    pub cpu: Option<usize>,
    pub rows: Vec<Row>,
    /// Benchmarks listed by the head only, and by the base only.
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub failures: Vec<Failure>,
    /// The run log.
    pub log: PathBuf,
}

impl Report {
    /// The report limited to the benchmarks of `only`.
    pub(crate) fn only(&self, only: &BTreeSet<String>) -> Report {
        let kept = |b: &String| only.contains(b);
        Report {
            threshold: self.threshold,
            rounds: self.rounds,
            base_commit: self.base_commit.clone(),
            cpu: self.cpu,
            rows: (self.rows.iter())
                .filter(|r| kept(&r.benchmark))
                .cloned()
                .collect(),
            added: self.added.iter().filter(|b| kept(b)).cloned().collect(),
            removed: self.removed.iter().filter(|b| kept(b)).cloned().collect(),
            failures: (self.failures.iter())
                .filter(|f| f.benchmark.as_ref().is_some_and(kept))
                .cloned()
                .collect(),
            log: self.log.clone(),
        }
    }

    pub(crate) fn regressions(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regressed)
            .count()
    }
}

/// A bench executable of one side's build.
struct Executable {
    path: PathBuf,
    /// Its package's directory, where cargo runs it.
    cwd: PathBuf,
}

/// Builds the suite in `dir` for timing with `cargo bench --no-run ARGS` in `target`: the
/// bench executables cargo made. Cargo's messages go to stderr.
fn build(
    dir: &Path,
    target: &Path,
    cargo_args: &[OsString],
    what: &str,
) -> crate::error::Result<Vec<Executable>> {
    let mut cmd = super::suite::cargo();
    cmd.current_dir(dir)
        .arg("bench")
        .arg("--no-run")
        .arg("--message-format=json-render-diagnostics")
        .args(cargo_args)
        .env("CARGO_TARGET_DIR", target)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .stdout(Stdio::piped());
    let out = cmd.output().map_err(|e| {
        Error::Command(format!(
            "cannot run `{}` ({what}): {e}",
            super::suite::shown(&cmd)
        ))
    })?;
    if !out.status.success() {
        return Err(Error::Command(format!(
            "`{}` failed ({what}, in {}): {}; its messages are above",
            super::suite::shown(&cmd),
            dir.display(),
            out.status
        )));
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some("compiler-artifact"), Some(exe)) =
            (msg["reason"].as_str(), msg["executable"].as_str())
        else {
            continue;
        };
        let cwd = msg["manifest_path"]
            .as_str()
            .and_then(|m| Path::new(m).parent())
            .map_or_else(|| dir.to_path_buf(), Path::to_path_buf);
        exes.push(Executable {
            path: exe.into(),
            cwd,
        });
    }
    Ok(exes)
}

/// The criterion benchmarks `exe` holds (`--list`, which criterion answers with `ID: benchmark`
/// lines; a libtest harness's `: bench` and `: test` lines are not criterion's and are left
/// out). `filter` is criterion's, as given after the cargo arguments' `--`.
fn list(exe: &Executable, filter: &[OsString]) -> crate::error::Result<Vec<String>> {
    let mut cmd = Command::new(&exe.path);
    cmd.current_dir(&exe.cwd)
        .arg("--bench")
        .args(filter)
        .arg("--list")
        .stdin(Stdio::null());
    let out = cmd
        .output()
        .map_err(|e| Error::Command(format!("cannot run `{}`: {e}", super::suite::shown(&cmd))))?;
    if !out.status.success() {
        return Err(Error::Command(format!(
            "`{}` failed ({}): {}",
            super::suite::shown(&cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": benchmark"))
        .map(str::to_string)
        .collect())
}

/// One side built and listed: each benchmark id and the executable that runs it.
pub(crate) struct Built {
    benchmarks: BTreeMap<String, usize>,
    /// Ids in the order the executables listed them.
    order: Vec<String>,
    exes: Vec<Executable>,
}

/// Builds and lists one side; what fails is added to `failures` (a failed listing of one
/// executable drops its benchmarks only).
pub(crate) fn prepare(
    dir: &Path,
    target: &Path,
    cargo_args: &[OsString],
    filter: &[OsString],
    side: Side,
    what: &str,
    failures: &mut Vec<Failure>,
) -> Built {
    let mut built = Built {
        benchmarks: BTreeMap::new(),
        order: Vec::new(),
        exes: Vec::new(),
    };
    let exes = match build(dir, target, cargo_args, what) {
        Ok(e) => e,
        Err(error) => {
            failures.push(Failure {
                side,
                benchmark: None,
                error: error.to_string(),
            });
            return built;
        }
    };
    for exe in exes {
        let ids = match list(&exe, filter) {
            Ok(ids) => ids,
            Err(error) => {
                failures.push(Failure {
                    side,
                    benchmark: None,
                    error: error.to_string(),
                });
                continue;
            }
        };
        let i = built.exes.len();
        for id in ids {
            if built.benchmarks.contains_key(&id) {
                failures.push(Failure {
                    side,
                    benchmark: Some(id.clone()),
                    error: format!(
                        "two bench executables hold a benchmark of this id ({} is the second): \
                         select one with `--bench NAME`",
                        exe.path.display()
                    ),
                });
                continue;
            }
            built.benchmarks.insert(id.clone(), i);
            built.order.push(id);
        }
        built.exes.push(exe);
    }
    built
}

/// The run's settings and state shared by every run.
struct Runner<'a> {
    args: &'a TimeArgs,
    /// `--out`/time: each run's private criterion directory is made in it.
    dir: PathBuf,
    log: std::fs::File,
    seq: u64,
    cpu: Option<usize>,
}

impl Runner<'_> {
    /// Criterion's measurement of `id` by `exe`, in ns per iteration (its median), logged.
    fn run(
        &mut self,
        exe: &Executable,
        id: &str,
        side: Side,
        round: u32,
    ) -> crate::error::Result<f64> {
        self.seq += 1;
        let started = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let clock = Instant::now();
        let result = self.measure(exe, id);
        let wall = clock.elapsed();
        let line = serde_json::json!({
            "seq": self.seq,
            "benchmark": id,
            "round": round,
            "side": side.name(),
            "started_unix_ms": u64::try_from(started.as_millis()).unwrap_or(u64::MAX),
            "wall_ms": u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
            "cpu": self.cpu,
            "median_ns": result.as_ref().ok().map(|m| m.0),
            "mean_ns": result.as_ref().ok().map(|m| m.1),
            "error": result.as_ref().err().map(ToString::to_string),
        });
        writeln!(self.log, "{line}")
            .map_err(|e| Error::Command(format!("cannot write the run log: {e}")))?;
        result.map(|m| m.0)
    }

    /// One criterion run of `id` in a fresh criterion directory: its median and mean.
    fn measure(&self, exe: &Executable, id: &str) -> crate::error::Result<(f64, f64)> {
        let home = tempfile::Builder::new()
            .prefix("criterion-")
            .tempdir_in(&self.dir)
            .map_err(|e| {
                Error::Command(format!(
                    "cannot make a directory in {}: {e}",
                    self.dir.display()
                ))
            })?;
        let mut cmd = Command::new(&exe.path);
        cmd.current_dir(&exe.cwd)
            .arg("--bench")
            .arg("--exact")
            .arg(id)
            .arg("--warm-up-time")
            .arg(self.args.warm_up_time.to_string())
            .arg("--measurement-time")
            .arg(self.args.measurement_time.to_string())
            .arg("--noplot")
            // Its bootstrap only sets confidence intervals, which the verdict does not use (the
            // spread is the runs' range); criterion warns at 1000 and below.
            .arg("--nresamples")
            .arg("1001");
        if let Some(n) = self.args.sample_size {
            cmd.arg("--sample-size").arg(n.to_string());
        }
        cmd.env("CRITERION_HOME", home.path())
            .env("CARGO_MANIFEST_DIR", &exe.cwd)
            .stdin(Stdio::null());
        let out = cmd.output().map_err(|e| {
            Error::Command(format!("cannot run `{}`: {e}", super::suite::shown(&cmd)))
        })?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.trim().lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(Error::Command(format!(
                "`{}` failed ({}): {}",
                super::suite::shown(&cmd),
                out.status,
                tail.join(" / ")
            )));
        }
        estimates(home.path(), id)
    }
}

/// Criterion's median and mean time per iteration, in ns, of `id` from the `estimates.json`
/// it wrote under `home` (the `new/` directory whose `benchmark.json` names `id`: criterion
/// makes its directory names from ids, not always one to one).
fn estimates(home: &Path, id: &str) -> crate::error::Result<(f64, f64)> {
    let mut stack = vec![home.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
        if dir.file_name().is_none_or(|n| n != "new") {
            continue;
        }
        let read = |f: &str| -> Option<serde_json::Value> {
            serde_json::from_slice(&std::fs::read(dir.join(f)).ok()?).ok()
        };
        if read("benchmark.json").is_none_or(|b| b["full_id"].as_str() != Some(id)) {
            continue;
        }
        let est = read("estimates.json").ok_or_else(|| {
            Error::Command(format!(
                "{}/estimates.json: missing or not JSON",
                dir.display()
            ))
        })?;
        let point = |k: &str| {
            est[k]["point_estimate"]
                .as_f64()
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        return match (point("median"), point("mean")) {
            (Some(median), Some(mean)) => Ok((median, mean)),
            _ => Err(Error::Command(format!(
                "{}/estimates.json holds no positive median and mean point estimates",
                dir.display()
            ))),
        };
    }
    Err(Error::Command(format!(
        "criterion wrote no estimates of {id:?} under {}: is the benchmark a criterion \
         benchmark with the wall-clock measurement?",
        home.display()
    )))
}

/// Pins this thread (and so the runs it starts, which inherit its mask) to the last CPU it may
/// run on, away from CPU 0 where interrupts usually land; the mask it had, to restore, and the
/// CPU. `None` when it cannot, with a line saying so.
fn pin() -> Option<(libc::cpu_set_t, usize)> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = size_of::<libc::cpu_set_t>();
    // SAFETY: `old` is a valid cpu_set_t of `size` bytes; 0 is this thread.
    if unsafe { libc::sched_getaffinity(0, size, &mut old) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!("memtrack: note: the runs are not pinned to one CPU (sched_getaffinity: {e})");
        return None;
    }
    let cpu = (0..libc::CPU_SETSIZE as usize)
        .rev()
        // SAFETY: CPU_ISSET reads `old` within its bounds (the index is below CPU_SETSIZE).
        .find(|&c| unsafe { libc::CPU_ISSET(c, &old) });
    let Some(cpu) = cpu else {
        eprintln!(
            "memtrack: note: the runs are not pinned to one CPU (no CPU in this thread's mask)"
        );
        return None;
    };
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE, within `one`.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: `one` is a valid cpu_set_t of `size` bytes.
    if unsafe { libc::sched_setaffinity(0, size, &one) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!("memtrack: note: the runs are not pinned to one CPU (sched_setaffinity: {e})");
        return None;
    }
    Some((old, cpu))
}

/// Restores the mask [`pin`] replaced.
fn unpin(old: &libc::cpu_set_t) {
    // SAFETY: `old` is the valid cpu_set_t sched_getaffinity filled.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), old) };
}

/// What `memtrack bench --measure time` was asked.
pub(crate) struct Request<'a> {
    pub here: &'a Path,
    pub target: &'a Path,
    pub out: &'a Path,
    pub reference: &'a str,
    pub cargo: &'a [OsString],
    pub threshold: Threshold,
    pub format: Format,
    /// Whether a time regression makes the exit code 1 (`--gate time`).
    pub gate: bool,
    pub time: &'a TimeArgs,
}

impl Runner<'_> {
    /// Times benchmark `id` of the base's and the head's executable (`exes`) in the order of
    /// `plan`, and judges the change; the first run that fails ends it, as its failure.
    fn ab(
        &mut self,
        id: &str,
        exes: (&Executable, &Executable),
        plan: &[Side],
        threshold: Threshold,
    ) -> Result<Row, Failure> {
        eprintln!(
            "memtrack: timing {id}: {} runs in the order base, head, head, base",
            plan.len()
        );
        let (mut bs, mut hs) = (Vec::new(), Vec::new());
        for (i, &side) in plan.iter().enumerate() {
            let round = i as u32 / 4 + 1;
            let exe = match side {
                Side::Base => exes.0,
                Side::Head => exes.1,
            };
            let v = self.run(exe, id, side, round).map_err(|e| Failure {
                side,
                benchmark: Some(id.to_string()),
                error: e.to_string(),
            })?;
            match side {
                Side::Base => bs.push(v),
                Side::Head => hs.push(v),
            }
        }
        let (base, head) = (Runs(bs), Runs(hs));
        let (change_percent, verdict) = judge(&base, &head, threshold);
        Ok(Row {
            benchmark: id.to_string(),
            base,
            head,
            change_percent,
            verdict,
        })
    }
}

/// Builds both sides, times every benchmark they share in alternating order and reports. Exit
/// 0, or 1 on a time regression when gated, or 2 when a build, a listing or a run failed (the
/// report, with what failed, is printed first).
pub(crate) fn run(r: &Request<'_>) -> crate::error::Result<ExitCode> {
    // The worktree first: a bad REF is refused before anything is built.
    let repo = Repo::find(r.here, "--base")?;
    let tree = Worktree::add(&repo, r.reference, r.target, "--base")?;
    let report = compare(r, &tree)?;
    drop(tree);
    print(&report, r)
}

/// Cargo's arguments, then criterion's after `--`.
pub(crate) fn split(cargo: &[OsString]) -> (&[OsString], &[OsString]) {
    match cargo.iter().position(|a| a == "--") {
        Some(i) => (&cargo[..i], &cargo[i + 1..]),
        None => (cargo, &[][..]),
    }
}

/// Builds both sides (the base in `tree`), times every benchmark they share in alternating
/// order and judges each. What failed to build, list or run is in the report's failures.
///
/// # Errors
/// The run log cannot be written.
pub(crate) fn compare(r: &Request<'_>, tree: &Worktree) -> crate::error::Result<Report> {
    let (cargo_args, filter) = split(r.cargo);
    let mut failures = Vec::new();
    let head = prepare(
        r.here,
        &r.target.join(super::TIME_TARGET),
        cargo_args,
        filter,
        Side::Head,
        "head",
        &mut failures,
    );
    let short = &tree.commit[..tree.commit.len().min(12)];
    let base = prepare(
        &tree.dir,
        &r.target.join(super::TIME_BASE_TARGET),
        cargo_args,
        filter,
        Side::Base,
        &format!("base {}, {short}", r.reference),
        &mut failures,
    );
    let mut timer = Timer::start(&r.out.join("time"), r.time, r.threshold)?;
    let rows = timer.compare((&base, &head), None, &mut failures);
    timer.finish(tree.commit.clone(), (&base, &head), None, (rows, failures))
}

/// Timed comparisons of built sides, each benchmark's runs in alternating order, every run
/// logged in one run log, pinned to one CPU while it lasts.
pub(crate) struct Timer<'a> {
    runner: Runner<'a>,
    log: memtrack::artifact::Output,
    pinned: Option<(libc::cpu_set_t, usize)>,
    threshold: Threshold,
}

impl<'a> Timer<'a> {
    /// Starts the run log, `dir`/runs.jsonl (each run's criterion directory is made in `dir`
    /// too), and pins this thread.
    ///
    /// # Errors
    /// `dir` or the run log cannot be made.
    pub(crate) fn start(
        dir: &Path,
        args: &'a TimeArgs,
        threshold: Threshold,
    ) -> crate::error::Result<Self> {
        memtrack::artifact::create_dir_all(dir)?;
        let log = memtrack::artifact::Output::create(dir.join("runs.jsonl"))?;
        let pinned = pin();
        let runner = Runner {
            args,
            log: log.writer()?,
            dir: dir.to_path_buf(),
            seq: 0,
            cpu: pinned.as_ref().map(|p| p.1),
        };
        Ok(Timer {
            runner,
            log,
            pinned,
            threshold,
        })
    }

    /// Times each benchmark both sides hold (only those of `only`, if given) in the order the
    /// head lists them; a benchmark whose run failed is added to `failures`.
    pub(crate) fn compare(
        &mut self,
        (base, head): (&Built, &Built),
        only: Option<&BTreeSet<String>>,
        failures: &mut Vec<Failure>,
    ) -> Vec<Row> {
        let plan = order(self.runner.args.rounds);
        let mut rows = Vec::new();
        for id in &head.order {
            if only.is_some_and(|o| !o.contains(id)) {
                continue;
            }
            let (Some(&b), Some(&h)) = (base.benchmarks.get(id), head.benchmarks.get(id)) else {
                continue;
            };
            let exes = (&base.exes[b], &head.exes[h]);
            match self.runner.ab(id, exes, &plan, self.threshold) {
                Ok(row) => rows.push(row),
                Err(failure) => failures.push(failure),
            }
        }
        rows
    }

    /// Unpins, closes the run log and makes the report of `rows` and `failures` (the base at
    /// `base_commit`; the benchmarks one side lacks are listed from `sides`, limited to `only`).
    ///
    /// # Errors
    /// The run log cannot be written.
    pub(crate) fn finish(
        self,
        base_commit: String,
        (base, head): (&Built, &Built),
        only: Option<&BTreeSet<String>>,
        (rows, failures): (Vec<Row>, Vec<Failure>),
    ) -> crate::error::Result<Report> {
        if let Some((old, _)) = &self.pinned {
            unpin(old);
        }
        let Timer {
            runner,
            log,
            pinned,
            threshold,
        } = self;
        let rounds = runner.args.rounds;
        drop(runner);
        let path = log.commit()?;
        let followed = |id: &String| only.is_none_or(|o| o.contains(id));
        Ok(Report {
            threshold,
            rounds,
            base_commit,
            cpu: pinned.map(|p| p.1),
            added: only_in(head, base).into_iter().filter(followed).collect(),
            removed: only_in(base, head).into_iter().filter(followed).collect(),
            rows,
            failures,
            log: path,
        })
    }
}

/// The benchmarks of `a` that `b` lacks, in `a`'s order.
fn only_in(a: &Built, b: &Built) -> Vec<String> {
    a.order
        .iter()
        .filter(|id| !b.benchmarks.contains_key(*id))
        .cloned()
        .collect()
}

/// Prints `report` as `r` asks (and its markdown into the job summary); the exit code: 2 when
/// something failed, 1 on a time regression when gated, else 0.
fn print(report: &Report, r: &Request<'_>) -> crate::error::Result<ExitCode> {
    let text = match r.format {
        Format::Table => render::table(report),
        Format::Markdown => render::markdown(report),
        Format::Json => render::json(report),
    };
    crate::out(&text)?;
    super::summary(&render::markdown(report));
    Ok(if !report.failures.is_empty() {
        // The report names what failed; the exit code says the run was not whole.
        ExitCode::from(2)
    } else if r.gate && report.regressions() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Threshold {
        "3%".parse().unwrap()
    }

    #[test]
    fn each_round_runs_base_head_head_base() {
        use Side::{Base as A, Head as B};
        assert_eq!(order(2), [A, B, B, A, A, B, B, A]);
        assert_eq!(order(1).iter().filter(|s| **s == A).count(), 2);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(Runs(vec![3.0, 1.0, 2.0]).median(), 2.0);
        assert_eq!(Runs(vec![4.0, 1.0, 2.0, 3.0]).median(), 2.5);
    }

    #[test]
    fn a_change_is_called_beyond_the_threshold_with_ranges_apart() {
        let base = Runs(vec![100.0, 101.0, 99.0, 100.0]);
        let slower = Runs(vec![110.0, 111.0, 109.0, 112.0]);
        assert_eq!(judge(&base, &slower, three()).1, Verdict::Regressed);
        assert_eq!(judge(&slower, &base, three()).1, Verdict::Improved);
        let (change, _) = judge(&base, &slower, three());
        assert!((change - 10.5).abs() < 1e-9, "{change}");
    }

    #[test]
    fn overlapping_ranges_are_noise_whatever_the_medians() {
        let base = Runs(vec![100.0, 100.0, 100.0, 150.0]);
        let head = Runs(vec![140.0, 140.0, 140.0, 141.0]);
        assert_eq!(judge(&base, &head, three()), (40.0, Verdict::WithinNoise));
    }

    #[test]
    fn ranges_apart_within_the_threshold_are_noise() {
        let base = Runs(vec![100.0, 100.5]);
        let head = Runs(vec![102.0, 102.5]);
        assert_eq!(judge(&base, &head, three()).1, Verdict::WithinNoise);
    }

    #[test]
    fn seconds_are_positive_and_finite() {
        assert_eq!(seconds("0.05").ok(), Some(0.05));
        for bad in ["0", "-1", "nan", "inf", "x"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
