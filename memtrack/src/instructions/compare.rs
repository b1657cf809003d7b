//! Base → head per benchmark: Ir per iteration judged against a threshold, and for a
//! regression the functions whose inclusive Ir per iteration grew most.

use std::collections::BTreeMap;

use super::InstructionsError;
use super::run::Measurement;
use crate::analysis::{Threshold, Verdict};

/// Functions named per regressed benchmark.
pub const GROWN_KEPT: usize = 5;

/// The harness's and the runtime's own frames, which grow with anything they call: a grown
/// function named is the benchmark's, not these.
const HARNESS: &[&str] = &[
    "main",
    "(below main)",
    "__libc_start_main",
    "__libc_start_call_main",
    "_start",
    "memtrack_criterion::",
    "criterion::",
    "std::rt::",
    "std::panicking::",
    "std::panic::",
    "std::sys::backtrace::",
    "core::ops::function::",
    "<alloc::boxed::Box<F,A> as core::ops::function::",
];

/// How one benchmark changed.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Compared: base and head Ir per iteration, and the verdict.
    Judged {
        /// Base Ir per iteration (median).
        base: f64,
        /// Head Ir per iteration (median).
        head: f64,
        /// Against the threshold.
        verdict: Verdict,
        /// For a regression: the functions whose inclusive Ir per iteration grew most,
        /// (name, base, head), largest growth first.
        grown: Vec<(String, f64, f64)>,
    },
    /// Not gated on one side or both: why.
    NotGated {
        /// Base Ir per iteration.
        base: f64,
        /// Head Ir per iteration.
        head: f64,
        /// Why.
        why: String,
    },
    /// In the head only.
    New,
    /// In the base only.
    Gone,
}

/// One benchmark's row of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The benchmark's id.
    pub benchmark: String,
    /// How it changed.
    pub change: Change,
}

impl Row {
    /// Whether this row fails a check.
    pub fn regressed(&self) -> bool {
        matches!(
            self.change,
            Change::Judged {
                verdict: Verdict::Regressed,
                ..
            }
        )
    }
}

/// Compares `base` with `head` per benchmark id (head's order, then what only the base has).
///
/// # Errors
/// [`InstructionsError::Incomparable`] when a benchmark of both sides was counted with another
/// toolchain ([`super::Toolchain::comparable`]).
pub fn compare(
    base: &[Measurement],
    head: &[Measurement],
    threshold: Threshold,
) -> Result<Vec<Row>, InstructionsError> {
    let by_id: BTreeMap<&str, &Measurement> =
        base.iter().map(|m| (m.benchmark.as_str(), m)).collect();
    let mut rows = Vec::new();
    for h in head {
        let Some(b) = by_id.get(h.benchmark.as_str()) else {
            rows.push(Row {
                benchmark: h.benchmark.clone(),
                change: Change::New,
            });
            continue;
        };
        b.toolchain.comparable(&h.toolchain, &h.benchmark)?;
        let change = match (&b.not_gated, &h.not_gated) {
            (Some(why), _) | (None, Some(why)) => Change::NotGated {
                base: b.ir_per_iteration,
                head: h.ir_per_iteration,
                why: why.clone(),
            },
            (None, None) => {
                // Tenths of an instruction per iteration: the precision shown.
                let tenths = |v: f64| (v * 10.0).round().max(0.0) as u64;
                let verdict =
                    threshold.judge(tenths(b.ir_per_iteration), tenths(h.ir_per_iteration));
                let grown = if verdict == Verdict::Regressed {
                    grown(b, h)
                } else {
                    Vec::new()
                };
                Change::Judged {
                    base: b.ir_per_iteration,
                    head: h.ir_per_iteration,
                    verdict,
                    grown,
                }
            }
        };
        rows.push(Row {
            benchmark: h.benchmark.clone(),
            change,
        });
    }
    let heads: BTreeMap<&str, ()> = head.iter().map(|m| (m.benchmark.as_str(), ())).collect();
    for b in base {
        if !heads.contains_key(b.benchmark.as_str()) {
            rows.push(Row {
                benchmark: b.benchmark.clone(),
                change: Change::Gone,
            });
        }
    }
    Ok(rows)
}

/// The functions (not the harness's) whose inclusive Ir per iteration grew most from `base`
/// to `head`: the benchmark's own (the standard library's and C's only when none of its own
/// grew), largest growth first. Of the benchmark's own functions that grew alike (within 10 %), only the one doing
/// the least is named: the callee, not the callers that pass its growth on.
pub fn grown(base: &Measurement, head: &Measurement) -> Vec<(String, f64, f64)> {
    let before: BTreeMap<&str, f64> = base
        .functions
        .iter()
        .map(|f| (f.name.as_str(), f.inclusive))
        .collect();
    let mut out: Vec<(String, f64, f64)> = head
        .functions
        .iter()
        .filter(|f| !harness(&f.name))
        .map(|f| {
            let b = before.get(f.name.as_str()).copied().unwrap_or(0.0);
            (f.name.clone(), b, f.inclusive)
        })
        .filter(|(_, b, h)| h - b >= 0.5)
        .collect();
    // A caller that only passes on a callee's growth is not named: one of the benchmark's own
    // functions doing less (a smaller inclusive count) grew as much, within 10 %.
    let own: Vec<(String, f64, f64)> = out.iter().filter(|f| !library(&f.0)).cloned().collect();
    let growth = |f: &(String, f64, f64)| f.2 - f.1;
    out.retain(|f| {
        library(&f.0)
            || !own
                .iter()
                .any(|g| g.2 < f.2 && (growth(g) - growth(f)).abs() <= 0.1 * growth(f))
    });
    // The benchmark's own code alone when some of it grew: its functions grew with what they
    // call in the standard library or in C, and they are what a reader can change.
    if out.iter().any(|f| !library(&f.0)) {
        out.retain(|f| !library(&f.0));
    }
    out.sort_by(|x, y| {
        let (gx, gy) = ((x.2 - x.1).round(), (y.2 - y.1).round());
        library(&x.0)
            .cmp(&library(&y.0))
            .then(gy.total_cmp(&gx))
            .then(x.2.total_cmp(&y.2))
    });
    out.truncate(GROWN_KEPT);
    out
}

