//! The report model every table memtrack prints is made of, and its renderers: a command (or a
//! harness integration) builds a [`Table`] of typed [`Cell`]s under named [`Column`]s, and one
//! renderer per format prints any table: [`text`] (aligned, for a terminal), [`markdown`]
//! (GitHub-flavoured, for a CI job summary) and [`json`] (exact values; [`Table`] serializes
//! to it too).
//!
//! A figure has one name everywhere: a column's [`key`](Column::key) is its JSON key, taken
//! from [`Totals`]' field names (`allocations`, `bytes_allocated`, `peak_live_bytes`); a
//! [`Cell::Figure`] adds `<key>_per_iteration` beside it. The measures a benchmark is reported
//! by are [`MEASURES`], and [`benchmarks`] is the one table of them (`memtrack bench` and
//! memtrack-criterion's end-of-run table): a new measure is one more entry there, and a new
//! format one more renderer.
//!
//! # Examples
//!
//! ```
//! use memtrack::render::{self, Align, Cell, Column, Table};
//!
//! let mut t = Table::new(vec![
//!     Column::new("benchmark", "benchmark", Align::Left),
//!     Column::new("allocations", "allocations", Align::Right),
//! ]);
//! t.push(vec![Cell::Text("parse".into()), Cell::Count(Some(1024))]);
//! assert_eq!(render::text(&t), "benchmark  allocations\nparse            1,024\n");
//! assert_eq!(render::json(&t)[0]["allocations"], 1024);
//! ```

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::analysis::{Benchmark, Metric, Verdict};
use crate::human;
use crate::totals::Totals;

/// Which side of its column a cell keeps to in the text and markdown tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Names and words.
    Left,
    /// Numbers.
    Right,
}

/// What a figure counts, which says how it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A number of things: `1,024`.
    Count,
    /// Bytes: `64 B`, `8.0 KiB`.
    Bytes,
    /// Instructions executed, as callgrind counts them (`Ir`): `2,007 Ir`.
    Instructions,
}

impl Unit {
    /// The unit of a [`Metric`]'s values.
    pub const fn of(metric: Metric) -> Unit {
        match metric {
            Metric::Allocations => Unit::Count,
            Metric::Bytes | Metric::Peak => Unit::Bytes,
        }
    }

    /// A whole value for people: `1,024`, `8.0 KiB`.
    pub fn human(self, v: u64) -> String {
        match self {
            Unit::Count => human::count(v),
            Unit::Bytes => human::bytes(v),
            Unit::Instructions => format!("{} Ir", human::count(v)),
        }
    }

    /// A value per iteration for people, at the precision figures are compared at
    /// (hundredths): `1.00/iter`, `64.00 B/iter`, `2,007.40 Ir/iter`. The one per-iteration
    /// format of every table.
    pub fn per_iteration(self, v: f64) -> String {
        match self {
            Unit::Count => format!("{v:.2}/iter"),
            Unit::Bytes => format!("{}/iter", human::bytes_f64(v)),
            Unit::Instructions => {
                let hundredths = (v.max(0.0) * 100.0).round() as u64;
                format!(
                    "{}.{:02} Ir/iter",
                    human::count(hundredths / 100),
                    hundredths % 100
                )
            }
        }
    }
}

/// A column: its JSON key, its header in the text and markdown tables, and where its cells
/// keep to.
#[derive(Clone, Debug)]
pub struct Column {
    /// The JSON key of its cells (a [`Cell::Figure`] adds `<key>_per_iteration`).
    pub key: &'static str,
    /// The header in the text and markdown tables.
    pub header: &'static str,
    /// Left for names, right for numbers.
    pub align: Align,
    /// Whether the text and markdown tables show it; JSON always has it.
    pub shown: bool,
}

impl Column {
    /// A column shown in every format.
    pub const fn new(key: &'static str, header: &'static str, align: Align) -> Column {
        Column {
            key,
            header,
            align,
            shown: true,
        }
    }

    /// A column of the JSON document only (a file's path, an exact count the table leaves
    /// out).
    pub const fn json_only(key: &'static str) -> Column {
        Column {
            key,
            header: "",
            align: Align::Left,
            shown: false,
        }
    }
}

