//! `memtrack compare`: verdicts, exit codes, refused inputs, directories and output formats.

mod common;

use std::path::Path;

use common::{alloc_free_pairs, memtrack, s, synth, text, write};
use memtrack::{event::Event, event::EventKind};

fn code(out: &std::process::Output) -> i32 {
    out.status.code().expect("exited normally")
}

/// The table line of `benchmark`'s `metric` row.
fn row<'a>(table: &'a str, benchmark: &str, metric: &str) -> &'a str {
    table
        .lines()
        .find(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some(benchmark) && w.next() == Some(metric)
        })
        .unwrap_or_else(|| panic!("no row {benchmark} {metric} in\n{table}"))
}

#[test]
fn identical_inputs_pass() {
    let dir = tempfile::tempdir().unwrap();
    // Two separate runs of the same model: different files, the same numbers.
    let a = synth(&dir.path().join("a.memtrack"), 100_000, 3);
    let b = synth(&dir.path().join("b.memtrack"), 100_000, 3);
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let out = memtrack(&["compare", s(&a), s(&b)]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    let name = "synth seed=3 threads=3";
    for m in ["allocations", "bytes", "peak"] {
        let line = table
            .lines()
            .find(|l| l.starts_with(name) && l.split_whitespace().nth(3) == Some(m))
            .unwrap_or_else(|| panic!("no {m} row in\n{table}"));
        assert!(line.ends_with("unchanged"), "{line}");
    }
    assert!(
        table.contains("no benchmark regressed (no figure beyond +3% growth"),
        "{table}"
    );
}

#[test]
fn ten_percent_more_allocations_regresses_that_row_only() {
    let dir = tempfile::tempdir().unwrap();
    // Base: 100 blocks of 110 bytes; head: 110 blocks of 100 bytes. Allocations +10 %,
    // bytes equal (11,000 both), peak (one block live at a time) 110 → 100.
    let base = write(
        &dir.path().join("base.memtrack"),
        Some("bench_a"),
        &alloc_free_pairs(100, 110),
        0,
    );
    let head = write(
        &dir.path().join("head.memtrack"),
        Some("bench_a"),
        &alloc_free_pairs(110, 100),
        0,
    );
    let out = memtrack(&["compare", s(&base), s(&head), "--threshold", "3%"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let table = String::from_utf8(out.stdout.clone()).unwrap();
    let r = row(&table, "bench_a", "allocations");
    assert_eq!(
        r.split_whitespace().collect::<Vec<_>>(),
        [
            "bench_a",
            "allocations",
            "100",
            "110",
            "+10.00%",
            "REGRESSED"
        ]
    );
    assert!(
        row(&table, "bench_a", "bytes").ends_with("unchanged"),
        "{table}"
    );
    let peak = row(&table, "bench_a", "peak");
    assert!(
        peak.contains("-9.09%") && peak.ends_with("improved"),
        "{peak}"
    );
    assert!(
        table.contains("1 benchmark regressed (1 figure beyond +3% growth"),
        "{table}"
    );

    // Exactly the threshold passes; just below it fails.
    let at = memtrack(&["compare", s(&base), s(&head), "--threshold", "10%"]);
    assert_eq!(code(&at), 0, "{}", text(&at));
    let below = memtrack(&["compare", s(&base), s(&head), "--threshold", "9.99%"]);
    assert_eq!(code(&below), 1, "{}", text(&below));
    // Gating on bytes only: nothing grew.
    let bytes = memtrack(&["compare", s(&base), s(&head), "--metric", "bytes"]);
    assert_eq!(code(&bytes), 0, "{}", text(&bytes));
    assert!(!String::from_utf8_lossy(&bytes.stdout).contains("allocations"));

    // The same verdicts in the markdown for a CI summary.
    let md = memtrack(&["compare", s(&base), s(&head), "--format", "markdown"]);
    assert_eq!(code(&md), 1);
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(
        md.contains("| benchmark | metric | base | head | change | verdict |"),
        "{md}"
    );
    assert!(md.contains("|:--|:--|--:|--:|--:|:--|"), "{md}");
    assert!(
        md.contains("| bench\\_a | allocations | 100 | 110 | +10.00% | ❌ **regressed** |"),
        "{md}"
    );
    assert!(
        md.contains("| bench\\_a | bytes | 10.7 KiB | 10.7 KiB | 0.00% | unchanged |"),
        "{md}"
    );
    assert!(
        md.contains("❌ **1 benchmark regressed (1 figure beyond +3% growth"),
        "{md}"
    );
}

#[test]
fn growth_from_zero_is_a_regression_and_json_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    // Base: no heap at all (one mapping). Head: two allocations whose byte sum, 2^61 + 2, is
    // not representable in an f64: the JSON must carry it exactly.
    let map = Event::new(
        5,
        7,
        7,
        EventKind::Mmap {
            addr: 0x7000_0000,
            size: 4096,
        },
    );
    let base = write(&dir.path().join("b.memtrack"), Some("huge"), &[map], 0);
    let big = (1u64 << 60) + 1;
    let head_events = [
        map,
        Event::new(
            6,
            7,
            7,
            EventKind::Malloc {
                addr: 0x10,
                size: big,
            },
        ),
        Event::new(
            7,
            7,
            7,
            EventKind::Malloc {
                addr: 0x20,
                size: big,
            },
        ),
    ];
    let head = write(
        &dir.path().join("h.memtrack"),
        Some("huge"),
        &head_events,
        0,
    );
    let out = memtrack(&[
        "compare",
        s(&base),
        s(&head),
        "--format",
        "json",
        "--threshold",
        "1000%",
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["threshold"], "1000%");
    assert_eq!(v["threshold_ppm"], 10_000_000);
    assert_eq!(v["regressions"], 3);
    let rows = v["rows"].as_array().unwrap();
    let got: Vec<(&str, u64, u64, &str)> = rows
        .iter()
        .map(|r| {
            assert!(
                r["change_percent"].is_null(),
                "growth from 0 has no percentage: {r}"
            );
            (
                r["metric"].as_str().unwrap(),
                r["base"].as_u64().unwrap(),
                r["head"].as_u64().unwrap(),
                r["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("allocations", 0, 2, "regressed"),
            ("bytes", 0, (1u64 << 61) + 2, "regressed"),
            ("peak", 0, (1u64 << 61) + 2, "regressed"),
        ]
    );
    assert_eq!(v["added"], serde_json::json!([]));
    assert_eq!(v["removed"], serde_json::json!([]));
}

/// A benchmark with `n` pairs of 64-byte blocks in `dir`, named by its metadata or, with
/// `name` = None, by its file stem.
fn bench(dir: &Path, file: &str, name: Option<&str>, n: u64) {
    write(&dir.join(file), name, &alloc_free_pairs(n, 64), 0);
}

#[test]
fn directories_match_by_name_and_list_added_and_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, head) = (tmp.path().join("base"), tmp.path().join("head"));
    std::fs::create_dir_all(&base).unwrap();
    std::fs::create_dir_all(&head).unwrap();
    // Matched by metadata name though the files are named differently.
    bench(&base, "x1.memtrack", Some("parse"), 1_000);
    bench(&head, "y9.memtrack", Some("parse"), 1_020);
    // No name in the metadata: the file stem names it.
    bench(&base, "render.memtrack", None, 50);
    bench(&head, "render.memtrack", None, 40);
    bench(&base, "old.memtrack", Some("old_bench"), 10);
    bench(&head, "new.memtrack", Some("new_bench"), 10);
    // Not an artifact by name: ignored.
    std::fs::write(head.join("notes.txt"), "ignore me").unwrap();

    let out = memtrack(&[
        "compare",
        s(&base),
        s(&head),
        "--format",
        "json",
        "--metric",
        "allocations",
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows: Vec<(String, u64, u64, String)> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["benchmark"].as_str().unwrap().to_string(),
                r["base"].as_u64().unwrap(),
                r["head"].as_u64().unwrap(),
                r["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "parse".to_string(),
                1_000,
                1_020,
                "within_threshold".to_string()
            ),
            ("render".to_string(), 50, 40, "improved".to_string()),
        ]
    );
    assert_eq!(v["rows"][0]["change_percent"], 2.0);
    assert_eq!(v["added"][0]["benchmark"], "new_bench");
    assert_eq!(v["removed"][0]["benchmark"], "old_bench");
    assert_eq!(
        (
            v["added"].as_array().unwrap().len(),
            v["removed"].as_array().unwrap().len()
        ),
        (1, 1)
    );

    let table = memtrack(&["compare", s(&base), s(&head)]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("added: new_bench ("), "{table}");
    assert!(table.contains("removed: old_bench ("), "{table}");
    let md = memtrack(&["compare", s(&base), s(&head), "--format", "markdown"]);
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(md.contains("**Added (only in head):** new\\_bench"), "{md}");
    assert!(
        md.contains("**Removed (only in base):** old\\_bench"),
        "{md}"
    );

    // Two artifacts of one name on one side are ambiguous.
    bench(&head, "dup.memtrack", Some("parse"), 3);
    let dup = memtrack(&["compare", s(&base), s(&head)]);
    assert_eq!(code(&dup), 2, "{}", text(&dup));
    assert!(
        text(&dup).contains("both hold benchmark \"parse\""),
        "{}",
        text(&dup)
    );
}

#[test]
fn lossy_incomplete_and_corrupt_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        &dir.path().join("good.memtrack"),
        Some("b"),
        &alloc_free_pairs(10, 8),
        0,
    );
    let lossy = write(
        &dir.path().join("lossy.memtrack"),
        Some("b"),
        &alloc_free_pairs(10, 8),
        3,
    );
    for args in [[s(&good), s(&lossy)], [s(&lossy), s(&good)]] {
        let out = memtrack(&["compare", args[0], args[1]]);
        assert_eq!(code(&out), 2, "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}: 3 events were lost", lossy.display())),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "no table from refused inputs");
    }

    // Without its trailer (the writer was killed): recovered, hence refused.
    let cut = dir.path().join("cut.memtrack");
    let bytes = std::fs::read(synth(&dir.path().join("s.memtrack"), 100_000, 1)).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 16]).unwrap();
    let out = memtrack(&["compare", s(&good), s(&cut)]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("{}: the artifact is incomplete", cut.display())),
        "{}",
        text(&out)
    );
    // The same gate refuses it for a differential flame graph, in the same words but the verb.
    let why = |out: &std::process::Output, verb: &str| {
        let t = text(out);
        let at = t
            .find(&format!("{}: ", cut.display()))
            .expect("the file is named");
        let line = t[at..].lines().next().unwrap().to_string();
        assert!(
            line.contains(&format!("so it cannot be {verb}; record it again")),
            "{t}"
        );
        line.replace(verb, "VERB")
    };
    let svg = dir.path().join("diff.svg");
    let diff = memtrack(&["flamegraph", "--diff", s(&good), s(&cut), "-o", s(&svg)]);
    assert_eq!(code(&diff), 2, "{}", text(&diff));
    assert_eq!(why(&out, "compared"), why(&diff, "diffed"));

    // A damaged byte in the middle of the frames: refused with the frame named.
    let bad = dir.path().join("bad.memtrack");
    let mut damaged = bytes.clone();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x55;
    std::fs::write(&bad, &damaged).unwrap();
    let out = memtrack(&["compare", s(&bad), s(&good)]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("{}: corrupt frame", bad.display())),
        "{}",
        text(&out)
    );

    // Not an artifact, a missing path, and a bad threshold.
    let junk = dir.path().join("junk.memtrack");
    std::fs::write(&junk, b"hello").unwrap();
    let out = memtrack(&["compare", s(&junk), s(&good)]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("not a memtrack artifact"),
        "{}",
        text(&out)
    );
    let out = memtrack(&["compare", s(&dir.path().join("nope")), s(&good)]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let out = memtrack(&["compare", s(&good), s(&good), "--threshold", "lots"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("invalid threshold"), "{}", text(&out));
    // Every refused input is reported, not just the first.
    let out = memtrack(&["compare", s(&lossy), s(&cut)]);
    assert_eq!(code(&out), 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lost") && err.contains("incomplete") && err.contains("2 input problems"),
        "{err}"
    );
}

/// `n` alloc/free pairs of 64 B written as a criterion Profiler would: with `iterations`.
fn profiled(dir: &Path, file: &str, pairs: u64, iterations: Option<u64>) -> std::path::PathBuf {
    use memtrack::{
        artifact::Backend, artifact::Metadata, encode::Encoder, encode::EncoderOptions,
    };
    let path = dir.join(file);
    let meta = Metadata::now(7, Backend::Other).with_name("parse");
    let f = std::fs::File::create(&path).unwrap();
    let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
    enc.extend(alloc_free_pairs(pairs, 64)).unwrap();
    if let Some(n) = iterations {
        enc.set_iterations(n);
    }
    enc.finish(0).unwrap();
    path
}

/// The same code run 480 then 300 times is unchanged per iteration, and
/// `show` says so; a per-iteration artifact and plain totals are refused, naming both.
#[test]
fn profiler_artifacts_compare_per_iteration() {
    let dir = tempfile::tempdir().unwrap();
    let base = profiled(dir.path(), "base.memtrack", 480, Some(480));
    let head = profiled(dir.path(), "head.memtrack", 300, Some(300));
    let out = memtrack(&["compare", s(&base), s(&head), "--threshold", "0%"]);
    let table = text(&out);
    assert_eq!(code(&out), 0, "{table}");
    assert!(
        row(&table, "parse", "allocations").contains("1.00/iter"),
        "{table}"
    );
    for metric in ["allocations", "bytes", "peak"] {
        assert!(
            row(&table, "parse", metric).ends_with("unchanged"),
            "{table}"
        );
    }
    let json = memtrack(&["compare", s(&base), s(&head), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["rows"][1]["head_per_iteration"], 64.0);
    assert_eq!(v["rows"][1]["head_iterations"], 300);
    assert_eq!(v["rows"][1]["head"], 300 * 64);

    let show = text(&memtrack(&["show", s(&head)]));
    assert!(
        show.contains("  per iteration 1.00 allocations, 64.00 B allocated (over 300 iterations"),
        "{show}"
    );
    let show = memtrack(&["show", "--json", s(&head)]);
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    let version = format!("1.{}", memtrack::artifact::VERSION_MINOR);
    assert_eq!(
        (v["iterations"].as_u64(), v["format_version"].as_str()),
        (Some(300), Some(version.as_str()))
    );
    assert_eq!(v["per_iteration"]["bytes_allocated"], 64.0);

    let plain = profiled(dir.path(), "plain.memtrack", 300, None);
    let out = memtrack(&["compare", s(&base), s(&plain)]);
    let err = text(&out);
    assert_eq!(code(&out), 2, "{err}");
    assert!(
        err.contains("base.memtrack) holds per-iteration figures (480 iterations)"),
        "{err}"
    );
    assert!(
        err.contains("plain.memtrack) plain totals (no iteration count)"),
        "{err}"
    );
}

/// `--threshold 0.05` could mean 0.05 % or 5 % (a gate 100× apart); a
/// bare number is a usage error showing both readings, and every output format states the
/// threshold it gated on.
#[test]
fn threshold_needs_its_percent_sign_and_is_printed_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let a = synth(&dir.path().join("a.memtrack"), 10_000, 3);
    let out = memtrack(&["compare", s(&a), s(&a), "--threshold", "0.05"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the % sign is required")
            && err.contains("0.05% (growth of 0.05%)")
            && err.contains("5% (a fraction of 0.05)"),
        "{err}"
    );
    for (format, expect) in [
        (
            "table",
            "no benchmark regressed (no figure beyond +0.05% growth",
        ),
        (
            "markdown",
            "no benchmark regressed (no figure beyond +0.05% growth",
        ),
        ("json", "\"threshold\": \"0.05%\""),
    ] {
        let out = memtrack(&[
            "compare",
            s(&a),
            s(&a),
            "--threshold",
            "0.05%",
            "--format",
            format,
        ]);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(text(&out).contains(expect), "{format}: {}", text(&out));
    }
}

/// Two sides with no benchmark in common: nothing was compared, so nothing passed: exit 2,
/// naming what each side holds.
#[test]
fn a_comparison_of_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (side, name) in [(&a, "one"), (&b, "two")] {
        std::fs::create_dir_all(side).unwrap();
        write(
            &side.join(format!("{name}.memtrack")),
            Some(name),
            &alloc_free_pairs(3, 8),
            0,
        );
    }
    let out = memtrack(&["compare", s(&a), s(&b)]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "memtrack: error: nothing to compare: no benchmark is on both sides (base {}: \
             \"one\"; head {}: \"two\"); compare recordings of the same benchmarks\n",
            a.display(),
            b.display()
        )
    );
}

