//! The library's layers point one way (the diagram in `ARCHITECTURE.md`): a module of
//! `memtrack/src` names (`use crate::…`, a `crate::…` path in code or a doc link) only modules
//! of its own layer or of a layer below it. A name re-exported at the crate root
//! (`crate::Totals`) counts as the module it comes from, read from `lib.rs`'s `pub use` lines.
//!
//! The table below is the one place the layers are declared: a module missing from it, or one
//! it names that `lib.rs` does not declare, fails the test too, so it cannot drift from the code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, lowest first, and the top-level modules of `memtrack/src` in each.
const LAYERS: &[(&str, &[&str])] = &[
    ("event model", &["event", "stack", "totals", "human"]),
    // Formats read and written: memtrack's artifacts, and callgrind's output files.
    ("artifact format", &["artifact", "callgrind"]),
    ("analysis", &["analysis"]),
    (
        "runtime: encoder pipeline",
        &["encode", "scope", "synth", "lifecycle"],
    ),
    (
        "runtime: recorders and limits",
        &["tracker", "modules", "allocator", "backend", "limits"],
    ),
    // Reads the recorded files (ELF, DWARF): runtime, never analysis.
    ("runtime: symbolization", &["symbolize"]),
    // Classifies off-CPU intervals by their symbolized stacks.
    ("runtime: lock waits", &["locks"]),
    // A session's report carries its lock waits when it recorded them.
    ("runtime: report", &["report"]),
    ("runtime: crate-wide error", &["error"]),
    ("runtime: session", &["session"]),
    // Runs benchmark programs under callgrind and compares their counts (reads `callgrind`).
    ("runtime: instruction counts", &["instructions"]),
    ("runtime: integrations", &["criterion", "__private"]),
    // The report model and its renderers (table, markdown, JSON): numbers become text.
    ("presentation", &["render"]),
    // The guide's pages as doctests (`cfg(doctest)` only): text, no code.
    ("docs", &["guide"]),
];

/// The layer index of each module.
fn ranks() -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for (rank, (_, modules)) in LAYERS.iter().enumerate() {
        for m in *modules {
            assert!(out.insert(*m, rank).is_none(), "{m} is in two layers");
        }
    }
    out
}

