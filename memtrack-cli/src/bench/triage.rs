//! `memtrack bench --base REF --measure all` (or any set of measures that holds `time`): each
//! measure taken at the head and at REF (time in alternating order, instructions under
//! callgrind, memory recorded), then one triage table, a row per benchmark with one class,
//! the row's first word in every format: `more allocation` (allocations or bytes per
//! iteration grew; first, since allocating adds instructions too), else `more work`
//! (instructions per iteration grew), else `layout or noise (no added work)` (only the time
//! moved), `faster` (something improved, nothing regressed), `unchanged`; `not compared` when
//! no measure has both sides (a benchmark on one side only). Under each regressed
//! row, the functions whose instructions grew most and the call sites whose allocations did.
//! A measure that failed, or that one side lacks for a benchmark, is listed, never a zero.

use std::path::Path;
use std::process::ExitCode;

use memtrack::analysis::{Comparison, Metric, Threshold, Verdict};
use memtrack::instructions::compare::compare;
use memtrack::instructions::run::{Callgrind, Measurement};

use super::suite::{Repo, Worktree};
use super::{Args, GateArg, Measure, instructions, time};
use crate::compare::{Attributed, Format};
use crate::error::Error;

mod render;

/// A triage row's class: what moved, named by the cause to look at first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Allocations or bytes per iteration grew beyond the threshold.
    MoreAllocation,
    /// Instructions per iteration grew beyond the threshold, allocations did not.
    MoreWork,
    /// Only the wall-clock time grew (beyond the threshold, ranges apart): no added work.
    LayoutOrNoise,
    /// Something improved beyond the threshold, nothing regressed.
    Faster,
    /// Nothing moved beyond the threshold.
    Unchanged,
    /// No measure was compared: the benchmark is on one side only, or every measure of it
    /// failed (the row's note says which).
    NotCompared,
}

impl Class {
    /// As the text and markdown tables show it.
    pub(crate) const fn text(self) -> &'static str {
        match self {
            Class::MoreAllocation => "more allocation",
            Class::MoreWork => "more work",
            Class::LayoutOrNoise => "layout or noise (no added work)",
            Class::Faster => "faster",
            Class::Unchanged => "unchanged",
            Class::NotCompared => "not compared",
        }
    }

    /// The name in JSON (`class`).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Class::MoreAllocation => "more_allocation",
            Class::MoreWork => "more_work",
            Class::LayoutOrNoise => "layout_or_noise",
            Class::Faster => "faster",
            Class::Unchanged => "unchanged",
            Class::NotCompared => "not_compared",
        }
    }

    /// Whether it is a regression (of one measure or another).
    pub(crate) const fn regressed(self) -> bool {
        matches!(
            self,
            Class::MoreAllocation | Class::MoreWork | Class::LayoutOrNoise
        )
    }
}

/// How one measure of one benchmark moved, base to head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Beyond the threshold up (a regression).
    Grew,
    /// Beyond the threshold down.
    Shrank,
    /// Neither.
    Flat,
}

impl Moved {
    /// A comparison's verdict and change: a regression grew; a fall beyond the threshold shrank
    /// (a comparison calls any fall improved, time only one beyond the threshold).
    pub(crate) fn of(verdict: Verdict, change_percent: Option<f64>, threshold: Threshold) -> Moved {
        match verdict {
            Verdict::Regressed => Moved::Grew,
            Verdict::Improved if change_percent.is_some_and(|p| p < -threshold.percent()) => {
                Moved::Shrank
            }
            _ => Moved::Flat,
        }
    }
}

/// The measures of one benchmark, each `None` when not measured on both sides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Moves {
    pub allocations: Option<Moved>,
    pub bytes: Option<Moved>,
    pub instructions: Option<Moved>,
    pub time: Option<Moved>,
}

