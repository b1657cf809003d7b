//! The triage through the report model ([`memtrack::render`]): one row per benchmark, its
//! class first, each measure's change (time with both sides' medians and ranges), what one
//! side lacks in a note; regressed and faster rows first, unchanged ones after (folded in
//! markdown); under each regressed row, the functions and call sites that grew.

use std::collections::HashSet;

use memtrack::analysis::{Metric, Row as MemoryRow};
use memtrack::human;
use memtrack::instructions::compare::Change;
use memtrack::render::{self, Align, Cell, Column, Table, Unit, md_escape};
use serde_json::Value;

use super::{Class, Measured, Moved, Moves, classify};
use crate::bench::{instructions, time};
use crate::compare::Attributed;
use crate::compare::render::{attribution_json, attribution_markdown, attribution_table};

/// One measure's base and head Ir per iteration and their iterations, its verdict.
struct Ir<'a> {
    base: (f64, u64),
    head: (f64, u64),
    verdict: Option<memtrack::analysis::Verdict>,
    grown: &'a [(String, f64, f64)],
}

/// One benchmark's row.
pub(crate) struct Line<'a> {
    pub benchmark: String,
    pub class: Class,
    time: Option<&'a time::Row>,
    instructions: Option<Ir<'a>>,
    allocations: Option<&'a MemoryRow>,
    bytes: Option<&'a MemoryRow>,
    /// What a side lacks or why a measure is absent.
    notes: Vec<String>,
}

/// The triage of every benchmark, in its printed order.
pub(crate) struct Triage<'a> {
    m: &'a Measured,
    pub lines: Vec<Line<'a>>,
}

/// Each benchmark any measure saw, once, in the order the measures list them.
fn names(m: &Measured) -> Vec<String> {
    let mut all: Vec<&str> = Vec::new();
    if let Some(t) = &m.time {
        all.extend(t.rows.iter().map(|r| r.benchmark.as_str()));
        all.extend(t.added.iter().chain(&t.removed).map(String::as_str));
        all.extend(t.failures.iter().filter_map(|f| f.benchmark.as_deref()));
    }
    if let Some(c) = &m.instructions {
        all.extend(c.rows.iter().map(|r| r.benchmark.as_str()));
    }
    if let Some(mem) = &m.memory {
        all.extend(mem.cmp.rows.iter().map(|r| r.benchmark.as_str()));
        let (added, removed) = (&mem.cmp.added, &mem.cmp.removed);
        all.extend(added.iter().chain(removed).map(|b| b.name.as_str()));
    }
    let mut seen = HashSet::new();
    all.into_iter()
        .filter(|n| seen.insert(*n))
        .map(str::to_string)
        .collect()
}

/// The time row of `name`, or why there is none.
fn time_of<'a>(m: &'a Measured, name: &str, notes: &mut Vec<String>) -> Option<&'a time::Row> {
    let t = m.time.as_ref()?;
    if let Some(r) = t.rows.iter().find(|r| r.benchmark == name) {
        return Some(r);
    }
    let failed = |f: &&time::Failure| f.benchmark.as_deref().is_none_or(|b| b == name);
    // A side that did not build lists none of its benchmarks: that, not "only in head".
    let why = if let Some(f) = t.failures.iter().find(failed) {
        match f.benchmark {
            Some(_) => format!("the {} run failed", f.side.name()),
            None => format!("not measured ({} failed)", f.side.name()),
        }
    } else if t.added.iter().any(|b| b == name) {
        "only in head".to_string()
    } else if t.removed.iter().any(|b| b == name) {
        "only in base".to_string()
    } else {
        "not timed".to_string()
    };
    notes.push(format!("time: {why}"));
    None
}

/// The instruction counts of `name`, or why there are none.
fn instructions_of<'a>(m: &'a Measured, name: &str, notes: &mut Vec<String>) -> Option<Ir<'a>> {
    let c = m.instructions.as_ref()?;
    let iterations = |set: &[memtrack::instructions::run::Measurement]| {
        set.iter()
            .find(|x| x.benchmark == name)
            .map_or(1, |x| x.iterations)
    };
    let (nb, nh) = (iterations(&c.base), iterations(&c.head));
    let Some(row) = c.rows.iter().find(|r| r.benchmark == name) else {
        notes.push("instructions: not counted".into());
        return None;
    };
    match &row.change {
        Change::Judged {
            base,
            head,
            verdict,
            grown,
        } => Some(Ir {
            base: (*base, nb),
            head: (*head, nh),
            verdict: Some(*verdict),
            grown,
        }),
        Change::NotGated { base, head, why } => {
            notes.push(format!("instructions: not gated: {why}"));
            Some(Ir {
                base: (*base, nb),
                head: (*head, nh),
                verdict: None,
                grown: &[],
            })
        }
        Change::New => {
            notes.push("instructions: only in head".into());
            None
        }
        Change::Gone => {
            notes.push("instructions: only in base".into());
            None
        }
    }
}

