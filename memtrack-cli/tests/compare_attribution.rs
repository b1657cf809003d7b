//! `memtrack compare` names the call sites behind a regression, matched across two builds by
//! their frames' functions and files. tests/fixtures/attribution.c is built three more times
//! beside its base build: `-DGROW` (one site allocates 20 % more), moved (7 lines inserted
//! before the functions, as an unrelated edit would: every line after it shifts) and both;
//! each build is compiled from the same path (as two checkouts of one workspace are), recorded
//! by the eBPF tracker (stacks walked by the kernel) and compared with the base.
//!
//! `harness = false` (memtrack-test-support's runner): each test needs CAP_BPF + CAP_PERFMON
//! and a C compiler, and without them is reported as ignored with what is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{memtrack, s, svg_doc, text};
use memtrack::{
    analysis::Metric, analysis::Sites, artifact::Reader, symbolize::SiteComparison,
    symbolize::Symbolizer, tracker::TrackerOptions, tracker::record_command,
};
use memtrack_test_support::fixtures;
use memtrack_test_support::{Need, TRACKER, requires, run, run_ok};

const NEEDS: &[Need] = &[TRACKER, Need::Tool("cc")];

/// Lines the moved build inserts before the functions.
const MOVED_BY: u64 = 7;

/// attribution.c, `moved` or not, written to `dir/src/attribution.c` (one path for every
/// build), built with `defines` into `dir/NAME/attribution` and recorded into
/// `dir/NAME.memtrack`.
fn build_and_record(dir: &Path, name: &str, defines: &[&str], moved: bool) -> PathBuf {
    let mut source = std::fs::read_to_string(fixtures::source("attribution.c")).unwrap();
    if moved {
        let lines = "/* an unrelated edit */\n".repeat(MOVED_BY as usize);
        assert!(source.contains("/* MOVE-HERE */\n"));
        source = source.replace("/* MOVE-HERE */\n", &format!("/* MOVE-HERE */\n{lines}"));
    }
    let src = dir.join("src/attribution.c");
    std::fs::create_dir_all(src.parent().unwrap()).unwrap();
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    let exe = out.join("attribution");
    run_ok(
        Command::new("cc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer"])
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg(&src)
            .arg("-o")
            .arg(&exe),
    );
    let artifact = dir.join(format!("{name}.memtrack"));
    let file = std::fs::File::create(&artifact).unwrap();
    let rec =
        record_command(&[exe.into_os_string()], file, &TrackerOptions::new()).expect("record");
    assert_eq!(rec.exit_code, 0);
    assert_eq!(rec.recorded.lost_events, 0);
    artifact
}

fn compare_json(base: &Path, head: &Path) -> (Option<i32>, serde_json::Value) {
    let out = memtrack(&["compare", s(base), s(head), "--format", "json"]);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    (out.status.code(), v)
}

