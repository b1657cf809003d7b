//! Running a benchmark program under callgrind: valgrind found on `PATH`, the toolchain that
//! makes counts comparable, one run read into one [`Counted`] per benchmark dump, and R runs
//! made into one [`Measurement`] per benchmark (the median, and the spread that decides
//! whether it is gated).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use serde::{Deserialize, Serialize};

use super::{Dump, InstructionsError, MAX_GATED_SPREAD, Toolchain};
use crate::callgrind::Profile;

/// Functions kept per benchmark in a [`Measurement`], largest inclusive count first.
pub const FUNCTIONS_KEPT: usize = 200;

/// One benchmark's dump of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Counted {
    /// The benchmark's id and iterations, from the dump's trigger.
    pub dump: Dump,
    /// Instructions of the whole window (every thread).
    pub ir: u64,
    /// Per function (demangled): inclusive and self instructions of the window.
    pub functions: Vec<(String, u64, u64)>,
}

/// One function's instructions per iteration in a benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionIr {
    /// Its name, demangled, without hash.
    pub name: String,
    /// Ir per iteration of the function and what it called.
    pub inclusive: f64,
    /// Ir per iteration of its own instructions.
    #[serde(rename = "self")]
    pub self_ir: f64,
}

/// A benchmark's instruction count, from R runs: the file `--out` holds per benchmark
/// (`<id>.instructions.json`, FORMAT.md "Instruction counts").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The benchmark's id.
    pub benchmark: String,
    /// Measured iterations per run.
    pub iterations: u64,
    /// Ir per iteration: the median of `runs`.
    pub ir_per_iteration: f64,
    /// Ir per iteration of each run, in run order.
    pub runs: Vec<f64>,
    /// (max − min) / median of `runs`, percent.
    pub spread_percent: f64,
    /// Why it is not gated (its spread is above [`MAX_GATED_SPREAD`]), or `None`: gated.
    pub not_gated: Option<String>,
    /// Functions of the median run, per iteration, largest inclusive first (at most
    /// [`FUNCTIONS_KEPT`]).
    pub functions: Vec<FunctionIr>,
    /// What counted it: counts of another toolchain do not compare.
    pub toolchain: Toolchain,
}

/// Valgrind, found; runs programs under callgrind.
#[derive(Clone, Debug)]
pub struct Callgrind {
    valgrind: PathBuf,
}