/// The class of a benchmark whose measures moved as `m` says; a measure not measured counts
/// for nothing.
pub(crate) fn classify(m: Moves) -> Class {
    let all = [m.allocations, m.bytes, m.instructions, m.time];
    if all.iter().all(Option::is_none) {
        return Class::NotCompared;
    }
    let grew = |x: Option<Moved>| x == Some(Moved::Grew);
    if grew(m.allocations) || grew(m.bytes) {
        Class::MoreAllocation
    } else if grew(m.instructions) {
        Class::MoreWork
    } else if grew(m.time) {
        Class::LayoutOrNoise
    } else if all.contains(&Some(Moved::Shrank)) {
        Class::Faster
    } else {
        Class::Unchanged
    }
}

/// Something that kept a measure from being whole: a side's build or run.
pub(crate) struct Failure {
    /// `time`, `instructions` or `memory`.
    pub measure: &'static str,
    /// `base`, `head`, or `both` (a comparison of the two).
    pub side: &'static str,
    pub error: String,
}

/// Memory compared: the comparison and the call sites behind its regressions.
pub(crate) struct Memory {
    pub cmp: Comparison,
    pub attributed: Vec<Attributed>,
}

/// Instructions compared: each benchmark's change and both sides' measurements.
pub(crate) struct Counted {
    pub rows: Vec<memtrack::instructions::compare::Row>,
    pub base: Vec<Measurement>,
    pub head: Vec<Measurement>,
}

/// Every measure taken; `None` for a measure not asked for, or one that failed (then in
/// `failures`).
pub(crate) struct Measured {
    pub threshold: Threshold,
    pub base_commit: String,
    pub asked: Asked,
    pub time: Option<time::Report>,
    pub instructions: Option<Counted>,
    pub memory: Option<Memory>,
    pub failures: Vec<Failure>,
}

/// Which measures were asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asked {
    pub time: bool,
    pub instructions: bool,
    pub memory: bool,
}

impl Asked {
    pub(crate) fn of(measures: &[Measure]) -> Asked {
        let has = |m| measures.contains(&m) || measures.contains(&Measure::All);
        Asked {
            time: has(Measure::Time),
            instructions: has(Measure::Instructions),
            memory: has(Measure::Memory),
        }
    }

