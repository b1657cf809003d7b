//! `memtrack bench --measure time`'s report through the report model ([`memtrack::render`]):
//! its rows are a comparison's (`benchmark`, `metric`, `base`, `head`, `change_percent`,
//! `verdict`), each side a [`Cell::Timing`] (median and range, `base_min`, `base_max`), with
//! its runs beside (JSON only).

use memtrack::human;
use memtrack::render::{self, Cell, Column, Table, md_escape};

use super::{Report, Row, Runs};

/// A side's runs as a cell: median and range.
pub(crate) fn timing(r: &Runs) -> Cell {
    Cell::Timing {
        median: r.median(),
        min: r.min(),
        max: r.max(),
    }
}

/// A comparison's columns, and the unit and each side's runs (JSON only).
fn columns() -> Vec<Column> {
    crate::compare::render::row_columns(vec![
        Column::json_only("unit"),
        Column::json_only("base_runs"),
        Column::json_only("head_runs"),
    ])
}

/// The rows: one per benchmark compared.
fn rows(c: &Report) -> Table {
    let mut t = Table::new(columns());
    for r in &c.rows {
        t.push(cells(r));
    }
    t
}

fn cells(r: &Row) -> Vec<Cell> {
    vec![
        Cell::Text(r.benchmark.clone()),
        Cell::Text("time".into()),
        timing(&r.base),
        timing(&r.head),
        Cell::Change(Some(r.change_percent)),
        Cell::Verdict(r.verdict),
        Cell::Text("ns".into()),
        Cell::Durations(r.base.0.clone()),
        Cell::Durations(r.head.0.clone()),
        // Criterion picks each run's iterations itself: the figures are per iteration.
        Cell::Count(None),
        Cell::Count(None),
    ]
}

/// The line under the table: what regressed, by which rule, how it was run.
pub(crate) fn summary(c: &Report) -> String {
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
pub(crate) fn notes(c: &Report) -> Vec<String> {
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
    let mut out = render::text(&rows(c));
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
        out.push_str(&render::markdown(&rows(c)));
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
    serde_json::to_string_pretty(&document(c)).expect("json values serialize") + "\n"
}

/// [`json`]'s document.
pub(crate) fn document(c: &Report) -> serde_json::Value {
    let name = |b: &String| serde_json::json!({ "benchmark": b });
    serde_json::json!({
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
        "rows": render::json(&rows(c)),
        "added": c.added.iter().map(name).collect::<Vec<_>>(),
        "removed": c.removed.iter().map(name).collect::<Vec<_>>(),
        "failed": c.failures.iter().map(|f| serde_json::json!({
            "side": f.side.name(),
            "benchmark": f.benchmark,
            "error": f.error,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memtrack::analysis::Verdict;

    /// A row in each format: median and range per side, the change and the verdict; JSON the
    /// keys a comparison's rows have, with each side's range and runs.
    #[test]
    fn a_row_in_three_formats() {
        let row = Row {
            benchmark: "render|x".into(),
            base: Runs(vec![1000.0, 1100.0, 1050.0]),
            head: Runs(vec![2000.0, 2100.0, 2050.0]),
            change_percent: 95.238,
            verdict: Verdict::Regressed,
        };
        let mut t = Table::new(columns());
        t.push(cells(&row));
        assert_eq!(
            render::text(&t),
            "benchmark  metric                         base                         head   change  \
             verdict\n\
             render|x   time    1.05 µs (1.00 µs – 1.10 µs)  2.05 µs (2.00 µs – 2.10 µs)  +95.24%  \
             REGRESSED\n"
        );
        let md = render::markdown(&t);
        assert!(md.contains("| render\\|x | time |"), "{md}");
        let j = &render::json(&t)[0];
        for (k, v) in [
            ("base", 1050.0),
            ("base_min", 1000.0),
            ("base_max", 1100.0),
            ("head", 2050.0),
            ("change_percent", 95.238),
        ] {
            assert_eq!(j[k].as_f64(), Some(v), "{k}: {j}");
        }
        assert_eq!(j["verdict"], "regressed");
        assert_eq!(j["head_runs"], serde_json::json!([2000.0, 2100.0, 2050.0]));
        assert_eq!(j["unit"], "ns");
    }
}