impl Callgrind {
    /// Valgrind from `PATH`.
    ///
    /// # Errors
    /// [`InstructionsError::NoValgrind`] when it is not there.
    pub fn find() -> Result<Callgrind, InstructionsError> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join("valgrind"))
            .find(|p| p.is_file())
            .map(|valgrind| Callgrind { valgrind })
            .ok_or(InstructionsError::NoValgrind)
    }

    /// Valgrind's version line (`valgrind-3.19.0`).
    ///
    /// # Errors
    /// When valgrind cannot be run.
    pub fn version(&self) -> Result<String, InstructionsError> {
        let out = self.output(
            Command::new(&self.valgrind).arg("--version"),
            "valgrind --version",
        )?;
        Ok(out.lines().next().unwrap_or("").trim().to_string())
    }

    /// The CPU features valgrind presents to programs (its `Arch and hwcaps` line, `amd64-cx16-
    /// lzcnt-…`): libraries pick code paths by them.
    ///
    /// # Errors
    /// When valgrind cannot be run or does not say.
    pub fn cpu(&self) -> Result<String, InstructionsError> {
        let mut cmd = Command::new(&self.valgrind);
        cmd.args(["-v", "--tool=none", "true"])
            .stdout(Stdio::null());
        let out = cmd.output().map_err(|e| run_error("valgrind -v", e))?;
        let text = String::from_utf8_lossy(&out.stderr);
        text.lines()
            .find_map(|l| l.split_once("Arch and hwcaps: ").map(|(_, h)| h.trim()))
            .and_then(|h| h.rsplit(", ").next())
            .map(str::to_string)
            .ok_or_else(|| InstructionsError::Run {
                what: "valgrind -v".into(),
                problem: "it named no CPU features (no `Arch and hwcaps` line)".into(),
            })
    }

    /// The toolchain of counts made here of programs built by `rustc` (its `rustc -V` line).
    ///
    /// # Errors
    /// When valgrind cannot be run.
    pub fn toolchain(&self, rustc: &str) -> Result<Toolchain, InstructionsError> {
        Ok(Toolchain {
            rustc: rustc.to_string(),
            valgrind: self.version()?,
            cpu: self.cpu()?,
        })
    }

    /// Runs `program args` under callgrind in `dir`, with `env` added, its output files in
    /// `scratch` (created; removed unless reading one failed), and reads every benchmark dump
    /// of it. Standard output and error are the caller's. The status is the program's (a
    /// benchmark harness exits 1 when a benchmark failed, after running the others).
    ///
    /// # Errors
    /// When valgrind cannot start or a dump cannot be read.
    pub fn count(
        &self,
        program: &Path,
        args: &[OsString],
        dir: &Path,
        env: &[(&str, &str)],
        scratch: &Path,
    ) -> Result<(Vec<Counted>, ExitStatus), InstructionsError> {
        std::fs::create_dir_all(scratch)
            .map_err(|e| run_error(&scratch.display().to_string(), e))?;
        let mut cmd = Command::new(&self.valgrind);
        cmd.current_dir(dir).stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.args([
            "--tool=callgrind",
            "-q",
            "--demangle=no",
            "--dump-instr=no",
            "--cache-sim=no",
            "--branch-sim=no",
            "--compress-strings=no",
        ]);
        cmd.arg(format!(
            "--callgrind-out-file={}",
            scratch.join("callgrind.out.%p").display()
        ));
        cmd.arg(program).args(args);
        let status = cmd
            .status()
            .map_err(|e| run_error(&format!("valgrind {}", program.display()), e))?;
        let mut counted = Vec::new();
        let entries =
            std::fs::read_dir(scratch).map_err(|e| run_error(&scratch.display().to_string(), e))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("callgrind.out."))
            })
            .collect();
        files.sort();
        for file in &files {
            let profile = Profile::read(file)?;
            if let Some(c) = counted_of(&profile) {
                counted.push(c);
            }
        }
        let _ = std::fs::remove_dir_all(scratch);
        Ok((counted, status))
    }

    fn output(&self, cmd: &mut Command, what: &str) -> Result<String, InstructionsError> {
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| run_error(what, e))?;
        if !out.status.success() {
            return Err(InstructionsError::Run {
                what: what.into(),
                problem: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn run_error(what: &str, e: std::io::Error) -> InstructionsError {
    InstructionsError::Run {
        what: what.into(),
        problem: e.to_string(),
    }
}

/// A profile's benchmark dump, or `None` for another dump (the one at the program's end).
pub fn counted_of(profile: &Profile) -> Option<Counted> {
    let dump = Dump::from_trigger(profile.trigger.as_deref()?)?;
    let ir_at = profile.event("Ir")?;
    Some(Counted {
        dump,
        ir: profile.totals.get(ir_at).copied().unwrap_or(0),
        functions: profile
            .functions
            .iter()
            .map(|f| (f.name.clone(), f.inclusive[ir_at], f.self_cost[ir_at]))
            .collect(),
    })
}

/// Median and spread ((max − min) / median, percent; 0 when the median is 0) of `values`.
pub fn median_spread(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    let spread = if median == 0.0 {
        0.0
    } else {
        (v[n - 1] - v[0]) / median * 100.0
    };
    Some((median, spread))
}

/// The measurements of R runs (each run's dumps): one per benchmark id found in any run, in
/// the first run's order. A benchmark missing from a run, or counted with other iterations,
/// is measured from the runs that have it (its `runs` says how many).
pub fn measure(runs: &[Vec<Counted>], toolchain: &Toolchain) -> Vec<Measurement> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_id: BTreeMap<&str, Vec<&Counted>> = BTreeMap::new();
    for run in runs {
        for c in run {
            let list = by_id.entry(&c.dump.id).or_default();
            if list.is_empty() {
                order.push(&c.dump.id);
            }
            list.push(c);
        }
    }
    order
        .into_iter()
        .map(|id| {
            let counts = &by_id[id];
            let iterations = counts[0].dump.iterations.max(1);
            let per = |c: &Counted| c.ir as f64 / c.dump.iterations.max(1) as f64;
            let values: Vec<f64> = counts.iter().map(|c| per(c)).collect();
            let (median, spread) = median_spread(&values).unwrap_or((0.0, 0.0));
            // The run whose count is nearest the median names the functions.
            let typical = counts
                .iter()
                .min_by(|a, b| (per(a) - median).abs().total_cmp(&(per(b) - median).abs()))
                .expect("a benchmark has a run");
            let n = typical.dump.iterations.max(1) as f64;
            let functions = typical
                .functions
                .iter()
                .take(FUNCTIONS_KEPT)
                .map(|(name, inc, own)| FunctionIr {
                    name: name.clone(),
                    inclusive: *inc as f64 / n,
                    self_ir: *own as f64 / n,
                })
                .collect();
            let not_gated = (spread > MAX_GATED_SPREAD).then(|| {
                format!(
                    "its count varied {spread:.1} % between {} runs (more than {MAX_GATED_SPREAD} \
                     %): threads or timing decide its work",
                    values.len()
                )
            });
            Measurement {
                benchmark: id.to_string(),
                iterations,
                ir_per_iteration: median,
                runs: values,
                spread_percent: spread,
                not_gated,
                functions,
                toolchain: toolchain.clone(),
            }
        })
        .collect()
}
