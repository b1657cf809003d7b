//! The three outputs of `memtrack compare`: an aligned table for a terminal, GitHub-flavoured
//! markdown for a CI job summary, and JSON with exact values. The numbers and verdicts are the
//! library's [`Comparison`]; only their presentation is here.

use memtrack::{Benchmark, Comparison, Metric, Row, Verdict, human};

/// An aligned plain-text table for a terminal, with a summary line and the added and removed
/// benchmarks.
pub fn table(c: &Comparison) -> String {
    let mut cells: Vec<[String; 6]> = vec![[
        "benchmark".into(),
        "metric".into(),
        "base".into(),
        "head".into(),
        "change".into(),
        "verdict".into(),
    ]];
    for r in &c.rows {
        cells.push([
            r.benchmark.clone(),
            r.metric.name().into(),
            human_base(r),
            human_head(r),
            change_text(r.change_percent),
            verdict_human(r.verdict).into(),
        ]);
    }
    let mut out = human::table(&cells, &[false, false, true, true, true, false]);
    out.push('\n');
    out.push_str(&summary(c));
    out.push('\n');
    for (what, list) in [("added", &c.added), ("removed", &c.removed)] {
        for b in list {
            out.push_str(&format!("{what}: {} ({})\n", b.name, b.path.display()));
        }
    }
    for (b, h) in &c.mismatched {
        out.push_str(&format!("not compared: {}\n", mismatch(b, h)));
    }
    out
}

/// GitHub-flavoured markdown for a CI job summary: a verdict line, the table, and the added and
/// removed benchmarks.
pub fn markdown(c: &Comparison) -> String {
    let mut out = String::from("### memtrack: memory comparison\n\n");
    let mark = if c.regressions() > 0 { "❌" } else { "✅" };
    out.push_str(&format!("{mark} **{}**\n\n", summary(c)));
    if !c.rows.is_empty() {
        out.push_str("| benchmark | metric | base | head | change | verdict |\n");
        out.push_str("|:--|:--|--:|--:|--:|:--|\n");
        for r in &c.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                md_escape(&r.benchmark),
                r.metric.name(),
                human_base(r),
                human_head(r),
                change_text(r.change_percent),
                verdict_markdown(r.verdict)
            ));
        }
        out.push('\n');
    }
    for (what, list) in [
        ("Added (only in head)", &c.added),
        ("Removed (only in base)", &c.removed),
    ] {
        if !list.is_empty() {
            let names: Vec<String> = list.iter().map(|b| md_escape(&b.name)).collect();
            out.push_str(&format!("**{what}:** {}\n\n", names.join(", ")));
        }
    }
    for (b, h) in &c.mismatched {
        out.push_str(&format!(
            "**Not compared:** {}\n\n",
            md_escape(&mismatch(b, h))
        ));
    }
    out
}

/// Machine-readable form: exact integer values, `change_percent` as a float (`null` for growth
/// from 0).
pub fn json(c: &Comparison) -> serde_json::Value {
    let bench = |b: &Benchmark| serde_json::json!({"benchmark": b.name, "file": b.path});
    serde_json::json!({
        "threshold": c.threshold.to_string(),
        "threshold_ppm": c.threshold.ppm(),
        "metrics": c.metrics.iter().map(|m| m.name()).collect::<Vec<_>>(),
        "regressions": c.regressions(),
        "rows": c.rows.iter().map(|r| serde_json::json!({
            "benchmark": r.benchmark,
            "metric": r.metric.name(),
            "base": r.base,
            "head": r.head,
            "base_iterations": r.base_iterations,
            "head_iterations": r.head_iterations,
            "base_per_iteration": r.base_per_iteration,
            "head_per_iteration": r.head_per_iteration,
            "change_percent": r.change_percent,
            "verdict": r.verdict.name(),
        })).collect::<Vec<_>>(),
        "added": c.added.iter().map(bench).collect::<Vec<_>>(),
        "removed": c.removed.iter().map(bench).collect::<Vec<_>>(),
        "mismatched": c.mismatched.iter().map(|(b, h)| serde_json::json!({
            "benchmark": h.name,
            "base": {"file": b.path, "iterations": b.iterations},
            "head": {"file": h.path, "iterations": h.iterations},
        })).collect::<Vec<_>>(),
    })
}

/// Why `base` and `head` are not compared when one counted its iterations and the other did
/// not ([`Comparison::mismatched`]), naming both files and what each holds.
pub fn mismatch(base: &Benchmark, head: &Benchmark) -> String {
    format!(
        "{}: the base ({}) holds {} and the head ({}) {}: record both the same way (criterion's \
         Profiler with `memtrack::criterion::iteration`, or both without)",
        head.name,
        base.path.display(),
        kind(base),
        head.path.display(),
        kind(head)
    )
}

