//! `memtrack bench --measure instructions`: the suite built in memtrack-criterion's
//! instructions mode, each bench executable run R times under callgrind
//! (`memtrack::instructions`), one `<id>.instructions.json` per benchmark in `--out`, the table
//! of Ir per iteration; with `--base`, both sides compared per benchmark.
//! Its rows are [`memtrack::render`] tables, as memory's are; in JSON they join memory's
//! document (`rows`, as `memtrack compare` writes them).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use memtrack::analysis::Threshold;
use memtrack::human;
use memtrack::instructions::compare::{Change, Row, compare};
use memtrack::instructions::run::{Callgrind, Measurement, measure};
use memtrack::instructions::{FILE_SUFFIX, load, save};
use memtrack::render::{self, Align, Cell, Column, Table, Unit};
use serde_json::Value;

use super::suite::{add_rustflags, benchmark_list, cargo, require_memtrack_criterion, shown};
use crate::compare::Format;
use crate::error::Error;

/// What one side needs: where to build, how many runs, cargo's and the benchmarks' arguments.
pub(crate) struct Counting {
    /// `cargo bench` arguments (before a `--`).
    pub cargo: Vec<OsString>,
    /// The bench executables' arguments (criterion's filter: after the `--`).
    pub bench: Vec<OsString>,
    /// Runs of the suite (R): the median is the figure.
    pub runs: usize,
    /// The target directory of this side's instructions-mode build.
    pub target: PathBuf,
    /// Only these benchmark ids (`MEMTRACK_BENCHMARKS`, as [`super::suite::Suite::only`]),
    /// or all.
    pub only: Option<Vec<String>>,
}

impl Counting {
    /// Splits `memtrack bench`'s trailing arguments at a second `--`.
    pub(crate) fn new(args: &[OsString], runs: usize, target: PathBuf) -> Counting {
        let split = args.iter().position(|a| a == "--");
        let (cargo, bench) = match split {
            Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
            None => (args.to_vec(), Vec::new()),
        };
        Counting {
            cargo,
            bench,
            runs,
            target,
            only: None,
        }
    }

    /// Builds the suite in `dir` and counts it, writing one file per benchmark into `out`.
    /// `what` names the side in messages.
    ///
    /// # Errors
    /// A suite not on memtrack-criterion (refused before it is built), no valgrind, a build or
    /// a bench executable that failed, no benchmark counted, a result that cannot be written.
    pub(crate) fn run(&self, dir: &Path, out: &Path, what: &str) -> Result<(), Error> {
        // A suite on criterion itself would run its whole timing under callgrind (minutes)
        // and count nothing.
        require_memtrack_criterion(dir, &self.cargo, what, "instructions")?;
        let callgrind = Callgrind::find()?;
        clear(out)?;
        let exes = self.build(dir, what)?;
        let rustc = rustc_version(dir)?;
        let toolchain = callgrind.toolchain(&rustc)?;
        let scratch = tempfile::Builder::new()
            .prefix("memtrack-callgrind-")
            .tempdir()
            .map_err(|e| crate::error::io("cannot make a temporary directory".into(), e))?;
        let mut args = vec![OsString::from("--bench")];
        args.extend(self.bench.iter().cloned());
        let only = self.only.as_deref().map(benchmark_list);
        let mut env = vec![("MEMTRACK_SUMMARY", "line")];
        env.extend(only.as_deref().map(|ids| ("MEMTRACK_BENCHMARKS", ids)));
        let mut runs = Vec::new();
        for run in 0..self.runs {
            eprintln!(
                "memtrack: counting instructions ({what}), run {} of {}",
                run + 1,
                self.runs
            );
            let mut counted = Vec::new();
            for (i, (exe, root)) in exes.iter().enumerate() {
                let files = scratch.path().join(format!("{run}-{i}"));
                let (c, status) = callgrind.count(exe, &args, root, &env, &files)?;
                if !status.success() {
                    return Err(Error::FailedUnderCallgrind {
                        exe: exe.clone(),
                        side: what.to_string(),
                        status,
                    });
                }
                counted.extend(c);
            }
            runs.push(counted);
        }
        let measured = measure(&runs, &toolchain);
        if measured.is_empty() {
            return Err(Error::NothingCounted {
                side: what.to_string(),
            });
        }
        save(out, &measured)?;
        Ok(())
    }