    /// The measures' names, in the table's order.
    pub(crate) fn names(self) -> Vec<&'static str> {
        [
            (self.time, "time"),
            (self.instructions, "instructions"),
            (self.memory, "memory"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

/// Whether `measures` asks for the triage: `all`, or time with another measure.
pub(crate) fn asked(measures: &[Measure]) -> bool {
    let a = Asked::of(measures);
    measures.contains(&Measure::All) || (a.time && (a.instructions || a.memory))
}

/// Measures every measure asked for at the head and at `--base`, prints the triage table.
/// Exit 0; 1 when a gated measure regressed (memory and instructions; time with
/// `--gate time`); 2 when a measure failed (the table, with what failed, is printed first).
pub(crate) fn run(args: &Args, here: &Path, target: &Path, out: &Path) -> Result<ExitCode, Error> {
    let Some(reference) = &args.base else {
        return Err(Error::Usage(
            "the triage compares two builds: give --base REF".into(),
        ));
    };
    let asked = Asked::of(&args.measure);
    if asked.instructions {
        // Before anything is built: without valgrind the triage cannot be whole.
        Callgrind::find()?;
    }
    let repo = Repo::find(here, "--base")?;
    let tree = Worktree::add(&repo, reference, target, "--base")?;
    let mut failures = Vec::new();
    let time = asked
        .time
        .then(|| {
            time::compare(
                &super::time_request(args, here, target, out, reference),
                &tree,
            )
        })
        .transpose()?;
    let side = format!(
        "base {reference}, {}",
        &tree.commit[..tree.commit.len().min(12)]
    );
    // The build-id store of both sides is --out's.
    super::clear(out)?;
    super::clear(&out.join("base"))?;
    super::clear(&out.join("head"))?;
    let dirs = (here, target, out);
    let instructions = asked
        .instructions
        .then(|| count(args, dirs, (&tree.dir, &side), &mut failures))
        .flatten();
    let memory = asked
        .memory
        .then(|| record(args, dirs, (&tree.dir, &side), &mut failures))
        .flatten();
    let measured = Measured {
        threshold: args.threshold,
        base_commit: tree.commit.clone(),
        asked,
        time,
        instructions,
        memory,
        failures,
    };
    drop(tree);
    print(&measured, args)
}

/// Instructions at the head and the base (`tree`: its directory and name in messages),
/// results in `out`/head and `out`/base, compared; a failure is added to `failures`.
fn count(
    args: &Args,
    (here, target, out): (&Path, &Path, &Path),
    tree: (&Path, &str),
    failures: &mut Vec<Failure>,
) -> Option<Counted> {
    let (base, head) = (out.join("base"), out.join("head"));
    let runs = args.runs as usize;
    let counting = instructions::Counting::new(&args.cargo, runs, target.join(super::TIME_TARGET));
    let base_counting =
        instructions::Counting::new(&args.cargo, runs, target.join(super::TIME_BASE_TARGET));
    let mut fail = |side, e: Error| {
        failures.push(Failure {
            measure: "instructions",
            side,
            error: e.to_string(),
        });
    };
    let h = counting
        .run(here, &head, "head")
        .map_err(|e| fail("head", e));
    let b = (base_counting.run(tree.0, &base, tree.1)).map_err(|e| fail("base", e));
    if h.is_err() || b.is_err() {
        return None;
    }
    let compared = (|| -> Result<Counted, Error> {
        let b = memtrack::instructions::load(&base)?;
        let h = memtrack::instructions::load(&head)?;
        let rows = compare(&b, &h, args.threshold)?;
        Ok(Counted {
            rows,
            base: b,
            head: h,
        })
    })();
    compared.map_err(|e| fail("both", e)).ok()
}

/// Memory recorded at the head and the base (`tree`), results in `out`/head and `out`/base,
/// compared on allocations and bytes per iteration; a failure is added to `failures`.
fn record(
    args: &Args,
    (here, target, out): (&Path, &Path, &Path),
    tree: (&Path, &str),
    failures: &mut Vec<Failure>,
) -> Option<Memory> {
    let (base, head) = (out.join("base"), out.join("head"));
    let suite = super::memory_suite(args, target, out);
    let mut fail = |side, e: Error| {
        failures.push(Failure {
            measure: "memory",
            side,
            error: e.to_string(),
        });
    };
    let h = suite.run(here, &head, "head").map_err(|e| fail("head", e));
    // A target directory of its own, as `--base` alone has (see `measure_both`).
    let base_suite = super::Suite {
        target: target.join("memtrack-bench-base"),
        ..suite
    };
    let b = (base_suite.run(tree.0, &base, tree.1)).map_err(|e| fail("base", e));
    if h.is_err() || b.is_err() {
        return None;
    }
    let judged = (|| -> Result<crate::compare::Judged, Error> {
        let loaded = crate::compare::load_pair(&base, &head)?;
        super::mixed(&loaded.base, &loaded.head)?;
        crate::compare::judge(
            &loaded,
            &[Metric::Allocations, Metric::Bytes],
            args.threshold,
        )
    })();
    let judged = judged.map_err(|e| fail("both", e)).ok()?;
    Some(Memory {
        cmp: judged.cmp,
        attributed: judged.attributed,
    })
}

/// Prints the triage as `args` asks (and its markdown into the job summary); the exit code.
fn print(m: &Measured, args: &Args) -> Result<ExitCode, Error> {
    let triage = render::Triage::of(m);
    let text = match args.format {
        Format::Table => triage.text(),
        Format::Markdown => triage.markdown(),
        Format::Json => {
            serde_json::to_string_pretty(&triage.json()).expect("json values serialize") + "\n"
        }
    };
    crate::out(&text)?;
    super::summary(&triage.markdown());
    let gate_time = args.gate.contains(&GateArg::Time);
    let gated = triage.lines.iter().any(|l| {
        matches!(l.class, Class::MoreAllocation | Class::MoreWork)
            || (gate_time && l.class == Class::LayoutOrNoise)
    });
    Ok(
        if !m.failures.is_empty() || m.time.as_ref().is_some_and(|t| !t.failures.is_empty()) {
            ExitCode::from(2)
        } else if gated {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [Option<Moved>; 4] = [
        None,
        Some(Moved::Flat),
        Some(Moved::Shrank),
        Some(Moved::Grew),
    ];

    /// Every combination of the four measures' moves, each in one of four states: the class
    /// follows the order of causes (allocation, work, time alone), then faster, unchanged.
    #[test]
    fn every_combination_gets_its_class() {
        let mut seen = std::collections::BTreeMap::new();
        for allocations in STATES {
            for bytes in STATES {
                for instructions in STATES {
                    for time in STATES {
                        let m = Moves {
                            allocations,
                            bytes,
                            instructions,
                            time,
                        };
                        let grew = |x| x == Some(Moved::Grew);
                        let shrank = |x| x == Some(Moved::Shrank);
                        let expected = if [allocations, bytes, instructions, time]
                            .iter()
                            .all(Option::is_none)
                        {
                            Class::NotCompared
                        } else if grew(allocations) || grew(bytes) {
                            Class::MoreAllocation
                        } else if grew(instructions) {
                            Class::MoreWork
                        } else if grew(time) {
                            Class::LayoutOrNoise
                        } else if [allocations, bytes, instructions, time]
                            .iter()
                            .any(|&x| shrank(x))
                        {
                            Class::Faster
                        } else {
                            Class::Unchanged
                        };
                        assert_eq!(classify(m), expected, "{m:?}");
                        *seen.entry(expected.name()).or_insert(0) += 1;
                    }
                }
            }
        }
        // Of 4⁴: allocations or bytes grew in all but 3·3·4·4; of those 144, instructions
        // grew in 3·3·4·4 − 3·3·3·4; of the 108 left, time grew in 3·3·3; of the 81 where
        // nothing grew, nothing shrank in 2⁴ (each not measured or flat), one of which has
        // nothing measured.
        assert_eq!(seen["more_allocation"], 256 - 144);
        assert_eq!(seen["more_work"], 144 - 108);
        assert_eq!(seen["layout_or_noise"], 27);
        assert_eq!(seen["faster"], 81 - 16);
        assert_eq!(seen["unchanged"], 15);
        assert_eq!(seen["not_compared"], 1);
    }

    /// Named cases, as the guide states them.
    #[test]
    fn the_guides_cases() {
        let flat = Some(Moved::Flat);
        let all_flat = Moves {
            allocations: flat,
            bytes: flat,
            instructions: flat,
            time: flat,
        };
        assert_eq!(classify(all_flat), Class::Unchanged);
        assert_eq!(classify(Moves::default()), Class::NotCompared);
        let more_allocation_and_work = Moves {
            allocations: Some(Moved::Grew),
            instructions: Some(Moved::Grew),
            time: Some(Moved::Grew),
            ..all_flat
        };
        assert_eq!(classify(more_allocation_and_work), Class::MoreAllocation);
        let work = Moves {
            instructions: Some(Moved::Grew),
            time: Some(Moved::Shrank),
            ..all_flat
        };
        assert_eq!(classify(work), Class::MoreWork);
        let time_only = Moves {
            time: Some(Moved::Grew),
            bytes: Some(Moved::Shrank),
            ..all_flat
        };
        assert_eq!(classify(time_only), Class::LayoutOrNoise);
        let faster = Moves {
            time: Some(Moved::Shrank),
            ..all_flat
        };
        assert_eq!(classify(faster), Class::Faster);
    }

    /// A comparison calls any fall improved; the triage only one beyond the threshold.
    #[test]
    fn a_fall_within_the_threshold_is_flat() {
        let t: Threshold = "3%".parse().unwrap();
        assert_eq!(Moved::of(Verdict::Improved, Some(-1.0), t), Moved::Flat);
        assert_eq!(Moved::of(Verdict::Improved, Some(-5.0), t), Moved::Shrank);
        assert_eq!(Moved::of(Verdict::Regressed, None, t), Moved::Grew);
        assert_eq!(
            Moved::of(Verdict::WithinThreshold, Some(2.0), t),
            Moved::Flat
        );
        assert_eq!(Moved::of(Verdict::WithinNoise, Some(9.0), t), Moved::Flat);
    }
}
