//! memtrack's recorders beside the other heap profilers, in one interleaved run, as a user
//! sees them: the whole process, wall clock and CPU time of every thread, on two
//! allocation-heavy workloads.
//!
//! - `churn`: `vec![0u8; n]` (Rust's `alloc_zeroed`, libc `calloc`) into a 64-slot ring,
//!   n ≤ 4096 — one allocation and one free per iteration;
//! - `mixed`: a `String` grown by `push` (malloc, then `realloc`s), a `HashMap` insert and
//!   remove of a boxed value, a `Box<u64>` — per iteration, N / 4 iterations (≈ N allocations).
//!
//! Configurations, each a fresh process of this same binary (its global allocator chooses at
//! start which allocator it forwards to, so every configuration pays the same dispatch):
//! - `untracked`: std's `System`;
//! - `counting`: `System` behind two relaxed atomic adds per allocation (its count and bytes),
//!   the floor of knowing anything;
//! - `alloc-idle`: `memtrack::Allocator`, no session; `alloc-session`: the same with a session
//!   of the allocator recorder;
//! - `dhat-rs`: dhat-rs's `Alloc` with its `Profiler` running (a backtrace per allocation);
//! - `ebpf-session`: `System` and an eBPF session in process (root);
//! - `record`, `heaptrack`, `valgrind-dhat`: the untracked child under `memtrack record`
//!   (root), heaptrack, Valgrind's DHAT; every allocator of the process.
//!
//! Each configuration runs at `N` iterations and at 0; the difference over the allocations
//! counted at `N` is the marginal cost per allocation (its free included), start-up (loading,
//! attaching, session start and finish, writing a profile) cancelled. Rounds are interleaved
//! with the order of configurations alternating (ABBA), medians of the rounds. A run that lost
//! an event, or whose allocation count disagrees with a session's, fails the bench.
//!
//! ```text
//! cargo build --release -p memtrack-cli      # the `memtrack` CLI, for the `record` row
//! cargo bench --bench recorders -- [N] [ROUNDS] [CONFIG,...]
//! ```
//! Defaults: N = 1,000,000, 3 rounds, every configuration; one that cannot run here (the eBPF
//! ones without root, a peer not installed) is skipped with a message saying what it needs.
//! `MEMTRACK_BIN` names the CLI if it is not beside this bench in `target/`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use memtrack::{Allocator, BackendChoice, SessionBuilder};

/// The global allocator a child runs with, chosen once at start (before any measured
/// allocation): std's `System`, a counting wrapper of it, `memtrack::Allocator`, or dhat-rs's.
struct Choose;

const SYSTEM: u8 = 0;
const COUNTING: u8 = 1;
const MEMTRACK: u8 = 2;
const DHAT: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(MEMTRACK);
static MEMTRACK_ALLOC: Allocator = Allocator::system();
/// The floor of knowing allocations and bytes: two relaxed atomic adds per allocation.
static COUNTED: AtomicU64 = AtomicU64::new(0);
static COUNTED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts one allocation of `size` bytes (the `counting` configuration).
#[inline(always)]
fn count(size: usize) {
    COUNTED.fetch_add(1, Ordering::Relaxed);
    COUNTED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
}

/// Forwards a call to the chosen allocator: `$a` is bound to it (`System` for `counting`, which
/// counts with `$count` first, if given).
macro_rules! forward {
    ($a:ident => $call:expr $(, $count:expr)?) => {
        match MODE.load(Ordering::Relaxed) {
            MEMTRACK => {
                let $a = &MEMTRACK_ALLOC;
                $call
            }
            DHAT => {
                let $a = &dhat::Alloc;
                $call
            }
            _mode => {
                $(if _mode == COUNTING {
                    $count;
                })?
                let $a = &System;
                $call
            }
        }
    };
}

// SAFETY: forwards every call unchanged to one allocator, chosen before `main` allocates
// anything that is freed through another (`System`, `Allocator::system()` and dhat-rs's
// `Alloc` all use libc's heap, so even a block crossing the switch is freed correctly; dhat-rs
// ignores the free of a block it did not see allocated).
unsafe impl GlobalAlloc for Choose {
    #[inline]
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        forward!(a => unsafe { a.alloc(l) }, count(l.size()))
    }
    #[inline]
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        forward!(a => unsafe { a.alloc_zeroed(l) }, count(l.size()))
    }
    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        forward!(a => unsafe { a.dealloc(p, l) })
    }
    #[inline]
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded.
        forward!(a => unsafe { a.realloc(p, l, n) }, count(n))
    }
}

