//! The `memtrack` command-line tool, run as a user would: synth, show, verify.

mod common;

use std::path::{Path, PathBuf};

use common::{memtrack, text};
use memtrack::{event::Event, event::EventKind, synth::Synth, synth::SynthOptions};

/// A 3-thread synth artifact `t.memtrack` in `dir`.
fn synth(dir: &Path, events: u64, seed: u64) -> PathBuf {
    common::synth(&dir.join("t.memtrack"), events, seed)
}

#[test]
fn show_json_reports_exact_totals() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), 200_000, 9);
    let out = memtrack(&["show", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");

    // The same model's events, counted by the test's own replay of the accounting rules (docs/src/numbers.md), not
    // by memtrack's Analyzer (the code `show` runs).
    let events: Vec<Event> = Synth::new(SynthOptions {
        seed: 9,
        threads: 3,
    })
    .take(200_000)
    .collect();
    let t = memtrack_test_support::count(&events);
    assert_eq!(v["events"], 200_000);
    assert_eq!(v["lost_events"], 0);
    assert_eq!(v["complete"], true);
    assert_eq!(v["allocations"], t.allocations);
    assert_eq!(v["frees"], t.frees);
    assert_eq!(v["bytes_allocated"], t.bytes_allocated);
    assert_eq!(v["bytes_freed"], t.bytes_freed);
    assert_eq!(v["peak_live_bytes"], t.peak_live_bytes);
    assert_eq!(v["live_bytes_at_end"], t.live_bytes_at_end);
    assert_eq!(v["live_blocks_at_end"], t.live_blocks_at_end);
    assert_eq!(v["mapped_bytes_peak"], t.mapped_bytes_peak);
    assert_eq!(v["mapped_bytes_at_end"], t.mapped_bytes_at_end);
    assert_eq!(v["threads"], 3);
    assert_eq!(v["file_bytes"], std::fs::metadata(&path).unwrap().len());
    // Kinds that are not memory events are keys only when recorded; these are not.
    let kinds: u64 = memtrack::event::KindTag::ALL
        .iter()
        .filter(|k| k.is_memory())
        .map(|k| v["kinds"][k.name()].as_u64().expect("every kind is a key"))
        .sum();
    assert_eq!(kinds, 200_000);
    assert!(v["frames"].as_u64().unwrap() >= 200_000 / 32_768);

    let human = memtrack(&["show", path.to_str().unwrap()]);
    assert!(human.status.success());
    assert!(text(&human).contains("200,000"), "{}", text(&human));
}

#[test]
fn verify_passes_a_sound_file_and_names_the_first_bad_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), 100_000, 1);
    let out = memtrack(&["verify", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).starts_with("OK "), "{}", text(&out));

    let bytes = std::fs::read(&path).unwrap();
    let r = memtrack::artifact::Reader::open(&path).unwrap();
    let f1 = r.frames()[1];

    // A flipped bit in frame 1's payload.
    let flipped = dir.path().join("flipped.memtrack");
    let mut bad = bytes.clone();
    bad[(f1.offset + 40 + 10) as usize] ^= 1;
    std::fs::write(&flipped, &bad).unwrap();
    let out = memtrack(&["verify", flipped.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("frame 1 at byte offset {}", f1.offset)),
        "{}",
        text(&out)
    );

    // Cut in the middle of frame 1: the writer "died" there.
    let cut = dir.path().join("cut.memtrack");
    std::fs::write(&cut, &bytes[..(f1.offset + 100) as usize]).unwrap();
    let out = memtrack(&["verify", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("trailer is missing"), "{}", text(&out));
    assert!(text(&out).contains("frame 1 at offset"), "{}", text(&out));
    // `show` still reads the complete frame, and says the file is incomplete.
    let out = memtrack(&["show", "--json", cut.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["complete"], false);
    assert_eq!(v["events"], r.frames()[0].events);
    assert_eq!(v["lost_events"], serde_json::Value::Null);
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning"));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let not = dir.path().join("not.memtrack");
    std::fs::write(&not, b"hello, world").unwrap();
    let out = memtrack(&["show", not.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("not a memtrack artifact"),
        "{}",
        text(&out)
    );

    let out = memtrack(&["show", dir.path().join("missing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("No such file"), "{}", text(&out));

    let path = synth(dir.path(), 10, 1);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 9;
    std::fs::write(&path, &bytes).unwrap();
    let out = memtrack(&["verify", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(&format!(
            "version 9.{} is not supported",
            memtrack::artifact::VERSION_MINOR
        )),
        "{}",
        text(&out)
    );

    let never = dir.path().join("never.memtrack");
    let out = memtrack(&[
        "synth",
        "--events",
        "10",
        "--workers",
        "0",
        "-o",
        never.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("workers must be at least 1"),
        "{}",
        text(&out)
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!never.exists() && left.len() == 2, "left behind: {left:?}");
}

/// One frame, one thread, one block: singular words, and what each number is said in words.
#[test]
fn show_says_what_each_number_is_with_correct_plurals() {
    let dir = tempfile::tempdir().unwrap();
    // One allocation of 48 B by thread 7 that stays live, one 16 B allocation freed.
    let events = [
        Event::new(
            1_000,
            7,
            7,
            EventKind::Malloc {
                addr: 0x10,
                size: 48,
            },
        ),
        Event::new(
            1_001,
            7,
            7,
            EventKind::Malloc {
                addr: 0x90,
                size: 16,
            },
        ),
        Event::new(1_002, 7, 7, EventKind::Free { addr: 0x90 }),
    ];
    let path = common::write(&dir.path().join("one.memtrack"), Some("one"), &events, 1);
    let out = memtrack(&["show", common::s(&path)]);
    assert!(out.status.success(), "{}", text(&out));
    let show = text(&out);
    for line in [
        ", 1 frame)",
        "  events        3 over 0.000 ms, from 1 thread, 1 event lost\n",
        "  allocations   2 (64 B allocated in total)\n",
        "  peak live     64 B of heap; at most 2 blocks live at once\n",
        "  live at end   1 block (48 B) allocated while recording and not freed\n",
    ] {
        assert!(show.contains(line), "{line:?} in:\n{show}");
    }
}

/// A recording that lost events is sound as a file but not whole, and
/// `verify` promises "exit 0 only if … sound": it fails, saying how many were lost, unless
/// `--structure-only` asks for the file's structure alone.
#[test]
fn verify_fails_a_recording_that_lost_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write(
        &dir.path().join("lossy.memtrack"),
        None,
        &common::alloc_free_pairs(100, 64),
        830,
    );
    let out = memtrack(&["verify", common::s(&path)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.starts_with("FAILED ") && t.contains("830 events were lost while recording"),
        "{t}"
    );
    assert!(t.contains("--structure-only"), "{t}");
    let out = memtrack(&["verify", "--structure-only", common::s(&path)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.starts_with("OK ") && t.contains("structure only: 830 events lost"),
        "{t}"
    );
    // A whole recording passes either way.
    let whole = common::write(
        &dir.path().join("whole.memtrack"),
        None,
        &common::alloc_free_pairs(100, 64),
        0,
    );
    let out = memtrack(&["verify", common::s(&whole)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A recording of accumulated calls (iteration marks): `show` gives each figure's median and
/// range over the calls, and `show --json` the exact spreads.
#[test]
fn show_gives_the_spread_of_marked_calls() {
    let dir = tempfile::tempdir().unwrap();
    // Call k (1..=3) allocates k blocks of 100 × k bytes, each freed before the next.
    let mut events = Vec::new();
    let mut ts = 1_000;
    let mut at = |kind| {
        ts += 1;
        Event::new(ts, 7, 7, kind)
    };
    for k in 1..=3u64 {
        events.push(at(EventKind::IterationStart));
        for i in 0..k {
            let addr = 0x10_0000 + (k * 10 + i) * 0x1000;
            events.push(at(EventKind::Malloc {
                addr,
                size: 100 * k,
            }));
            events.push(at(EventKind::Free { addr }));
        }
        events.push(at(EventKind::IterationEnd));
    }
    let path = common::write(&dir.path().join("calls.memtrack"), None, &events, 0);
    let out = memtrack(&["show", common::s(&path)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "  per call      3 calls, median (min–max): allocations 2 (1–3), allocated 400 B \
             (100 B–900 B), peak 200 B (100 B–300 B)\n"
        ),
        "{}",
        text(&out)
    );
    let out = memtrack(&["show", "--json", common::s(&path)]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let s = &v["iteration_spread"];
    assert_eq!(s["iterations"], 3);
    assert_eq!(
        (
            &s["allocations"]["min"],
            &s["allocations"]["median"],
            &s["allocations"]["max"],
            &s["allocations"]["total"]
        ),
        (&1.into(), &2.into(), &3.into(), &6.into())
    );
    assert_eq!(s["bytes_allocated"]["total"], 100 + 400 + 900);
    assert_eq!(s["peak_live_bytes"]["max"], 300);
}

/// A name in an artifact reaches the terminal with its control characters escaped: through
/// `show` it cannot send escape sequences (retitle the window, hide the text after it).
#[test]
fn names_reach_the_terminal_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let name = "a\u{1b}]0;owned\u{7}b\r";
    let f = common::write(
        &dir.path().join("evil.memtrack"),
        Some(name),
        &common::alloc_free_pairs(2, 8),
        0,
    );
    let out = memtrack(&["show", common::s(&f)]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        !stdout.chars().any(|c| c.is_control() && c != '\n'),
        "{stdout:?}"
    );
    assert!(
        stdout.contains("name a\\u{1b}]0;owned\\u{7}b\\r"),
        "{stdout}"
    );
}

/// A tail whose trailer pointer is damaged (it points far from the end, here 8 GiB before it
/// in a sparse file) is refused from the trailer's fixed head: the reader never loads the span
/// it points to, so `show` fails at once under a 4 GiB address-space limit.
#[test]
fn a_damaged_trailer_pointer_is_refused_without_reading_its_span() {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let good = common::write(
        &dir.path().join("good.memtrack"),
        Some("t"),
        &common::alloc_free_pairs(3, 8),
        0,
    );
    let bytes = std::fs::read(&good).unwrap();
    let (body, tail) = bytes.split_at(bytes.len() - 16);
    let bad = dir.path().join("bad.memtrack");
    let mut f = std::fs::File::create(&bad).unwrap();
    f.write_all(body).unwrap();
    f.seek(SeekFrom::Current(8 << 30)).unwrap();
    // The tail as it was: its pointer names the trailer, now 8 GiB before the end.
    f.write_all(tail).unwrap();
    drop(f);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_memtrack"));
    cmd.args(["show", common::s(&bad)]);
    // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("index and metadata lengths do not fill the trailer"),
        "{stderr}"
    );
}
