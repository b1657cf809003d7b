//! `--trim-allocator` on a real Rust program: the allocator recorder's fixture
//! (tests/fixtures/alloc_stacks.rs, built here with frame pointers by memtrack-test-support's
//! `fixtures::rust_alloc_stacks`) allocates 7 × 800 bytes by `Vec::<u64>::with_capacity` in
//! `generic_path`. Its recorded stacks begin with the allocator's own frames (memtrack's
//! `GlobalAlloc`, the `__rust_alloc` shim, `alloc::alloc`, `RawVec`); the flame graph and
//! `show --top` hide those by default and keep them with `--no-trim-allocator`, and stop at the
//! `Vec` function the fixture called, with every frame outside it (`generic_path`, `main`…)
//! kept; `export --format folded` keeps every frame.
//!
//! `harness = false` (memtrack-test-support's runner): without `rustc` on PATH the test is
//! reported as ignored with what is missing.

mod common;

use std::path::{Path, PathBuf};

use common::{memtrack, s, svg_doc, text};
use memtrack_test_support::fixtures;
use memtrack_test_support::{Need, requires, run};
use serde_json::Value;

const NEEDS: &[Need] = &[Need::Tool("rustc")];

/// The frames that are the allocator's in this program: memtrack's recorder, the global
/// allocator's shim, `alloc::alloc` and `RawVec`.
fn allocators(name: &str) -> bool {
    let name = name.trim_start_matches('<');
    [
        "memtrack::",
        "__rustc::",
        "__rust_alloc",
        "alloc::alloc::",
        "alloc::raw_vec::",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// Runs the fixture: its `paths` session's artifact.
fn recording(dir: &Path) -> PathBuf {
    let exe = fixtures::rust_alloc_stacks(dir, "alloc_stacks");
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    let o = std::process::Command::new(&exe).arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join("paths.memtrack")
}

/// The functions of the top site of 800-byte blocks in `show --top --json`, innermost first,
/// and how many frames it says it left out.
fn generic_site(input: &Path, extra: &[&str]) -> (Vec<String>, u64) {
    let mut args = vec!["show", s(input), "--json", "--top", "2"];
    args.extend_from_slice(extra);
    let out = memtrack(&args);
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = v["top_sites"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["bytes"] == 7 * 800)
        .unwrap_or_else(|| panic!("no site of 7 × 800 bytes in {v}"))
        .clone();
    let functions = row["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("?").to_string())
        .collect();
    (
        functions,
        row["allocator_frames_trimmed"].as_u64().unwrap_or(0),
    )
}

/// The flame graph's frames, as their tooltips name them (`name (N bytes, P%)`).
fn flame_frames(input: &Path, svg: &Path, extra: &[&str]) -> (Vec<String>, String) {
    let mut args = vec!["flamegraph", s(input), "-o", s(svg)];
    args.extend_from_slice(extra);
    let out = memtrack(&args);
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(svg).unwrap();
    let doc = svg_doc(&body);
    let titles = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .map(|t| t.rsplit_once(" (").map_or(t, |(name, _)| name).to_string())
        .collect();
    let texts = doc.descendants().filter_map(|n| n.text()).collect();
    (titles, texts)
}

fn trims_the_allocator_frames_of_a_rust_program() {
    let dir = tempfile::tempdir().unwrap();
    let input = recording(dir.path());
    let (whole, none) = generic_site(&input, &["--no-trim-allocator"]);
    assert_eq!(none, 0);
    let first_user = whole
        .iter()
        .position(|f| !allocators(f))
        .unwrap_or_else(|| panic!("only allocator frames: {whole:#?}"));
    assert!(
        first_user >= 3,
        "the allocator's frames of the fixture: {whole:#?}"
    );
    // The first frame past the allocator's is the Vec function the fixture called.
    assert!(
        whole[first_user]
            .trim_start_matches('<')
            .starts_with("alloc::vec::Vec<"),
        "{whole:#?}"
    );
    let (trimmed, count) = generic_site(&input, &[]);
    assert_eq!(count as usize, first_user, "{whole:#?}");
    assert_eq!(
        trimmed,
        whole[first_user..],
        "the frames outside are kept, in order"
    );
    assert!(
        trimmed
            .iter()
            .any(|f| f.starts_with("alloc_stacks::generic_path"))
    );
    let out = memtrack(&["show", s(&input), "--top", "2"]);
    assert!(
        text(&out).contains("--no-trim-allocator shows them"),
        "{}",
        text(&out)
    );

    let svg = dir.path().join("flame.svg");
    let (frames, texts) = flame_frames(&input, &svg, &[]);
    assert!(!frames.iter().any(|f| allocators(f)), "{frames:#?}");
    for f in &whole[first_user..] {
        assert!(
            frames.contains(f),
            "{f} is not in the flame graph: {frames:#?}"
        );
    }
    assert!(texts.contains("allocator frames hidden (--no-trim-allocator)"));
    let (frames, texts) = flame_frames(&input, &svg, &["--no-trim-allocator"]);
    for f in &whole {
        assert!(
            frames.contains(f),
            "{f} is not in the flame graph: {frames:#?}"
        );
    }
    assert!(!texts.contains("allocator frames hidden"));
    // `--trim-allocator` says the default; the last of the two given wins.
    let (explicit, _) = flame_frames(&input, &svg, &["--no-trim-allocator", "--trim-allocator"]);
    assert!(!explicit.iter().any(|f| allocators(f)), "{explicit:#?}");

    // The export keeps every frame.
    let folded = dir.path().join("paths.folded");
    let out = memtrack(&["export", s(&input), "--format", "folded", "-o", s(&folded)]);
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(&folded).unwrap();
    let line = body
        .lines()
        .find(|l| l.ends_with(" 5600"))
        .unwrap_or_else(|| panic!("no stack of 5,600 bytes in {body}"));
    let leaf_first: Vec<&str> = line.rsplit_once(' ').unwrap().0.rsplit(';').collect();
    assert_eq!(leaf_first[..whole.len()], whole, "{line}");
}

fn main() {
    run(vec![requires(
        "trims_the_allocator_frames_of_a_rust_program",
        NEEDS,
        trims_the_allocator_frames_of_a_rust_program,
    )]);
}