#[global_allocator]
static GLOBAL: Choose = Choose;

/// Every configuration, in the table's order: the untracked process and the floor, memtrack's
/// recorders, then the whole-program peers (each wrapping the untracked child).
const CONFIGS: [&str; 9] = [
    "untracked",
    "counting",
    "alloc-idle",
    "alloc-session",
    "dhat-rs",
    "ebpf-session",
    "record",
    "heaptrack",
    "valgrind-dhat",
];
const WORKLOADS: [&str; 2] = ["churn", "mixed"];

fn churn(n: usize) {
    let mut ring: Vec<Vec<u8>> = (0..64).map(|_| Vec::new()).collect();
    let mut x: u32 = 12345;
    for i in 0..n {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let size = 1 + (x >> 20) as usize; // 1..=4096
        ring[i % 64] = vec![0u8; size];
        black_box(&ring[i % 64]);
    }
    black_box(ring);
}

fn mixed(n: usize) {
    let mut map: HashMap<u64, Box<[u64; 4]>> = HashMap::with_capacity(256);
    let mut x: u32 = 12345;
    let mut i = 0;
    while i < n {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        // A String grown a char at a time: malloc(8), then reallocs to 16 and 32.
        let mut s = String::new();
        for c in 0..(x >> 27) {
            s.push(char::from(b'a' + (c % 26) as u8));
        }
        black_box(&s);
        drop(s);
        // A boxed value inserted, an older one removed (the map itself stays at its capacity).
        let k = u64::from(x >> 24);
        if let Some(old) = map.insert(k, Box::new([u64::from(x); 4])) {
            black_box(old);
        }
        map.remove(&(k ^ 0x55));
        black_box(Box::new(u64::from(x)));
        i += 1;
    }
    black_box(map);
}

fn run_workload(w: &str, n: usize) {
    match w {
        "churn" => churn(n),
        // About 4 allocations per iteration: N / 4 iterations make about N allocations.
        "mixed" => mixed(n / 4),
        _ => panic!("unknown workload {w}"),
    }
}

/// The child: one configuration, one workload, `n` iterations; prints the allocations its
/// recorder counted (or nothing) and fails on lost events. `out` names dhat-rs's profile.
fn child(config: &str, w: &str, n: usize, out: &Path) {
    let backend = match config {
        "untracked" | "alloc-idle" => {
            run_workload(w, n);
            return;
        }
        "counting" => {
            let before = COUNTED.load(Ordering::Relaxed);
            run_workload(w, n);
            println!("{}", COUNTED.load(Ordering::Relaxed) - before);
            return;
        }
        "dhat-rs" => {
            let profiler = dhat::Profiler::builder().file_name(out).build();
            run_workload(w, n);
            println!("{}", dhat::HeapStats::get().total_blocks);
            // Writes the profile, as a user's run ends.
            drop(profiler);
            return;
        }
        "alloc-session" => BackendChoice::Alloc,
        "ebpf-session" => BackendChoice::Ebpf,
        _ => panic!("unknown configuration {config}"),
    };
    let s = SessionBuilder::new(format!("recorders-{w}"))
        .backend(backend)
        .in_memory(true)
        .quiet(true)
        .scope(memtrack::Scope::Process)
        .start()
        .expect("session");
    run_workload(w, n);
    let r = s.finish().expect("finish");
    assert_eq!(r.lost_events(), 0, "{config} {w}: lost events");
    println!("{}", r.totals().allocations);
}

/// The global allocator of configuration `config`'s child.
fn mode(config: &str) -> u8 {
    match config {
        "untracked" | "ebpf-session" => SYSTEM,
        "counting" => COUNTING,
        "dhat-rs" => DHAT,
        _ => MEMTRACK,
    }
}

/// Whether `tool --version` runs (heaptrack, valgrind).
fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn memtrack_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MEMTRACK_BIN") {
        return Some(p.into());
    }
    // target/release/deps/recorders-HASH → target/release/memtrack
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("memtrack");
    p.exists().then_some(p)
}

