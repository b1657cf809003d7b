//! Comparing two sets of benchmarks metric by metric: the memory regression gate.
//!
//! # Rules
//! - Benchmarks are matched by name. One only in the base is *removed*, one only in the head is
//!   *added*; neither is a regression.
//! - Metrics: `allocations` ([`Totals::allocations`]), `bytes` ([`Totals::bytes_allocated`]) and
//!   `peak` ([`Totals::peak_live_bytes`]).
//! - The threshold bounds **growth** relative to the base: a metric *regressed* when
//!   `head > base` and `(head − base) / base > threshold`, computed exactly in integers (growth
//!   of exactly the threshold passes). A base of 0 growing to anything above 0 is a regression
//!   whatever the threshold (the relative change is infinite). `head < base` is an
//!   *improvement*, whatever its size; `head == base` is *unchanged*; growth up to the threshold
//!   is *within threshold*.
//! - **Per iteration.** A benchmark that records how many iterations it covers
//!   ([`Benchmark::iterations`]: criterion's `Profiler` stores it) is compared per iteration:
//!   its `allocations` and `bytes` are divided by its iterations and judged at the precision
//!   they are printed, hundredths (`1.00` allocations, `64.00` B), since criterion runs a
//!   different number of iterations each time (and a handful of its own allocations per run
//!   spread over them). `peak` is a maximum, not a sum: it is compared as is. A benchmark with
//!   iterations and one without are not compared at all ([`Comparison::mismatched`]).
//! - The inputs must be whole recordings: the caller refuses lossy, recovered or corrupt
//!   artifacts before they get here (`memtrack compare` does).
//!
//! This is numbers and verdicts only; the `memtrack compare` command (the memtrack-cli crate)
//! renders them as a table, markdown or JSON.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::totals::Totals;

/// A metric the comparison gates on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// Number of allocations ([`Totals::allocations`]).
    Allocations,
    /// Bytes allocated ([`Totals::bytes_allocated`]).
    Bytes,
    /// Peak live heap bytes ([`Totals::peak_live_bytes`]).
    Peak,
}

impl Metric {
    /// Every metric, in table order.
    pub const ALL: [Metric; 3] = [Metric::Allocations, Metric::Bytes, Metric::Peak];

    /// The name used on the command line and in JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Metric::Allocations => "allocations",
            Metric::Bytes => "bytes",
            Metric::Peak => "peak",
        }
    }

    /// The metric's value in `t`.
    pub fn value(self, t: &Totals) -> u64 {
        match self {
            Metric::Allocations => t.allocations,
            Metric::Bytes => t.bytes_allocated,
            Metric::Peak => t.peak_live_bytes,
        }
    }

    /// Whether the metric is a sum over the iterations (then compared per iteration), not a
    /// maximum.
    pub const fn per_iteration(self) -> bool {
        matches!(self, Metric::Allocations | Metric::Bytes)
    }
}

/// The largest growth threshold accepted, in parts per million (1,000,000 %).
const MAX_PPM: u64 = 10_000_000_000;

/// A growth threshold, held exactly in parts per million. Parsed from `"3%"` or `"0.25%"` (at
/// most 4 decimals), between 0 % and 1,000,000 %. The `%` is required: a bare `0.05` could mean
/// 0.05 % or a fraction of 0.05 (5 %), a gate 100× apart, so it is refused with both readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Threshold {
    ppm: u64,
}

impl Threshold {
    /// A threshold of `ppm` parts per million (30,000 is 3 %).
    pub fn from_ppm(ppm: u64) -> Self {
        Threshold {
            ppm: ppm.min(MAX_PPM),
        }
    }

    /// The threshold in parts per million.
    pub fn ppm(self) -> u64 {
        self.ppm
    }

    /// The threshold in percent.
    pub fn percent(self) -> f64 {
        self.ppm as f64 / 10_000.0
    }

    /// The verdict on a metric going from `base` to `head`; see the module docs.
    pub fn judge(self, base: u64, head: u64) -> Verdict {
        if head == base {
            Verdict::Unchanged
        } else if head < base {
            Verdict::Improved
        } else if base == 0
            // Growth from 0 is infinitely relative: above any threshold.
            || (head - base) as u128 * 1_000_000 > self.ppm as u128 * base as u128
        {
            Verdict::Regressed
        } else {
            Verdict::WithinThreshold
        }
    }
}

