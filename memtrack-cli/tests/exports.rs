//! `memtrack flamegraph` and `memtrack export`, each output read by an independent reader and
//! checked against `memtrack show --json`'s totals:
//! - DHAT JSON: its documented fields, the program points' sums, and loaded by Valgrind's own
//!   viewer (dh_view.js run by node, `readers/dh_view_load.js`);
//! - DHAT JSON and the flame graph SVG in the browser users open them in: headless Chromium
//!   driven through its DevTools protocol (`readers/chromium.js`), Valgrind's `dh_view.html`
//!   loading the export through its file input and showing `show`'s totals, inferno's script
//!   searching and showing a frame's tooltip without an error;
//! - pprof: decoded by Python's protobuf package from pprof's field numbers
//!   (`readers/pprof_decode.py`), not by memtrack's encoder, mapping 1 (pprof's main binary)
//!   the recorded executable with the build id `readelf` reads;
//! - folded: lines summing to the metric;
//! - Firefox: the processed format's required fields and tables, the allocation samples'
//!   sizes summing to the bytes allocated (positive) and to the live bytes at the end (all);
//! - SVG: well-formed XML (roxmltree), titled, frames coloured by module; the differential
//!   flame graph (`flamegraph --diff`) with the grown site's frame red and the others white.
//!
//! Inputs: `memtrack synth --stacks`, and the C fixture with a known call chain (`chain.c`),
//! built and run for real, whose printed return addresses make the stacks of a recording of
//! its 6 blocks of 4,321 bytes: its exports must name main → chain_outer → chain_middle with
//! their lines; and a `memtrack record` of it by the eBPF tracker (`chain_recorded`), whose
//! exports must name main → chain_outer → chain_middle → chain_inner with the counts the
//! fixture declares.
//!
//! `harness = false` (memtrack-test-support's runner): a test whose reader (node, chromium,
//! python3's protobuf, valgrind's viewer, a C compiler) is missing is reported as ignored with
//! what to install.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{memtrack, s, svg_doc, text};
use memtrack::{
    artifact::Backend, artifact::Metadata, encode::Encoder, encode::EncoderOptions, event::Event,
    event::EventKind, stack::Frame, stack::Module, stack::ModuleId, stack::Stack, stack::StackId,
};
use memtrack_test_support::fixtures::{self, line_of};
use memtrack_test_support::{Need, Trial, requires, test};
use serde_json::Value;

const DH_VIEW: &str = "/usr/libexec/valgrind/dh_view.js";
const NODE: &[Need] = &[
    Need::Tool("node"),
    Need::File(DH_VIEW, "apt-get install valgrind"),
];
/// Valgrind's DHAT viewer, the page users open.
const DH_VIEW_HTML: &str = "/usr/libexec/valgrind/dh_view.html";
const CHROMIUM_DHAT: &[Need] = &[
    Need::Tool("node"),
    Need::Tool("chromium"),
    Need::File(DH_VIEW_HTML, "apt-get install valgrind"),
];
const CHROMIUM_CC: &[Need] = &[Need::Tool("node"), Need::Tool("chromium"), Need::Tool("cc")];
const PPROF_RECORDED: &[Need] = &[
    Need::Tool("cc"),
    Need::Tool("readelf"),
    Need::Tool("python3"),
    Need::Python("google.protobuf", "python3 -m pip install protobuf"),
    memtrack_test_support::TRACKER,
];
const PROTOBUF: &[Need] = &[
    Need::Tool("python3"),
    Need::Python("google.protobuf", "python3 -m pip install protobuf"),
];

fn reader(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/readers")
        .join(name)
}

