//! The exact bytes `show` (text, `--threads`, `--json`) and `compare` (table, markdown, json)
//! print for fixed inputs, against tests/golden/: any change to what a user or a script reads
//! fails here.
//!
//! What differs from run to run is replaced before comparing: the temporary directory
//! (`$DIR`), and the file's size in bytes (`$FILE_BYTES`, `$FILE_SIZE`: the trailer stores the
//! monotonic clock at finish, whose digit count grows with uptime). Run with `MEMTRACK_BLESS=1`
//! to rewrite the files after an intended change, and review the diff.

mod common;

use std::path::{Path, PathBuf};

use common::{alloc_free_pairs, memtrack, s, text};
use memtrack::{
    artifact::Backend, artifact::Metadata, encode::Encoder, encode::EncoderOptions, event::Event,
    event::EventKind, human, stack::Frame, stack::Module, stack::ModuleId, stack::Stack,
    stack::StackId,
};

/// Writes `events` to `dir/file` as a finished artifact with fixed metadata (start times,
/// pid, name, command), so that the output of `show` depends on the events alone.
fn artifact(
    dir: &Path,
    file: &str,
    name: &str,
    events: &[Event],
    lost: u64,
    iterations: Option<u64>,
) -> PathBuf {
    let mut meta = Metadata::now(4242, Backend::Other)
        .with_name(name)
        .with_command(vec!["./bench".into(), "--exact".into()]);
    meta.start_unix_ns = 1_700_000_000_000_000_000;
    meta.start_monotonic_ns = 1_000;
    let path = dir.join(file);
    let f = std::fs::File::create(&path).unwrap();
    let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
    enc.extend(events.iter().copied()).unwrap();
    if let Some(n) = iterations {
        enc.set_iterations(n);
    }
    enc.finish(lost).unwrap();
    path
}

/// Every kind, three threads, sizes over several classes, a leak, a free of an unknown block,
/// a free the allocator makes of a block already freed, mappings and an exec.
fn mixed() -> Vec<Event> {
    let mut v = Vec::new();
    let mut ts = 10_000;
    let mut push = |tid: u32, kind: EventKind| {
        ts += 137;
        v.push(Event::new(ts, 4242, tid, kind));
    };
    for i in 0..40u64 {
        let tid = 4242 + (i % 3) as u32;
        let addr = 0x10_0000 + i * 0x1_0000;
        push(
            tid,
            EventKind::Malloc {
                addr,
                size: 8 << (i % 12),
            },
        );
        if i % 4 == 0 {
            push(
                tid,
                EventKind::Realloc {
                    old_addr: addr,
                    new_addr: addr + 0x8000,
                    size: 3000 + i,
                },
            );
            push(
                tid + 1,
                EventKind::Free {
                    addr: addr + 0x8000,
                },
            );
        } else if i % 5 != 0 {
            push(tid, EventKind::Free { addr });
        }
    }
    push(
        4242,
        EventKind::Calloc {
            addr: 0x90_0000,
            size: 24,
        },
    );
    push(
        4243,
        EventKind::AlignedAlloc {
            addr: 0x91_0000,
            size: 4096,
            align: 64,
        },
    );
    push(4243, EventKind::Free { addr: 0x91_0000 });
    push(4243, EventKind::Free { addr: 0x91_0000 }); // already freed: the allocator's own
    push(4244, EventKind::Free { addr: 0xdead_0000 }); // no recorded call allocated it
    push(
        4242,
        EventKind::Realloc {
            old_addr: 0,
            new_addr: 0x92_0000,
            size: 100,
        },
    );
    push(
        4242,
        EventKind::Mmap {
            addr: 0x7f00_0000_0000,
            size: 1 << 20,
        },
    );
    push(
        4242,
        EventKind::Mremap {
            old_addr: 0x7f00_0000_0000,
            new_addr: 0x7f10_0000_0000,
            size: 2 << 20,
        },
    );
    push(
        4242,
        EventKind::Munmap {
            addr: 0x7f10_0000_0000,
            size: 1 << 20,
        },
    );
    push(4242, EventKind::Brk { addr: 0x5555_0000 });
    push(
        4242,
        EventKind::Malloc {
            addr: 0x93_0000,
            size: 77,
        },
    );
    push(4242, EventKind::Exec);
    push(
        4242,
        EventKind::Malloc {
            addr: 0x94_0000,
            size: 33,
        },
    );
    v
}

/// `out`'s stdout with the run's variable parts replaced (see the module docs).
fn normalized(out: &std::process::Output, dir: &Path, files: &[&Path]) -> String {
    let mut t = String::from_utf8(out.stdout.clone()).expect("utf-8 output");
    for f in files {
        let n = std::fs::metadata(f).unwrap().len();
        t = t.replace(
            &format!("\"file_bytes\": {n}"),
            "\"file_bytes\": \"$FILE_BYTES\"",
        );
        let first = t.lines().next().unwrap_or_default().to_string();
        if first.contains("(format ") {
            let fixed = first.replace(&format!(", {}, ", human::bytes(n)), ", $FILE_SIZE, ");
            t = t.replacen(&first, &fixed, 1);
        }
    }
    t.replace(s(dir), "$DIR")
        .replace(env!("CARGO_BIN_EXE_memtrack"), "$MEMTRACK")
}

