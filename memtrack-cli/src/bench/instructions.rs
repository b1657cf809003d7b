//! `memtrack bench --measure instructions`: the suite built in memtrack-criterion's
//! instructions mode, each bench executable run R times under callgrind
//! (`memtrack::instructions`), one `<id>.instructions.json` per benchmark in `--out`, the table
//! of Ir per iteration; with `--base`, both sides compared per benchmark.
//!
//! Its rendering is its own (table, markdown, JSON), kept apart from memory's, to be moved
//! onto one report model.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use memtrack::analysis::{Threshold, Verdict};
use memtrack::human;
use memtrack::instructions::compare::{Change, Row, compare};
use memtrack::instructions::run::{Callgrind, Measurement, measure};
use memtrack::instructions::{FILE_SUFFIX, load, save};

use super::suite::{add_rustflags, cargo, shown};
use crate::compare::Format;

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
        }
    }

    /// Builds the suite in `dir` and counts it, writing one file per benchmark into `out`.
    /// `what` names the side in messages.
    pub(crate) fn run(&self, dir: &Path, out: &Path, what: &str) -> Result<(), String> {
        let callgrind = Callgrind::find().map_err(|e| e.to_string())?;
        clear(out)?;
        let exes = self.build(dir, what)?;
        let rustc = rustc_version(dir)?;
        let toolchain = callgrind.toolchain(&rustc).map_err(|e| e.to_string())?;
        let scratch = tempfile::Builder::new()
            .prefix("memtrack-callgrind-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let mut args = vec![OsString::from("--bench")];
        args.extend(self.bench.iter().cloned());
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
                let env = [("MEMTRACK_SUMMARY", "line")];
                let (c, status) = callgrind
                    .count(exe, &args, root, &env, &files)
                    .map_err(|e| e.to_string())?;
                if !status.success() {
                    return Err(format!(
                        "{} failed under callgrind ({what}): {status}; its messages are above",
                        exe.display()
                    ));
                }
                counted.extend(c);
            }
            runs.push(counted);
        }
        let measured = measure(&runs, &toolchain);
        if measured.is_empty() {
            return Err(format!(
                "no benchmark was counted ({what}): is the suite on memtrack-criterion \
                 (`criterion = {{ package = \"memtrack-criterion\", … }}`), and does the filter \
                 match?"
            ));
        }
        save(out, &measured).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// `cargo bench --no-run` in instructions mode: each bench executable and the directory
    /// cargo would run it in (its package's).
    fn build(&self, dir: &Path, what: &str) -> Result<Vec<(PathBuf, PathBuf)>, String> {
        let mut cmd = cargo();
        cmd.current_dir(dir);
        add_rustflags(&mut cmd, dir, &["--cfg", "memtrack_bench=\"instructions\""]);
        cmd.args([
            "bench",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(&self.cargo)
        .env("CARGO_TARGET_DIR", &self.target)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run `{}` ({what}): {e}", shown(&cmd)))?;
        if !out.status.success() {
            return Err(format!(
                "`{}` failed ({what}, in {}): {}; its messages are above",
                shown(&cmd),
                dir.display(),
                out.status
            ));
        }
        let mut exes = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(m) = serde_json::from_str::<serde_json::Value>(line) else {
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
        if exes.is_empty() {
            return Err(format!(
                "`{}` built no bench executable ({what})",
                shown(&cmd)
            ));
        }
        Ok(exes)
    }
}

/// `rustc -V` as cargo would run it in `dir` (`$RUSTC`, else rustup's choice there).
fn rustc_version(dir: &Path) -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.current_dir(dir).arg("-V");
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run `{}`: {e}", shown(&cmd)))?;
    if !out.status.success() {
        return Err(format!("`{}` failed: {}", shown(&cmd), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Removes the `*.instructions.json` of a previous run from `dir` (created if need be).
pub(crate) fn clear(dir: &Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot clear {}: {e}", dir.display());
    memtrack::artifact::create_dir_all(dir).map_err(|e| e.to_string())?;
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

/// Ir per iteration as shown: one decimal, thousands grouped.
fn ir(v: f64) -> String {
    let tenths = (v * 10.0).round() as u64;
    format!("{}.{}", human::count(tenths / 10), tenths % 10)
}

fn gated(m: &Measurement) -> String {
    match &m.not_gated {
        None => "gated".into(),
        Some(_) => "not gated".into(),
    }
}

/// The figures of one side, in `format`.
pub(crate) fn report(dir: &Path, format: Format) -> Result<String, String> {
    let set = load(dir).map_err(|e| e.to_string())?;
    Ok(match format {
        Format::Json => {
            let rows: Vec<_> = set
                .iter()
                .map(|m| {
                    serde_json::json!({
                        "benchmark": m.benchmark,
                        "metric": "instructions",
                        "ir_per_iteration": m.ir_per_iteration,
                        "spread_percent": m.spread_percent,
                        "gated": m.not_gated.is_none(),
                        "not_gated": m.not_gated,
                    })
                })
                .collect();
            let doc = serde_json::json!({ "rows": rows });
            format!("{}\n", serde_json::to_string_pretty(&doc).expect("JSON"))
        }
        Format::Table => {
            let mut rows = vec![["benchmark", "Ir/iter", "spread", "gated"].map(String::from)];
            for m in &set {
                rows.push([
                    m.benchmark.clone(),
                    ir(m.ir_per_iteration),
                    format!("{:.2} %", m.spread_percent),
                    gated(m),
                ]);
            }
            let mut t = human::table(&rows, &[false, true, true, false]);
            for m in &set {
                if let Some(why) = &m.not_gated {
                    t.push_str(&format!("{}: not gated: {why}\n", m.benchmark));
                }
            }
            t
        }
        Format::Markdown => {
            let mut t = String::from(
                "### Instructions per iteration\n\n| benchmark | Ir/iter | spread | gated |\n|---|---:|---:|---|\n",
            );
            for m in &set {
                t.push_str(&format!(
                    "| `{}` | {} | {:.2} % | {} |\n",
                    m.benchmark,
                    ir(m.ir_per_iteration),
                    m.spread_percent,
                    gated(m)
                ));
            }
            t
        }
    })
}

/// What comparing base with head gives: the text in `format`, and whether one regressed.
pub(crate) struct Gated {
    pub text: String,
    pub regressed: bool,
}

/// Compares the measurements in `base` with those in `head`.
///
/// # Errors
/// Counts that do not compare (another rustc, valgrind or CPU feature set), or files that
/// cannot be read: the caller exits 2.
pub(crate) fn gate(
    base: &Path,
    head: &Path,
    threshold: Threshold,
    format: Format,
) -> Result<Gated, String> {
    let (b, h) = (
        load(base).map_err(|e| e.to_string())?,
        load(head).map_err(|e| e.to_string())?,
    );
    // Counts of another toolchain are refused (InstructionsError::Incomparable): exit 2.
    let rows = compare(&b, &h, threshold).map_err(|e| e.to_string())?;
    let regressed = rows.iter().any(Row::regressed);
    let text = match format {
        Format::Json => json(&rows, threshold),
        Format::Table => table(&rows, threshold),
        Format::Markdown => markdown(&rows, threshold),
    };
    Ok(Gated { text, regressed })
}

fn verdict(change: &Change) -> &'static str {
    match change {
        Change::Judged { verdict, .. } => match verdict {
            Verdict::Regressed => "regressed",
            Verdict::Improved => "improved",
            Verdict::Unchanged => "unchanged",
            _ => "within threshold",
        },
        Change::NotGated { .. } => "not gated",
        Change::New => "new",
        Change::Gone => "gone",
    }
}

fn sides(change: &Change) -> (Option<f64>, Option<f64>) {
    match change {
        Change::Judged { base, head, .. } | Change::NotGated { base, head, .. } => {
            (Some(*base), Some(*head))
        }
        Change::New | Change::Gone => (None, None),
    }
}

fn percent(base: f64, head: f64) -> String {
    if base == 0.0 {
        return String::new();
    }
    format!("{:+.2} %", (head - base) / base * 100.0)
}

/// The grown functions of a regression: `write_frames: 380.0 → 536.0 Ir/iter`.
fn grown_lines(change: &Change) -> Vec<String> {
    match change {
        Change::Judged { grown, .. } => grown
            .iter()
            .map(|(name, b, h)| format!("{name}: {} → {} Ir/iter", ir(*b), ir(*h)))
            .collect(),
        _ => Vec::new(),
    }
}

fn table(rows: &[Row], threshold: Threshold) -> String {
    let mut cells = vec![
        [
            "benchmark",
            "base Ir/iter",
            "head Ir/iter",
            "change",
            "verdict",
        ]
        .map(String::from),
    ];
    for r in rows {
        let (b, h) = sides(&r.change);
        cells.push([
            r.benchmark.clone(),
            b.map(ir).unwrap_or_default(),
            h.map(ir).unwrap_or_default(),
            match (b, h) {
                (Some(b), Some(h)) => percent(b, h),
                _ => String::new(),
            },
            verdict(&r.change).to_string(),
        ]);
    }
    let mut t = human::table(&cells, &[false, true, true, true, false]);
    for r in rows {
        match &r.change {
            Change::NotGated { why, .. } => {
                t.push_str(&format!("{}: not gated: {why}\n", r.benchmark));
            }
            c if r.regressed() => {
                t.push_str(&format!(
                    "{} regressed (more than {} %); grown:\n",
                    r.benchmark,
                    threshold.percent()
                ));
                for l in grown_lines(c) {
                    t.push_str(&format!("  {l}\n"));
                }
            }
            _ => {}
        }
    }
    t
}

fn markdown(rows: &[Row], threshold: Threshold) -> String {
    let mut t = format!(
        "### Instructions per iteration (threshold {} %)\n\n| benchmark | base Ir/iter | head Ir/iter | change | verdict |\n|---|---:|---:|---:|---|\n",
        threshold.percent()
    );
    for r in rows {
        let (b, h) = sides(&r.change);
        t.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            r.benchmark,
            b.map(ir).unwrap_or_default(),
            h.map(ir).unwrap_or_default(),
            match (b, h) {
                (Some(b), Some(h)) => percent(b, h),
                _ => String::new(),
            },
            verdict(&r.change)
        ));
    }
    for r in rows.iter().filter(|r| r.regressed()) {
        t.push_str(&format!("\n**{}** grew in:\n\n", r.benchmark));
        for l in grown_lines(&r.change) {
            t.push_str(&format!("- `{l}`\n"));
        }
    }
    t
}

fn json(rows: &[Row], threshold: Threshold) -> String {
    let rows: Vec<_> = rows
        .iter()
        .map(|r| {
            let (b, h) = sides(&r.change);
            let grown: Vec<_> = match &r.change {
                Change::Judged { grown, .. } => grown
                    .iter()
                    .map(|(n, b, h)| serde_json::json!({"function": n, "base": b, "head": h}))
                    .collect(),
                _ => Vec::new(),
            };
            let why = match &r.change {
                Change::NotGated { why, .. } => Some(why.clone()),
                _ => None,
            };
            serde_json::json!({
                "benchmark": r.benchmark,
                "metric": "instructions",
                "base": b,
                "head": h,
                "verdict": verdict(&r.change),
                "not_gated": why,
                "grown": grown,
            })
        })
        .collect();
    let doc = serde_json::json!({ "threshold_percent": threshold.percent(), "rows": rows });
    format!("{}\n", serde_json::to_string_pretty(&doc).expect("JSON"))
}
