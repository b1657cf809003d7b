//! No function in the crates' `src/` is longer than 80 lines, from its `fn` line to its closing
//! brace: a longer one is split by meaning (helpers whose names say what each part does). The
//! sources are rustfmt-formatted (CI checks it), so a function's body ends at the first line
//! that is its `fn` line's indentation followed by `}`.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 80;

/// Every `.rs` file under the crates' `src/` folders.
fn sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    memtrack_test_support::rust_sources(
        std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().path().join("src"))
            .filter(|p| p.is_dir() && p.parent().is_some_and(|c| c.join("Cargo.toml").is_file()))
            .collect(),
    )
}

/// Whether `line` (indentation stripped) begins a function item with a body on later lines.
fn starts_fn(line: &str) -> bool {
    let mut rest = line;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    rest = rest.strip_prefix("extern \"C\" ").unwrap_or(rest);
    rest.starts_with("fn ") && !line.trim_end().ends_with(';') && !line.trim_end().ends_with('}')
}

/// (first line, name, lines) of each function of `src` longer than [`MAX_LINES`].
fn long_functions(src: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        if !starts_fn(body) {
            continue;
        }
        let indent = &line[..line.len() - body.len()];
        let end = lines[i..]
            .iter()
            .position(|l| l.strip_prefix(indent).is_some_and(|r| r.starts_with('}')));
        let Some(end) = end else { continue };
        if end + 1 > MAX_LINES {
            let name = body
                .split("fn ")
                .nth(1)
                .unwrap_or("")
                .split(['(', '<'])
                .next();
            out.push((i + 1, name.unwrap_or("").to_string(), end + 1));
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let mut found = Vec::new();
    for path in sources() {
        let src = std::fs::read_to_string(&path).unwrap();
        for (line, name, n) in long_functions(&src) {
            found.push(format!("{}:{line} {name}: {n} lines", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "functions over {MAX_LINES} lines (split them by meaning):\n{}",
        found.join("\n")
    );
}

/// The check finds a long function, and only a long one.
#[test]
fn the_check_measures_from_fn_to_its_closing_brace() {
    let body = |n: usize| "        x();\n".repeat(n);
    let src = format!(
        "impl A {{\n    pub(crate) fn long(&self) {{\n{}    }}\n\n    fn short() {{\n{}    }}\n}}\n",
        body(79),
        body(78)
    );
    assert_eq!(long_functions(&src), vec![(2, "long".to_string(), 81)]);
}