/// Checks `got` against tests/golden/`name` (or writes it under `MEMTRACK_BLESS=1`).
fn check(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("MEMTRACK_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (MEMTRACK_BLESS=1 writes it)", path.display()));
    assert!(
        got == want,
        "{name} differs from {}:\n--- want\n{want}\n--- got\n{got}",
        path.display()
    );
}

#[test]
fn show_prints_exactly_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases = [
        (
            "mixed",
            artifact(d, "mixed.memtrack", "mixed", &mixed(), 0, None),
        ),
        (
            "lossy",
            artifact(
                d,
                "lossy.memtrack",
                "lossy",
                &alloc_free_pairs(300, 48),
                17,
                None,
            ),
        ),
        (
            "iter",
            artifact(
                d,
                "iter.memtrack",
                "parse",
                &alloc_free_pairs(480, 64),
                0,
                Some(480),
            ),
        ),
    ];
    for (case, path) in &cases {
        for (flags, suffix) in [
            (&[][..], "txt"),
            (&["--threads"][..], "threads.txt"),
            (&["--json"][..], "json"),
            (&["--json", "--threads"][..], "threads.json"),
        ] {
            let mut args = vec!["show", s(path)];
            args.extend_from_slice(flags);
            let out = memtrack(&args);
            assert!(out.status.success(), "{}", text(&out));
            check(
                &format!("show-{case}.{suffix}"),
                &normalized(&out, d, &[path]),
            );
        }
    }
}

#[test]
fn compare_prints_exactly_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let (base, head) = (dir.path().join("base"), dir.path().join("head"));
    std::fs::create_dir_all(&base).unwrap();
    std::fs::create_dir_all(&head).unwrap();
    let side = |d: &Path, file: &str, n: u64, size: u64| {
        artifact(
            d,
            file,
            file.trim_end_matches(".memtrack"),
            &alloc_free_pairs(n, size),
            0,
            None,
        )
    };
    side(&base, "same.memtrack", 100, 64);
    side(&head, "same.memtrack", 100, 64);
    side(&base, "grew|md_chars.memtrack", 100, 64);
    side(&head, "grew|md_chars.memtrack", 110, 64);
    side(&base, "shrank.memtrack", 200, 4096);
    side(&head, "shrank.memtrack", 150, 1024);
    side(&base, "from_zero.memtrack", 0, 64);
    side(&head, "from_zero.memtrack", 5, 64);
    side(&base, "removed.memtrack", 10, 8);
    side(&head, "added.memtrack", 10, 8);
    // Per iteration, within a threshold given with decimals.
    let (b, h) = (dir.path().join("b.memtrack"), dir.path().join("h.memtrack"));
    artifact(
        dir.path(),
        "b.memtrack",
        "parse",
        &alloc_free_pairs(480, 64),
        0,
        Some(480),
    );
    artifact(
        dir.path(),
        "h.memtrack",
        "parse",
        &alloc_free_pairs(301, 64),
        0,
        Some(300),
    );
    for (base, head, flags, code, name) in [
        (&base, &head, &[][..], 1, "compare"),
        (&b, &h, &["--threshold", "0.5%"][..], 0, "compare-iter"),
    ] {
        for (format, file) in [("table", "txt"), ("markdown", "md"), ("json", "json")] {
            let mut args = vec!["compare", s(base), s(head)];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["--format", format]);
            let out = memtrack(&args);
            assert_eq!(out.status.code(), Some(code), "{}", text(&out));
            check(
                &format!("{name}.{file}"),
                &normalized(&out, dir.path(), &[]),
            );
        }
    }
}