    /// `cargo bench --no-run` in instructions mode: each bench executable and the directory
    /// cargo would run it in (its package's).
    fn build(&self, dir: &Path, what: &str) -> Result<Vec<(PathBuf, PathBuf)>, Error> {
        let mut cmd = cargo();
        cmd.current_dir(dir);
        let feature = instructions_feature(dir, &self.cargo);
        if feature.is_none() {
            add_rustflags(&mut cmd, dir, &["--cfg", "memtrack_bench=\"instructions\""]);
        }
        cmd.args([
            "bench",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(feature.iter().flat_map(|f| ["--features", f]))
        .args(&self.cargo)
        .env("CARGO_TARGET_DIR", &self.target)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
        let out = cmd
            .output()
            .map_err(|e| Error::Command(format!("cannot run `{}` ({what}): {e}", shown(&cmd))))?;
        if !out.status.success() {
            return Err(Error::Command(format!(
                "`{}` failed ({what}, in {}): {}; its messages are above",
                shown(&cmd),
                dir.display(),
                out.status
            )));
        }
        let exes = bench_executables(&String::from_utf8_lossy(&out.stdout), dir);
        if exes.is_empty() {
            return Err(Error::Command(format!(
                "`{}` built no bench executable ({what})",
                shown(&cmd)
            )));
        }
        Ok(exes)
    }
}

/// The bench executables among cargo's messages (`cargo bench --no-run
/// --message-format=json`'s `stdout`), each with the directory cargo would run it in (its
/// package's; `dir` for a bench without a manifest).
fn bench_executables(stdout: &str, dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut exes = Vec::new();
    for line in stdout.lines() {
        let Ok(m) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if m["reason"] == "compiler-artifact"
            && m["target"]["kind"] == serde_json::json!(["bench"])
            && let (Some(exe), Some(manifest)) =
                (m["executable"].as_str(), m["manifest_path"].as_str())
        {
            let root = Path::new(manifest).parent().unwrap_or(dir).to_path_buf();
            exes.push((PathBuf::from(exe), root));
        }
    }
    exes
}

/// `NAME/instructions`, NAME being what the packages of the workspace in `dir` call
/// memtrack-criterion: its feature `instructions` builds the suite's other dependencies as
/// timing mode does, where `--cfg memtrack_bench="instructions"` in RUSTFLAGS rebuilds them all.
/// None (the cfg, then) when they call it by more than one name, or its version has no such
/// feature, or `cargo metadata` fails (the build says why). `cargo_args` are the user's: their
/// `--offline`, `--frozen` and `--locked` hold for the metadata too.
fn instructions_feature(dir: &Path, cargo_args: &[OsString]) -> Option<String> {
    let mut cmd = cargo();
    cmd.current_dir(dir)
        .args(["metadata", "--format-version", "1"])
        .args(
            cargo_args.iter().filter(|a| {
                ["--offline", "--frozen", "--locked"].contains(&a.to_str().unwrap_or(""))
            }),
        )
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    let meta: Value = serde_json::from_slice(&out.stdout).ok()?;
    let packages = meta["packages"].as_array()?;
    let ours: Vec<&Value> = packages
        .iter()
        .filter(|p| p["name"] == "memtrack-criterion")
        .collect();
    if ours.is_empty()
        || !ours
            .iter()
            .all(|p| p["features"].get("instructions").is_some())
    {
        return None;
    }
    let members = meta["workspace_members"].as_array()?;
    let names: BTreeSet<&str> = packages
        .iter()
        .filter(|p| members.contains(&p["id"]))
        .flat_map(|p| p["dependencies"].as_array().into_iter().flatten())
        .filter(|d| d["name"] == "memtrack-criterion")
        .filter_map(|d| d["rename"].as_str().or(d["name"].as_str()))
        .collect();
    match names.into_iter().collect::<Vec<_>>()[..] {
        [name] => Some(format!("{name}/instructions")),
        _ => None,
    }
}

/// `rustc -V` as cargo would run it in `dir` (`$RUSTC`, else rustup's choice there).
fn rustc_version(dir: &Path) -> Result<String, Error> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.current_dir(dir).arg("-V");
    let out = cmd
        .output()
        .map_err(|e| Error::Command(format!("cannot run `{}`: {e}", shown(&cmd))))?;
    if !out.status.success() {
        return Err(Error::Command(format!(
            "`{}` failed: {}",
            shown(&cmd),
            out.status
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Removes the `*.instructions.json` of a previous run from `dir` (created if need be).
pub(crate) fn clear(dir: &Path) -> Result<(), Error> {
    let fail = |e: std::io::Error| crate::error::io(format!("cannot clear {}", dir.display()), e);
    memtrack::artifact::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        if entry.file_name().to_string_lossy().ends_with(FILE_SUFFIX)
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            std::fs::remove_file(entry.path()).map_err(fail)?;
        }
    }
    Ok(())
}

/// Ir per iteration as a figure: the Ir of the `iterations` counted (rounded, as the median of
/// even runs may fall between two counts) and per iteration.
pub(crate) fn figure(per_iteration: f64, iterations: u64) -> Cell {
    Cell::Figure {
        unit: Unit::Instructions,
        total: (per_iteration * iterations as f64).round().max(0.0) as u64,
        per_iteration: Some(per_iteration),
    }
}

/// Why a benchmark is not gated, or nothing (JSON: `null`).
fn not_gated(why: Option<&str>) -> Cell {
    why.map_or(Cell::Empty, |w| Cell::Text(w.into()))
}

/// The figures of one side: one row per benchmark, Ir per iteration (the median of the runs),
/// its spread between runs and why it is not gated.
pub(crate) struct Counts {
    table: Table,
}

/// The figures of one side, read from `dir`.
pub(crate) fn report(dir: &Path) -> Result<Counts, Error> {
    let set = load(dir)?;
    let mut table = Table::new(vec![
        Column::new("benchmark", "benchmark", Align::Left),
        Column::json_only("metric"),
        Column::new("iterations", "iterations", Align::Right),
        Column::new("instructions", "instructions", Align::Right),
        Column::new("spread_percent", "spread", Align::Right),
        Column::new("not_gated", "not gated", Align::Left),
    ]);
    for m in &set {
        table.push(vec![
            Cell::Text(m.benchmark.clone()),
            Cell::Text(METRIC.into()),
            Cell::Count(Some(m.iterations)),
            figure(m.ir_per_iteration, m.iterations),
            Cell::Percent(m.spread_percent),
            not_gated(m.not_gated.as_deref()),
        ]);
    }
    shown_when_some(&mut table, "not_gated");
    Ok(Counts { table })
}

/// Shows column `key` in the text and markdown tables only when a row has something in it.
fn shown_when_some(t: &mut Table, key: &str) {
    if let Some(i) = t.columns.iter().position(|c| c.key == key) {
        t.columns[i].shown = t.rows.iter().any(|r| r[i] != Cell::Empty);
    }
}

impl Counts {
    /// The table or the markdown; JSON is [`Counts::add_to`]'s.
    pub(crate) fn render(&self, format: Format) -> String {
        match format {
            Format::Markdown => format!(
                "### memtrack: instructions per benchmark\n\n{}\n",
                render::markdown(&self.table)
            ),
            Format::Table | Format::Json => render::text(&self.table),
        }
    }

    /// Puts the rows into `doc` (a JSON object) under `rows`.
    pub(crate) fn add_to(&self, doc: &mut Value) {
        doc["rows"] = render::json(&self.table);
    }
}

/// The metric of instruction rows, in every format.
const METRIC: &str = "instructions";

/// Base compared with head: a row per benchmark and the functions that grew most in each
/// regressed one.
pub(crate) struct Gated {
    rows: Table,
    grown: Table,
    threshold: Threshold,
    /// The benchmarks that regressed, in the rows' order.
    regressed: Vec<String>,
    /// The benchmarks whose count changed at all, or that one side lacks.
    moved: Vec<Moved>,
}

/// A benchmark whose Ir per iteration changed from base to head (or that one side lacks:
/// its figures empty), as a step of `--chain` shows it.
pub(crate) struct Moved {
    pub benchmark: String,
    pub base: Cell,
    pub head: Cell,
    pub change: Cell,
}

/// Compares the measurements in `base` with those in `head`.
///
/// # Errors
/// Counts that do not compare (another rustc, valgrind or CPU feature set), or files that
/// cannot be read: the caller exits 2.
pub(crate) fn gate(base: &Path, head: &Path, threshold: Threshold) -> Result<Gated, Error> {
    judge(&load(base)?, &load(head)?, threshold)
}

/// One step of `--chain`: the benchmarks of `only` in `base` and `head` (two consecutive
/// measured commits), compared with a threshold of 0 so that every growth names the functions
/// behind it.
///
/// # Errors
/// As [`gate`]'s.
pub(crate) fn step(base: &Path, head: &Path, only: &BTreeSet<String>) -> Result<Gated, Error> {
    let followed = |mut set: Vec<Measurement>| {
        set.retain(|m| only.contains(&m.benchmark));
        set
    };
    judge(
        &followed(load(base)?),
        &followed(load(head)?),
        Threshold::from_ppm(0),
    )
}

fn judge(b: &[Measurement], h: &[Measurement], threshold: Threshold) -> Result<Gated, Error> {
    // Counts of another toolchain are refused (InstructionsError::Incomparable): exit 2.
    let compared = compare(b, h, threshold)?;
    let side = |set: &[Measurement], id: &str| set.iter().find(|m| m.benchmark == id).cloned();
    let mut rows = Table::new(crate::compare::render::row_columns(vec![Column::new(
        "not_gated",
        "not gated",
        Align::Left,
    )]));
    rows.columns.extend([
        Column::json_only("base_spread_percent"),
        Column::json_only("head_spread_percent"),
    ]);
    let mut gated = Gated {
        rows,
        grown: Table::new(vec![
            Column::new("benchmark", "benchmark", Align::Left),
            Column::new("function", "function", Align::Left),
            Column::new("base", "base", Align::Right),
            Column::new("head", "head", Align::Right),
        ]),
        threshold,
        regressed: Vec::new(),
        moved: Vec::new(),
    };
    for r in &compared {
        gated.push(r, side(b, &r.benchmark), side(h, &r.benchmark));
    }
    shown_when_some(&mut gated.rows, "not_gated");
    Ok(gated)
}

impl Gated {
    /// Adds benchmark `r`'s row, measured `mb` in the base and `mh` in the head, its grown
    /// functions, and notes whether it regressed and whether it moved.
    fn push(&mut self, r: &Row, mb: Option<Measurement>, mh: Option<Measurement>) {
        let iterations = |m: &Option<Measurement>| m.as_ref().map_or(1, |m| m.iterations);
        let (nb, nh) = (iterations(&mb), iterations(&mh));
        let (sides, verdict, why) = match &r.change {
            Change::Judged {
                base,
                head,
                verdict,
                grown: g,
            } => {
                for (function, fb, fh) in g {
                    self.grown.push(vec![
                        Cell::Text(r.benchmark.clone()),
                        Cell::Text(function.clone()),
                        figure(*fb, nb),
                        figure(*fh, nh),
                    ]);
                }
                (Some((*base, *head)), Cell::Verdict(*verdict), None)
            }
            Change::NotGated { base, head, why } => (
                Some((*base, *head)),
                Cell::Text("not_gated".into()),
                Some(why.as_str()),
            ),
            Change::New => (None, Cell::Text("new".into()), None),
            Change::Gone => (None, Cell::Text("gone".into()), None),
        };
        let (base, head, change) = match sides {
            Some((vb, vh)) => (figure(vb, nb), figure(vh, nh), change(vb, vh)),
            None => (Cell::Empty, Cell::Empty, Cell::Empty),
        };
        if r.regressed() {
            self.regressed.push(r.benchmark.clone());
        }
        // To the tenth of an instruction, the precision compared and shown.
        let tenths = |v: f64| (v * 10.0).round();
        if sides.is_none_or(|(vb, vh)| tenths(vb) != tenths(vh)) {
            self.moved.push(Moved {
                benchmark: r.benchmark.clone(),
                base: base.clone(),
                head: head.clone(),
                change: change.clone(),
            });
        }
        let count = |m: &Option<Measurement>| Cell::Count(m.as_ref().map(|m| m.iterations));
        let spread = |m: &Option<Measurement>| {
            m.as_ref()
                .map_or(Cell::Empty, |m| Cell::Percent(m.spread_percent))
        };
        self.rows.push(vec![
            Cell::Text(r.benchmark.clone()),
            Cell::Text(METRIC.into()),
            base,
            head,
            change,
            verdict,
            not_gated(why),
            count(&mb),
            count(&mh),
            spread(&mb),
            spread(&mh),
        ]);
    }
}

/// Base → head in percent; `None` is growth from 0.
fn change(base: f64, head: f64) -> Cell {
    if base == 0.0 {
        return Cell::Change((head == 0.0).then_some(0.0));
    }
    Cell::Change(Some((head - base) / base * 100.0))
}

impl Gated {
    /// Whether a benchmark regressed.
    pub(crate) fn regressed(&self) -> bool {
        !self.regressed.is_empty()
    }

    /// The benchmarks that regressed.
    pub(crate) fn regressed_benchmarks(&self) -> &[String] {
        &self.regressed
    }

    /// The benchmarks whose count changed, or that one side lacks.
    pub(crate) fn moved(&self) -> &[Moved] {
        &self.moved
    }

    /// The functions that grew most, as a table or markdown (`None` when none grew).
    pub(crate) fn grown(&self, format: Format) -> Option<String> {
        (!self.grown.rows.is_empty()).then(|| match format {
            Format::Markdown => render::markdown(&self.grown),
            Format::Table | Format::Json => render::text(&self.grown),
        })
    }

    /// The line under the table: how many regressed at which threshold.
    fn summary(&self) -> String {
        let head = match self.regressed.len() {
            0 => "no benchmark regressed".to_string(),
            n => format!(
                "{} regressed",
                human::plural(n as u64, "benchmark", "benchmarks")
            ),
        };
        format!(
            "{head} (beyond +{} growth in instructions), {} compared",
            self.threshold,
            human::count(self.rows.rows.len() as u64)
        )
    }

    /// The table or the markdown; JSON is [`Gated::add_to`]'s.
    pub(crate) fn render(&self, format: Format) -> String {
        match format {
            Format::Markdown => {
                let mark = if self.regressed() { "❌" } else { "✅" };
                let mut out = format!(
                    "### memtrack: instructions comparison\n\n{mark} **{}**\n\n{}\n",
                    self.summary(),
                    render::markdown(&self.rows)
                );
                if !self.grown.rows.is_empty() {
                    out.push_str(&format!(
                        "Functions that grew most (inclusive, per iteration):\n\n{}\n",
                        render::markdown(&self.grown)
                    ));
                }
                out
            }
            Format::Table | Format::Json => {
                let mut out = format!("{}\n{}\n", render::text(&self.rows), self.summary());
                if !self.grown.rows.is_empty() {
                    out.push_str(&format!(
                        "\nfunctions that grew most (inclusive, per iteration):\n{}",
                        render::text(&self.grown)
                    ));
                }
                out
            }
        }
    }

    /// Puts the comparison into `doc`, a comparison's JSON document (`memtrack compare`'s,
    /// or an empty object): its rows after `rows`' own, `instructions` among `metrics`, its
    /// regressions counted in `regressions`, and the grown functions under `grown`.
    pub(crate) fn add_to(&self, doc: &mut Value) {
        if doc.get("threshold").is_none() {
            doc["threshold"] = self.threshold.to_string().into();
            doc["threshold_ppm"] = self.threshold.ppm().into();
        }
        let mut rows = doc["rows"].as_array().cloned().unwrap_or_default();
        rows.extend(
            render::json(&self.rows)
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        doc["rows"] = rows.into();
        let mut metrics = doc["metrics"].as_array().cloned().unwrap_or_default();
        metrics.push(METRIC.into());
        doc["metrics"] = metrics.into();
        let before = doc["regressions"].as_u64().unwrap_or(0);
        doc["regressions"] = (before + self.regressed.len() as u64).into();
        doc["grown"] = render::json(&self.grown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cargo's messages for a suite's bench executable, after its criterion library's and a
    /// line that is not JSON.
    fn messages() -> String {
        let lib = serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///src/memtrack-criterion#0.1.0",
            "manifest_path": "/src/memtrack-criterion/Cargo.toml",
            "target": { "kind": ["lib"], "crate_types": ["lib"], "name": "memtrack_criterion" },
            "filenames": ["/t/release/deps/libmemtrack_criterion-0347462a981e0c24.rlib"],
            "executable": null,
            "fresh": true
        });
        let bench = serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///tmp/real-semver#semver@1.0.27",
            "manifest_path": "/tmp/real-semver/Cargo.toml",
            "target": { "kind": ["bench"], "crate_types": ["bin"], "name": "parse" },
            "filenames": ["/t/release/deps/parse-b3b580388397a23c"],
            "executable": "/t/release/deps/parse-b3b580388397a23c",
            "fresh": false
        });
        let done = serde_json::json!({ "reason": "build-finished", "success": true });
        format!("{lib}\nnot json\n{bench}\n{done}\n")
    }

    #[test]
    fn the_bench_executables_are_read_with_their_packages_directory() {
        assert_eq!(
            bench_executables(&messages(), Path::new("/elsewhere")),
            [(
                PathBuf::from("/t/release/deps/parse-b3b580388397a23c"),
                PathBuf::from("/tmp/real-semver"),
            )]
        );
    }
}