impl Default for Threshold {
    /// 3 %.
    fn default() -> Self {
        Threshold { ppm: 30_000 }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (int, frac) = (self.ppm / 10_000, self.ppm % 10_000);
        if frac == 0 {
            write!(f, "{int}%")
        } else {
            let frac = format!("{frac:04}");
            write!(f, "{int}.{}%", frac.trim_end_matches('0'))
        }
    }
}

impl FromStr for Threshold {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "invalid threshold {s:?}: expected a percentage like 3% or 0.5% \
                 (0 to 1000000, at most 4 decimals)"
            )
        };
        let Some(num) = s.trim().strip_suffix('%') else {
            // Show both readings of a bare number, if it is one.
            return Err(match format!("{}%", s.trim()).parse::<Threshold>() {
                Ok(t) => format!(
                    "invalid threshold {s:?}: the % sign is required, as a bare number reads two \
                     ways: {t} (growth of {t}) or {} (a fraction of {})",
                    Threshold::from_ppm(t.ppm().saturating_mul(100)),
                    s.trim(),
                ),
                Err(_) => bad(),
            });
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && frac.is_empty()
            || frac.len() > 4
            || !int.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let int: u64 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad())?
        };
        let frac: u64 = format!("{frac:0<4}").parse().map_err(|_| bad())?;
        let ppm = int
            .checked_mul(10_000)
            .and_then(|p| p.checked_add(frac))
            .filter(|&p| p <= MAX_PPM)
            .ok_or_else(bad)?;
        Ok(Threshold { ppm })
    }
}

/// What happened to one metric of one benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `head == base`.
    Unchanged,
    /// `head < base`.
    Improved,
    /// `head > base`, by no more than the threshold.
    WithinThreshold,
    /// Grew past the threshold (or from 0).
    Regressed,
    /// A measure that varies from run to run (wall-clock time) moved less than the threshold,
    /// or its two sides' ranges overlap: no change is called.
    WithinNoise,
}

impl Verdict {
    /// The name used in JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Verdict::Unchanged => "unchanged",
            Verdict::Improved => "improved",
            Verdict::WithinThreshold => "within_threshold",
            Verdict::Regressed => "regressed",
            Verdict::WithinNoise => "within_noise",
        }
    }
}

/// One whole recording of a benchmark, as a comparison input.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Benchmark {
    /// The benchmark's name (the artifact's metadata `name`, else its file stem).
    pub name: String,
    /// The artifact it was read from.
    pub path: PathBuf,
    /// Its totals.
    pub totals: Totals,
    /// Iterations of the measured routine its totals cover, if recorded (see the module docs:
    /// then it is compared per iteration).
    pub iterations: Option<u64>,
}

impl Benchmark {
    /// A benchmark named `name`, read from `path`, with totals `totals`.
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>, totals: Totals) -> Self {
        Benchmark {
            name: name.into(),
            path: path.into(),
            totals,
            iterations: None,
        }
    }

    /// The same benchmark, its totals covering `iterations` iterations (from the artifact's
    /// [`Final::iterations`](crate::artifact::Final::iterations)); `None` for plain totals.
    pub fn with_iterations(mut self, iterations: Option<u64>) -> Self {
        self.iterations = iterations;
        self
    }
}

/// `total / iterations` in hundredths, rounded half up, exactly (the precision per-iteration
/// figures are printed and judged at). `iterations` 0 counts as 1.
fn hundredths(total: u64, iterations: u64) -> u64 {
    let n = iterations.max(1) as u128;
    ((total as u128 * 200 + n) / (2 * n)).min(u64::MAX as u128) as u64
}

/// One metric of one benchmark in both sets.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Row {
    /// The benchmark's name.
    pub benchmark: String,
    /// The metric.
    pub metric: Metric,
    /// Its value in the base.
    pub base: u64,
    /// Its value in the head.
    pub head: u64,
    /// Iterations of the base, if it is compared per iteration.
    pub base_iterations: Option<u64>,
    /// Iterations of the head, if it is compared per iteration.
    pub head_iterations: Option<u64>,
    /// The base's value per iteration (rounded to hundredths), if compared per iteration.
    pub base_per_iteration: Option<f64>,
    /// The head's value per iteration (rounded to hundredths), if compared per iteration.
    pub head_per_iteration: Option<f64>,
    /// `(head − base) / base × 100` of the compared values (per iteration, when they are);
    /// `None` when the base is 0 and the head is not.
    pub change_percent: Option<f64>,
    /// The verdict under the comparison's threshold.
    pub verdict: Verdict,
}

