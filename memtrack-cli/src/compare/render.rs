//! The three outputs of `memtrack compare`: an aligned table for a terminal, GitHub-flavoured
//! markdown for a CI job summary, and JSON with exact values. The numbers and verdicts are the
//! library's [`Comparison`]; only their presentation is here.

use memtrack::render::{self, Align, Cell, Column, Table, Unit, md_escape};
use memtrack::{
    analysis::Benchmark, analysis::Comparison, analysis::Metric, analysis::SiteDelta,
    analysis::Verdict, human, symbolize::KeyFrame, symbolize::SiteKey,
};

use super::Attributed;
use crate::callsites::{self, Class};

/// The columns of a comparison's rows, whatever the measure (`extra` after the verdict): the
/// row every command that compares base with head prints, and `rows` in its JSON.
pub(crate) fn row_columns(extra: Vec<Column>) -> Vec<Column> {
    let mut columns = vec![
        Column::new("benchmark", "benchmark", Align::Left),
        Column::new("metric", "metric", Align::Left),
        Column::new("base", "base", Align::Right),
        Column::new("head", "head", Align::Right),
        Column::new("change_percent", "change", Align::Right),
        Column::new("verdict", "verdict", Align::Left),
    ];
    columns.extend(extra);
    columns.extend([
        Column::json_only("base_iterations"),
        Column::json_only("head_iterations"),
    ]);
    columns
}

/// The comparison's rows, one per benchmark and metric, with the figures compared (per
/// iteration when they are) and the verdict.
pub(crate) fn rows(c: &Comparison) -> Table {
    let mut t = Table::new(row_columns(vec![]));
    for r in &c.rows {
        t.push(vec![
            Cell::Text(r.benchmark.clone()),
            Cell::Text(r.metric.name().into()),
            Cell::metric(r.metric, r.base, r.base_per_iteration),
            Cell::metric(r.metric, r.head, r.head_per_iteration),
            Cell::Change(r.change_percent),
            Cell::Verdict(r.verdict),
            Cell::Count(r.base_iterations),
            Cell::Count(r.head_iterations),
        ]);
    }
    t
}

/// A metric's value for people: a count with thousands separators, or bytes in KiB/MiB.
pub(crate) fn metric_human(m: Metric, v: u64) -> String {
    Unit::of(m).human(v)
}

/// Sites shown per regressed row in the table and markdown (JSON has them all).
const SHOWN_SITES: usize = 10;

/// Frames shown per site in the table and markdown (JSON has them all).
const SHOWN_FRAMES: usize = 4;

/// A site's innermost frames, joined by ` ← `, with how many more there are. The allocator's
/// own innermost frames (the allocator recorder's, `__rust_alloc`, `RawVec`'s growth: what
/// `show` hides by default) are left out, so that the first frame shown is the code that
/// allocated; JSON keeps every frame.
fn site_text(k: &SiteKey) -> String {
    if k.0.is_empty() {
        return k.to_string();
    }
    let own = k.0.iter().take_while(|f| allocators(f)).count();
    let frames = &k.0[own.min(k.0.len() - 1)..];
    let mut s: Vec<String> = frames
        .iter()
        .take(SHOWN_FRAMES)
        .map(|f| f.to_string())
        .collect();
    if frames.len() > SHOWN_FRAMES {
        s.push(format!("… {} more", frames.len() - SHOWN_FRAMES));
    }
    s.join(" ← ")
}

/// Whether a site's frame is the allocator's own ([`callsites::is_allocator_function`]; a
/// frame's module is not in its key, so a C allocator's name counts wherever it is).
fn allocators(f: &KeyFrame) -> bool {
    match f {
        KeyFrame::Function { function, file } => {
            callsites::is_allocator_function(function, file.as_deref(), Class::Other)
        }
        _ => false,
    }
}

/// An aligned plain-text table for a terminal, with a summary line and the added and removed
/// benchmarks.
pub fn table(c: &Comparison, attributed: &[Attributed]) -> String {
    let mut out = render::text(&rows(c));
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
    for a in attributed {
        out.push('\n');
        out.push_str(&attribution_table(a));
    }
    out
}

/// The head line of a regressed row's attribution.
fn attribution_title(a: &Attributed) -> String {
    let at = &a.attribution;
    format!(
        "{} {}: {} → {} ({}), {} changed, {} unchanged",
        a.benchmark,
        at.metric.name(),
        metric_human(at.metric, at.base_total),
        metric_human(at.metric, at.head_total),
        delta_human(at.metric, at.delta()),
        human::plural(at.sites.len() as u64, "site", "sites"),
        at.unchanged
    )
}