/// The functions of a site's frames, as JSON lists them.
fn functions(site: &serde_json::Value) -> Vec<String> {
    site["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["function"].as_str().map(String::from))
        .collect()
}

/// The line `show --top` gives the first frame of `function` in the top sites by bytes.
fn line_in(artifact: &Path, function: &str) -> u64 {
    let out = memtrack(&["show", s(artifact), "--top", "5", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["top_sites"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["frames"].as_array().unwrap().iter())
        .find(|f| f["function"].as_str() == Some(function))
        .and_then(|f| f["line"].as_u64())
        .unwrap_or_else(|| {
            panic!(
                "no frame of {function} with a line in {}",
                artifact.display()
            )
        })
}

/// The grown site ranks first with its exact delta, and is the only one that changed; the
/// same holds when the head's code also moved.
fn the_grown_site_ranks_first_with_its_exact_delta() {
    let dir = tempfile::tempdir().unwrap();
    let base = build_and_record(dir.path(), "base", &[], false);
    for (name, moved) in [("grow", false), ("grow-moved", true)] {
        let head = build_and_record(dir.path(), name, &["GROW"], moved);
        let (code, v) = compare_json(&base, &head);
        assert_eq!(code, Some(1), "{name}: {v:#}");
        let attribution = v["attribution"].as_array().expect("an attribution");
        let metrics: Vec<&str> = attribution
            .iter()
            .map(|a| a["metric"].as_str().unwrap())
            .collect();
        assert_eq!(metrics, ["allocations", "bytes"], "{name}: {v:#}");
        for (a, delta) in attribution.iter().zip([200u64, 200 * 1000]) {
            let sites = a["sites"].as_array().unwrap();
            assert_eq!(sites.len(), 1, "{name}: exactly one site changed: {a:#}");
            let top = &sites[0];
            assert_eq!(top["delta"].as_u64(), Some(delta), "{name}: {a:#}");
            assert_eq!(
                top["head"].as_u64().unwrap() - top["base"].as_u64().unwrap(),
                delta
            );
            assert_eq!(top["share"].as_f64(), Some(1.0));
            assert_eq!(top["status"], "changed");
            assert_eq!(a["delta"].as_u64(), Some(delta));
            let f = functions(top);
            assert!(
                f.iter().any(|x| x == "grow_site") && f.iter().any(|x| x == "main"),
                "{name}: the top site is grow_site's: {f:?}"
            );
            assert!(!f.iter().any(|x| x == "steady_site"));
        }
    }
    // Text and markdown show it too: the table row, the collapsible section.
    let head = dir.path().join("grow.memtrack");
    let out = memtrack(&["compare", s(&base), s(&head)]);
    let t = text(&out);
    assert!(
        t.contains("call sites behind") && t.contains("grow_site (attribution.c)"),
        "{t}"
    );
    let out = memtrack(&["compare", s(&base), s(&head), "--format", "markdown"]);
    let t = text(&out);
    assert!(
        t.contains("<details><summary>Call sites behind") && t.contains("grow\\_site"),
        "{t}"
    );
}

/// A build that only moves code matches site for site: no regression, and no site delta in
/// any metric, though every line of the sites' functions moved.
fn moved_code_has_no_site_deltas() {
    let dir = tempfile::tempdir().unwrap();
    let base = build_and_record(dir.path(), "base", &[], false);
    let head = build_and_record(dir.path(), "moved", &[], true);
    for f in ["grow_site", "steady_site", "main"] {
        assert_eq!(
            line_in(&head, f),
            line_in(&base, f) + MOVED_BY,
            "the edit moves {f}'s lines"
        );
    }
    let (code, v) = compare_json(&base, &head);
    assert_eq!(code, Some(0), "{v:#}");
    assert!(v.get("attribution").is_none());
    // The library's attribution, for every metric (compare computes it for regressions only).
    let (br, hr) = (Reader::open(&base).unwrap(), Reader::open(&head).unwrap());
    let (bs, hs) = (Sites::read(&br).unwrap(), Sites::read(&hr).unwrap());
    assert!(bs.has_stacks() && hs.has_stacks());
    let keyed = SiteComparison::new(&mut Symbolizer::new(), &br, &bs, &hr, &hs).unwrap();
    assert_eq!((keyed.base.unmatched, keyed.head.unmatched), (0, 0));
    for m in Metric::ALL {
        let a = keyed.attribution(m);
        assert!(a.sites.is_empty(), "{m:?}: {:#?}", a.sites);
        assert!(a.unchanged >= 2, "{m:?}: both fixture sites matched");
    }
    // The differential flame graph matches the sites the same way: nothing grew or shrank.
    let svg = dir.path().join("diff.svg");
    for metric in ["bytes", "allocations", "peak", "leaked"] {
        let out = memtrack(&[
            "flamegraph",
            "--diff",
            s(&base),
            s(&head),
            "-o",
            s(&svg),
            "--metric",
            metric,
        ]);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert!(t.contains("(0 of "), "{metric}: a stack changed: {t}");
        let body = std::fs::read_to_string(&svg).unwrap();
        let doc = svg_doc(&body);
        // Every frame's box white (inferno's "unchanged"); none red or blue.
        let coloured: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("rect"))
            .filter_map(|n| n.attribute("fill"))
            .filter(|f| f.starts_with("rgb(") && *f != "rgb(250,250,250)")
            .collect();
        assert!(
            coloured.is_empty(),
            "{metric}: frames not white: {coloured:?}"
        );
    }
}

fn main() {
    run(vec![
        requires(
            "the_grown_site_ranks_first_with_its_exact_delta",
            NEEDS,
            the_grown_site_ranks_first_with_its_exact_delta,
        ),
        requires(
            "moved_code_has_no_site_deltas",
            NEEDS,
            moved_code_has_no_site_deltas,
        ),
    ])
}