/// The memory rows (allocations, bytes) of `name`, or why there are none.
fn memory_of<'a>(
    m: &'a Measured,
    name: &str,
    notes: &mut Vec<String>,
) -> Option<(&'a MemoryRow, &'a MemoryRow)> {
    let mem = m.memory.as_ref()?;
    let row = |metric| (mem.cmp.rows.iter()).find(|r| r.benchmark == name && r.metric == metric);
    if let (Some(a), Some(b)) = (row(Metric::Allocations), row(Metric::Bytes)) {
        return Some((a, b));
    }
    let has = |set: &[memtrack::analysis::Benchmark]| set.iter().any(|b| b.name == name);
    let why = if has(&mem.cmp.added) {
        "only in head"
    } else if has(&mem.cmp.removed) {
        "only in base"
    } else {
        "not compared"
    };
    notes.push(format!("memory: {why}"));
    None
}

impl<'a> Triage<'a> {
    /// Every benchmark's row, classified, in the printed order: regressions (by class),
    /// faster, unchanged.
    pub(crate) fn of(m: &'a Measured) -> Triage<'a> {
        let mut lines = Vec::new();
        for benchmark in names(m) {
            let mut notes = Vec::new();
            let time = time_of(m, &benchmark, &mut notes);
            let instructions = instructions_of(m, &benchmark, &mut notes);
            let memory = memory_of(m, &benchmark, &mut notes);
            for f in &m.failures {
                notes.push(match f.side {
                    "both" => format!("{}: not compared (below)", f.measure),
                    side => format!("{}: not measured ({side} failed)", f.measure),
                });
            }
            let t = m.threshold;
            let moves = Moves {
                allocations: memory.map(|(a, _)| Moved::of(a.verdict, a.change_percent, t)),
                bytes: memory.map(|(_, b)| Moved::of(b.verdict, b.change_percent, t)),
                instructions: instructions.as_ref().map(|ir| match ir.verdict {
                    Some(v) => Moved::of(v, change(ir.base.0, ir.head.0), t),
                    None => Moved::Flat,
                }),
                time: time.map(|r| Moved::of(r.verdict, Some(r.change_percent), t)),
            };
            lines.push(Line {
                benchmark,
                class: classify(moves),
                time,
                instructions,
                allocations: memory.map(|(a, _)| a),
                bytes: memory.map(|(_, b)| b),
                notes,
            });
        }
        lines.sort_by_key(|l| rank(l.class));
        Triage { m, lines }
    }
}

/// The printed order of the classes.
fn rank(c: Class) -> u8 {
    match c {
        Class::MoreAllocation => 0,
        Class::MoreWork => 1,
        Class::LayoutOrNoise => 2,
        Class::Faster => 3,
        Class::NotCompared => 4,
        Class::Unchanged => 5,
    }
}

/// Base → head in percent; `None` is growth from 0.
fn change(base: f64, head: f64) -> Option<f64> {
    if base == 0.0 {
        return (head == 0.0).then_some(0.0);
    }
    Some((head - base) / base * 100.0)
}

/// A measure's columns: JSON keys `<measure>_<what>`, shown or not.
fn columns(shown: &[bool; 4]) -> Vec<Column> {
    let mut c = vec![
        Column::new("class", "class", Align::Left),
        Column::new("benchmark", "benchmark", Align::Left),
        Column::new("time_base", "time base", Align::Right),
        Column::new("time_head", "time head", Align::Right),
        Column::new("time_change_percent", "Δ time", Align::Right),
        Column::json_only("time_verdict"),
        Column::json_only("instructions_base"),
        Column::json_only("instructions_head"),
        Column::new("instructions_change_percent", "Δ Ir/iter", Align::Right),
        Column::json_only("instructions_verdict"),
        Column::json_only("allocations_base"),
        Column::json_only("allocations_head"),
        Column::new(
            "allocations_change_percent",
            "Δ allocations/iter",
            Align::Right,
        ),
        Column::json_only("allocations_verdict"),
        Column::json_only("bytes_allocated_base"),
        Column::json_only("bytes_allocated_head"),
        Column::new(
            "bytes_allocated_change_percent",
            "Δ bytes/iter",
            Align::Right,
        ),
        Column::json_only("bytes_allocated_verdict"),
        Column::new("note", "note", Align::Left),
    ];
    // Time's three shown columns, instructions' one, memory's two.
    let shows = [2, 3, 4, 8, 12, 16];
    let of = [0, 0, 0, 1, 2, 2];
    for (i, m) in shows.into_iter().zip(of) {
        c[i].shown = shown[m];
    }
    c[18].shown = shown[3];
    c
}

/// A comparison row of memory's as the triage's four cells.
fn memory_cells(r: Option<&MemoryRow>) -> [Cell; 4] {
    let Some(r) = r else {
        return [Cell::Absent, Cell::Absent, Cell::Absent, Cell::Absent];
    };
    let figure = |total, per_iteration| Cell::Figure {
        unit: Unit::of(r.metric),
        total,
        per_iteration,
    };
    [
        figure(r.base, r.base_per_iteration),
        figure(r.head, r.head_per_iteration),
        Cell::Change(r.change_percent),
        Cell::Verdict(r.verdict),
    ]
}

impl Line<'_> {
    fn cells(&self) -> Vec<Cell> {
        let mut cells = vec![
            Cell::Label {
                text: self.class.text(),
                name: self.class.name(),
                loud: self.class.regressed(),
            },
            Cell::Text(self.benchmark.clone()),
        ];
        cells.extend(match self.time {
            Some(r) => [
                time::render::timing(&r.base),
                time::render::timing(&r.head),
                Cell::Change(Some(r.change_percent)),
                Cell::Verdict(r.verdict),
            ],
            None => [Cell::Absent, Cell::Absent, Cell::Absent, Cell::Absent],
        });
        cells.extend(match &self.instructions {
            Some(ir) => [
                instructions::figure(ir.base.0, ir.base.1),
                instructions::figure(ir.head.0, ir.head.1),
                Cell::Change(change(ir.base.0, ir.head.0)),
                ir.verdict
                    .map_or(Cell::Text("not_gated".into()), Cell::Verdict),
            ],
            None => [Cell::Absent, Cell::Absent, Cell::Absent, Cell::Absent],
        });
        cells.extend(memory_cells(self.allocations));
        cells.extend(memory_cells(self.bytes));
        cells.push(match self.notes.is_empty() {
            true => Cell::Empty,
            false => Cell::Text(self.notes.join("; ")),
        });
        cells
    }
}

