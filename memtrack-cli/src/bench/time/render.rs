//! `memtrack bench --measure time`'s report as an aligned table, markdown or JSON; the rows
//! follow `memtrack compare`'s (`benchmark`, `metric`, `base`, `head`, `change_percent`,
//! `verdict`), with each side's range and runs beside its median.

use memtrack::human;

use super::{Report, Row, Runs, Verdict};
use memtrack::render::md_escape;

/// A time in ns for people, to three significant digits: `812 ns`, `51.8 µs`, `1.20 s`.
pub(crate) fn duration(ns: f64) -> String {
    let (v, unit) = match ns.abs() {
        n if n < 1e3 => (ns, "ns"),
        n if n < 1e6 => (ns / 1e3, "µs"),
        n if n < 1e9 => (ns / 1e6, "ms"),
        _ => (ns / 1e9, "s"),
    };
    let digits = match v.abs() {
        a if a < 10.0 => 2,
        a if a < 100.0 => 1,
        _ => 0,
    };
    format!("{v:.digits$} {unit}")
}

fn range(r: &Runs) -> String {
    format!("{} – {}", duration(r.min()), duration(r.max()))
}

fn change(p: f64) -> String {
    format!("{p:+.2}%")
}

fn verdict_human(v: Verdict) -> &'static str {
    match v {
        Verdict::Regressed => "REGRESSED",
        Verdict::Improved => "improved",
        Verdict::WithinNoise => "within noise",
    }
}

fn verdict_markdown(v: Verdict) -> &'static str {
    match v {
        Verdict::Regressed => "❌ **regressed**",
        Verdict::Improved => "✅ improved",
        Verdict::WithinNoise => "within noise",
    }
}

const HEADER: [&str; 8] = [
    "benchmark",
    "metric",
    "base",
    "base range",
    "head",
    "head range",
    "change",
    "verdict",
];

fn cells(r: &Row, verdict: &str) -> [String; 8] {
    [
        r.benchmark.clone(),
        "time".into(),
        duration(r.base.median()),
        range(&r.base),
        duration(r.head.median()),
        range(&r.head),
        change(r.change_percent),
        verdict.into(),
    ]
}

/// The line under the table: what regressed, by which rule, how it was run.
fn summary(c: &Report) -> String {
    let head = match c.regressions() {
        0 => "no benchmark regressed in time".to_string(),
        n => format!(
            "{} regressed in time",
            human::plural(n as u64, "benchmark", "benchmarks")
        ),
    };
    let pinned = match c.cpu {
        Some(cpu) => format!("pinned to CPU {cpu}"),
        None => "not pinned".into(),
    };
    format!(
        "{head} (median beyond ±{} and ranges apart), {} compared; {} of base, head, head, base \
         per benchmark, {pinned}",
        c.threshold,
        human::count(c.rows.len() as u64),
        human::plural(u64::from(c.rounds), "round", "rounds"),
    )
}

/// What was not compared, one line each.
fn notes(c: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for b in &c.added {
        out.push(format!("only in head (not compared): {b}"));
    }
    for b in &c.removed {
        out.push(format!("only in base (not compared): {b}"));
    }
    for f in &c.failures {
        match &f.benchmark {
            Some(b) => out.push(format!(
                "not compared: {b} ({}): {}",
                f.side.name(),
                f.error
            )),
            None => out.push(format!("failed ({}): {}", f.side.name(), f.error)),
        }
    }
    out
}

/// An aligned plain-text table for a terminal, the summary line and what was not compared.
pub(crate) fn table(c: &Report) -> String {
    let mut rows = vec![HEADER.map(String::from)];
    rows.extend(c.rows.iter().map(|r| cells(r, verdict_human(r.verdict))));
    let mut out = human::table(&rows, &[false, false, true, true, true, true, true, false]);
    out.push('\n');
    out.push_str(&summary(c));
    out.push('\n');
    for n in notes(c) {
        out.push_str(&n);
        out.push('\n');
    }
    out.push_str(&format!("run log: {}\n", c.log.display()));
    out
}

/// GitHub-flavoured markdown for a CI job summary.
pub(crate) fn markdown(c: &Report) -> String {
    let mut out = String::from("### memtrack: wall-clock time comparison\n\n");
    let mark = if c.regressions() > 0 || !c.failures.is_empty() {
        "❌"
    } else {
        "✅"
    };
    out.push_str(&format!("{mark} **{}**\n\n", summary(c)));
    if !c.rows.is_empty() {
        out.push_str(&format!("| {} |\n", HEADER.join(" | ")));
        out.push_str("|:--|:--|--:|--:|--:|--:|--:|:--|\n");
        for r in &c.rows {
            let mut cells = cells(r, verdict_markdown(r.verdict));
            cells[0] = md_escape(&cells[0]);
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out.push('\n');
    }
    for n in notes(c) {
        out.push_str(&format!("- {}\n", md_escape(&n)));
    }
    out.push('\n');
    out
}

/// Machine-readable form: times in ns per iteration as floats, each side's median, range and
/// runs (in the order they ran).
pub(crate) fn json(c: &Report) -> String {
    let name = |b: &String| serde_json::json!({ "benchmark": b });
    let v = serde_json::json!({
        "measure": "time",
        "threshold": c.threshold.to_string(),
        "threshold_ppm": c.threshold.ppm(),
        "metrics": ["time"],
        "regressions": c.regressions(),
        "base_commit": c.base_commit,
        "rounds": c.rounds,
        "order": ["base", "head", "head", "base"],
        "cpu": c.cpu,
        "run_log": c.log,
        "rows": c.rows.iter().map(|r| serde_json::json!({
            "benchmark": r.benchmark,
            "metric": "time",
            "unit": "ns",
            "base": r.base.median(),
            "head": r.head.median(),
            "base_min": r.base.min(),
            "base_max": r.base.max(),
            "head_min": r.head.min(),
            "head_max": r.head.max(),
            "base_runs": r.base.0,
            "head_runs": r.head.0,
            "change_percent": r.change_percent,
            "verdict": r.verdict.name(),
        })).collect::<Vec<_>>(),
        "added": c.added.iter().map(name).collect::<Vec<_>>(),
        "removed": c.removed.iter().map(name).collect::<Vec<_>>(),
        "failed": c.failures.iter().map(|f| serde_json::json!({
            "side": f.side.name(),
            "benchmark": f.benchmark,
            "error": f.error,
        })).collect::<Vec<_>>(),
    });
    serde_json::to_string_pretty(&v).expect("json values serialize") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_three_significant_digits() {
        assert_eq!(duration(812.0), "812 ns");
        assert_eq!(duration(51_818.0), "51.8 µs");
        assert_eq!(duration(1_204_000_000.0), "1.20 s");
        assert_eq!(duration(5.5), "5.50 ns");
    }
}
