//! Instructions per benchmark: a benchmark harness marks each benchmark's measured iterations
//! with callgrind's client requests ([`client`]), one callgrind dump per benchmark named by a
//! [`Dump`] line; [`run`] runs a benchmark program under callgrind and reads those dumps into
//! figures per iteration, R times; [`compare`] compares two sides' figures, once they are
//! known to be comparable ([`Toolchain`]).
//!
//! Behind the `callgrind` feature, like [`crate::callgrind`], whose profiles it reads.

pub mod client;
pub mod compare;
pub mod run;

use std::ffi::CString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::callgrind::CallgrindError;

/// A benchmark whose Ir per iteration varies more than this between runs (percent of the
/// median) is not gated: its count depends on scheduling or time (threads that spin or keep
/// running), not on its code alone. A single-threaded benchmark's count is the same in every
/// run.
pub const MAX_GATED_SPREAD: f64 = 0.5;

/// The suffix of a measurement's file: `<benchmark id, escaped>.instructions.json`.
pub const FILE_SUFFIX: &str = ".instructions.json";

/// Why instructions could not be counted, read or compared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstructionsError {
    /// No `valgrind` on `PATH`.
    #[error(
        "valgrind is not installed (no `valgrind` on PATH): counting instructions runs the \
         benchmarks under callgrind; install the package `valgrind` (apt-get install valgrind)"
    )]
    NoValgrind,
    /// A program could not be run, or failed.
    #[error("{what}: {problem}")]
    Run {
        /// What was run.
        what: String,
        /// What went wrong.
        problem: String,
    },
    /// A callgrind output file.
    #[error(transparent)]
    Callgrind(#[from] CallgrindError),
    /// A measurement file that cannot be read, written or parsed.
    #[error("{}: {problem}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Counts of different compilers, valgrinds or CPU features, which do not compare.
    #[error(
        "{benchmark}: the base was counted with {what} {base:?} and the head with {head:?}: \
         instruction counts of different {what}s do not compare; count both sides on one \
         machine with one toolchain"
    )]
    Incomparable {
        /// The first benchmark found so.
        benchmark: String,
        /// `rustc`, `valgrind` or `CPU feature set`.
        what: &'static str,
        /// The base's.
        base: String,
        /// The head's.
        head: String,
    },
}

/// What instruction counts depend on besides the code: the compiler, valgrind, and the CPU
/// features valgrind presents (glibc and many crates pick code paths by them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toolchain {
    /// `rustc -V` of the compiler that built the benchmarks.
    pub rustc: String,
    /// `valgrind --version`.
    pub valgrind: String,
    /// The CPU features the program saw under valgrind.
    pub cpu: String,
}

impl Toolchain {
    /// Whether counts made with `self` (the base's) compare with counts made with `head`.
    ///
    /// # Errors
    /// [`InstructionsError::Incomparable`] naming `benchmark` and the first difference.
    pub fn comparable(&self, head: &Toolchain, benchmark: &str) -> Result<(), InstructionsError> {
        let pairs = [
            ("rustc", &self.rustc, &head.rustc),
            ("valgrind", &self.valgrind, &head.valgrind),
            ("CPU feature set", &self.cpu, &head.cpu),
        ];
        for (what, base, head) in pairs {
            if base != head {
                return Err(InstructionsError::Incomparable {
                    benchmark: benchmark.to_string(),
                    what,
                    base: base.clone(),
                    head: head.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Writes each measurement to `dir/<id>.instructions.json` (the id escaped as an artifact's
/// name is), each file replaced only by a finished one.
///
/// # Errors
/// When a file cannot be written.
pub fn save(
    dir: &Path,
    measurements: &[run::Measurement],
) -> Result<Vec<PathBuf>, InstructionsError> {
    let mut out = Vec::new();
    for m in measurements {
        let path = dir.join(format!(
            "{}{FILE_SUFFIX}",
            crate::session::sanitize(&m.benchmark)
        ));
        let fail = |problem: String| InstructionsError::File {
            path: path.clone(),
            problem,
        };
        let json = serde_json::to_vec_pretty(m).map_err(|e| fail(e.to_string()))?;
        let output = crate::artifact::Output::create(&path).map_err(|e| fail(e.to_string()))?;
        std::io::Write::write_all(
            &mut output.writer().map_err(|e| fail(e.to_string()))?,
            &json,
        )
        .map_err(|e| fail(e.to_string()))?;
        out.push(output.commit().map_err(|e| fail(e.to_string()))?);
    }
    Ok(out)
}

/// Every measurement in `dir` (its `*.instructions.json`), by benchmark id.
///
/// # Errors
/// When the directory or a file cannot be read or parsed.
pub fn load(dir: &Path) -> Result<Vec<run::Measurement>, InstructionsError> {
    let fail = |path: &Path, problem: String| InstructionsError::File {
        path: path.to_path_buf(),
        problem,
    };
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| fail(dir, e.to_string()))?;
    for entry in entries {
        let path = entry.map_err(|e| fail(dir, e.to_string()))?.path();
        if !path.to_string_lossy().ends_with(FILE_SUFFIX) {
            continue;
        }
        let text = std::fs::read(&path).map_err(|e| fail(&path, e.to_string()))?;
        out.push(serde_json::from_slice(&text).map_err(|e| fail(&path, e.to_string()))?);
    }
    out.sort_by(|a: &run::Measurement, b| a.benchmark.cmp(&b.benchmark));
    Ok(out)
}

/// The text a harness gives `CALLGRIND_DUMP_STATS_AT` for one benchmark, and reads back from
/// the dump's `desc: Trigger: Client Request: …` line: `memtrack-bench iterations=N id=ID`,
/// the id on one line ([`crate::human::escape_line`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    /// The benchmark's id, as its harness names it (criterion's `group/function/parameter`).
    pub id: String,
    /// How many iterations the dump counted.
    pub iterations: u64,
}

const DUMP_PREFIX: &str = "memtrack-bench iterations=";
const CLIENT_REQUEST: &str = "Client Request: ";

impl Dump {
    /// The text to pass to [`client::dump_stats_at`].
    pub fn text(&self) -> CString {
        let id = crate::human::escape_line(&self.id);
        CString::new(format!("{DUMP_PREFIX}{} id={id}", self.iterations))
            .expect("NUL bytes are escaped")
    }

    /// The dump a profile's trigger ([`crate::callgrind::Profile::trigger`]) names, if a
    /// harness made it.
    pub fn from_trigger(trigger: &str) -> Option<Dump> {
        let rest = trigger
            .strip_prefix(CLIENT_REQUEST)?
            .strip_prefix(DUMP_PREFIX)?;
        let (n, id) = rest.split_once(" id=")?;
        let iterations = n.parse().ok()?;
        Some(Dump {
            id: crate::human::unescape_line(id),
            iterations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_text_reads_back() {
        for id in ["vec/1024", "a\\b\nc #2", "", "id=x iterations=3"] {
            let d = Dump {
                id: id.into(),
                iterations: 7,
            };
            let text = d.text().into_string().unwrap();
            assert!(!text.contains('\n'));
            let back = Dump::from_trigger(&format!("{CLIENT_REQUEST}{text}"));
            assert_eq!(back, Some(d));
        }
        assert_eq!(Dump::from_trigger("Program termination"), None);
        assert_eq!(Dump::from_trigger("Client Request: other"), None);
    }
}
