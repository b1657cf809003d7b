//! The human tables of `memtrack show`: allocations by size class, and per thread.

use memtrack::analysis::SizeClass;
use memtrack::render::{self, Align, Cell, Column, Table};

use crate::show::{ShowReport, ThreadRow};

/// `(n / of)` as a percentage with one decimal.
pub fn percent(n: u64, of: u64) -> String {
    if of == 0 {
        "-".into()
    } else {
        format!("{:.1}%", n as f64 * 100.0 / of as f64)
    }
}

/// A power of two (or `u64::MAX`) in bytes, exactly: `16 B`, `1 KiB`, `4 MiB`.
fn bound(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n == u64::MAX {
        return "16 EiB".into();
    }
    let mut unit = 0;
    let mut v = n;
    while v >= 1024 && v % 1024 == 0 && unit + 1 < UNITS.len() {
        v /= 1024;
        unit += 1;
    }
    format!("{v} {}", UNITS[unit])
}

/// The size-class table: one row per non-empty class, `(lower, upper]` bounds, with each
/// class's share of `allocations` and of `bytes_allocated`.
pub fn size_classes(classes: &[SizeClass], allocations: u64, bytes_allocated: u64) -> String {
    let mut t = Table::new(vec![
        Column::new("size_class", "size class", Align::Left),
        Column::new("allocations", "allocations", Align::Right),
        Column::new("allocations_share", "share", Align::Right),
        Column::new("bytes", "bytes", Align::Right),
        Column::new("bytes_share", "share", Align::Right),
    ]);
    for c in classes {
        let range = if c.min == 0 {
            format!("[0, {}]", bound(c.max))
        } else {
            format!("({}, {}]", bound(c.min - 1), bound(c.max))
        };
        t.push(vec![
            Cell::Text(range),
            Cell::Count(Some(c.allocations)),
            Cell::Text(percent(c.allocations, allocations)),
            Cell::Bytes(c.bytes),
            Cell::Text(percent(c.bytes, bytes_allocated)),
        ]);
    }
    indent(&render::text(&t))
}

/// The per-thread table with a total row from the report's totals; frees count in the
/// freeing thread.
pub fn threads(rows: &[ThreadRow], total: &ShowReport) -> String {
    let mut t = Table::new(vec![
        Column::new("tid", "tid", Align::Left),
        Column::new("events", "events", Align::Right),
        Column::new("allocations", "allocations", Align::Right),
        Column::new("bytes_allocated", "allocated", Align::Right),
        Column::new("frees", "frees", Align::Right),
        Column::new("bytes_freed", "freed", Align::Right),
    ]);
    let row = |tid: String, events, allocations, allocated, frees, freed| {
        vec![
            Cell::Text(tid),
            Cell::Count(Some(events)),
            Cell::Count(Some(allocations)),
            Cell::Bytes(allocated),
            Cell::Count(Some(frees)),
            Cell::Bytes(freed),
        ]
    };
    for th in rows {
        t.push(row(
            th.tid.to_string(),
            th.events,
            th.allocations,
            th.bytes_allocated,
            th.frees,
            th.bytes_freed,
        ));
    }
    t.push(row(
        "total".into(),
        total.events,
        total.allocations,
        total.bytes_allocated,
        total.frees,
        total.bytes_freed,
    ));
    indent(&render::text(&t))
}

fn indent(table: &str) -> String {
    table.lines().map(|l| format!("    {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_exact() {
        assert_eq!(bound(16), "16 B");
        assert_eq!(bound(1024), "1 KiB");
        assert_eq!(bound(1536), "1536 B");
        assert_eq!(bound(4 << 20), "4 MiB");
        assert_eq!(bound(1 << 63), "8 EiB");
        assert_eq!(percent(1, 3), "33.3%");
    }
}
