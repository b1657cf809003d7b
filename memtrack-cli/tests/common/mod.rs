//! Helpers shared by the tests of the `memtrack` binary: running it and writing
//! artifacts from hand-built events.

#![allow(dead_code)] // each test binary uses a different subset

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use memtrack::{Backend, Encoder, EncoderOptions, Event, EventKind, Metadata};

/// Runs the `memtrack` binary with `args`.
pub fn memtrack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memtrack"))
        .args(args)
        .output()
        .expect("run memtrack")
}

/// stdout then stderr, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `p` as &str.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Writes `events` to `path` as a finished artifact named `name` (no name if `None`) that
/// reports `lost` lost events.
pub fn write(path: &Path, name: Option<&str>, events: &[Event], lost: u64) -> PathBuf {
    let mut meta = Metadata::now(7, Backend::Other);
    if let Some(n) = name {
        meta = meta.with_name(n);
    }
    let file = File::create(path).expect("create artifact");
    let mut enc = Encoder::new(file, &meta, EncoderOptions::new().workers(1)).expect("encoder");
    for &e in events {
        enc.push(e).expect("push");
    }
    enc.finish(lost).expect("finish");
    path.to_path_buf()
}

/// `n` allocations of `size` bytes by thread 7, each freed right after it is made: `n`
/// allocations, `n × size` bytes, a peak of `size`.
pub fn alloc_free_pairs(n: u64, size: u64) -> Vec<Event> {
    let mut v = Vec::new();
    for i in 0..n {
        let addr = 0x10_0000 + i * 0x1000;
        v.push(Event::new(
            1_000 + 2 * i,
            7,
            7,
            EventKind::Malloc { addr, size },
        ));
        v.push(Event::new(1_001 + 2 * i, 7, 7, EventKind::Free { addr }));
    }
    v
}

/// Runs `memtrack synth` with `events` events, seed `seed`, 3 threads, into `path`.
pub fn synth(path: &Path, events: u64, seed: u64) -> PathBuf {
    let out = memtrack(&[
        "synth",
        "--events",
        &events.to_string(),
        "--seed",
        &seed.to_string(),
        "--threads",
        "3",
        "-o",
        s(path),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    path.to_path_buf()
}
