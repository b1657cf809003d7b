//! Where the start-up of an eBPF session goes: the first session of a process
//! (cold), a second one 100 ms after the first ended (warm), a third right after the second
//! (back to back), phase by phase, and what a malloc costs before any session and after the
//! last one ended (a session must leave no probe behind).
//!
//! ```text
//! sudo cargo run --release --example startup [ROUNDS]
//! ```
//! Each round runs two fresh processes, in alternating order: one that measures the sessions,
//! one that splits the object's load into maps and programs. Medians over the rounds, in ms
//! (ns per call for malloc). Phases:
//!
//! - `open`: libbpf parses the embedded object; `load`: maps created, programs verified and
//!   loaded (split by the second process: `maps only` loads the object with no program);
//!   `scan`: the mapped ELF files' symbol tables read and every probe placed
//!   ([`memtrack::tracker::StartupTimes`]);
//! - `tracker`: all of the above as a session's first call pays it (`Tracker::global`);
//! - `start`: `SessionBuilder::start` once the tracker is loaded, of which `attach wait`
//!   (the previous probes' background detach) and `attach` (creating the links);
//! - `first event`: from `start` returning to the session's numbers showing an allocation
//!   made right after it (the poller drains every 10 ms);
//! - `finish`: stop, drain, write the artifact (the probes detach in the background).

use std::os::fd::{AsFd, AsRawFd};
use std::process::Command;
use std::time::{Duration, Instant};

use memtrack::{SessionBuilder, tracker::StartupTimes, tracker::Tracker, tracker::TrackerOptions};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// ns per `malloc(16)` + `free` pair over `n` calls.
fn malloc_ns(n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: a malloc'd block freed at once.
        unsafe { libc::free(std::hint::black_box(libc::malloc(16))) };
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// One session around one allocation: prints its phases under `label`.
fn session(dir: &std::path::Path, label: &str) {
    let t = Instant::now();
    let s = SessionBuilder::new(label)
        .output_dir(dir)
        .quiet(true)
        .start()
        .expect("session start");
    let start = t.elapsed();
    let at = Tracker::global(&TrackerOptions::new())
        .expect("the loaded tracker")
        .startup_times();
    let t = Instant::now();
    let v = std::hint::black_box(vec![1u8; 1000]);
    drop(v);
    while s.stats().expect("stats").allocations == 0 {
        std::thread::sleep(Duration::from_micros(200));
    }
    let first = t.elapsed();
    let t = Instant::now();
    s.finish().expect("session finish");
    let finish = t.elapsed();
    println!("{label} start {}", ms(start));
    println!("{label} attach-wait {}", ms(at.attach_wait));
    println!("{label} attach {}", ms(at.attach));
    println!("{label} first-event {}", ms(first));
    println!("{label} finish {}", ms(finish));
}

fn child_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    malloc_ns(100_000);
    let before = malloc_ns(200_000);
    let t = Instant::now();
    let tracker = Tracker::global(&TrackerOptions::new()).expect("loading the tracker");
    let tracker_ms = ms(t.elapsed());
    let st: StartupTimes = tracker.startup_times();
    println!("cold tracker {tracker_ms}");
    println!("cold open {}", ms(st.open));
    println!("cold load {}", ms(st.load));
    println!("cold scan {}", ms(st.scan));
    println!("cold files {}", st.files);
    println!("cold sites {}", st.sites);
    session(dir.path(), "cold");
    let right_after = malloc_ns(200_000);
    std::thread::sleep(Duration::from_millis(100));
    session(dir.path(), "warm");
    session(dir.path(), "b2b");
    std::thread::sleep(Duration::from_millis(200));
    let later = malloc_ns(200_000);
    println!("malloc before {before}");
    println!("malloc right-after {right_after}");
    println!("malloc 200ms-after {later}");
}

/// The object's load split: maps only (no program loaded), then everything, each a fresh
/// object in this fresh process.
fn child_split() {
    let open = |autoload: bool| {
        let mut o = libbpf_rs::ObjectBuilder::default()
            .open_memory(memtrack_bpf::OBJECT)
            .expect("open");
        for mut m in o.maps_mut() {
            let name = m.name().to_string_lossy().into_owned();
            if name.ends_with(".rodata") {
                let cfg = memtrack_bpf::RawConfig::new(std::process::id());
                m.initial_value_mut()
                    .expect("rodata")
                    .copy_from_slice(&cfg.to_bytes());
            } else if name == memtrack_bpf::MAP_EVENTS {
                m.set_max_entries(memtrack::tracker::DEFAULT_RINGBUF_BYTES as u32)
                    .expect("ring buffer size");
            }
        }
        if !autoload {
            for mut p in o.progs_mut() {
                p.set_autoload(false);
            }
        }
        o
    };
    let t = Instant::now();
    let o = open(false);
    println!("split open {}", ms(t.elapsed()));
    let t = Instant::now();
    let obj = o.load().expect("load maps");
    println!("split maps-only {}", ms(t.elapsed()));
    drop(obj);
    let o = open(true);
    let t = Instant::now();
    let obj = o.load().expect("load all");
    println!("split all {}", ms(t.elapsed()));
    for p in obj.progs() {
        // SAFETY: an all-zero bpf_prog_info is valid; the kernel fills it.
        let mut info: libbpf_rs::libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
        let mut len = size_of_val(&info) as u32;
        // SAFETY: the program's fd, a buffer of `len` bytes.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
                p.as_fd().as_raw_fd(),
                &mut info,
                &mut len,
            )
        };
        if rc == 0 {
            println!(
                "insns {} {}",
                p.name().to_string_lossy(),
                info.verified_insns
            );
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("--sessions") => return child_sessions(),
        Some("--split") => return child_split(),
        _ => {}
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("startup: skipped, not root (the eBPF tracker needs CAP_BPF + CAP_PERFMON)");
        return;
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(7, |a| a.parse().expect("ROUNDS"));
    let mut keys: Vec<String> = Vec::new();
    let mut values: std::collections::HashMap<String, Vec<f64>> = Default::default();
    let exe = std::env::current_exe().expect("current_exe");
    for r in 0..rounds {
        let mut order = ["--sessions", "--split"];
        if r % 2 == 1 {
            order.reverse();
        }
        for mode in order {
            let out = Command::new(&exe).arg(mode).output().expect("child");
            assert!(
                out.status.success(),
                "{mode}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let (k, v) = line.rsplit_once(' ').expect("key value");
                let v: f64 = v.parse().expect("number");
                if !values.contains_key(k) {
                    keys.push(k.to_owned());
                }
                values.entry(k.to_owned()).or_default().push(v);
            }
        }
    }
    println!(
        "median of {rounds} fresh processes, ms (malloc: ns per malloc+free pair); load {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    for k in keys {
        let v = values.remove(&k).unwrap_or_default();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        println!("  {k:<28} {:>9.2}   [{lo:.2} – {hi:.2}]", median(v.clone()));
    }
}