/// Every `crate::NAME` in `text` (also the items of `crate::{a::X, b::Y}` groups), with its
/// line number; `$crate::` (a macro's) is not this crate's path.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with('$')
            || text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let line = text[..i].matches('\n').count() + 1;
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b::{Y, Z}, c};`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push((line, first_segment(&item)));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            if !item.trim().is_empty() {
                out.push((line, first_segment(&item)));
            }
        } else {
            out.push((line, first_segment(rest)));
        }
    }
    out
}

fn first_segment(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// `lib.rs`'s modules and what its `pub use` lines re-export from each: name → module.
fn lib_rs(text: &str) -> (Vec<String>, BTreeMap<String, String>) {
    let mut modules = Vec::new();
    let mut exports = BTreeMap::new();
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    for stmt in text.split(';') {
        let stmt = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
        let stmt = stmt.rsplit(']').next().unwrap_or(&stmt).trim(); // drop attributes
        if let Some(m) = stmt.strip_prefix("mod ").or(stmt.strip_prefix("pub mod ")) {
            modules.push(m.trim().to_string());
        } else if let Some(path) = stmt.strip_prefix("pub use ") {
            let (module, names) = path.split_once("::").expect("pub use of a path");
            let names = names.trim_start_matches('{').trim_end_matches('}');
            for name in names.split(',') {
                let name = name.trim();
                let name = name.rsplit(" as ").next().unwrap_or(name);
                let name = name.rsplit("::").next().unwrap_or(name);
                if !name.is_empty() {
                    exports.insert(name.to_string(), module.to_string());
                }
            }
        }
    }
    (modules, exports)
}

/// The violations of the layering in `files` (module name, file, text): `file:line: message`.
fn violations(files: &[(String, PathBuf, String)], lib: &str) -> Vec<String> {
    let ranks = ranks();
    let (modules, exports) = lib_rs(lib);
    let mut out = Vec::new();
    for m in &modules {
        if !ranks.contains_key(m.as_str()) {
            out.push(format!(
                "lib.rs: module {m} is in no layer: add it to LAYERS in {}",
                file!()
            ));
        }
    }
    for m in ranks.keys() {
        if !modules.iter().any(|x| x == m) {
            out.push(format!("LAYERS names {m}, which lib.rs does not declare"));
        }
    }
    for (module, path, text) in files {
        let Some(&own) = ranks.get(module.as_str()) else {
            continue; // reported above
        };
        for (line, name) in crate_paths(text) {
            let target = if ranks.contains_key(name.as_str()) {
                name.clone()
            } else if let Some(m) = exports.get(&name) {
                m.clone()
            } else {
                out.push(format!(
                    "{}:{line}: crate::{name} is neither a module nor a re-export of lib.rs",
                    path.display()
                ));
                continue;
            };
            let Some(&theirs) = ranks.get(target.as_str()) else {
                continue; // an external crate's re-export (the macro)
            };
            if theirs > own {
                out.push(format!(
                    "{}:{line}: {module} ({}) names crate::{name} of {target} ({}), a layer \
                     above it: move the code, or pass what it needs down as plain values",
                    path.display(),
                    LAYERS[own].0,
                    LAYERS[theirs].0
                ));
            }
        }
    }
    out
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(String, PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).expect("reading memtrack/src") {
        let path = entry.expect("a directory entry").path();
        let rel = path.strip_prefix(root).expect("under src").to_path_buf();
        let top = rel.components().next().expect("non-empty").as_os_str();
        let top = top.to_string_lossy();
        if top == "bin" || top == "lib.rs" {
            continue; // the binary is a crate of its own; lib.rs is the root, above all
        }
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let module = top.trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&path).expect("reading a source file");
            out.push((module, rel, text));
        }
    }
}

#[test]
fn no_module_names_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 20, "found only {} source files", files.len());
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("reading lib.rs");
    let found = violations(&files, &lib);
    assert!(found.is_empty(), "\n{}", found.join("\n"));
}

/// The check can fail: an analysis module importing the session, through a group and through a
/// root re-export, and an artifact doc link to the session's report are each caught.
#[test]
fn a_planted_upward_import_is_caught() {
    let lib = "mod analysis;\nmod session;\nmod artifact;\nmod event;\nmod totals;\nmod human;\n\
               #[cfg(feature = \"callgrind\")]\npub mod callgrind;\n#[cfg(feature = \"callgrind\")]\npub mod instructions;\nmod encode;\nmod lifecycle;\nmod scope;\nmod synth;\nmod tracker;\nmod allocator;\nmod backend;\nmod render;\nmod limits;\n\
               mod report;\nmod error;\nmod stack;\nmod modules;\nmod locks;\n#[cfg(feature = \"symbolize\")]\nmod symbolize;\n#[cfg(feature = \"criterion\")]\npub mod criterion;\n\
               #[doc(hidden)]\npub mod __private;\n#[cfg(doctest)]\nmod guide;\n\
               pub use report::Report;\npub use analysis::{Analyzer, Totals};\n";
    let file = |m: &str, text: &str| {
        (
            m.to_string(),
            PathBuf::from(format!("{m}.rs")),
            text.to_string(),
        )
    };
    let ok = [
        file(
            "session",
            "use crate::analysis::Totals;\nuse crate::{event::Event, Report};",
        ),
        file(
            "analysis",
            "use crate::event::Event; // pub(crate) fn f() {}",
        ),
        file(
            "tracker",
            "macro_rules! m { () => { $crate::session::x() } }",
        ),
    ];
    assert_eq!(violations(&ok, lib), Vec::<String>::new());
    let bad = [
        file("analysis", "use crate::{event::Event, session::Session};"),
        file("analysis", "fn f(r: &crate::Report) {}"),
        file(
            "artifact",
            "/// See [`Report`](crate::report::Report).\nstruct A;",
        ),
        file("event", "use crate::nowhere::X;"),
    ];
    let found = violations(&bad, lib);
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(
        found[0].starts_with("analysis.rs:1: analysis (analysis) names crate::session"),
        "{}",
        found[0]
    );
    assert!(found[1].contains("crate::Report of report"), "{}", found[1]);
    assert!(
        found[2].starts_with("artifact.rs:1: artifact"),
        "{}",
        found[2]
    );
    assert!(
        found[3].contains("neither a module nor a re-export"),
        "{}",
        found[3]
    );
    let missing = violations(&[], "mod analysis;\nmod extra;\n");
    assert!(
        missing
            .iter()
            .any(|v| v.contains("module extra is in no layer")),
        "{missing:#?}"
    );
    assert!(
        missing.iter().any(|v| v.contains("LAYERS names session")),
        "{missing:#?}"
    );
}