/// What a benchmark's figures are, for messages: `per-iteration figures (480,313 iterations)`
/// or `plain totals (no iteration count)`.
fn kind(b: &Benchmark) -> String {
    match b.iterations {
        Some(n) => format!(
            "per-iteration figures ({})",
            human::plural(n, "iteration", "iterations")
        ),
        None => "plain totals (no iteration count)".into(),
    }
}

/// The line under the table: how many regressions, at which threshold, over what.
fn summary(c: &Comparison) -> String {
    let metrics: Vec<&str> = c.metrics.iter().map(|m| m.name()).collect();
    let n = c.regressions();
    let benchmarks = c.rows.len() / c.metrics.len().max(1);
    let head = match n {
        0 => "no regression".to_string(),
        1 => "1 regression".to_string(),
        n => format!("{n} regressions"),
    };
    format!(
        "{head} beyond +{} growth in {} ({} {} compared)",
        c.threshold,
        metrics.join(", "),
        benchmarks,
        if benchmarks == 1 {
            "benchmark"
        } else {
            "benchmarks"
        }
    )
}

/// A metric's value for people: a count with thousands separators, or bytes in KiB/MiB.
fn metric_human(m: Metric, v: u64) -> String {
    match m {
        Metric::Allocations => human::count(v),
        Metric::Bytes | Metric::Peak => human::bytes(v),
    }
}

/// A per-iteration value for people: `1.00/iter`, `64.00 B/iter`.
fn metric_human_per_iteration(m: Metric, v: f64) -> String {
    match m {
        Metric::Allocations => format!("{v:.2}/iter"),
        Metric::Bytes | Metric::Peak => format!("{}/iter", human::bytes_f64(v)),
    }
}

fn human_base(r: &Row) -> String {
    match r.base_per_iteration {
        Some(v) => metric_human_per_iteration(r.metric, v),
        None => metric_human(r.metric, r.base),
    }
}

fn human_head(r: &Row) -> String {
    match r.head_per_iteration {
        Some(v) => metric_human_per_iteration(r.metric, v),
        None => metric_human(r.metric, r.head),
    }
}

fn verdict_human(v: Verdict) -> &'static str {
    match v {
        Verdict::Unchanged => "unchanged",
        Verdict::Improved => "improved",
        Verdict::WithinThreshold => "ok",
        Verdict::Regressed => "REGRESSED",
    }
}

fn verdict_markdown(v: Verdict) -> &'static str {
    match v {
        Verdict::Unchanged => "unchanged",
        Verdict::Improved => "✅ improved",
        Verdict::WithinThreshold => "within threshold",
        Verdict::Regressed => "❌ **regressed**",
    }
}

fn change_text(p: Option<f64>) -> String {
    match p {
        None => "from 0".into(),
        Some(0.0) => "0.00%".into(),
        Some(p) => format!("{p:+.2}%"),
    }
}

/// Backslash-escapes what would break a GFM table cell or start markup.
fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(
            c,
            '|' | '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '#'
        ) {
            out.push('\\');
        }
        out.push(if c == '\n' { ' ' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use memtrack::{Analyzer, Event, EventKind, Threshold};

    use super::*;

    /// `n` allocations of 64 bytes, each freed before the next (a peak of 64 B), over
    /// `iterations` iterations.
    fn bench(name: &str, n: u64, iterations: Option<u64>) -> Benchmark {
        let mut a = Analyzer::new();
        for i in 0..n {
            let addr = 0x1000 + i * 0x100;
            a.update(&Event::new(
                2 * i,
                7,
                7,
                EventKind::Malloc { addr, size: 64 },
            ));
            a.update(&Event::new(2 * i + 1, 7, 7, EventKind::Free { addr }));
        }
        Benchmark::new(name, format!("{name}.memtrack"), a.totals()).with_iterations(iterations)
    }

    /// Per-iteration rows print at the precision they are judged at (hundredths per
    /// iteration), not as totals.
    #[test]
    fn per_iteration_rows_print_per_iteration() {
        let c = Comparison::new(
            &[bench("b", 4, Some(4))],
            &[bench("b", 6, Some(6))],
            &Metric::ALL,
            Threshold::default(),
        );
        assert_eq!(
            table(&c),
            "benchmark  metric               base          head  change  verdict\n\
             b          allocations     1.00/iter     1.00/iter   0.00%  unchanged\n\
             b          bytes        64.00 B/iter  64.00 B/iter   0.00%  unchanged\n\
             b          peak                 64 B          64 B   0.00%  unchanged\n\
             \n\
             no regression beyond +3% growth in allocations, bytes, peak (1 benchmark compared)\n"
        );
        assert_eq!(
            (change_text(Some(0.0)), change_text(None)),
            ("0.00%".into(), "from 0".into())
        );
    }

    #[test]
    fn markdown_escapes_names() {
        assert_eq!(md_escape("a|b_c"), "a\\|b\\_c");
    }
}