struct Run {
    wall_ns: f64,
    cpu_ns: f64,
    allocations: Option<u64>,
}

/// Runs one child process; wall time and CPU time (user + system, every thread) of the child.
fn run(config: &str, w: &str, n: usize, tmp: &Path, bin: Option<&Path>) -> Run {
    let exe = std::env::current_exe().expect("current_exe");
    let file = |ext: &str| tmp.join(format!("{config}-{w}-{n}.{ext}"));
    let (mut cmd, child_config) = match wrapper(config, &file, bin) {
        Some(mut c) => {
            c.arg(&exe);
            (c, "untracked")
        }
        None => (Command::new(&exe), config),
    };
    cmd.args(["--child", child_config, w, &n.to_string()])
        .arg(file("json"));
    cmd.stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let t = Instant::now();
    let child = cmd.spawn().expect("spawning a child");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers; `pid` is our child, reaped here (not by `Child::wait`).
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall_ns = t.elapsed().as_nanos() as f64;
    assert_eq!(r, pid, "wait4");
    let output = child.wait_with_output_after_reap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{config} {w} N={n} failed: {}",
        output.1
    );
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e9 + t.tv_usec as f64 * 1e3;
    let cpu_ns = tv(ru.ru_utime) + tv(ru.ru_stime);
    let allocations = if config == "record" {
        Some(record_allocations(
            bin.expect("memtrack CLI"),
            &file("memtrack"),
        ))
    } else {
        output.0.trim().parse().ok()
    };
    Run {
        wall_ns,
        cpu_ns,
        allocations,
    }
}

/// The whole-program tool configuration `config` runs the untracked child under, its output
/// at `file(extension)`; `None` for a configuration that is the child itself.
fn wrapper(config: &str, file: &dyn Fn(&str) -> PathBuf, bin: Option<&Path>) -> Option<Command> {
    let c = match config {
        "record" => {
            let mut c = Command::new(bin.expect("memtrack CLI"));
            c.arg("record")
                .arg("-o")
                .arg(file("memtrack"))
                .arg("--no-syscalls")
                .arg("--");
            c
        }
        "heaptrack" => {
            let mut c = Command::new("heaptrack");
            c.arg("-o").arg(file("heaptrack"));
            c
        }
        "valgrind-dhat" => {
            let mut c = Command::new("valgrind");
            c.arg("--tool=dhat")
                .arg(format!("--dhat-out-file={}", file("dhat.json").display()));
            c
        }
        _ => return None,
    };
    Some(c)
}

/// Reads the child's pipes after it was reaped by `wait4`.
trait AfterReap {
    fn wait_with_output_after_reap(self) -> (String, String);
}

impl AfterReap for std::process::Child {
    fn wait_with_output_after_reap(mut self) -> (String, String) {
        use std::io::Read;
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(mut o) = self.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (out, err)
    }
}

