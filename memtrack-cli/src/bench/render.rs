//! `memtrack bench`'s report without `--base`: the library's table of benchmarks
//! ([`memtrack::render::benchmarks`], the one memtrack-criterion prints too) as a table,
//! markdown or JSON.

use memtrack::analysis::Benchmark;
use memtrack::render::{self, BenchmarkRow};

fn table_of(set: &[Benchmark]) -> render::Table {
    render::benchmarks(set.iter().map(BenchmarkRow::Measured))
}

/// An aligned plain-text table for a terminal.
pub(crate) fn table(set: &[Benchmark]) -> String {
    render::text(&table_of(set))
}

/// GitHub-flavoured markdown for a CI job summary.
pub(crate) fn markdown(set: &[Benchmark]) -> String {
    format!(
        "### memtrack: memory per benchmark\n\n{}\n",
        render::markdown(&table_of(set))
    )
}

/// Machine-readable form, `bench`'s document's `benchmarks`: exact integers, and the
/// per-iteration figures as floats (`null` without an iteration count).
pub(crate) fn json(set: &[Benchmark]) -> serde_json::Value {
    render::json(&table_of(set))
}