/// A synth recording with stacks (several frames of the file: 32,768 events each), and
/// `show --json` of it.
fn synth_stacks(dir: &Path) -> (PathBuf, Value) {
    let path = dir.join("synth.memtrack");
    let out = memtrack(&[
        "synth",
        "--events",
        "80000",
        "--seed",
        "7",
        "--stacks",
        "-o",
        s(&path),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    (path.clone(), show_json(&path))
}

fn show_json(path: &Path) -> Value {
    let out = memtrack(&["show", s(path), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `memtrack export` and returns the output's path.
fn export(input: &Path, format: &str, extra: &[&str]) -> PathBuf {
    let output = input.with_extension(format);
    let mut args = vec!["export", s(input), "--format", format, "-o", s(&output)];
    args.extend_from_slice(extra);
    let out = memtrack(&args);
    assert!(out.status.success(), "{}", text(&out));
    output
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

/// The fields dh_view.js checks (`buildTree`, `checkPP`) and those valgrind's dh_main.c
/// writes in heap mode with block lifetimes.
fn check_dhat_fields(d: &Value) {
    for f in [
        "dhatFileVersion",
        "mode",
        "verb",
        "bklt",
        "bkacc",
        "tu",
        "Mtu",
        "tuth",
        "cmd",
        "pid",
        "te",
        "tg",
        "pps",
        "ftbl",
    ] {
        assert!(d.get(f).is_some(), "no {f} in the DHAT file");
    }
    assert_eq!(d["dhatFileVersion"], 2);
    assert_eq!(d["mode"], "heap");
    assert_eq!(d["bklt"], true);
    assert_eq!(d["ftbl"][0], "[root]");
    let frames = d["ftbl"].as_array().unwrap().len() as u64;
    assert!(u(d, "tg") <= u(d, "te"));
    for pp in d["pps"].as_array().unwrap() {
        for f in ["tb", "tbk", "tl", "mb", "mbk", "gb", "gbk", "eb", "ebk"] {
            u(pp, f);
        }
        // Live at once: never more than allocated, at least what was live at any instant.
        assert!(
            u(pp, "mbk") <= u(pp, "tbk") && u(pp, "mb") <= u(pp, "tb"),
            "{pp}"
        );
        assert!(
            u(pp, "gb") <= u(pp, "mb") && u(pp, "eb") <= u(pp, "mb"),
            "{pp}"
        );
        let fs = pp["fs"].as_array().unwrap();
        assert!(!fs.is_empty());
        assert!(
            fs.iter()
                .all(|i| (1..frames).contains(&i.as_u64().unwrap())),
            "{pp}"
        );
    }
}

/// Sums `field` over the program points.
fn pp_sum(d: &Value, field: &str) -> u64 {
    d["pps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u(p, field))
        .sum()
}

fn dhat_synth() {
    let dir = tempfile::tempdir().unwrap();
    let (input, show) = synth_stacks(dir.path());
    let d = json_file(&export(&input, "dhat", &[]));
    check_dhat_fields(&d);
    assert_eq!(pp_sum(&d, "tb"), u(&show, "bytes_allocated"));
    assert_eq!(pp_sum(&d, "tbk"), u(&show, "allocations"));
    assert_eq!(pp_sum(&d, "gb"), u(&show, "peak_live_bytes"));
    assert_eq!(pp_sum(&d, "eb"), u(&show, "live_bytes_at_end"));
    assert_eq!(pp_sum(&d, "ebk"), u(&show, "live_blocks_at_end"));
}

/// Valgrind's own viewer builds its tree from the export, and its totals are show's.
fn dhat_loads_in_dh_view() {
    let dir = tempfile::tempdir().unwrap();
    let (input, show) = synth_stacks(dir.path());
    let path = export(&input, "dhat", &[]);
    let out = Command::new("node")
        .arg(reader("dh_view_load.js"))
        .arg(DH_VIEW)
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let root: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(u(&root, "tb"), u(&show, "bytes_allocated"), "{root}");
    assert_eq!(u(&root, "tbk"), u(&show, "allocations"), "{root}");
    assert_eq!(u(&root, "gb"), u(&show, "peak_live_bytes"), "{root}");
    assert_eq!(u(&root, "eb"), u(&show, "live_bytes_at_end"), "{root}");
    assert_eq!(u(&root, "ebk"), u(&show, "live_blocks_at_end"), "{root}");
}

fn pprof_decoded(path: &Path) -> Value {
    let out = Command::new("python3")
        .arg(reader("pprof_decode.py"))
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn pprof_synth() {
    let dir = tempfile::tempdir().unwrap();
    let (input, show) = synth_stacks(dir.path());
    let p = pprof_decoded(&export(&input, "pprof", &[]));
    assert_eq!(
        p["sample_types"],
        serde_json::json!([
            ["alloc_objects", "count"],
            ["alloc_space", "bytes"],
            ["inuse_objects", "count"],
            ["inuse_space", "bytes"]
        ])
    );
    assert_eq!(p["default_sample_type"], "inuse_space");
    assert_eq!(p["period_type"], serde_json::json!(["space", "bytes"]));
    let sums: Vec<u64> = p["sums"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(
        sums,
        [
            u(&show, "allocations"),
            u(&show, "bytes_allocated"),
            u(&show, "live_blocks_at_end"),
            u(&show, "live_bytes_at_end")
        ]
    );
}

/// The folded lines: `frames weight`, distinct stacks, the weights summing to each metric.
fn folded_synth() {
    let dir = tempfile::tempdir().unwrap();
    let (input, show) = synth_stacks(dir.path());
    for (metric, total) in [
        ("bytes", "bytes_allocated"),
        ("allocations", "allocations"),
        ("peak", "peak_live_bytes"),
        ("leaked", "live_bytes_at_end"),
    ] {
        let path = export(&input, "folded", &["--metric", metric]);
        let body = std::fs::read_to_string(&path).unwrap();
        let mut stacks = std::collections::HashSet::new();
        let mut sum = 0;
        for line in body.lines() {
            let (frames, w) = line.rsplit_once(' ').unwrap();
            let w: u64 = w.parse().unwrap();
            assert!(w > 0, "{line}");
            assert!(frames.split(';').all(|f| !f.is_empty()), "{line}");
            assert!(stacks.insert(frames.to_string()), "repeated stack: {line}");
            sum += w;
        }
        assert_eq!(sum, u(&show, total), "--metric {metric}");
    }
}

/// The processed format's fields (the Firefox Profiler's `processed-profile` schema: meta,
/// libs, threads with their tables) and the allocation samples.
fn firefox_synth() {
    let dir = tempfile::tempdir().unwrap();
    let (input, show) = synth_stacks(dir.path());
    assert!(u(&show, "frames") > 1);
    let p = json_file(&export(&input, "firefox", &[]));
    for f in ["meta", "libs", "threads", "pages", "counters"] {
        assert!(p.get(f).is_some(), "no {f}");
    }
    for f in [
        "version",
        "preprocessedProfileVersion",
        "interval",
        "startTime",
        "product",
        "categories",
    ] {
        assert!(p["meta"].get(f).is_some(), "no meta.{f}");
    }
    let (mut plus, mut all, mut samples) = (0i64, 0i64, 0);
    for t in p["threads"].as_array().unwrap() {
        for f in [
            "samples",
            "stackTable",
            "frameTable",
            "funcTable",
            "stringArray",
            "name",
            "pid",
            "tid",
        ] {
            assert!(t.get(f).is_some(), "no thread.{f}");
        }
        let stacks = u(&t["stackTable"], "length");
        let frames = u(&t["frameTable"], "length");
        let funcs = u(&t["funcTable"], "length");
        let strings = t["stringArray"].as_array().unwrap().len() as u64;
        for (i, prefix) in t["stackTable"]["prefix"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            if let Some(p) = prefix.as_u64() {
                assert!(p < i as u64, "a stack's prefix after it");
            }
        }
        assert!(
            t["stackTable"]["frame"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f.as_u64().unwrap() < frames)
        );
        assert!(
            t["frameTable"]["func"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f.as_u64().unwrap() < funcs)
        );
        assert!(
            t["funcTable"]["name"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n.as_u64().unwrap() < strings)
        );
        let Some(na) = t.get("nativeAllocations") else {
            continue;
        };
        let n = u(na, "length") as usize;
        assert_eq!(na["weightType"], "bytes");
        for col in ["time", "weight", "stack", "memoryAddress", "threadId"] {
            assert_eq!(
                na[col].as_array().unwrap().len(),
                n,
                "nativeAllocations.{col}"
            );
        }
        assert!(
            na["stack"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s.as_u64().is_none_or(|s| s < stacks))
        );
        for w in na["weight"].as_array().unwrap() {
            let w = w.as_i64().unwrap();
            plus += w.max(0);
            all += w;
        }
        samples += n;
    }
    // One sample per allocation, one per free of a block seen allocated (synth has no exec
    // nor replaced block).
    assert_eq!(
        samples as u64,
        u(&show, "allocations") + u(&show, "frees") - u(&show, "unmatched_frees")
    );
    assert_eq!(plus as u64, u(&show, "bytes_allocated"));
    assert_eq!(all as u64, u(&show, "live_bytes_at_end"));
}

/// The flame graph: well-formed XML, titled with the benchmark's name and the metric, one box
/// per frame with its tooltip.
fn flamegraph_synth() {
    let dir = tempfile::tempdir().unwrap();
    let (input, show) = synth_stacks(dir.path());
    for (metric, label) in [
        ("bytes", "bytes allocated"),
        ("leaked", "bytes live at the end"),
    ] {
        let svg = dir.path().join(format!("{metric}.svg"));
        let out = memtrack(&["flamegraph", s(&input), "-o", s(&svg), "--metric", metric]);
        assert!(out.status.success(), "{}", text(&out));
        let body = std::fs::read_to_string(&svg).unwrap();
        let doc = svg_doc(&body);
        let name = show["metadata"]["name"].as_str().unwrap().to_string();
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        assert!(
            texts.iter().any(|t| t.contains(&name) && t.contains(label)),
            "no title with {name:?} and {label:?}"
        );
        // The root box holds the whole metric.
        let total = u(
            &show,
            if metric == "bytes" {
                "bytes_allocated"
            } else {
                "live_bytes_at_end"
            },
        );
        let all = format!("all ({} bytes, 100%)", group(total));
        assert!(texts.iter().any(|t| *t == all), "no {all:?}");
    }
}

/// `n` with inferno's thousands separators.
fn group(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A recording without stacks is refused with the reason and the way to get them; no output
/// is left behind.
fn refused_without_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let input = common::synth(&dir.path().join("plain.memtrack"), 5000, 1);
    let svg = dir.path().join("f.svg");
    for args in [
        vec!["flamegraph", s(&input), "-o", s(&svg)],
        vec!["export", s(&input), "--format", "pprof", "-o", s(&svg)],
    ] {
        let out = memtrack(&args);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let t = text(&out);
        assert!(t.contains("no call stacks in this recording"), "{t}");
        assert!(t.contains("without --stacks"), "{t}");
        assert!(!svg.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

/// A recording of the C fixture's real call chain: its 6 blocks of 4,321 bytes allocated
/// through chain_middle (called from chain_outer, from main), the stack made of the return
/// addresses the program printed.
fn chain_recording(dir: &Path) -> PathBuf {
    let exe = fixtures::c_chain(dir, "chain", true, &["-Wl,--build-id=none"]);
    chain_artifact(&exe, &dir.join("chain.memtrack"), &[(0, 6, 4321)])
}

/// An artifact at `artifact` of allocations made with stacks of `exe`'s printed return
/// addresses: for each `(skip, count, bytes)`, `count` blocks of `bytes` under the stack
/// main → chain_outer → chain_middle without its `skip` innermost frames (each site its own
/// stack), each block freed 5 µs later but the very last one.
fn chain_artifact(exe: &Path, artifact: &Path, sites: &[(usize, u64, u64)]) -> PathBuf {
    let printed = fixtures::run_printed(exe, &["--print".as_ref()]);
    let frames: Vec<Frame> = ["ret_chain_middle", "ret_chain_outer", "ret_main"]
        .iter()
        .map(|name| {
            let (path, offset) = printed.file_offset(printed.addr(name));
            assert_eq!(path, exe);
            Frame {
                module: ModuleId(1),
                offset,
            }
        })
        .collect();
    let meta = Metadata::now(1, Backend::Ebpf);
    let f = std::fs::File::create(artifact).unwrap();
    let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
    enc.define_module(
        ModuleId(1),
        Module {
            path: s(exe).to_string(),
            build_id: None,
        },
    )
    .unwrap();
    let total: u64 = sites.iter().map(|(_, n, _)| n).sum();
    let mut i = 0u64;
    for (k, &(skip, count, bytes)) in sites.iter().enumerate() {
        let id = StackId(k as u32 + 1);
        enc.define_stack(
            id,
            Stack {
                frames: frames[skip..].to_vec(),
                truncated: false,
            },
        )
        .unwrap();
        for _ in 0..count {
            let addr = 0x1000 + i * 0x2000;
            enc.push(
                Event::new(10_000 * i, 1, 1, EventKind::Malloc { addr, size: bytes })
                    .with_stack(id),
            )
            .unwrap();
            // Each block lives 5 µs, but the last one, never freed.
            if i + 1 < total {
                enc.push(Event::new(
                    10_000 * i + 5_000,
                    1,
                    1,
                    EventKind::Free { addr },
                ))
                .unwrap();
            }
            i += 1;
        }
    }
    enc.finish(0).unwrap();
    artifact.to_path_buf()
}

const CHAIN: [&str; 3] = ["main", "chain_outer", "chain_middle"];

/// The fixture's exports name its functions, root first in folded stacks and the flame graph
/// (coloured as the program's code), leaf first with file and line in pprof and DHAT.
fn chain_folded_and_flamegraph() {
    let dir = tempfile::tempdir().unwrap();
    let input = chain_recording(dir.path());
    let folded = std::fs::read_to_string(export(&input, "folded", &[])).unwrap();
    assert_eq!(folded, format!("{} {}\n", CHAIN.join(";"), 6 * 4321));
    let leaked =
        std::fs::read_to_string(export(&input, "folded", &["--metric", "leaked"])).unwrap();
    assert_eq!(leaked, format!("{} 4321\n", CHAIN.join(";")));

    let svg = dir.path().join("chain.svg");
    let out = memtrack(&[
        "flamegraph",
        s(&input),
        "-o",
        s(&svg),
        "--metric",
        "allocations",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(&svg).unwrap();
    let doc = svg_doc(&body);
    for name in CHAIN {
        let tooltip = format!("{name} (6 allocations, 100.00%)");
        let g = doc
            .descendants()
            .find(|n| n.has_tag_name("title") && n.text() == Some(tooltip.as_str()))
            .unwrap_or_else(|| {
                let titles: Vec<_> = doc
                    .descendants()
                    .filter(|n| n.has_tag_name("title"))
                    .filter_map(|n| n.text())
                    .collect();
                panic!("no frame {tooltip:?} in {titles:?}")
            })
            .parent()
            .unwrap();
        let rect = g.children().find(|n| n.has_tag_name("rect")).unwrap();
        assert_eq!(rect.attribute("fill"), Some("rgb(235,110,60)"), "{name}");
    }
}

fn chain_dhat() {
    let dir = tempfile::tempdir().unwrap();
    let input = chain_recording(dir.path());
    let d = json_file(&export(&input, "dhat", &[]));
    check_dhat_fields(&d);
    let pp = &d["pps"][0];
    assert_eq!(d["pps"].as_array().unwrap().len(), 1);
    assert_eq!((u(pp, "tb"), u(pp, "tbk")), (6 * 4321, 6));
    assert_eq!((u(pp, "mb"), u(pp, "mbk")), (4321, 1));
    assert_eq!((u(pp, "eb"), u(pp, "ebk")), (4321, 1));
    // 5 blocks of 5 µs; the last one lives from 50 µs to the end, the same instant.
    assert_eq!(u(pp, "tl"), 25);
    assert_eq!((u(&d, "te"), u(&d, "tg")), (50, 0));
    let names: Vec<&str> = pp["fs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| d["ftbl"][i.as_u64().unwrap() as usize].as_str().unwrap())
        .collect();
    for (got, want) in names.iter().zip(CHAIN.iter().rev()) {
        let line = format!("{want} (");
        let end = format!("chain.c:{})", line_of("chain.c", want));
        assert!(
            got.contains(&line) && got.ends_with(&end),
            "{got} vs {want}"
        );
    }
    assert_eq!(names.len(), 3);
}

fn chain_pprof() {
    let dir = tempfile::tempdir().unwrap();
    let input = chain_recording(dir.path());
    let p = pprof_decoded(&export(&input, "pprof", &[]));
    // A recording without processes (an in-process session's): its executable is the module
    // that is not a library, its mapping first (built without a build id).
    let exe = s(&dir.path().join("chain")).to_string();
    assert_eq!(p["mappings"], serde_json::json!([[exe, ""]]));
    let samples = p["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0]["mappings"], serde_json::json!([exe, exe, exe]));
    assert_eq!(
        samples[0]["value"],
        serde_json::json!([6, 6 * 4321, 1, 4321])
    );
    let got: Vec<(String, String, u64)> = samples[0]["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|loc| {
            let lines = loc.as_array().unwrap();
            assert_eq!(lines.len(), 1, "{loc}");
            let l = &lines[0];
            (
                l[0].as_str().unwrap().to_string(),
                l[1].as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string(),
                l[2].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, String, u64)> = CHAIN
        .iter()
        .rev()
        .map(|n| {
            (
                n.to_string(),
                "chain.c".to_string(),
                line_of("chain.c", n) as u64,
            )
        })
        .collect();
    assert_eq!(got, want);
}

/// The fill of the frame whose tooltip starts with `tooltip`, as (r, g, b); fails listing
/// the tooltips when there is none or more than one.
fn fill_of(doc: &roxmltree::Document<'_>, tooltip: &str) -> (u8, u8, u8) {
    let titles: Vec<roxmltree::Node<'_, '_>> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title") && n.text().is_some_and(|t| t.starts_with(tooltip)))
        .collect();
    assert_eq!(
        titles.len(),
        1,
        "frames {tooltip:?} in {}",
        tooltips(doc).join(" | ")
    );
    let rect = titles[0]
        .parent()
        .unwrap()
        .children()
        .find(|n| n.has_tag_name("rect"))
        .unwrap();
    let fill = rect.attribute("fill").unwrap();
    let rgb: Vec<u8> = fill
        .strip_prefix("rgb(")
        .and_then(|f| f.strip_suffix(')'))
        .unwrap_or_else(|| panic!("fill {fill}"))
        .split(',')
        .map(|c| c.parse().unwrap())
        .collect();
    (rgb[0], rgb[1], rgb[2])
}

fn tooltips<'a>(doc: &'a roxmltree::Document<'_>) -> Vec<&'a str> {
    doc.descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect()
}

/// inferno's differential colours: white for no change, red (full red, equal green and blue
/// below white's) for growth, blue for shrinking.
const WHITE: (u8, u8, u8) = (250, 250, 250);
fn is_red((r, g, b): (u8, u8, u8)) -> bool {
    r == 255 && g == b && g < 250
}
fn is_blue((r, g, b): (u8, u8, u8)) -> bool {
    b == 255 && r == g && r < 250
}

/// `flamegraph --diff` of two builds of the chain fixture (-O2 and -O1: other return
/// addresses) with three sites, one per function (chain_middle: 6 blocks of 4,321 bytes,
/// chain_outer: 3 of 100, main: 2 of 50), where only chain_middle's grows (7 blocks): its
/// frame is red, every other frame (its callers, the root) white, matched across the builds by
/// function and file although no address is the same; swapped, its frame is blue.
fn flamegraph_diff_one_site_grows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let flags = ["-Wl,--build-id=none"];
    let base_exe = fixtures::c_chain(d, "chain_base", true, &flags);
    let head_exe = fixtures::c_chain(d, "chain_head", true, &[flags[0], "-O1"]);
    let offsets = |exe: &Path| -> Vec<u64> {
        let p = fixtures::run_printed(exe, &["--print".as_ref()]);
        ["ret_chain_middle", "ret_chain_outer", "ret_main"]
            .iter()
            .map(|n| p.file_offset(p.addr(n)).1)
            .collect()
    };
    let (bo, ho) = (offsets(&base_exe), offsets(&head_exe));
    assert!(
        bo.iter().zip(&ho).all(|(b, h)| b != h),
        "the builds share return addresses: {bo:x?} {ho:x?}"
    );
    let base = chain_artifact(
        &base_exe,
        &d.join("base.memtrack"),
        &[(0, 6, 4321), (1, 3, 100), (2, 2, 50)],
    );
    let head = chain_artifact(
        &head_exe,
        &d.join("head.memtrack"),
        &[(0, 7, 4321), (1, 3, 100), (2, 2, 50)],
    );
    let svg = d.join("diff.svg");
    for (metric, label, unit, head_total, grown) in [
        ("allocations", "allocations", "allocations", 12, 7),
        (
            "bytes",
            "bytes allocated",
            "bytes",
            7 * 4321 + 400,
            7 * 4321,
        ),
    ] {
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
        assert!(out.status.success(), "{}", text(&out));
        let body = std::fs::read_to_string(&svg).unwrap();
        let doc = svg_doc(&body);
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        let title = format!("base → head: {label} (differential)");
        assert!(texts.contains(&title.as_str()), "no title {title:?}");
        assert_eq!(tooltips(&doc).len(), 4, "{:?}", tooltips(&doc));
        let grown = format!("chain_middle (chain.c) ({} {unit},", group(grown));
        assert!(
            is_red(fill_of(&doc, &grown)),
            "{grown} {:?}",
            fill_of(&doc, &grown)
        );
        for same in [
            format!("all ({} {unit},", group(head_total)),
            "main (chain.c) (".to_string(),
            "chain_outer (chain.c) (".to_string(),
        ] {
            assert_eq!(fill_of(&doc, &same), WHITE, "{same}");
        }
    }
    // HEAD → BASE: the site shrinks.
    let out = memtrack(&["flamegraph", "--diff", s(&head), s(&base), "-o", s(&svg)]);
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(&svg).unwrap();
    let doc = svg_doc(&body);
    let shrunk = format!("chain_middle (chain.c) ({} bytes,", group(6 * 4321));
    assert!(
        is_blue(fill_of(&doc, &shrunk)),
        "{:?}",
        fill_of(&doc, &shrunk)
    );
    assert_eq!(fill_of(&doc, "main (chain.c) ("), WHITE);
}

/// A small artifact with call stacks (frames in a file that does not exist, of build id
/// 0x0102: named by their fallback), `lost` events lost and `unfollowed` processes not
/// followed.
fn stacks_artifact(path: &Path, lost: u64, unfollowed: u64) -> PathBuf {
    stacks_artifact_of(path, lost, unfollowed, Some(vec![1, 2]))
}

/// [`stacks_artifact`] with the module's build id `build_id`.
fn stacks_artifact_of(
    path: &Path,
    lost: u64,
    unfollowed: u64,
    build_id: Option<Vec<u8>>,
) -> PathBuf {
    let f = std::fs::File::create(path).unwrap();
    let meta = Metadata::now(1, Backend::Ebpf);
    let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
    let module = Module {
        path: "/nonexistent/libx.so".into(),
        build_id,
    };
    enc.define_module(ModuleId(1), module).unwrap();
    let frames = vec![Frame {
        module: ModuleId(1),
        offset: 0x1234,
    }];
    let stack = Stack {
        frames,
        truncated: false,
    };
    enc.define_stack(StackId(1), stack).unwrap();
    enc.push(
        Event::new(
            1_000,
            1,
            1,
            EventKind::Malloc {
                addr: 0x10,
                size: 64,
            },
        )
        .with_stack(StackId(1)),
    )
    .unwrap();
    enc.set_processes(Vec::new(), unfollowed);
    enc.finish(lost).unwrap();
    path.to_path_buf()
}

/// `flamegraph --diff` refuses, with exit code 2 (compare's) and the reason, an input without
/// call stacks, with lost events, or with processes not covered, on either side; nothing is
/// written. Two sound inputs are drawn.
fn flamegraph_diff_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = stacks_artifact(&d.join("good.memtrack"), 0, 0);
    let plain = common::synth(&d.join("plain.memtrack"), 5000, 1);
    let lost = stacks_artifact(&d.join("lost.memtrack"), 3, 0);
    let unfollowed = stacks_artifact(&d.join("unfollowed.memtrack"), 0, 1);
    let svg = d.join("diff.svg");
    for (bad, why) in [
        (&plain, "no call stacks in this recording"),
        (&lost, "3 events were lost while recording"),
        (&unfollowed, "not followed"),
    ] {
        for (base, head) in [(bad, &good), (&good, bad)] {
            let out = memtrack(&["flamegraph", "--diff", s(base), s(head), "-o", s(&svg)]);
            let t = text(&out);
            assert_eq!(out.status.code(), Some(2), "{t}");
            assert!(t.contains(s(bad)) && t.contains(why), "{t}");
            assert!(!svg.exists());
        }
    }
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 4);
    let out = memtrack(&["flamegraph", "--diff", s(&good), s(&good), "-o", s(&svg)]);
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(&svg).unwrap();
    let doc = svg_doc(&body);
    assert_eq!(fill_of(&doc, "libx.so+0x1234 ("), WHITE);
    // FILE and --diff exclude each other, and one of them is needed.
    let out = memtrack(&["flamegraph", s(&good), "--diff", s(&good), s(&good)]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = memtrack(&["flamegraph"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// `flamegraph --diff` matches frames as `compare`'s attribution does (`memtrack::symbolize::site_keys`):
/// an unnamed frame (`module+0xOFFSET`, its file gone) matches the same offset of a module of
/// the same build id (white: unchanged), never one of another build id or of a module without
/// one (the head's frame is then new, red, and the base's not drawn).
fn flamegraph_diff_unnamed_frames_match_by_build_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = stacks_artifact_of(&d.join("a.memtrack"), 0, 0, Some(vec![1, 2]));
    let same = stacks_artifact_of(&d.join("same.memtrack"), 0, 0, Some(vec![1, 2]));
    let other = stacks_artifact_of(&d.join("other.memtrack"), 0, 0, Some(vec![3, 4]));
    let none = stacks_artifact_of(&d.join("none.memtrack"), 0, 0, None);
    let svg = d.join("diff.svg");
    let draw = |base: &Path, head: &Path| {
        let out = memtrack(&["flamegraph", "--diff", s(base), s(head), "-o", s(&svg)]);
        assert!(out.status.success(), "{}", text(&out));
        (std::fs::read_to_string(&svg).unwrap(), text(&out))
    };
    let (body, t) = draw(&a, &same);
    assert!(t.contains("0 of 1 stacks changed"), "{t}");
    assert_eq!(fill_of(&svg_doc(&body), "libx.so+0x1234 ("), WHITE);
    // The same offset in another build, or in a module without a build id: not the same code.
    for (head, frame) in [
        (&other, "libx.so+0x1234 (build id 0304) ("),
        (&none, "libx.so+0x1234 (unmatched) in the head ("),
    ] {
        let (body, t) = draw(&a, head);
        assert!(t.contains("2 of 2 stacks changed"), "{t}");
        let doc = svg_doc(&body);
        assert!(
            is_red(fill_of(&doc, frame)),
            "{frame}: {}",
            tooltips(&doc).join(" | ")
        );
    }
    // Two recordings without build ids do not match each other either.
    let (_, t) = draw(&none, &none);
    assert!(t.contains("2 of 2 stacks changed"), "{t}");
}

/// `memtrack record` of the C fixture (the eBPF tracker, real stacks): its folded export and
/// flame graph name main → chain_outer → chain_middle → chain_inner with the fixture's
/// declared count and bytes ([`fixtures::C_CHAIN`]), and its DHAT export's totals equal
/// `show --json`'s.
fn chain_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    let input = dir.path().join("chain.memtrack");
    let out = memtrack(&["record", "-o", s(&input), "--", s(&exe)]);
    assert!(out.status.success(), "{}", text(&out));
    let site = fixtures::C_CHAIN;
    let chain: Vec<&str> = site.chain.iter().rev().copied().collect();
    let want = chain.join(";");
    for (metric, weight) in [
        ("allocations", site.count),
        ("bytes", site.count * site.bytes),
    ] {
        let folded =
            std::fs::read_to_string(export(&input, "folded", &["--metric", metric])).unwrap();
        let lines: Vec<&str> = folded.lines().filter(|l| l.contains(&want)).collect();
        // One stack through the chain (maybe under the C runtime's frames: _start,
        // __libc_start_main), ending at chain_inner, weighing exactly what the fixture makes.
        assert_eq!(lines.len(), 1, "{folded}");
        let (frames, w) = lines[0].rsplit_once(' ').unwrap();
        assert!(
            frames.ends_with(&format!(";{want}")) || frames == want,
            "{frames}"
        );
        assert_eq!(w, weight.to_string(), "--metric {metric}: {folded}");
    }
    let svg = dir.path().join("chain.svg");
    let out = memtrack(&[
        "flamegraph",
        s(&input),
        "-o",
        s(&svg),
        "--metric",
        "allocations",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let body = std::fs::read_to_string(&svg).unwrap();
    let doc = svg_doc(&body);
    let tips = tooltips(&doc);
    for name in chain {
        // chain_outer and below hold only the chain's blocks (main also the markers').
        let n = if name == "main" {
            2 + site.count
        } else {
            site.count
        };
        let tooltip = format!("{name} ({n} allocations,");
        assert!(
            tips.iter().any(|t| t.starts_with(&tooltip)),
            "no frame {tooltip:?} in {tips:?}"
        );
    }
    let show = show_json(&input);
    let d = json_file(&export(&input, "dhat", &[]));
    check_dhat_fields(&d);
    assert_eq!(pp_sum(&d, "tb"), u(&show, "bytes_allocated"));
    assert_eq!(pp_sum(&d, "tbk"), u(&show, "allocations"));
    assert_eq!(pp_sum(&d, "gb"), u(&show, "peak_live_bytes"));
    assert_eq!(pp_sum(&d, "eb"), u(&show, "live_bytes_at_end"));
    assert_eq!(pp_sum(&d, "ebk"), u(&show, "live_blocks_at_end"));
}

/// The GNU build id of the ELF file at `path` as `readelf -n` prints it (hex).
fn readelf_build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}", path.display()))
        .trim()
        .to_string()
}

/// `memtrack record` of the C fixture (a build id of its own, malloc's frames in libc
/// outside its stacks but libc's own allocations in libc's): in its pprof export, mapping 1,
/// the one pprof takes for the main binary (its `File:` and `Build ID:` header), is the
/// recorded executable with the build id readelf reads, every mapping has its file's build
/// id, and the function of the largest flat `alloc_space` (the first row of `pprof -top
/// -sample_index=alloc_space`) is a frame of the executable, as are the chain's.
fn pprof_main_binary_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixtures::c_chain(dir.path(), "chain", true, &[]);
    let input = dir.path().join("chain.memtrack");
    let out = memtrack(&["record", "-o", s(&input), "--", s(&exe)]);
    assert!(out.status.success(), "{}", text(&out));
    let p = pprof_decoded(&export(&input, "pprof", &[]));
    let exe = exe.canonicalize().unwrap();
    let mappings = p["mappings"].as_array().unwrap();
    assert_eq!(
        mappings[0],
        serde_json::json!([s(&exe), readelf_build_id(&exe)]),
        "{mappings:?}"
    );
    assert!(
        mappings.len() > 1,
        "libc's allocations are in its mapping: {mappings:?}"
    );
    for m in mappings {
        let file = Path::new(m[0].as_str().unwrap());
        assert_eq!(m[1].as_str().unwrap(), readelf_build_id(file), "{m}");
    }
    // pprof's flat value of a sample is its leaf's: the first line of its first location.
    let mut flat: std::collections::BTreeMap<(String, String), i64> = Default::default();
    let mut chain_in = None;
    for sample in p["samples"].as_array().unwrap() {
        let leaf = &sample["stack"][0][0];
        let module = sample["mappings"][0].as_str().unwrap().to_string();
        let name = leaf[0].as_str().unwrap().to_string();
        if name == fixtures::C_CHAIN.chain[0] {
            chain_in = Some(module.clone());
        }
        *flat.entry((name, module)).or_default() += sample["value"][1].as_i64().unwrap();
    }
    let ((top, module), _) = flat.iter().max_by_key(|(_, v)| **v).unwrap();
    assert_eq!(
        module,
        s(&exe),
        "-top starts from {top} in {module}: {flat:?}"
    );
    assert_eq!(chain_in.as_deref(), Some(s(&exe)), "{flat:?}");
}

/// The numbers after `label` on the root program point's line of DHAT's viewer's text (`PP
/// 1/1`): `Total:     1,234 bytes (100%, …) in 56 blocks (…)` gives [1234, 100, …, 56, …].
fn dh_view_numbers(page: &str, label: &str) -> Vec<u64> {
    let root = page
        .split_once("PP 1/1")
        .unwrap_or_else(|| panic!("the viewer shows no tree:\n{page}"))
        .1;
    let line = root
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in the viewer's root:\n{root}"));
    line.split(|c: char| !(c.is_ascii_digit() || c == ',' || c == '.'))
        .filter(|w| w.contains(|c: char| c.is_ascii_digit()) && !w.contains('.'))
        .map(|w| w.replace(',', "").parse().unwrap())
        .collect()
}

/// Valgrind's viewer page in Chromium, the export chosen in its file input: it shows the tree
/// of the export, and at its root `show --json`'s totals, without an error.
fn dhat_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let (input, show) = synth_stacks(dir.path());
    let path = export(&input, "dhat", &[]);
    let out = Command::new("node")
        .arg(reader("chromium.js"))
        .args(["dhat", DH_VIEW_HTML])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    let page = v["text"].as_str().unwrap();
    // Total: bytes (100%, rate) in blocks (100%, rate).
    let total = dh_view_numbers(page, "Total:");
    assert_eq!(
        (total[0], total[1], total[2], total[3]),
        (
            u(&show, "bytes_allocated"),
            100,
            u(&show, "allocations"),
            100
        ),
        "{total:?}"
    );
    let gmax = dh_view_numbers(page, "At t-gmax:");
    assert_eq!(gmax[0], u(&show, "peak_live_bytes"), "{gmax:?}");
    let end = dh_view_numbers(page, "At t-end:");
    assert_eq!(
        (end[0], end[2]),
        (
            u(&show, "live_bytes_at_end"),
            u(&show, "live_blocks_at_end")
        ),
        "{end:?}"
    );
}

/// The flame graph in Chromium, as a user works it: its script runs without an error, the
/// Search button's prompt answered `chain_middle` highlights that frame (only) and reports the
/// share it matched, and the mouse over `chain_outer` shows its tooltip in the details line, with
/// the numbers of the three sites the artifact holds (chain_middle: 6 × 4,321 bytes,
/// chain_outer: 3 × 100 more, main: 2 × 50 more).
fn flamegraph_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let exe = fixtures::c_chain(d, "chain", true, &["-Wl,--build-id=none"]);
    let input = chain_artifact(
        &exe,
        &d.join("sites.memtrack"),
        &[(0, 6, 4321), (1, 3, 100), (2, 2, 50)],
    );
    let svg = d.join("flame.svg");
    let out = memtrack(&["flamegraph", s(&input), "-o", s(&svg)]);
    assert!(out.status.success(), "{}", text(&out));
    let out = Command::new("node")
        .arg(reader("chromium.js"))
        .arg("flamegraph")
        .arg(&svg)
        .args(["chain_middle", "chain_outer ("])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    let (middle, outer, all) = (6 * 4321, 6 * 4321 + 3 * 100, 6 * 4321 + 3 * 100 + 2 * 50);
    let matched = format!("Matched: {:.1}%", 100.0 * middle as f64 / all as f64);
    assert_eq!(v["matched"], matched.as_str(), "{v}");
    // inferno's search colour on the matched frame, set by the page's script; the others
    // keep the program's colour.
    assert_eq!(v["fills"]["chain_middle"], "rgb(230,0,230)", "{v}");
    assert_eq!(v["fills"]["chain_outer"], "rgb(235,110,60)", "{v}");
    let details = format!(
        "Function: chain_outer ({} bytes, {:.2}%)",
        group(outer),
        100.0 * outer as f64 / all as f64
    );
    assert_eq!(v["details"], details.as_str(), "{v}");
}

fn main() {
    let cc: &'static [Need] = &[Need::Tool("cc")];
    let cc_tracker: &'static [Need] = &[Need::Tool("cc"), memtrack_test_support::TRACKER];
    let cc_python: &'static [Need] = &[
        Need::Tool("cc"),
        Need::Tool("python3"),
        Need::Python("google.protobuf", "python3 -m pip install protobuf"),
    ];
    let trials: Vec<Trial> = vec![
        test("dhat_synth", dhat_synth),
        requires("dhat_loads_in_dh_view", NODE, dhat_loads_in_dh_view),
        requires("pprof_synth", PROTOBUF, pprof_synth),
        test("folded_synth", folded_synth),
        test("firefox_synth", firefox_synth),
        test("flamegraph_synth", flamegraph_synth),
        test("refused_without_stacks", refused_without_stacks),
        requires(
            "chain_folded_and_flamegraph",
            cc,
            chain_folded_and_flamegraph,
        ),
        requires("chain_dhat", cc, chain_dhat),
        requires("chain_pprof", cc_python, chain_pprof),
        requires(
            "flamegraph_diff_one_site_grows",
            cc,
            flamegraph_diff_one_site_grows,
        ),
        test("flamegraph_diff_refusals", flamegraph_diff_refusals),
        test(
            "flamegraph_diff_unnamed_frames_match_by_build_id",
            flamegraph_diff_unnamed_frames_match_by_build_id,
        ),
        requires("chain_recorded", cc_tracker, chain_recorded),
        requires(
            "pprof_main_binary_recorded",
            PPROF_RECORDED,
            pprof_main_binary_recorded,
        ),
        requires("dhat_in_chromium", CHROMIUM_DHAT, dhat_in_chromium),
        requires(
            "flamegraph_in_chromium",
            CHROMIUM_CC,
            flamegraph_in_chromium,
        ),
    ];
    memtrack_test_support::run(trials);
}