/// A benchmark name with control characters reaches stderr escaped too: here in the refusal
/// of per-iteration figures against plain totals, which names the benchmark.
#[test]
fn names_in_errors_reach_the_terminal_escaped() {
    use memtrack::{
        artifact::Backend, artifact::Metadata, encode::Encoder, encode::EncoderOptions,
    };
    let dir = tempfile::tempdir().unwrap();
    let name = "evil\u{1b}[2J\u{7}";
    let mut paths = Vec::new();
    for (file, iterations) in [("base.memtrack", Some(10)), ("head.memtrack", None)] {
        let path = dir.path().join(file);
        let meta = Metadata::now(7, Backend::Other).with_name(name);
        let f = std::fs::File::create(&path).unwrap();
        let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
        enc.extend(alloc_free_pairs(10, 64)).unwrap();
        if let Some(n) = iterations {
            enc.set_iterations(n);
        }
        enc.finish(0).unwrap();
        paths.push(path);
    }
    let out = memtrack(&["compare", s(&paths[0]), s(&paths[1])]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.chars().any(|c| c.is_control() && c != '\n'),
        "{stderr:?}"
    );
    assert!(
        stderr.starts_with("memtrack: error: evil\\u{1b}[2J\\u{7}: the base ("),
        "{stderr}"
    );
}
