//! `memtrack bench`'s report without `--base`: one row per benchmark (allocations and bytes per
//! iteration, the peak, what was live at the end) as a table, markdown or JSON. Numbers are
//! formatted as `memtrack compare` formats them.

use memtrack::{analysis::Benchmark, analysis::Metric, human};

use crate::compare::render::{md_escape, metric_human, metric_human_per_iteration};

/// A summed metric per iteration (the total when the artifact counted no iterations).
fn per_iteration(b: &Benchmark, m: Metric) -> String {
    let v = m.value(&b.totals);
    match b.iterations {
        Some(n) if n > 0 => metric_human_per_iteration(m, v as f64 / n as f64),
        _ => metric_human(m, v),
    }
}

/// The cells of one benchmark's row.
fn cells(b: &Benchmark) -> [String; 6] {
    let t = &b.totals;
    [
        b.name.clone(),
        b.iterations.map_or_else(|| "-".into(), human::count),
        per_iteration(b, Metric::Allocations),
        per_iteration(b, Metric::Bytes),
        human::bytes(t.peak_live_bytes),
        format!(
            "{} ({})",
            human::plural(t.live_blocks_at_end, "block", "blocks"),
            human::bytes(t.live_bytes_at_end)
        ),
    ]
}

const HEADER: [&str; 6] = [
    "benchmark",
    "iterations",
    "allocations",
    "bytes",
    "peak",
    "live at end",
];

/// An aligned plain-text table for a terminal.
pub(crate) fn table(set: &[Benchmark]) -> String {
    let mut rows = vec![HEADER.map(String::from)];
    rows.extend(set.iter().map(cells));
    human::table(&rows, &[false, true, true, true, true, true])
}

/// GitHub-flavoured markdown for a CI job summary.
pub(crate) fn markdown(set: &[Benchmark]) -> String {
    let mut out = String::from("### memtrack: memory per benchmark\n\n");
    out.push_str(&format!("| {} |\n", HEADER.join(" | ")));
    out.push_str("|:--|--:|--:|--:|--:|--:|\n");
    for b in set {
        let mut c = cells(b);
        c[0] = md_escape(&c[0]);
        out.push_str(&format!("| {} |\n", c.join(" | ")));
    }
    out.push('\n');
    out
}

/// Machine-readable form: exact integers, and the per-iteration figures as floats (`null`
/// without an iteration count).
pub(crate) fn json(set: &[Benchmark]) -> String {
    let per = |b: &Benchmark, v: u64| b.iterations.filter(|&n| n > 0).map(|n| v as f64 / n as f64);
    let rows: Vec<serde_json::Value> = set
        .iter()
        .map(|b| {
            let t = &b.totals;
            serde_json::json!({
                "benchmark": b.name,
                "file": b.path,
                "iterations": b.iterations,
                "allocations": t.allocations,
                "bytes": t.bytes_allocated,
                "allocations_per_iteration": per(b, t.allocations),
                "bytes_per_iteration": per(b, t.bytes_allocated),
                "peak": t.peak_live_bytes,
                "live_blocks_at_end": t.live_blocks_at_end,
                "live_bytes_at_end": t.live_bytes_at_end,
            })
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({ "benchmarks": rows }))
        .expect("json values serialize")
        + "\n"
}
