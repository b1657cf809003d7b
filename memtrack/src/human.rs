//! Human-readable numbers for summaries and tables: `1,234,567` and `1.2 MiB`.

/// `n` with thousands separators: `1234567` → `"1,234,567"`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `n` with thousands separators and `one` or `many` after it: `1 frame`, `2,048 frames`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// `n` bytes in binary units with one decimal: `512` → `"512 B"`, `1536` → `"1.5 KiB"`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A fractional number of bytes (a per-iteration figure): `64.00 B`, `1.5 KiB`.
pub fn bytes_f64(v: f64) -> String {
    if v < 1024.0 {
        format!("{v:.2} B")
    } else {
        bytes(v.round() as u64)
    }
}

/// `rows` as aligned columns separated by two spaces, one line each (trailing spaces trimmed);
/// column `i` is right-aligned when `right[i]` (numbers), else left-aligned. Widths count
/// `char`s, which is right for the ASCII and Latin text memtrack prints.
pub fn table<const N: usize>(rows: &[[String; N]], right: &[bool; N]) -> String {
    let mut width = [0usize; N];
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = " ".repeat(width[i] - c.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if right[i] {
                line.push_str(&pad);
                line.push_str(c);
            } else {
                line.push_str(c);
                line.push_str(&pad);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What `record`'s summary and `show` say of `n` heap allocations whose call stack stops early
/// (the artifact trailer's `short_stacks`): what it means and how to fix it.
pub fn short_stacks_note(n: u64) -> String {
    format!(
        "{} call stacks that stop early (no caller beyond the allocation site, or a frame \
         outside the mapped code): the code on the way was built without frame pointers (an \
         allocation inside a C library built without them, such as glibc's stdio, stays \
         short). Rust: \
         build with RUSTFLAGS=\"-C force-frame-pointers=yes\", or put \
         `[build] rustflags = [\"-C\", \"force-frame-pointers=yes\"]` in .cargo/config.toml; \
         C and C++: compile with -fno-omit-frame-pointer",
        plural(n, "allocation has", "allocations have")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(plural(1, "frame", "frames"), "1 frame");
        assert_eq!(plural(0, "frame", "frames"), "0 frames");
        assert_eq!(plural(1234, "block", "blocks"), "1,234 blocks");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 * 1024 * 1024), "5.0 MiB");
        let rows = [
            ["tid".to_string(), "bytes".to_string()],
            ["7".to_string(), "1.5 KiB".to_string()],
        ];
        assert_eq!(table(&rows, &[false, true]), "tid    bytes\n7    1.5 KiB\n");
    }
}
