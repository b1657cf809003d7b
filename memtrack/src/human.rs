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

/// A time in nanoseconds for people, to three significant digits: `812 ns`, `51.8 µs`,
/// `1.20 s`.
pub fn duration(ns: f64) -> String {
    let (v, unit) = match ns.abs() {
        n if n < 1e3 => (ns, "ns"),
        n if n < 1e6 => (ns / 1e3, "µs"),
        n if n < 1e9 => (ns / 1e6, "ms"),
        _ => (ns / 1e9, "s"),
    };
    let digits = match v.abs() {
        a if a < 10.0 => 2,
        a if a < 100.0 => 1,
        _ => 0,
    };
    format!("{v:.digits$} {unit}")
}

/// `rows` as aligned columns separated by two spaces, one line each (trailing spaces trimmed);
/// column `i` is right-aligned when `right[i]` (numbers), else left-aligned. Widths count
/// `char`s, which is right for the ASCII and Latin text memtrack prints.
pub fn table<const N: usize>(rows: &[[String; N]], right: &[bool; N]) -> String {
    // A cell keeps to its line: a control character (a criterion id may hold a line break)
    // is shown escaped.
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|r| r.clone().map(|c| one_line(&c).into_owned()))
        .collect();
    let mut width = [0usize; N];
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
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

/// `s` as a terminal should receive it: each control character but the line break written as
/// Rust escapes it (`\t`, `\r`, `\u{1b}`), so that a name in an artifact (a benchmark id, a
/// command) cannot move the cursor, retitle the window or hide text behind escape sequences.
pub fn terminal(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\n') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() && c != '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `s` on one line: each control character (a line break, a tab) written as Rust escapes it
/// (`\n`, `\t`, `\u{1b}`), the rest as it is.
pub fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `s` (a benchmark's id) on one line, reversibly ([`unescape_line`] reads it back): a
/// backslash written `\\`, a line break `\n`, a carriage return `\r`, NUL `\0`.
pub fn escape_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out
}

/// The text [`escape_line`] wrote `line` from: `\n`, `\r` and `\0` undone, another
/// character after a backslash standing for itself, a backslash at the end for itself.
pub fn unescape_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// The one line said of `short` heap allocations (of `allocations`) whose call stack stops
/// early, `in_libc` of them made by the C library for itself: how to fix it, or `None` when
/// those a rebuild can fix are under 1 % of the allocations (a few short stacks change no
/// call site's figures, and the C library's own stay short whatever is rebuilt).
pub fn short_stacks_note(short: u64, in_libc: u64, allocations: u64) -> Option<String> {
    let fixable = short.saturating_sub(in_libc);
    if fixable == 0 || fixable.saturating_mul(100) < allocations {
        return None;
    }
    Some(format!(
        "{} of {} allocations ({:.1} %) have call stacks that stop early: build with frame \
         pointers (Rust: RUSTFLAGS=\"-C force-frame-pointers=yes\"; C and C++: \
         -fno-omit-frame-pointer)",
        count(fixable),
        count(allocations),
        fixable as f64 * 100.0 / allocations.max(1) as f64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_three_significant_digits() {
        assert_eq!(duration(812.0), "812 ns");
        assert_eq!(duration(51_818.0), "51.8 µs");
        assert_eq!(duration(1_204_000_000.0), "1.20 s");
        assert_eq!(duration(5.5), "5.50 ns");
    }

    #[test]
    fn an_escaped_line_reads_back() {
        for s in ["vec/1024", "a\\b\nc\r\0 #2", "", "end\\", "\\n"] {
            let line = escape_line(s);
            assert!(!line.contains(['\n', '\r', '\0']), "{line:?}");
            assert_eq!(unescape_line(&line), s);
        }
        assert_eq!(unescape_line("x\\q\\"), "xq\\");
    }

    /// For a terminal, every control character but the line break is escaped.
    #[test]
    fn terminal_text_keeps_line_breaks_only() {
        assert_eq!(terminal("two\nlines"), "two\nlines");
        assert_eq!(
            terminal("a\u{1b}[31mred\r\t\u{7}\n"),
            "a\\u{1b}[31mred\\r\\t\\u{7}\n"
        );
    }

    /// A cell with a line break stays on its row, the break shown as `\n`.
    #[test]
    fn a_line_break_in_a_cell_is_escaped() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(one_line("a {\n  /3\t\u{1b}"), "a {\\n  /3\\t\\u{1b}");
        let rows = [
            ["name".to_string(), "n".to_string()],
            ["g {\n /1".to_string(), "7".to_string()],
        ];
        assert_eq!(table(&rows, &[false, true]), "name      n\ng {\\n /1  7\n");
    }

    #[test]
    fn short_stacks_are_noted_from_one_percent_outside_the_c_library() {
        // Glibc's stdio buffers in a large recording: nothing to fix.
        assert_eq!(short_stacks_note(29, 29, 730_851), None);
        assert_eq!(short_stacks_note(0, 0, 10), None);
        // Under 1 % of the allocations.
        assert_eq!(short_stacks_note(99, 0, 10_000), None);
        // Only the ones outside the C library count.
        assert_eq!(short_stacks_note(150, 51, 10_000), None);
        let note = short_stacks_note(150, 50, 10_000).expect("1 % is noted");
        assert!(
            note.starts_with("100 of 10,000 allocations (1.0 %) have call stacks"),
            "{note}"
        );
        assert!(!note.contains('\n') && !note.contains("  "), "{note}");
        assert!(note.contains("-fno-omit-frame-pointer"), "{note}");
        assert!(
            short_stacks_note(3, 0, 3)
                .unwrap()
                .starts_with("3 of 3 allocations (100.0 %)")
        );
    }

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