/// The comparison of a base and a head set of benchmarks; see the module docs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Comparison {
    /// The growth threshold.
    pub threshold: Threshold,
    /// The metrics compared, in table order.
    pub metrics: Vec<Metric>,
    /// One row per matched benchmark and metric, by benchmark name then metric.
    pub rows: Vec<Row>,
    /// Benchmarks only in the head, by name.
    pub added: Vec<Benchmark>,
    /// Benchmarks only in the base, by name.
    pub removed: Vec<Benchmark>,
    /// Benchmarks in both whose figures are not of the same kind, `(base, head)`: one counted
    /// its iterations and the other did not. They get no rows: a total over an unknown number
    /// of iterations says nothing about a per-iteration figure. `memtrack compare` refuses
    /// them.
    pub mismatched: Vec<(Benchmark, Benchmark)>,
}

impl Comparison {
    /// Matches `base` and `head` by name and judges every metric in `metrics`. Names must be
    /// unique within each side (the caller checks).
    pub fn new(
        base: &[Benchmark],
        head: &[Benchmark],
        metrics: &[Metric],
        threshold: Threshold,
    ) -> Self {
        let mut metrics = metrics.to_vec();
        metrics.sort();
        metrics.dedup();
        let mut head_sorted: Vec<&Benchmark> = head.iter().collect();
        head_sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let mut rows = Vec::new();
        let mut added = Vec::new();
        let mut mismatched = Vec::new();
        for h in head_sorted {
            let Some(b) = base.iter().find(|b| b.name == h.name) else {
                added.push(h.clone());
                continue;
            };
            let iterations = match (b.iterations, h.iterations) {
                (Some(bi), Some(hi)) => Some((bi, hi)),
                (None, None) => None,
                _ => {
                    mismatched.push((b.clone(), h.clone()));
                    continue;
                }
            };
            for &m in &metrics {
                let (bv, hv) = (m.value(&b.totals), m.value(&h.totals));
                let per = iterations.filter(|_| m.per_iteration());
                // Judged on what is printed: hundredths per iteration, or the totals.
                let (bj, hj) = match per {
                    Some((bi, hi)) => (hundredths(bv, bi), hundredths(hv, hi)),
                    None => (bv, hv),
                };
                rows.push(Row {
                    benchmark: h.name.clone(),
                    metric: m,
                    base: bv,
                    head: hv,
                    base_iterations: per.map(|p| p.0),
                    head_iterations: per.map(|p| p.1),
                    base_per_iteration: per.map(|_| bj as f64 / 100.0),
                    head_per_iteration: per.map(|_| hj as f64 / 100.0),
                    change_percent: change_percent(bj, hj),
                    verdict: threshold.judge(bj, hj),
                });
            }
        }
        let mut removed: Vec<Benchmark> = base
            .iter()
            .filter(|b| !head.iter().any(|h| h.name == b.name))
            .cloned()
            .collect();
        removed.sort_by(|a, b| a.name.cmp(&b.name));
        Comparison {
            threshold,
            metrics,
            rows,
            added,
            removed,
            mismatched,
        }
    }

    /// Number of rows that regressed.
    pub fn regressions(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regressed)
            .count()
    }
}

