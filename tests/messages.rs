//! The messages the crates print are prose: two spaces in a row between words are a string
//! joined across a source line without its `\` continuation (the next line's indentation
//! inside the message). Tables may align their columns with runs of spaces, but only after a
//! label or a placeholder, never inside a sentence.

use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};

/// Every `.rs` file under the crates' `src/` folders.
fn sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    memtrack_test_support::rust_sources(
        [
            "memtrack",
            "memtrack-cli",
            "memtrack-criterion",
            "memtrack-macros",
            "memtrack-bpf",
        ]
        .iter()
        .map(|c| root.join(c).join("src"))
        .collect(),
    )
}

/// The values of the string literals of `tokens`, doc comments (`#[doc = …]`) left out.
fn literals(tokens: TokenStream, out: &mut Vec<String>) {
    let mut tokens = tokens.into_iter().peekable();
    while let Some(t) = tokens.next() {
        match t {
            // An attribute (`#[…]`, `#![…]`): doc comments are attributes; so are
            // `#[error("…")]` messages, which do count.
            TokenTree::Punct(p) if p.as_char() == '#' => {
                if let Some(TokenTree::Punct(bang)) = tokens.peek()
                    && bang.as_char() == '!'
                {
                    tokens.next();
                }
                if let Some(TokenTree::Group(g)) = tokens.next() {
                    let mut inner = g.stream().into_iter();
                    if !matches!(inner.next(), Some(TokenTree::Ident(i)) if i == "doc") {
                        literals(g.stream(), out);
                    }
                }
            }
            TokenTree::Group(g) => literals(g.stream(), out),
            TokenTree::Literal(l) => {
                if let Ok(s) = syn::parse_str::<syn::LitStr>(&l.to_string()) {
                    out.push(s.value());
                }
            }
            _ => {}
        }
    }
}

/// The run of two or more spaces inside prose in `text`, if any: on a line of it, after
/// sentence punctuation followed by a word (`, ` `: ` `; ` `. `), where no table label stands.
fn run_in_prose(text: &str) -> Option<&str> {
    for line in text.lines() {
        let line = line.trim_start();
        let Some(run) = line.find(|c: char| c != ' ').and_then(|_| find_run(line)) else {
            continue;
        };
        let before = &line[..run];
        if [", ", ": ", "; ", ". "].iter().any(|p| before.contains(p)) {
            return Some(line);
        }
    }
    None
}

/// Where the first run of two or more spaces between two other characters starts.
fn find_run(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    (1..b.len().saturating_sub(2)).find(|&i| {
        b[i - 1] != b' ' && b[i] == b' ' && b[i + 1] == b' ' && {
            let rest = &line[i..];
            rest.trim_start().len() < rest.len() && !rest.trim_start().is_empty()
        }
    })
}

#[test]
fn no_message_has_a_run_of_spaces_inside_a_sentence() {
    let mut found = Vec::new();
    let files = sources();
    assert!(files.len() > 50, "found only {} source files", files.len());
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let tokens: TokenStream = text
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut lits = Vec::new();
        literals(tokens, &mut lits);
        for value in lits {
            if let Some(bad) = run_in_prose(&value) {
                found.push(format!("{}: {bad:?}", path.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "runs of spaces in messages:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_a_joined_line_and_passes_tables() {
    assert!(run_in_prose("switched off: drop                  one of the two").is_some());
    assert!(run_in_prose("the totals are not whole, and              the file").is_some());
    assert_eq!(run_in_prose("  call stacks   {line}"), None);
    assert_eq!(
        run_in_prose("not frees     {} by the allocator: its cache"),
        None
    );
    assert_eq!(run_in_prose("{:>8} {:>8}  command"), None);
    assert_eq!(run_in_prose("one sentence. Another one"), None);
    assert_eq!(run_in_prose("trailing spaces, ok  "), None);
}