/// Whether `name` is the standard library's (`core`, `alloc`, `std`, the allocator shims, a
/// std trait's impl for a primitive or generic type: `<T as alloc::…>`) or C's (no path): code
/// the benchmark calls rather than its own.
fn library(name: &str) -> bool {
    const STD: &[&str] = &[
        "core::",
        "alloc::",
        "std::",
        "__rustc::",
        "hashbrown::",
        "dyn core::",
    ];
    if !name.contains("::") {
        return true;
    }
    let n = name
        .trim_start_matches(['<', '&'])
        .trim_start_matches("mut ");
    if STD.iter().any(|p| n.starts_with(p)) || n.starts_with('[') || n.starts_with("str as ") {
        return true;
    }
    n.split_once(" as ")
        .is_some_and(|(ty, tr)| !ty.contains("::") && STD.iter().any(|p| tr.starts_with(p)))
}

fn harness(name: &str) -> bool {
    HARNESS.iter().any(|h| {
        if h.ends_with("::") {
            name.starts_with(h)
        } else {
            name == *h
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instructions::Toolchain;
    use crate::instructions::run::{Counted, FunctionIr, measure};
    use crate::instructions::{Dump, InstructionsError};

    fn toolchain(rustc: &str) -> Toolchain {
        Toolchain {
            rustc: rustc.into(),
            valgrind: "valgrind-3.19.0".into(),
            cpu: "amd64-avx2".into(),
        }
    }

    /// One run's dump of benchmark `id`: 10 iterations, `ir` in all, `write` doing `write`.
    fn counted(id: &str, ir: u64, write: u64) -> Counted {
        Counted {
            dump: Dump {
                id: id.into(),
                iterations: 10,
            },
            ir,
            functions: vec![
                ("main".into(), ir, 0),
                ("app::{{closure}}".into(), ir, 10),
                ("app::write_frames".into(), write, write - 20),
                ("app::other".into(), 20, 20),
                ("alloc::string::String::push".into(), write / 2, write / 2),
                (
                    "<T as alloc::slice::hack::ConvertVec>::to_vec".into(),
                    write - 5,
                    5,
                ),
            ],
        }
    }

    #[test]
    fn median_spread_and_not_gated() {
        let runs = vec![
            vec![counted("a", 1000, 500), counted("t", 1000, 500)],
            vec![counted("a", 1000, 500), counted("t", 1200, 500)],
            vec![counted("a", 1000, 500), counted("t", 1100, 500)],
        ];
        let m = measure(&runs, &toolchain("rustc 1"));
        assert_eq!(m[0].benchmark, "a");
        assert_eq!((m[0].ir_per_iteration, m[0].spread_percent), (100.0, 0.0));
        assert_eq!(m[0].not_gated, None);
        assert_eq!(m[1].ir_per_iteration, 110.0);
        assert!((m[1].spread_percent - 200.0 / 11.0).abs() < 1e-9);
        assert!(m[1].not_gated.is_some());
        let w = m[0]
            .functions
            .iter()
            .find(|f| f.name == "app::write_frames");
        let want = FunctionIr {
            name: "app::write_frames".into(),
            inclusive: 50.0,
            self_ir: 48.0,
        };
        assert_eq!(w, Some(&want));
    }

    #[test]
    fn a_regression_names_the_function_that_grew() {
        let t = toolchain("rustc 1");
        let base = measure(
            &[vec![counted("a", 1000, 380), counted("b", 1000, 380)]],
            &t,
        );
        let head = measure(
            &[vec![
                counted("a", 1156, 536),
                counted("b", 1020, 400),
                counted("c", 5, 25),
            ]],
            &t,
        );
        let rows = compare(&base, &head, Threshold::from_ppm(30_000)).unwrap();
        assert_eq!(rows.len(), 3);
        assert!(rows[0].regressed());
        match &rows[0].change {
            Change::Judged {
                base, head, grown, ..
            } => {
                assert_eq!((*base, *head), (100.0, 115.6));
                // The closure grew as much, but does more: the callee is named, the closure
                // (which passes its growth on) is not; `main` is the harness's; the standard
                // library's functions are not named, even one that grew alike with less work.
                assert_eq!(grown[0], ("app::write_frames".to_string(), 38.0, 53.6));
                let names: Vec<&str> = grown.iter().map(|g| g.0.as_str()).collect();
                assert_eq!(names, ["app::write_frames"]);
            }
            other => panic!("{other:?}"),
        }
        // 2 % is within 3 %.
        assert!(!rows[1].regressed());
        assert_eq!(rows[2].change, Change::New);
    }

    #[test]
    fn other_toolchains_do_not_compare() {
        let base = measure(&[vec![counted("a", 1000, 380)]], &toolchain("rustc 1"));
        let head = measure(&[vec![counted("a", 1000, 380)]], &toolchain("rustc 2"));
        match compare(&base, &head, Threshold::default()) {
            Err(InstructionsError::Incomparable { what, .. }) => assert_eq!(what, "rustc"),
            other => panic!("{other:?}"),
        }
    }
}