/// One value of a row, typed: each renderer formats it its own way (people read `8.0 KiB`,
/// programs `8192`).
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// Words: a name, a metric. JSON: a string.
    Text(String),
    /// Code: a commit, a command. Markdown: in backticks. JSON: a string.
    Code(String),
    /// A file. JSON: its path as a string.
    Path(PathBuf),
    /// A count, `-` when unknown. JSON: an integer or `null`.
    Count(Option<u64>),
    /// Bytes. JSON: an integer.
    Bytes(u64),
    /// A summed figure and, when its recording counted iterations, its value per iteration:
    /// shown per iteration when there is one ([`Unit::per_iteration`]), else whole. JSON: the
    /// total under the column's key and the float (or `null`) under `<key>_per_iteration`.
    Figure {
        /// What it counts.
        unit: Unit,
        /// The whole figure.
        total: u64,
        /// Its value per iteration, when known.
        per_iteration: Option<f64>,
    },
    /// Blocks and their bytes, `1 block (24 B)`. JSON: the blocks under the column's key,
    /// which names blocks, and the bytes under the same key with `blocks` replaced by `bytes`
    /// (as [`Totals`] names them: `live_blocks_at_end`, `live_bytes_at_end`).
    Blocks {
        /// The blocks.
        blocks: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// A duration in nanoseconds, shown in milliseconds with one decimal (`12.3`). JSON: the
    /// nanoseconds.
    Nanos(u64),
    /// A time per iteration in nanoseconds, measured over runs: their median and range, shown
    /// to three significant digits, `51.8 µs (51.0 µs – 52.5 µs)`. JSON: the floats under the
    /// column's key (the median), `<key>_min` and `<key>_max`.
    Timing {
        /// The median of the runs.
        median: f64,
        /// The fastest run.
        min: f64,
        /// The slowest run.
        max: f64,
    },
    /// Times per iteration in nanoseconds, one per run in the order they ran. JSON: an array of
    /// floats.
    Durations(Vec<f64>),
    /// A ratio, shown with three decimals (`0.125`). JSON: a float.
    Ratio(f64),
    /// A signed change of a figure, `+1,024 B`, `-3`. JSON: an integer.
    Delta {
        /// What it counts.
        unit: Unit,
        /// The change.
        delta: i128,
    },
    /// A share of a whole, `12.3%`. JSON: the fraction, or `null`.
    Share(Option<f64>),
    /// A change in percent, `+1.23%`; `None` is growth from 0. JSON: a float or `null`.
    Change(Option<f64>),
    /// A percentage that is no change (a spread between runs), `1.23%`. JSON: the float.
    Percent(f64),
    /// A comparison's verdict. JSON: its [name](Verdict::name).
    Verdict(Verdict),
    /// A word of a fixed set (a class): shown as `text`, bold in markdown when `loud`. JSON:
    /// its `name`.
    Label {
        /// As the text and markdown tables show it.
        text: &'static str,
        /// The JSON name.
        name: &'static str,
        /// Whether markdown shows it in bold (a regression).
        loud: bool,
    },
    /// A figure that was not measured (its measure not run, or this benchmark missing on a
    /// side), never a zero: shown as `absent`. JSON: `null`.
    Absent,
    /// Nothing (a failed benchmark's figures). JSON: `null`.
    Empty,
}

impl Cell {
    /// A whole figure of `unit`: [`Cell::Count`] or [`Cell::Bytes`].
    pub fn whole(unit: Unit, v: u64) -> Cell {
        match unit {
            Unit::Count | Unit::Instructions => Cell::Count(Some(v)),
            Unit::Bytes => Cell::Bytes(v),
        }
    }

    /// `metric`'s figure in `b`: per iteration when `b` counted its iterations and the metric
    /// is summed over them (a peak is not).
    pub fn figure(metric: Metric, b: &Benchmark) -> Cell {
        let total = metric.value(&b.totals);
        if !metric.per_iteration() {
            return Cell::whole(Unit::of(metric), total);
        }
        let per_iteration = b
            .iterations
            .filter(|&n| n > 0)
            .map(|n| total as f64 / n as f64);
        Cell::metric(metric, total, per_iteration)
    }