impl Triage<'_> {
    /// The rows of `lines` as a table.
    fn table<'b>(&self, lines: impl IntoIterator<Item = &'b Line<'b>>) -> Table
    where
        Self: 'b,
    {
        let a = self.m.asked;
        let noted = self.lines.iter().any(|l| !l.notes.is_empty());
        let mut t = Table::new(columns(&[a.time, a.instructions, a.memory, noted]));
        for l in lines {
            t.push(l.cells());
        }
        t
    }

    fn regressions(&self) -> usize {
        self.lines.iter().filter(|l| l.class.regressed()).count()
    }

    /// The line under the table: how many of each class, the rule and how time was run.
    fn summary(&self) -> String {
        let mut counts: Vec<String> = Vec::new();
        for class in [
            Class::MoreAllocation,
            Class::MoreWork,
            Class::LayoutOrNoise,
            Class::Faster,
            Class::NotCompared,
            Class::Unchanged,
        ] {
            let n = self.lines.iter().filter(|l| l.class == class).count();
            if n > 0 {
                counts.push(format!("{n} {}", class.text()));
            }
        }
        let mut s = format!(
            "{} of {} ({}); threshold ±{}",
            human::plural(self.regressions() as u64, "regression", "regressions"),
            human::plural(self.lines.len() as u64, "benchmark", "benchmarks"),
            counts.join(", "),
            self.m.threshold
        );
        if let Some(t) = &self.m.time {
            let pinned = t
                .cpu
                .map_or("not pinned".into(), |c| format!("pinned to CPU {c}"));
            s.push_str(&format!(
                "; time: {} of base, head, head, base, {pinned}, changes called beyond the \
                 threshold with ranges apart",
                human::plural(u64::from(t.rounds), "round", "rounds")
            ));
        }
        s
    }

    /// What failed, one line each.
    fn failures(&self) -> Vec<String> {
        let mut out: Vec<String> = (self.m.failures.iter())
            .map(|f| format!("{} failed ({}): {}", f.measure, f.side, f.error))
            .collect();
        if let Some(t) = &self.m.time {
            for f in &t.failures {
                let which = f
                    .benchmark
                    .as_deref()
                    .map_or(String::new(), |b| format!(" {b}"));
                out.push(format!(
                    "time failed ({}{which}): {}",
                    f.side.name(),
                    f.error
                ));
            }
        }
        out
    }

    /// The functions that grew most in `l` (instructions'), as a table.
    fn grown(&self, l: &Line<'_>) -> Option<Table> {
        let ir = l.instructions.as_ref().filter(|ir| !ir.grown.is_empty())?;
        let mut t = Table::new(vec![
            Column::new("benchmark", "benchmark", Align::Left),
            Column::new("function", "function", Align::Left),
            Column::new("base", "base", Align::Right),
            Column::new("head", "head", Align::Right),
        ]);
        t.columns[0].shown = false;
        for (function, fb, fh) in ir.grown {
            t.push(vec![
                Cell::Text(l.benchmark.clone()),
                Cell::Text(function.clone()),
                instructions::figure(*fb, ir.base.1),
                instructions::figure(*fh, ir.head.1),
            ]);
        }
        Some(t)
    }

    /// The call sites behind `l`'s memory regressions (compare's attributions).
    fn sites(&self, l: &Line<'_>) -> Vec<&Attributed> {
        (self.m.memory.iter())
            .flat_map(|m| &m.attributed)
            .filter(|a| a.benchmark == l.benchmark)
            .collect()
    }

    fn regressed(&self) -> impl Iterator<Item = &Line<'_>> {
        self.lines.iter().filter(|l| l.class.regressed())
    }
}