/// A `memtrack synth` trace: the seed fixes its events; its start times vary, and the JSON is
/// compared after they are replaced (so as a value: the other cases check the bytes).
#[test]
fn show_of_a_synth_trace_prints_exactly_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::synth(&dir.path().join("s.memtrack"), 20_000, 3);
    let out = memtrack(&["show", s(&path), "--threads"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = normalized(&out, dir.path(), &[&path]);
    // Line 2 holds the command line: the binary and the temporary path, both replaced.
    check("show-synth.threads.txt", &t);
    let out = memtrack(&["show", s(&path), "--json", "--threads"]);
    assert!(out.status.success(), "{}", text(&out));
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in ["start_unix_ns", "start_monotonic_ns"] {
        v["metadata"][k] = "$VARIES".into();
    }
    v["file_bytes"] = "$FILE_BYTES".into();
    let t = serde_json::to_string_pretty(&v)
        .unwrap()
        .replace(s(dir.path()), "$DIR")
        .replace(env!("CARGO_BIN_EXE_memtrack"), "$MEMTRACK");
    check("show-synth.threads.json", &(t + "\n"));
}

/// A hand-made recording with call stacks: three sites (one stack cut at the depth cap, one
/// with a frame outside any module), allocations without a stack, a leak, the peak in the
/// middle, fixed metadata: `show --top` prints exactly these bytes.
fn with_stacks(dir: &Path) -> PathBuf {
    let mut meta = Metadata::now(4242, Backend::Ebpf).with_name("stacks");
    meta.start_unix_ns = 1_700_000_000_000_000_000;
    meta.start_monotonic_ns = 1_000;
    let path = dir.join("stacks.memtrack");
    let f = std::fs::File::create(&path).unwrap();
    let mut enc = Encoder::new(f, &meta, EncoderOptions::new().workers(1)).unwrap();
    let module = |path: &str| Module {
        path: path.into(),
        build_id: Some(vec![0x5a; 20]),
    };
    enc.define_module(ModuleId(1), module("/opt/memtrack-golden/bin/server"))
        .unwrap();
    enc.define_module(ModuleId(2), module("/opt/memtrack-golden/lib/libc.so.6"))
        .unwrap();
    let frame = |module, offset| Frame {
        module: ModuleId(module),
        offset,
    };
    let main = [frame(1, 0x4a10), frame(2, 0x29d90)];
    let stacks = [
        vec![frame(1, 0x12f3), frame(1, 0x2200)],
        vec![
            frame(1, 0x1450),
            frame(0, 0x7f12_3456_7000),
            frame(1, 0x2240),
        ],
        vec![frame(1, 0x1999)],
    ];
    for (i, inner) in stacks.iter().enumerate() {
        let mut frames = inner.clone();
        frames.extend(main);
        enc.define_stack(
            StackId(i as u32 + 1),
            Stack {
                frames,
                truncated: i == 2,
            },
        )
        .unwrap();
    }
    let mut ts = 10_000;
    let mut push = |kind: EventKind, stack: u32| {
        ts += 100;
        enc.push(Event::new(ts, 4242, 4242, kind).with_stack(StackId(stack)))
            .unwrap();
    };
    // Site 1: 100 blocks of 64 B, all freed after the peak. Site 2: 10 blocks of 4 KiB, 3 kept
    // to the end. Site 3: one block of 16 KiB, freed before the peak. No stack: 5 of 24 B.
    push(
        EventKind::Malloc {
            addr: 0x900_0000,
            size: 16 << 10,
        },
        3,
    );
    push(EventKind::Free { addr: 0x900_0000 }, 0);
    for i in 0..100 {
        push(
            EventKind::Malloc {
                addr: 0x1000 + i * 64,
                size: 64,
            },
            1,
        );
    }
    for i in 0..10 {
        push(
            EventKind::Calloc {
                addr: 0x10_0000 + i * 4096,
                size: 4096,
            },
            2,
        );
    }
    for i in 0..5 {
        push(
            EventKind::Malloc {
                addr: 0x20_0000 + i * 32,
                size: 24,
            },
            0,
        );
    }
    for i in 0..100 {
        push(
            EventKind::Free {
                addr: 0x1000 + i * 64,
            },
            0,
        );
    }
    for i in 0..7 {
        push(
            EventKind::Free {
                addr: 0x10_0000 + i * 4096,
            },
            0,
        );
    }
    enc.finish(0).unwrap();
    path
}

/// `show --top`: the table with each site's stack (text), the exact numbers (JSON), every
/// order; and a recording without stacks says so and how to get them.
#[test]
fn show_top_prints_exactly_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = with_stacks(d);
    for by in ["bytes", "allocations", "peak", "leaked"] {
        let out = memtrack(&["show", s(&path), "--top", "3", "--by", by]);
        assert!(out.status.success(), "{}", text(&out));
        check(
            &format!("show-top.{by}.txt"),
            &normalized(&out, d, &[&path]),
        );
    }
    let out = memtrack(&["show", s(&path), "--top", "10", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    check("show-top.json", &normalized(&out, d, &[&path]));
    // Without stacks: a note instead of a table.
    let plain = artifact(d, "plain.memtrack", "plain", &mixed(), 0, None);
    let out = memtrack(&["show", s(&plain), "--top", "5"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = normalized(&out, d, &[&plain]);
    check("show-top.no-stacks.txt", &t);
    assert!(t.contains("no call stacks in this recording"), "{t}");
}

/// `show --top` of a `memtrack synth --stacks` trace (300 sites, 10–40 frames): the text of the
/// top 5 and the JSON of the top 3 by bytes live at the peak.
#[test]
fn show_top_of_a_synth_trace_with_stacks_prints_exactly_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("st.memtrack");
    let out = memtrack(&[
        "synth",
        "--events",
        "20000",
        "--seed",
        "3",
        "--threads",
        "3",
        "--stacks",
        "-o",
        s(&path),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = memtrack(&["show", s(&path), "--top", "5"]);
    assert!(out.status.success(), "{}", text(&out));
    check(
        "show-synth-stacks.top.txt",
        &normalized(&out, dir.path(), &[&path]),
    );
    let out = memtrack(&["show", s(&path), "--top", "3", "--by", "peak", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = serde_json::to_string_pretty(&v["top_sites"]).unwrap();
    check("show-synth-stacks.top.json", &(t + "\n"));
}