    /// A [`Cell::Figure`] of `metric`: `total`, and its value per iteration when known (a
    /// comparison's side, a step of a chain).
    pub const fn metric(metric: Metric, total: u64, per_iteration: Option<f64>) -> Cell {
        Cell::Figure {
            unit: Unit::of(metric),
            total,
            per_iteration,
        }
    }

    /// The cell as the text table shows it.
    pub fn human(&self) -> String {
        match self {
            Cell::Text(s) | Cell::Code(s) => s.clone(),
            Cell::Path(p) => p.display().to_string(),
            Cell::Count(n) => n.map_or_else(|| "-".into(), human::count),
            Cell::Bytes(n) => human::bytes(*n),
            Cell::Figure {
                unit,
                total,
                per_iteration,
            } => match per_iteration {
                Some(v) => unit.per_iteration(*v),
                None => unit.human(*total),
            },
            Cell::Blocks { blocks, bytes } => format!(
                "{} ({})",
                human::plural(*blocks, "block", "blocks"),
                human::bytes(*bytes)
            ),
            Cell::Delta { unit, delta } => {
                let mag = u64::try_from(delta.unsigned_abs()).unwrap_or(u64::MAX);
                format!("{}{}", if *delta < 0 { "-" } else { "+" }, unit.human(mag))
            }
            Cell::Nanos(ns) => format!("{:.1}", *ns as f64 / 1e6),
            Cell::Timing { median, min, max } => format!(
                "{} ({} – {})",
                human::duration(*median),
                human::duration(*min),
                human::duration(*max)
            ),
            Cell::Durations(v) => {
                let each: Vec<String> = v.iter().map(|&ns| human::duration(ns)).collect();
                each.join(", ")
            }
            Cell::Label { text, .. } => (*text).into(),
            Cell::Absent => "absent".into(),
            Cell::Ratio(r) => format!("{r:.3}"),
            Cell::Share(s) => s.map_or_else(String::new, |s| format!("{:.1}%", s * 100.0)),
            Cell::Change(None) => "from 0".into(),
            Cell::Change(Some(p)) if *p == 0.0 => "0.00%".into(),
            Cell::Change(Some(p)) => format!("{p:+.2}%"),
            Cell::Percent(p) => format!("{p:.2}%"),
            Cell::Verdict(v) => match v {
                Verdict::Unchanged => "unchanged",
                Verdict::Improved => "improved",
                Verdict::WithinThreshold => "ok",
                Verdict::Regressed => "REGRESSED",
                Verdict::WithinNoise => "within noise",
            }
            .into(),
            Cell::Empty => String::new(),
        }
    }

    /// The cell as the markdown table shows it.
    fn markdown(&self) -> String {
        match self {
            Cell::Verdict(v) => match v {
                Verdict::Unchanged => "unchanged",
                Verdict::Improved => "✅ improved",
                Verdict::WithinThreshold => "within threshold",
                Verdict::Regressed => "❌ **regressed**",
                Verdict::WithinNoise => "within noise",
            }
            .into(),
            Cell::Label {
                text, loud: true, ..
            } => format!("**{text}**"),
            Cell::Text(_) | Cell::Path(_) => md_escape(&self.human()),
            Cell::Code(s) => format!("`{}`", s.replace('`', "'")),
            c => c.human(),
        }
    }

    /// The cell's JSON fields, under `key`.
    fn json(&self, key: &str, into: &mut Map<String, Value>) {
        let mut put = |k: String, v: Value| {
            into.insert(k, v);
        };
        match self {
            Cell::Text(s) | Cell::Code(s) => put(key.into(), s.clone().into()),
            Cell::Path(p) => put(key.into(), p.display().to_string().into()),
            Cell::Count(n) => put(key.into(), (*n).into()),
            Cell::Bytes(n) | Cell::Nanos(n) => put(key.into(), (*n).into()),
            Cell::Ratio(r) | Cell::Percent(r) => put(key.into(), (*r).into()),
            Cell::Figure {
                total,
                per_iteration,
                ..
            } => {
                put(key.into(), (*total).into());
                put(format!("{key}_per_iteration"), (*per_iteration).into());
            }
            Cell::Blocks { blocks, bytes } => {
                put(key.into(), (*blocks).into());
                put(key.replacen("blocks", "bytes", 1), (*bytes).into());
            }
            Cell::Delta { delta, .. } => {
                let clamped =
                    i64::try_from(*delta).unwrap_or(if *delta < 0 { i64::MIN } else { i64::MAX });
                put(key.into(), clamped.into());
            }
            Cell::Share(s) | Cell::Change(s) => put(key.into(), (*s).into()),
            Cell::Verdict(v) => put(key.into(), v.name().into()),
            Cell::Label { name, .. } => put(key.into(), (*name).into()),
            Cell::Timing { median, min, max } => {
                put(key.into(), (*median).into());
                put(format!("{key}_min"), (*min).into());
                put(format!("{key}_max"), (*max).into());
            }
            Cell::Durations(v) => put(key.into(), v.clone().into()),
            Cell::Empty | Cell::Absent => put(key.into(), Value::Null),
        }
    }
}