/// `(head − base) / base × 100`; 0 for 0 → 0, `None` for 0 → more.
fn change_percent(base: u64, head: u64) -> Option<f64> {
    match (base, head) {
        (0, 0) => Some(0.0),
        (0, _) => None,
        _ => Some((head as f64 - base as f64) / base as f64 * 100.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_exactly() {
        let t = |s: &str| s.parse::<Threshold>().map(|t| t.ppm());
        assert_eq!(t("3%"), Ok(30_000));
        assert_eq!(t("0.5%"), Ok(5_000));
        assert_eq!(t(".25%"), Ok(2_500));
        assert_eq!(t("0%"), Ok(0));
        assert_eq!(t("12.3456%"), Ok(123_456));
        // A bare number is refused: 0.05 meant as 5 % would gate 100×
        // stricter than intended.
        let bare = t("0.05").unwrap_err();
        assert!(bare.contains("the % sign is required"), "{bare}");
        assert!(bare.contains("0.05%") && bare.contains("5%"), "{bare}");
        for bad in [
            "", "%", "3", "0.05", "-1%", "1.23456%", "abc", "1e3", "3 %x", "1000001%",
        ] {
            assert!(t(bad).is_err(), "{bad:?} must be refused");
        }
        assert_eq!(Threshold::from_ppm(5_000).to_string(), "0.5%");
        assert_eq!(Threshold::default().to_string(), "3%");
    }

    #[test]
    fn verdicts_follow_the_rules() {
        let t: Threshold = "10%".parse().unwrap();
        assert_eq!(t.judge(100, 100), Verdict::Unchanged);
        assert_eq!(t.judge(100, 50), Verdict::Improved);
        assert_eq!(
            t.judge(100, 110),
            Verdict::WithinThreshold,
            "exactly 10% passes"
        );
        assert_eq!(t.judge(100, 111), Verdict::Regressed);
        assert_eq!(t.judge(0, 1), Verdict::Regressed, "growth from 0");
        assert_eq!(t.judge(0, 0), Verdict::Unchanged);
        assert_eq!(t.judge(u64::MAX - 1, u64::MAX), Verdict::WithinThreshold);
        let zero = Threshold::from_ppm(0);
        assert_eq!(zero.judge(1_000_000, 1_000_001), Verdict::Regressed);
        assert_eq!(change_percent(200, 250), Some(25.0));
        assert_eq!(change_percent(0, 5), None);
    }

    fn bench(name: &str, allocations: u64, bytes: u64, peak: u64, it: Option<u64>) -> Benchmark {
        let totals = Totals {
            allocations,
            bytes_allocated: bytes,
            peak_live_bytes: peak,
            ..Totals::default()
        };
        Benchmark::new(name, format!("{name}.memtrack"), totals).with_iterations(it)
    }

    /// The same code over 480,313 then 300,195 iterations (plus one allocation of criterion's
    /// own in the longer run) is unchanged per iteration, not -37.50%.
    #[test]
    fn per_iteration_figures_compare_across_iteration_counts() {
        let base = [bench("b", 480_313, 480_313 * 64, 64, Some(480_313))];
        let head = [bench("b", 300_196, 300_195 * 64 + 8, 64, Some(300_195))];
        let c = Comparison::new(&base, &head, &Metric::ALL, Threshold::default());
        let got: Vec<_> = c
            .rows
            .iter()
            .map(|r| (r.metric, r.head_per_iteration, r.verdict))
            .collect();
        assert_eq!(
            got,
            vec![
                (Metric::Allocations, Some(1.0), Verdict::Unchanged),
                (Metric::Bytes, Some(64.0), Verdict::Unchanged),
                (Metric::Peak, None, Verdict::Unchanged),
            ]
        );
        // Without the iteration counts the same totals read as a 37.50 % improvement.
        let plain = |b: &Benchmark| b.clone().with_iterations(None);
        let c = Comparison::new(
            &[plain(&base[0])],
            &[plain(&head[0])],
            &[Metric::Allocations],
            Threshold::default(),
        );
        assert_eq!(c.rows[0].verdict, Verdict::Improved);
        // 1.5 allocations per iteration instead of 1 is a regression.
        let worse = [bench("b", 3, 192, 64, Some(2))];
        let c = Comparison::new(&base, &worse, &[Metric::Allocations], Threshold::default());
        assert_eq!(
            (c.rows[0].head_per_iteration, c.rows[0].verdict),
            (Some(1.5), Verdict::Regressed)
        );
    }

    #[test]
    fn per_iteration_and_plain_totals_are_not_compared() {
        let base = [bench("b", 10, 640, 64, Some(10))];
        let head = [bench("b", 10, 640, 64, None)];
        let c = Comparison::new(&base, &head, &Metric::ALL, Threshold::default());
        assert!(c.rows.is_empty());
        assert_eq!(c.mismatched.len(), 1);
        assert_eq!(hundredths(2, 3), 67);
        assert_eq!(hundredths(1, 200), 1, "0.005 rounds up");
        assert_eq!(hundredths(u64::MAX, 1), u64::MAX);
    }
}
