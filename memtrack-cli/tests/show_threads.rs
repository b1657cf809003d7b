//! `memtrack show --threads` and the size-class histogram: per-thread rows add up to the
//! totals, and both match counts made here independently of the analysis code.

mod common;

use std::collections::BTreeMap;

use common::{memtrack, s, synth, text, write};
use memtrack::{event::Event, event::EventKind, synth::Synth, synth::SynthOptions};

/// Per thread, counted straight from the model's events: (events, allocations).
fn model_counts(events: usize, seed: u64) -> BTreeMap<u64, (u64, u64)> {
    let mut m = BTreeMap::new();
    for e in Synth::new(SynthOptions { seed, threads: 3 }).take(events) {
        let c = m.entry(e.tid as u64).or_insert((0, 0));
        c.0 += 1;
        c.1 += match e.kind {
            EventKind::Malloc { .. }
            | EventKind::Calloc { .. }
            | EventKind::AlignedAlloc { .. } => 1,
            EventKind::Realloc { new_addr, .. } => u64::from(new_addr != 0),
            _ => 0,
        };
    }
    m
}

fn num(s: &str) -> u64 {
    s.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("{s:?} is not a count"))
}

#[test]
fn per_thread_rows_add_up_to_the_totals() {
    let dir = tempfile::tempdir().unwrap();
    let art = synth(&dir.path().join("t.memtrack"), 150_000, 11);
    let out = memtrack(&["show", "--json", "--threads", s(&art)]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let threads = v["per_thread"]
        .as_array()
        .expect("per_thread with --threads");
    assert_eq!(threads.len() as u64, v["threads"].as_u64().unwrap());
    for key in [
        "events",
        "allocations",
        "bytes_allocated",
        "frees",
        "bytes_freed",
    ] {
        let sum: u64 = threads.iter().map(|t| t[key].as_u64().unwrap()).sum();
        assert_eq!(
            sum,
            v[key].as_u64().unwrap(),
            "per-thread {key} add up to the total"
        );
    }
    let model = model_counts(150_000, 11);
    let got: BTreeMap<u64, (u64, u64)> = threads
        .iter()
        .map(|t| {
            (
                t["tid"].as_u64().unwrap(),
                (
                    t["events"].as_u64().unwrap(),
                    t["allocations"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    assert_eq!(got, model);

    // The human table: one aligned row per thread, then the total row.
    let out = memtrack(&["show", "--threads", s(&art)]);
    assert!(out.status.success(), "{}", text(&out));
    let human = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = human.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.trim_start().starts_with("tid "))
        .unwrap_or_else(|| panic!("no thread table in\n{human}"));
    let rows = &lines[head + 1..head + 1 + model.len() + 1];
    let width = lines[head].len();
    let (mut events, mut allocs, mut frees) = (0, 0, 0);
    for (r, (tid, (ev, al))) in rows.iter().zip(&model) {
        assert_eq!(r.len(), width, "aligned: {r:?}");
        let c: Vec<&str> = r.split_whitespace().collect();
        // tid, events, allocations, allocated (2 words), frees, freed (2 words)
        assert_eq!((num(c[0]), num(c[1]), num(c[2])), (*tid, *ev, *al), "{r}");
        events += num(c[1]);
        allocs += num(c[2]);
        frees += num(c[5]);
    }
    let total: Vec<&str> = rows[model.len()].split_whitespace().collect();
    assert_eq!(total[0], "total");
    assert_eq!(
        (num(total[1]), num(total[2]), num(total[5])),
        (events, allocs, frees)
    );
    assert_eq!(events, 150_000);
    assert_eq!(frees, v["frees"].as_u64().unwrap());
    assert!(
        !String::from_utf8(memtrack(&["show", s(&art)]).stdout)
            .unwrap()
            .contains("per thread")
    );
}

#[test]
fn size_classes_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let ev = |ts, kind| Event::new(ts, 7, 7, kind);
    let events = [
        ev(
            1,
            EventKind::Malloc {
                addr: 0x10,
                size: 0,
            },
        ),
        ev(
            2,
            EventKind::Calloc {
                addr: 0x20,
                size: 16,
            },
        ),
        ev(
            3,
            EventKind::Malloc {
                addr: 0x30,
                size: 17,
            },
        ),
        ev(
            4,
            EventKind::AlignedAlloc {
                addr: 0x40,
                size: 32,
                align: 32,
            },
        ),
        ev(
            5,
            EventKind::Realloc {
                old_addr: 0x30,
                new_addr: 0x50,
                size: 3 << 20,
            },
        ),
        ev(
            6,
            EventKind::Realloc {
                old_addr: 0x50,
                new_addr: 0,
                size: 0,
            },
        ),
        ev(7, EventKind::Free { addr: 0x10 }),
        ev(
            8,
            EventKind::Mmap {
                addr: 0x7000_0000,
                size: 1 << 30,
            },
        ),
    ];
    let art = write(
        &dir.path().join("sizes.memtrack"),
        Some("sizes"),
        &events,
        0,
    );
    let out = memtrack(&["show", "--json", s(&art)]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["size_classes"],
        serde_json::json!([
            {"min": 0, "max": 16, "allocations": 2, "bytes": 16},
            {"min": 17, "max": 32, "allocations": 2, "bytes": 49},
            {"min": 2_097_153, "max": 4_194_304, "allocations": 1, "bytes": 3 << 20},
        ])
    );
    assert_eq!(v["allocations"], 5);
    assert_eq!(v["bytes_allocated"], 16 + 49 + (3 << 20));

    let human = String::from_utf8(memtrack(&["show", s(&art)]).stdout).unwrap();
    let row = |prefix: &str| {
        human
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} row in\n{human}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("[0, 16 B]"), "[0, 16 B] 2 40.0% 16 B 0.0%");
    assert_eq!(row("(16 B, 32 B]"), "(16 B, 32 B] 2 40.0% 49 B 0.0%");
    assert_eq!(
        row("(2 MiB, 4 MiB]"),
        "(2 MiB, 4 MiB] 1 20.0% 3.0 MiB 100.0%"
    );
}

#[test]
fn size_classes_add_up_on_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let art = synth(&dir.path().join("m.memtrack"), 100_000, 2);
    let out = memtrack(&["show", "--json", s(&art)]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let classes = v["size_classes"].as_array().unwrap();
    let sum = |k: &str| classes.iter().map(|c| c[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("allocations"), v["allocations"].as_u64().unwrap());
    assert_eq!(sum("bytes"), v["bytes_allocated"].as_u64().unwrap());
    // Classes are disjoint, in order, and each holds what its bounds say.
    for w in classes.windows(2) {
        assert!(w[0]["max"].as_u64() < w[1]["min"].as_u64());
    }
    for c in classes {
        let (min, max, n, b) = (
            c["min"].as_u64().unwrap(),
            c["max"].as_u64().unwrap(),
            c["allocations"].as_u64().unwrap(),
            c["bytes"].as_u64().unwrap(),
        );
        assert!(n * min <= b && b <= n * max, "{c}");
    }
}