/// Rows of typed cells under columns: the model every table is rendered from.
#[derive(Clone, Debug)]
pub struct Table {
    /// The columns, in order.
    pub columns: Vec<Column>,
    /// The rows, one cell per column.
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// A table of `columns` without rows.
    pub fn new(columns: Vec<Column>) -> Table {
        Table {
            columns,
            rows: Vec::new(),
        }
    }

    /// Adds a row, one cell per column.
    ///
    /// # Panics
    ///
    /// If the row has not one cell per column (a bug of the caller's).
    pub fn push(&mut self, row: Vec<Cell>) {
        assert_eq!(row.len(), self.columns.len(), "one cell per column");
        self.rows.push(row);
    }

    /// The shown columns' indices.
    fn shown(&self) -> Vec<usize> {
        (0..self.columns.len())
            .filter(|&i| self.columns[i].shown)
            .collect()
    }
}

impl serde::Serialize for Table {
    /// As [`json`]: an array of one object per row.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        json(self).serialize(s)
    }
}

/// The table aligned for a terminal: a header line, then a line per row, columns two spaces
/// apart, trailing blanks trimmed; a cell's control characters are escaped to keep it on its
/// line.
pub fn text(t: &Table) -> String {
    let shown = t.shown();
    let mut lines: Vec<Vec<String>> = vec![
        shown
            .iter()
            .map(|&i| t.columns[i].header.to_string())
            .collect(),
    ];
    for row in &t.rows {
        lines.push(
            shown
                .iter()
                .map(|&i| human::one_line(&row[i].human()).into_owned())
                .collect(),
        );
    }
    let mut width = vec![0usize; shown.len()];
    for l in &lines {
        for (w, c) in width.iter_mut().zip(l) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for l in &lines {
        let mut line = String::new();
        for (j, c) in l.iter().enumerate() {
            let pad = " ".repeat(width[j] - c.chars().count());
            if j > 0 {
                line.push_str("  ");
            }
            match t.columns[shown[j]].align {
                Align::Right => {
                    line.push_str(&pad);
                    line.push_str(c);
                }
                Align::Left => {
                    line.push_str(c);
                    line.push_str(&pad);
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The table in GitHub-flavoured markdown: a header row, the alignment row and a row per row,
/// names escaped.
pub fn markdown(t: &Table) -> String {
    let shown = t.shown();
    let row = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut out = row(shown
        .iter()
        .map(|&i| t.columns[i].header.to_string())
        .collect());
    let aligns: Vec<&str> = (shown.iter())
        .map(|&i| match t.columns[i].align {
            Align::Left => ":--",
            Align::Right => "--:",
        })
        .collect();
    out.push_str(&format!("|{}|\n", aligns.join("|")));
    for r in &t.rows {
        out.push_str(&row(shown.iter().map(|&i| r[i].markdown()).collect()));
    }
    out
}

/// The table as JSON: an array of one object per row, each column's cell under its key
/// (exact integers; per-iteration figures as floats).
pub fn json(t: &Table) -> Value {
    Value::Array(
        t.rows
            .iter()
            .map(|r| {
                let mut o = Map::new();
                for (c, cell) in t.columns.iter().zip(r) {
                    cell.json(c.key, &mut o);
                }
                Value::Object(o)
            })
            .collect(),
    )
}

/// Backslash-escapes what would break a GFM table cell or start markup; a line break becomes
/// a space.
pub fn md_escape(s: &str) -> String {
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

/// A benchmark measure: the JSON key of the figure (its [`Totals`] field's name), its header,
/// and the metric that reads it.
#[derive(Clone, Copy, Debug)]
pub struct Measure {
    /// The JSON key.
    pub key: &'static str,
    /// The header in the text and markdown tables.
    pub header: &'static str,
    /// The metric (its value and whether it is summed over iterations).
    pub metric: Metric,
}

/// The measures every benchmark is reported by, in column order. Adding a measure here adds
/// it to `memtrack bench`'s table, markdown and JSON, and to memtrack-criterion's table.
pub const MEASURES: [Measure; 3] = [
    Measure {
        key: "allocations",
        header: "allocations",
        metric: Metric::Allocations,
    },
    Measure {
        key: "bytes_allocated",
        header: "bytes",
        metric: Metric::Bytes,
    },
    Measure {
        key: "peak_live_bytes",
        header: "peak",
        metric: Metric::Peak,
    },
];

/// The JSON key of `metric`'s figure: its [`Totals`] field's name.
pub fn key(metric: Metric) -> &'static str {
    MEASURES
        .iter()
        .find(|m| m.metric == metric)
        .map_or(metric.name(), |m| m.key)
}

/// One row of [`benchmarks`]: a benchmark's figures, or that it failed.
#[derive(Clone, Debug)]
pub enum BenchmarkRow<'a> {
    /// A benchmark measured.
    Measured(&'a Benchmark),
    /// A benchmark that failed (named; its error is reported elsewhere).
    Failed(&'a str),
}

/// The table of benchmarks, one row each: its name, its file (JSON only), iterations, each of
/// [`MEASURES`] (per iteration when counted), and what was still live at the end. The one
/// table of `memtrack bench` and of memtrack-criterion's end of run.
pub fn benchmarks<'a>(rows: impl IntoIterator<Item = BenchmarkRow<'a>>) -> Table {
    let mut columns = vec![
        Column::new("benchmark", "benchmark", Align::Left),
        Column::json_only("file"),
        Column::new("iterations", "iterations", Align::Right),
    ];
    columns.extend(
        MEASURES
            .iter()
            .map(|m| Column::new(m.key, m.header, Align::Right)),
    );
    columns.push(Column::new(
        "live_blocks_at_end",
        "live at end",
        Align::Right,
    ));
    let mut t = Table::new(columns);
    for row in rows {
        let mut cells = Vec::with_capacity(t.columns.len());
        match row {
            BenchmarkRow::Measured(b) => {
                cells.push(Cell::Text(b.name.clone()));
                cells.push(Cell::Path(b.path.clone()));
                cells.push(Cell::Count(b.iterations));
                cells.extend(MEASURES.iter().map(|m| Cell::figure(m.metric, b)));
                cells.push(Cell::Blocks {
                    blocks: b.totals.live_blocks_at_end,
                    bytes: b.totals.live_bytes_at_end,
                });
            }
            BenchmarkRow::Failed(name) => {
                cells.push(Cell::Text(name.into()));
                cells.push(Cell::Empty);
                cells.push(Cell::Text("failed".into()));
                cells.resize(t.columns.len(), Cell::Empty);
            }
        }
        t.push(cells);
    }
    t
}

/// Totals that hold the figures [`benchmarks`] shows, for a caller that has them apart (a
/// harness's own numbers).
pub fn totals(
    allocations: u64,
    bytes_allocated: u64,
    peak_live_bytes: u64,
    live_blocks_at_end: u64,
    live_bytes_at_end: u64,
) -> Totals {
    Totals {
        allocations,
        bytes_allocated,
        peak_live_bytes,
        live_blocks_at_end,
        live_bytes_at_end,
        ..Totals::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(iterations: Option<u64>, allocations: u64, bytes: u64) -> Benchmark {
        Benchmark::new(
            "vec/1024",
            "b.memtrack",
            totals(allocations, bytes, 8192, 1, 24),
        )
        .with_iterations(iterations)
    }

    /// Every format shows a figure per iteration when the iterations are known, whole when
    /// not; JSON has both, exact, under the figure's one name.
    #[test]
    fn one_table_in_three_formats() {
        let (a, b) = (bench(Some(4), 5, 50), bench(None, 10, 81_920));
        let t = benchmarks([
            BenchmarkRow::Measured(&a),
            BenchmarkRow::Measured(&b),
            BenchmarkRow::Failed("custom|x"),
        ]);
        assert_eq!(
            text(&t),
            "benchmark  iterations  allocations         bytes     peak     live at end\n\
             vec/1024            4    1.25/iter  12.50 B/iter  8.0 KiB  1 block (24 B)\n\
             vec/1024            -           10      80.0 KiB  8.0 KiB  1 block (24 B)\n\
             custom|x       failed\n"
        );
        assert_eq!(
            markdown(&t),
            "| benchmark | iterations | allocations | bytes | peak | live at end |\n\
             |:--|--:|--:|--:|--:|--:|\n\
             | vec/1024 | 4 | 1.25/iter | 12.50 B/iter | 8.0 KiB | 1 block (24 B) |\n\
             | vec/1024 | - | 10 | 80.0 KiB | 8.0 KiB | 1 block (24 B) |\n\
             | custom\\|x | failed |  |  |  |  |\n"
        );
        let j = json(&t);
        assert_eq!(j[0]["bytes_allocated"], 50);
        assert_eq!(j[0]["bytes_allocated_per_iteration"], 12.5);
        assert_eq!(j[0]["peak_live_bytes"], 8192);
        assert_eq!(j[0]["peak_live_bytes_per_iteration"], Value::Null);
        assert_eq!(j[0]["live_bytes_at_end"], 24);
        assert_eq!(j[1]["allocations_per_iteration"], Value::Null);
        assert_eq!(j[1]["iterations"], Value::Null);
        assert_eq!(j[0]["file"], "b.memtrack");
    }

    /// Instructions per iteration read at hundredths, thousands grouped; a spread is a
    /// percentage without a sign; JSON has the exact values.
    #[test]
    fn instructions_and_percent() {
        assert_eq!(Unit::Instructions.per_iteration(2007.4), "2,007.40 Ir/iter");
        assert_eq!(Unit::Instructions.human(1024), "1,024 Ir");
        let delta = Cell::Delta {
            unit: Unit::Instructions,
            delta: -3,
        };
        assert_eq!(delta.human(), "-3 Ir");
        assert_eq!(Cell::Percent(0.5).human(), "0.50%");
        let mut t = Table::new(vec![Column::new("spread_percent", "spread", Align::Right)]);
        t.push(vec![Cell::Percent(0.25)]);
        assert_eq!(json(&t)[0]["spread_percent"], 0.25);
    }

    /// A timing reads as its median and range; JSON has the exact floats under the column's
    /// key, `_min` and `_max`; a label is its text, bold in markdown when loud, its name in
    /// JSON; an absent figure is `absent`, not a zero, and `null`.
    #[test]
    fn timings_labels_and_absent_figures() {
        let mut t = Table::new(vec![
            Column::new("class", "class", Align::Left),
            Column::new("base", "base", Align::Right),
            Column::json_only("base_runs"),
            Column::new("instructions", "Ir", Align::Right),
        ]);
        t.push(vec![
            Cell::Label {
                text: "more work",
                name: "more_work",
                loud: true,
            },
            Cell::Timing {
                median: 51_818.0,
                min: 51_000.0,
                max: 812_000.0,
            },
            Cell::Durations(vec![51_818.0, 51_000.0]),
            Cell::Absent,
        ]);
        assert_eq!(
            text(&t),
            "class                            base      Ir\n\
             more work  51.8 µs (51.0 µs – 812 µs)  absent\n"
        );
        assert!(markdown(&t).contains("| **more work** | 51.8 µs (51.0 µs – 812 µs) | absent |"));
        let j = json(&t);
        assert_eq!(j[0]["class"], "more_work");
        assert_eq!(
            (
                j[0]["base"].as_f64(),
                j[0]["base_min"].as_f64(),
                j[0]["base_max"].as_f64()
            ),
            (Some(51_818.0), Some(51_000.0), Some(812_000.0))
        );
        assert_eq!(j[0]["base_runs"], serde_json::json!([51_818.0, 51_000.0]));
        assert_eq!(j[0]["instructions"], Value::Null);
        assert_eq!(Cell::Verdict(Verdict::WithinNoise).human(), "within noise");
    }
}