/// The allocations a `record` artifact holds (of the recorded process: its pid), failing on
/// lost events.
fn record_allocations(bin: &Path, file: &Path) -> u64 {
    let out = Command::new(bin)
        .arg("show")
        .arg("--json")
        .arg(file)
        .output()
        .expect("memtrack show");
    assert!(out.status.success(), "memtrack show failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("show --json");
    assert_eq!(v["lost_events"], 0, "record lost events");
    v["allocations"]
        .as_u64()
        .expect("allocations in show --json")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let config = args[1].as_str();
        MODE.store(mode(config), Ordering::Relaxed);
        let out = Path::new(&args[4]);
        child(config, &args[2], args[3].parse().expect("N"), out);
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let free: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let n: usize = free.first().map_or(1_000_000, |a| a.parse().expect("N"));
    let rounds: usize = free.get(1).map_or(3, |a| a.parse().expect("ROUNDS"));
    let wanted: Vec<&str> = free
        .get(2)
        .map_or(CONFIGS.to_vec(), |a| a.split(',').collect());
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let bin = memtrack_bin();
    let configs: Vec<&str> = CONFIGS
        .iter()
        .copied()
        .filter(|c| wanted.contains(c))
        .filter(|c| {
            let ok = match *c {
                "ebpf-session" => root,
                "record" => root && bin.is_some(),
                "heaptrack" => installed("heaptrack"),
                "valgrind-dhat" => installed("valgrind"),
                _ => true,
            };
            if !ok {
                println!(
                    "skipping {c}: needs {}",
                    match *c {
                        "heaptrack" => "heaptrack (apt-get install heaptrack)",
                        "valgrind-dhat" => "valgrind (apt-get install valgrind)",
                        _ => "root (and the memtrack CLI built, for `record`)",
                    }
                );
            }
            ok
        })
        .collect();
    let tmp = tempfile::tempdir().expect("tempdir");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "recorders: N = {n} iterations, {rounds} rounds interleaved (order alternating), \
         medians; load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    // (workload, config) → (wall at N, wall at 0, cpu at N, cpu at 0, allocations at N)
    let mut table: HashMap<(&str, &str), [Vec<f64>; 4]> = HashMap::new();
    let mut allocs: HashMap<&str, u64> = HashMap::new();
    for w in WORKLOADS {
        // Warm-up: page cache, the CLI's and this binary's pages.
        for c in &configs {
            run(c, w, 1000, tmp.path(), bin.as_deref());
        }
        for round in 0..rounds {
            let mut order = configs.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for c in order {
                for size in if round % 2 == 0 { [n, 0] } else { [0, n] } {
                    let r = run(c, w, size, tmp.path(), bin.as_deref());
                    let e = table.entry((w, c)).or_default();
                    let k = usize::from(size == 0);
                    e[k].push(r.wall_ns);
                    e[2 + k].push(r.cpu_ns);
                    if size == n
                        && let Some(a) = r.allocations
                    {
                        // Sessions, the counter and dhat-rs count the workload's allocations;
                        // `record` also counts the process's start-up (a few hundred): the
                        // counts agree within that, or the row is wrong. The denominator is a
                        // session's count.
                        let prev = allocs.entry(w).or_insert(a);
                        assert!(
                            prev.abs_diff(a) <= 2_000,
                            "{w}: {c} counted {a} allocations, another recorder {prev}"
                        );
                        if c.ends_with("-session") {
                            *prev = a;
                        }
                    }
                }
            }
        }
    }
    println!(
        "marginal cost per allocation (its free included) over `untracked`, start-up subtracted"
    );
    println!(
        "{:<15} {:>8} | {:>14} {:>14} | {:>14} {:>14} | {:>14}",
        "recorder", "", "churn wall", "churn CPU", "mixed wall", "mixed CPU", "start-up ms"
    );
    let per = |w: &str, c: &str| -> (f64, f64) {
        let a = allocs.get(w).copied().unwrap_or(n as u64) as f64;
        let [wn, w0, cn, c0] = table[&(w, c)].clone().map(median);
        ((wn - w0) / a, (cn - c0) / a)
    };
    for c in &configs {
        let mut line = format!("{c:<15} {:>8} |", "ns/alloc");
        for w in WORKLOADS {
            let (wall, cpu) = per(w, c);
            let (bw, bc) = if configs.contains(&"untracked") {
                per(w, "untracked")
            } else {
                (0.0, 0.0)
            };
            let _ = std::fmt::Write::write_fmt(
                &mut line,
                format_args!(" {:>14.1} {:>14.1} |", wall - bw, cpu - bc),
            );
        }
        // The process at N = 0: start-up and shutdown (eBPF: loading and attaching).
        let startup = median(table[&("churn", *c)][1].clone()) / 1e6;
        println!("{line} {startup:>14.1}");
    }
    if configs.contains(&"untracked") {
        for w in WORKLOADS {
            let a = allocs.get(w).copied().unwrap_or(n as u64) as f64;
            let [wn, w0, cn, c0] = table[&(w, "untracked")].clone().map(median);
            println!(
                "{w}: untracked {:.1} ns wall, {:.1} ns CPU per allocation; start-up {:.1} ms",
                (wn - w0) / a,
                (cn - c0) / a,
                w0 / 1e6
            );
        }
    }
    for w in WORKLOADS {
        println!(
            "{w}: {} allocations at N (a session's count; events ≈ 2 per allocation)",
            allocs.get(w).map_or("?".into(), |a| a.to_string())
        );
    }
}