impl Triage<'_> {
    /// An aligned table for a terminal: the rows, the summary, what failed, then what grew
    /// under each regressed row.
    pub(crate) fn text(&self) -> String {
        let mut out = render::text(&self.table(&self.lines));
        out.push('\n');
        out.push_str(&self.summary());
        out.push('\n');
        for f in self.failures() {
            out.push_str(&f);
            out.push('\n');
        }
        for l in self.regressed() {
            out.push_str(&format!("\n{}: {}\n", l.benchmark, l.class.text()));
            if let Some(t) = self.grown(l) {
                out.push_str("functions that grew most (inclusive, per iteration):\n");
                out.push_str(&render::text(&t));
            }
            for a in self.sites(l) {
                out.push_str(&attribution_table(a));
            }
        }
        out
    }

    /// GitHub-flavoured markdown for a job summary: regressed and faster rows in a table,
    /// the unchanged ones folded under it, then what grew under each regressed row.
    pub(crate) fn markdown(&self) -> String {
        let mark = if self.regressions() > 0 || !self.failures().is_empty() {
            "❌"
        } else {
            "✅"
        };
        let mut out = format!(
            "### memtrack: triage ({})\n\n{mark} **{}**\n\n",
            self.m.asked.names().join(", "),
            md_escape(&self.summary())
        );
        let (moved, unchanged): (Vec<&Line<'_>>, Vec<&Line<'_>>) =
            self.lines.iter().partition(|l| l.class != Class::Unchanged);
        if !moved.is_empty() {
            out.push_str(&render::markdown(&self.table(moved)));
            out.push('\n');
        }
        if !unchanged.is_empty() {
            out.push_str(&format!(
                "<details><summary>{} unchanged</summary>\n\n{}\n</details>\n\n",
                unchanged.len(),
                render::markdown(&self.table(unchanged))
            ));
        }
        for f in self.failures() {
            out.push_str(&format!("- {}\n", md_escape(&f)));
        }
        for l in self.regressed() {
            out.push_str(&format!(
                "\n#### {}: {}\n\n",
                md_escape(&l.benchmark),
                l.class.text()
            ));
            if let Some(t) = self.grown(l) {
                out.push_str("Functions that grew most (inclusive, per iteration):\n\n");
                out.push_str(&render::markdown(&t));
                out.push('\n');
            }
            for a in self.sites(l) {
                out.push_str(&attribution_markdown(a));
            }
        }
        out
    }

    /// Every row with its class and exact figures, the grown functions and call sites of the
    /// regressed ones, what failed, and how time was run.
    pub(crate) fn json(&self) -> Value {
        let grown: Vec<Value> = (self.regressed())
            .filter_map(|l| self.grown(l))
            .flat_map(|t| render::json(&t).as_array().cloned().unwrap_or_default())
            .collect();
        let sites: Vec<Value> = (self.regressed())
            .flat_map(|l| self.sites(l))
            .map(attribution_json)
            .collect();
        let failed: Vec<Value> = (self.m.failures.iter())
            .map(|f| serde_json::json!({"measure": f.measure, "side": f.side, "error": f.error}))
            .chain(self.m.time.iter().flat_map(|t| &t.failures).map(|f| {
                serde_json::json!({"measure": "time", "side": f.side.name(),
                                   "benchmark": f.benchmark, "error": f.error})
            }))
            .collect();
        serde_json::json!({
            "measures": self.m.asked.names(),
            "threshold": self.m.threshold.to_string(),
            "threshold_ppm": self.m.threshold.ppm(),
            "base_commit": self.m.base_commit,
            "regressions": self.regressions(),
            "rows": render::json(&self.table(&self.lines)),
            "grown": grown,
            "attribution": sites,
            "failed": failed,
            "time": self.m.time.as_ref().map(|t| serde_json::json!({
                "rounds": t.rounds,
                "order": ["base", "head", "head", "base"],
                "cpu": t.cpu,
                "run_log": t.log,
            })),
        })
    }
}
