//! The human tables of `memtrack show`: allocations by size class, and per thread.

use memtrack::{analysis::SizeClass, human};

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
    let mut rows = vec![[
        "size class".to_string(),
        "allocations".into(),
        "share".into(),
        "bytes".into(),
        "share".into(),
    ]];
    for c in classes {
        let range = if c.min == 0 {
            format!("[0, {}]", bound(c.max))
        } else {
            format!("({}, {}]", bound(c.min - 1), bound(c.max))
        };
        rows.push([
            range,
            human::count(c.allocations),
            percent(c.allocations, allocations),
            human::bytes(c.bytes),
            percent(c.bytes, bytes_allocated),
        ]);
    }
    indent(&human::table(&rows, &[false, true, true, true, true]))
}

/// The per-thread table with a total row from the report's totals; frees count in the
/// freeing thread.
pub fn threads(rows_in: &[ThreadRow], t: &ShowReport) -> String {
    let mut rows = vec![[
        "tid".to_string(),
        "events".into(),
        "allocations".into(),
        "allocated".into(),
        "frees".into(),
        "freed".into(),
    ]];
    for th in rows_in {
        rows.push([
            th.tid.to_string(),
            human::count(th.events),
            human::count(th.allocations),
            human::bytes(th.bytes_allocated),
            human::count(th.frees),
            human::bytes(th.bytes_freed),
        ]);
    }
    rows.push([
        "total".into(),
        human::count(t.events),
        human::count(t.allocations),
        human::bytes(t.bytes_allocated),
        human::count(t.frees),
        human::bytes(t.bytes_freed),
    ]);
    indent(&human::table(&rows, &[false, true, true, true, true, true]))
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