/// Notes under an attribution: unmatched sites and modules that could not be named.
fn attribution_notes(a: &Attributed) -> Vec<String> {
    let mut notes = Vec::new();
    if a.unmatched != [0, 0] {
        notes.push(format!(
            "{} of the base and {} of the head have frames that could not be symbolized nor \
             matched by build id: they are unmatched (listed as vanished and new)",
            human::plural(a.unmatched[0] as u64, "site", "sites"),
            a.unmatched[1]
        ));
    }
    for (path, why) in &a.unnamed_modules {
        notes.push(format!("frames of {path} not named: {why}"));
    }
    if a.attribution.sites.len() > SHOWN_SITES {
        notes.push(format!(
            "{} more changed sites not shown (--format json lists them all)",
            a.attribution.sites.len() - SHOWN_SITES
        ));
    }
    notes
}

/// What a site did: `new`, `vanished` or nothing.
fn presence(d: &SiteDelta<SiteKey>) -> &'static str {
    if d.is_new() {
        "new"
    } else if d.vanished() {
        "vanished"
    } else {
        ""
    }
}

/// A signed change for people: `+1,024 B`, `-3`.
fn delta_human(m: Metric, d: i128) -> String {
    Cell::Delta {
        unit: Unit::of(m),
        delta: d,
    }
    .human()
}

/// The sites shown of a regressed row's attribution, ranked: share of the change, the change,
/// the figures, whether new or vanished, and the innermost frames.
fn sites_table(a: &Attributed) -> Table {
    let at = &a.attribution;
    let unit = Unit::of(at.metric);
    let mut t = Table::new(vec![
        Column::new("rank", "#", Align::Right),
        Column::new("share", "share", Align::Right),
        Column::new("delta", "delta", Align::Right),
        Column::new("base", "base", Align::Right),
        Column::new("head", "head", Align::Right),
        Column::new("status", "", Align::Left),
        Column::new("site", "site (innermost frame first)", Align::Left),
    ]);
    for (i, d) in at.sites.iter().take(SHOWN_SITES).enumerate() {
        t.push(vec![
            Cell::Count(Some(i as u64 + 1)),
            Cell::Share(at.share(d)),
            Cell::Delta {
                unit,
                delta: d.delta(),
            },
            Cell::whole(unit, d.base),
            Cell::whole(unit, d.head),
            Cell::Text(presence(d).into()),
            Cell::Text(site_text(&d.key)),
        ]);
    }
    t
}

/// A regressed row's attribution as a compact ranked table.
pub(crate) fn attribution_table(a: &Attributed) -> String {
    let at = &a.attribution;
    let mut out = format!("call sites behind {}\n", attribution_title(a));
    if !at.sites.is_empty() {
        out.push_str(&render::text(&sites_table(a)));
    }
    for n in attribution_notes(a) {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// A regressed row's attribution as a collapsible markdown section.
pub(crate) fn attribution_markdown(a: &Attributed) -> String {
    let at = &a.attribution;
    let mut out = format!(
        "<details><summary>Call sites behind {}</summary>\n\n",
        html_escape(&attribution_title(a))
    );
    if !at.sites.is_empty() {
        out.push_str(&render::markdown(&sites_table(a)));
        out.push('\n');
    }
    for n in attribution_notes(a) {
        out.push_str(&format!("*{}*\n\n", md_escape(&n)));
    }
    out.push_str("</details>\n\n");
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// GitHub-flavoured markdown for a CI job summary: a verdict line, the table, and the added and
/// removed benchmarks.
pub fn markdown(c: &Comparison, attributed: &[Attributed]) -> String {
    let mut out = String::from("### memtrack: memory comparison\n\n");
    let mark = if c.regressions() > 0 { "❌" } else { "✅" };
    out.push_str(&format!("{mark} **{}**\n\n", summary(c)));
    if !c.rows.is_empty() {
        out.push_str(&render::markdown(&rows(c)));
        out.push('\n');
    }
    // A GFM table cannot hold a block: each regressed row's sites follow the table, in the
    // table's order, each in a section named after its row.
    for a in attributed {
        out.push_str(&attribution_markdown(a));
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
pub fn json(c: &Comparison, attributed: &[Attributed]) -> serde_json::Value {
    let bench = |b: &Benchmark| serde_json::json!({"benchmark": b.name, "file": b.path});
    let mut v = serde_json::json!({
        "threshold": c.threshold.to_string(),
        "threshold_ppm": c.threshold.ppm(),
        "metrics": c.metrics.iter().map(|m| m.name()).collect::<Vec<_>>(),
        "regressions": c.regressions(),
        "rows": rows(c),
        "added": c.added.iter().map(bench).collect::<Vec<_>>(),
        "removed": c.removed.iter().map(bench).collect::<Vec<_>>(),
        "mismatched": c.mismatched.iter().map(|(b, h)| serde_json::json!({
            "benchmark": h.name,
            "base": {"file": b.path, "iterations": b.iterations},
            "head": {"file": h.path, "iterations": h.iterations},
        })).collect::<Vec<_>>(),
    });
    // Only when there is some: a comparison without call stacks prints what it always did.
    if !attributed.is_empty() {
        v["attribution"] = attributed.iter().map(attribution_json).collect();
    }
    v
}

/// A regressed row's sites with exact numbers (deltas as integers, shares as fractions).
pub(crate) fn attribution_json(a: &Attributed) -> serde_json::Value {
    let at = &a.attribution;
    let int = |d: i128| {
        serde_json::json!(i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX }))
    };
    serde_json::json!({
        "benchmark": a.benchmark,
        "metric": at.metric.name(),
        "base": at.base_total,
        "head": at.head_total,
        "delta": int(at.delta()),
        "unchanged_sites": at.unchanged,
        "unmatched_sites": {"base": a.unmatched[0], "head": a.unmatched[1]},
        "unnamed_modules": a.unnamed_modules.iter().map(|(p, w)| serde_json::json!({"module": p, "reason": w})).collect::<Vec<_>>(),
        "sites": at.sites.iter().map(|d| serde_json::json!({
            "base": d.base,
            "head": d.head,
            "delta": int(d.delta()),
            "share": at.share(d),
            "status": match presence(d) { "" => "changed", p => p },
            "frames": d.key,
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

/// The line under the table: how many benchmarks regressed, in how many figures, at which
/// threshold, of how many compared.
fn summary(c: &Comparison) -> String {
    let metrics: Vec<&str> = c.metrics.iter().map(|m| m.name()).collect();
    let figures = c.regressions();
    let regressed: std::collections::BTreeSet<&str> = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regressed)
        .map(|r| r.benchmark.as_str())
        .collect();
    let compared = c.rows.len() / c.metrics.len().max(1);
    let head = match regressed.len() {
        0 => "no benchmark regressed".to_string(),
        n => format!(
            "{} regressed",
            human::plural(n as u64, "benchmark", "benchmarks")
        ),
    };
    let figures = match figures {
        0 => "no figure".to_string(),
        n => human::plural(n as u64, "figure", "figures"),
    };
    format!(
        "{head} ({figures} beyond +{} growth in {}), {} compared",
        c.threshold,
        metrics.join(", "),
        human::count(compared as u64),
    )
}

#[cfg(test)]
mod tests {
    use memtrack::{analysis::Analyzer, analysis::Threshold, event::Event, event::EventKind};

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

    /// A site shown starts at the code that allocated: the allocator recorder's frames,
    /// `__rust_alloc` and `RawVec`'s are left out, and counted in none of "… N more"; a
    /// site of allocator frames only keeps its outermost.
    #[test]
    fn sites_show_the_code_that_allocated_first() {
        let f = |function: &str| KeyFrame::Function {
            function: function.into(),
            file: None,
        };
        let site = SiteKey(vec![
            f("memtrack::allocator::walk::Here::now"),
            f("<memtrack::allocator::Allocator<A> as core::alloc::global::GlobalAlloc>::alloc"),
            f("__rustc::__rust_alloc"),
            f("<alloc::raw_vec::RawVecInner>::try_allocate_in"),
            f("downstream::render"),
            f("bench::main"),
        ]);
        assert_eq!(site_text(&site), "downstream::render ← bench::main");
        let deep = SiteKey([&site.0[..4], &vec![f("x"); 6]].concat());
        assert_eq!(site_text(&deep), "x ← x ← x ← x ← … 2 more");
        let only = SiteKey(site.0[..3].to_vec());
        assert_eq!(site_text(&only), "__rustc::__rust_alloc");
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
            table(&c, &[]),
            "benchmark  metric               base          head  change  verdict\n\
             b          allocations     1.00/iter     1.00/iter   0.00%  unchanged\n\
             b          bytes        64.00 B/iter  64.00 B/iter   0.00%  unchanged\n\
             b          peak                 64 B          64 B   0.00%  unchanged\n\
             \n\
             no benchmark regressed (no figure beyond +3% growth in allocations, bytes, peak), 1 compared\n"
        );
    }

    #[test]
    fn markdown_escapes_names() {
        assert_eq!(md_escape("a|b_c"), "a\\|b\\_c");
    }
}
