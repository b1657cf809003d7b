//! What the workspace's integration tests share, in one place: the check of what a test needs
//! (capabilities, tools, headers) read from the process itself, the test runner for the
//! `harness = false` binaries, the checks several binaries make, and artifacts built from
//! hand-written events.
//!
//! **Skipped is never passed.** A test that needs something this machine lacks is reported by
//! the runner as `ignored, <what is missing and how to get it>`, and counted as ignored in the
//! summary line. With `MEMTRACK_REQUIRE_PRIVILEGED=1` in the environment (CI sets it, as root)
//! a missing need fails the test instead: a CI run that skipped a privileged test is red.
//!
//! The runner is [libtest-mimic](https://docs.rs/libtest-mimic): libtest's command line
//! (filters, `--exact`, `--skip`, `--list`, `--ignored`, `--test-threads`, `-q`), its output and
//! its `test result: ok. N passed; N failed; N ignored; …` line, for binaries that cannot use
//! libtest itself (the recorders see every thread of the process, and libtest's threads would
//! add allocations to exact counts) or that decide at run time whether a test can run (libtest
//! can only ignore at compile time).

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Output;

use libtest_mimic::{Arguments, Completion};
pub use libtest_mimic::{Failed, Trial};
use memtrack::{
    artifact::Backend, artifact::Metadata, encode::Encoder, encode::EncoderOptions, event::Event,
    event::EventKind,
};

pub mod fixtures;

/// The environment variable that turns a missing need into a failure (CI sets it).
pub const REQUIRE: &str = "MEMTRACK_REQUIRE_PRIVILEGED";

/// A capability, by its bit in `CapEff` (linux/capability.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// `CAP_CHOWN`: give a file to another user.
    Chown = 0,
    /// `CAP_SETGID`: run a child as another group.
    Setgid = 6,
    /// `CAP_SETUID`: run a child as another user.
    Setuid = 7,
    /// `CAP_SETFCAP`: give a file capabilities (`setcap`).
    Setfcap = 31,
    /// `CAP_PERFMON`: attach uprobes.
    Perfmon = 38,
    /// `CAP_BPF`: load BPF programs and maps.
    Bpf = 39,
}

impl Cap {
    fn name(self) -> &'static str {
        match self {
            Cap::Chown => "CAP_CHOWN",
            Cap::Setgid => "CAP_SETGID",
            Cap::Setuid => "CAP_SETUID",
            Cap::Setfcap => "CAP_SETFCAP",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::Bpf => "CAP_BPF",
        }
    }
}

/// Something a test needs that a machine may lack.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// These capabilities in the effective set.
    Caps(&'static [Cap]),
    /// Effective uid 0: for a test of what memtrack does when run by root (it decides on the
    /// uid, not on capabilities, e.g. `record --user`).
    Root,
    /// A program found on `PATH` (a compiler for the fixtures, `setcap`).
    Tool(&'static str),
    /// A file (a header a fixture compiles against), and the command that installs it.
    File(&'static str, &'static str),
    /// Setuid bits and file capabilities take effect for programs in the temporary directory
    /// ([`std::env::temp_dir`]) that this process starts: the directory is not on a `nosuid`
    /// mount, and this process does not run with `no_new_privs`.
    Setuid,
    /// A Python module `python3` can import (an independent reader of an export), and the
    /// command that installs it.
    Python(&'static str, &'static str),
    /// A feature of the running kernel that the test's figures depend on (the tracker's older
    /// way without it records less of what the test checks, as the guide says). Missing, the
    /// test is reported as ignored even with [`REQUIRE`] set: no set-up can add it.
    Kernel(memtrack::tracker::Feature),
}

/// What the eBPF tracker needs: `CAP_BPF` and `CAP_PERFMON` (root has both).
pub const TRACKER: Need = Need::Caps(&[Cap::Bpf, Cap::Perfmon]);

/// The capabilities in this process's effective set, from `/proc/self/status` (`CapEff`, hex).
pub fn effective_caps() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff in /proc/self/status")
        .trim();
    u64::from_str_radix(hex, 16).expect("CapEff is hex")
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(d.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Whether `dir` is on a mount where setuid bits and file capabilities have no effect
/// (`statvfs`'s `ST_NOSUID`; a directory that cannot be examined counts as nosuid).
fn nosuid(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: an all-zero statvfs is a valid value for statvfs to overwrite.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid statvfs to fill.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    r != 0 || st.f_flag & libc::ST_NOSUID != 0
}

/// Whether this process runs with `no_new_privs` (then nothing it executes gains privileges).
fn no_new_privs() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NoNewPrivs:"))
            .is_some_and(|v| v.trim() == "1")
    })
}

fn python_has(module: &str) -> bool {
    std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Why a test with `needs` cannot run here (every missing need, and how to get it), or `None`.
pub fn missing(needs: &[Need]) -> Option<String> {
    let caps = effective_caps();
    let mut why = Vec::new();
    for need in needs {
        match *need {
            Need::Caps(wanted) => {
                let lacking: Vec<&str> = wanted
                    .iter()
                    .filter(|&&c| caps & (1 << c as u32) == 0)
                    .map(|c| c.name())
                    .collect();
                if !lacking.is_empty() {
                    why.push(format!(
                        "needs {}, not in this process's effective capabilities: run as \
                         root, e.g. `sudo -E cargo test`",
                        lacking.join(" + ")
                    ));
                }
            }
            // SAFETY: geteuid has no preconditions.
            Need::Root if unsafe { libc::geteuid() } != 0 => why.push(
                "needs to run as root (effective uid 0), not only with capabilities: \
                 e.g. `sudo -E cargo test`"
                    .to_string(),
            ),
            Need::Tool(tool) if !on_path(tool) => why.push(format!("needs `{tool}` on PATH")),
            Need::File(path, fix) if !Path::new(path).exists() => {
                why.push(format!("needs {path}: {fix}"))
            }
            Need::Setuid if nosuid(&std::env::temp_dir()) => why.push(format!(
                "needs setuid bits and file capabilities to take effect in the temporary \
                 directory, and {} is on a nosuid mount: set TMPDIR to a directory on a mount \
                 without nosuid",
                std::env::temp_dir().display()
            )),
            Need::Setuid if no_new_privs() => why.push(
                "needs setuid bits and file capabilities to take effect, and this process runs \
                 with no_new_privs (NoNewPrivs: 1 in /proc/self/status): run the tests outside \
                 the sandbox that sets it"
                    .to_string(),
            ),
            Need::Python(module, fix) if !python_has(module) => {
                why.push(format!("needs the Python module {module}: {fix}"))
            }
            Need::Kernel(f) => {
                if let Some(k) = kernel_lacks(f) {
                    why.push(k);
                }
            }
            _ => {}
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Why the running kernel does not do for a test that needs `f` (probed only with the
/// tracker's privileges: without them the test's other needs say what is missing).
fn kernel_lacks(f: memtrack::tracker::Feature) -> Option<String> {
    if !memtrack::tracker::privileged() {
        return None;
    }
    let k = memtrack::tracker::Kernel::get();
    (!k.has(f)).then(|| {
        format!(
            "needs {} of the kernel, which Linux {} lacks (or MEMTRACK_KERNEL_WITHOUT says it does)",
            f.name(),
            k.release
        )
    })
}

/// Whether every missing need of `needs` is a kernel feature (see [`Need::Kernel`]).
fn only_kernel_lacks(needs: &[Need]) -> bool {
    let other: Vec<Need> = needs
        .iter()
        .copied()
        .filter(|n| !matches!(n, Need::Kernel(_)))
        .collect();
    missing(&other).is_none()
}

/// Runs `cmd` to completion and returns its output; panics, with its stderr, unless it
/// succeeded.
pub fn run_ok(cmd: &mut std::process::Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether missing needs fail instead of being ignored ([`REQUIRE`] set to anything but `0`).
pub fn required() -> bool {
    std::env::var_os(REQUIRE).is_some_and(|v| !v.is_empty() && v != "0")
}

fn outcome(r: std::thread::Result<()>) -> Result<Completion, Failed> {
    r.map(|()| Completion::Completed).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("(a panic without a message)");
        Failed::from(format!("test panicked: {msg}"))
    })
}

/// A test that runs wherever the binary runs.
pub fn test(name: &str, f: impl FnOnce() + Send + 'static) -> Trial {
    requires(name, &[], f)
}

/// A test that runs only where `needs` are met: elsewhere it is reported as ignored with what
/// is missing, or fails if [`REQUIRE`] is set.
pub fn requires(name: &str, needs: &'static [Need], f: impl FnOnce() + Send + 'static) -> Trial {
    Trial::ignorable_test(name, move || match missing(needs) {
        Some(why) if required() && !only_kernel_lacks(needs) => Err(Failed::from(format!(
            "{REQUIRE} is set and this test {why}"
        ))),
        Some(why) => Ok(Completion::ignored_with(why)),
        None => outcome(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))),
    })
}

/// A test of what happens *without* `needs` (a refusal that only an unprivileged process
/// sees): where they are met it is reported as ignored, whatever [`REQUIRE`] says; CI runs
/// such binaries a second time as an unprivileged user.
pub fn lacking(name: &str, needs: &'static [Need], f: impl FnOnce() + Send + 'static) -> Trial {
    Trial::ignorable_test(name, move || match missing(needs) {
        None => Ok(Completion::ignored_with(
            "checks a refusal seen only without these privileges, and this process has them; CI runs it unprivileged too",
        )),
        Some(_) => outcome(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))),
    })
}

/// Runs `trials` with libtest's command line and exits with libtest's status, in parallel
/// (`--test-threads`, default: the number of CPUs), in name order as libtest runs them (which
/// tests overlap in time then stays what it was under libtest).
pub fn run(mut trials: Vec<Trial>) -> ! {
    trials.sort_by(|a, b| a.name().cmp(b.name()));
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}

/// Runs `trials` one after another on the main thread, whatever `--test-threads` says, in a
/// fresh `$MEMTRACK_DIR`: for binaries whose tests record the whole process. Call it first
/// thing in `main` (it sets an environment variable: no other thread may exist yet).
pub fn run_sequential(trials: Vec<Trial>) -> ! {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let dir = tempfile::tempdir().expect("tempdir");
    // SAFETY: called first thing in `main` (documented): no other thread exists yet.
    unsafe { std::env::set_var("MEMTRACK_DIR", dir.path()) };
    let conclusion = libtest_mimic::run(&args, trials);
    drop(dir);
    conclusion.exit()
}

/// Asserts that for each of `threads` worker threads, which made `per_thread` mallocs of size
/// `base + i` (a size no one else uses), all of them are in `evs`, from one thread that is not
/// the main thread, and that the workers are distinct threads.
pub fn assert_one_thread_per_size(evs: &[Event], threads: u64, base: u64, per_thread: usize) {
    let mut tids = BTreeSet::new();
    for i in 0..threads {
        let of: Vec<&Event> = evs
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { size, .. } if size == base + i))
            .collect();
        assert_eq!(of.len(), per_thread, "thread {i}: {of:?}");
        assert!(
            of.iter()
                .all(|e| e.tid == of[0].tid && e.tid != std::process::id()),
            "thread {i}: {of:?}"
        );
        tids.insert(of[0].tid);
    }
    assert_eq!(tids.len() as u64, threads);
}

/// The three blocks many tests count, all live at once: 100 bytes (malloc), 64 (a boxed
/// `[u64; 8]`: malloc) and 1,000 zeroed bytes (calloc): 3 allocations, 1,164 bytes, a peak of
/// 1,164. Dropping them frees all three.
#[inline(never)]
pub fn three_blocks() -> (Vec<u8>, Box<[u64; 8]>, Vec<u8>) {
    let a: Vec<u8> = std::hint::black_box(Vec::with_capacity(100));
    let b = std::hint::black_box(Box::new([7u64; 8]));
    let c = std::hint::black_box(vec![0u8; 1000]);
    (a, b, c)
}

/// Two sessions one after the other, started by `start`, making 5 and 9 blocks of `10 + i`
/// bytes: each report counts its own blocks only, and the artifact's events (counted by
/// [`count`]) hold exactly them.
pub fn check_sequential_sessions(start: impl Fn(&str) -> memtrack::Session) {
    for (name, n) in [("seq_a", 5u64), ("seq_b", 9)] {
        let s = start(name);
        for i in 0..n {
            std::hint::black_box(Vec::<u8>::with_capacity(10 + i as usize));
        }
        let report = s.finish().expect("finish");
        let bytes = (0..n).map(|i| 10 + i).sum::<u64>();
        assert_eq!(
            (report.allocations(), report.bytes_allocated()),
            (n, bytes),
            "{name}: {}",
            report.summary_line()
        );
        assert_eq!(report.lost_events(), 0);
        let path = report.path.as_ref().expect("written to a file");
        let events: Vec<Event> = memtrack::artifact::Reader::open(path)
            .expect("artifact")
            .events()
            .collect::<Result<_, _>>()
            .expect("decode");
        let c = count(&events);
        assert_eq!(
            (c.allocations, c.bytes_allocated, c.frees),
            (n, bytes, n),
            "{name}: {events:?}"
        );
    }
}

/// Makes two blocks (100 and 200 bytes) in `s`, takes a snapshot after each step, and checks
/// the snapshots count exactly what came before them and that taking them allocated nothing.
pub fn check_stats_mid_session(s: memtrack::Session) {
    let a = std::hint::black_box(Vec::<u8>::with_capacity(100));
    let b = std::hint::black_box(Vec::<u8>::with_capacity(200));
    let st = s.stats().expect("stats");
    assert_eq!(
        (
            st.allocations,
            st.bytes_allocated,
            st.live_blocks,
            st.live_bytes
        ),
        (2, 300, 2, 300),
        "{st:?}"
    );
    drop(a);
    let st = s.stats().expect("stats");
    assert_eq!(
        (
            st.allocations,
            st.frees,
            st.live_blocks,
            st.live_bytes,
            st.peak_live_bytes
        ),
        (2, 1, 1, 200, 300),
        "{st:?}"
    );
    drop(b);
    let r = s.finish().expect("finish");
    // Taking the snapshots allocated and freed nothing on this thread.
    assert_eq!(
        (
            r.allocations(),
            r.totals().frees,
            r.totals().live_blocks_at_end
        ),
        (2, 2, 0),
        "{}",
        r.summary_line()
    );
}

/// Totals computed from the events by the test, with the simplest model of the rules the
/// guide states (docs/src/numbers.md) (not memtrack's `Analyzer`): the independent oracle for `show`, reports and
/// trailers. For well-formed streams (every free frees a live block, mappings do not overlap),
/// as the fixtures and `Synth` make.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// malloc, calloc, the aligned family, and reallocs that return a block.
    pub allocations: u64,
    /// The sum of their sizes.
    pub bytes_allocated: u64,
    /// Frees of a block (`free`, or a `realloc` moving or freeing its old block).
    pub frees: u64,
    /// The sizes of the blocks those frees freed.
    pub bytes_freed: u64,
    /// The most heap bytes live at once.
    pub peak_live_bytes: u64,
    /// Blocks and bytes live after the last event.
    pub live_blocks_at_end: u64,
    /// See `live_blocks_at_end`.
    pub live_bytes_at_end: u64,
    /// The most mapped bytes at once (mappings are whole 4 KiB pages).
    pub mapped_bytes_peak: u64,
    /// Mapped bytes after the last event.
    pub mapped_bytes_at_end: u64,
}

/// The finished artifact at `path` (complete, or the test fails) and its events.
pub fn read_complete(path: &Path) -> (memtrack::artifact::Reader, Vec<Event>) {
    let r = memtrack::artifact::Reader::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        r.completeness(),
        &memtrack::artifact::Completeness::Complete,
        "{}",
        path.display()
    );
    let evs = r.events().collect::<Result<_, _>>().expect("decode");
    (r, evs)
}

/// Every `.rs` file under `dirs` (recursively), sorted: what the source checks read.
pub fn rust_sources(mut dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// [`Counted`] over `evs`.
pub fn count(evs: &[Event]) -> Counted {
    use std::collections::HashMap;
    fn pages(size: u64) -> u64 {
        size.div_ceil(4096) * 4096
    }
    fn free(c: &mut Counted, live: &mut HashMap<u64, u64>, live_bytes: &mut u64, addr: u64) {
        if addr != 0 {
            c.frees += 1;
            if let Some(size) = live.remove(&addr) {
                c.bytes_freed += size;
                *live_bytes -= size;
            }
        }
    }
    let mut c = Counted::default();
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut maps: HashMap<u64, u64> = HashMap::new();
    let (mut live_bytes, mut mapped) = (0u64, 0u64);
    for e in evs {
        let mut alloc = None;
        match e.kind {
            EventKind::Malloc { addr, size }
            | EventKind::Calloc { addr, size }
            | EventKind::AlignedAlloc { addr, size, .. } => alloc = Some((addr, size)),
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            } => {
                free(&mut c, &mut live, &mut live_bytes, old_addr);
                if new_addr != 0 {
                    alloc = Some((new_addr, size));
                }
            }
            EventKind::Free { addr } => free(&mut c, &mut live, &mut live_bytes, addr),
            EventKind::Mmap { addr, size } => {
                maps.insert(addr, pages(size));
                mapped += pages(size);
            }
            EventKind::Munmap { addr, .. } => mapped -= maps.remove(&addr).unwrap_or(0),
            EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            } => {
                mapped -= maps.remove(&old_addr).unwrap_or(0);
                maps.insert(new_addr, pages(size));
                mapped += pages(size);
            }
            // Neither changes the heap; `iterations` in tests/calls.rs cuts the events at them.
            EventKind::Brk { .. } | EventKind::IterationStart | EventKind::IterationEnd => {}
            other => panic!(
                "count() has no rule for {other:?}: add the guide's rule for it (docs/src/numbers.md)"
            ),
        }
        if let Some((addr, size)) = alloc {
            c.allocations += 1;
            c.bytes_allocated += size;
            live_bytes += size;
            if let Some(old) = live.insert(addr, size) {
                live_bytes -= old;
            }
        }
        c.peak_live_bytes = c.peak_live_bytes.max(live_bytes);
        c.mapped_bytes_peak = c.mapped_bytes_peak.max(mapped);
    }
    c.live_blocks_at_end = live.len() as u64;
    c.live_bytes_at_end = live_bytes;
    c.mapped_bytes_at_end = mapped;
    c
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

/// The lock-wait tests' contended workload: `threads` threads, released together, take turns
/// on one `std::sync::Mutex`, each holding it `holds` times for `hold` (sleeping while it holds
/// it); returns when all have joined.
pub fn take_turns(threads: usize, holds: u32, hold: std::time::Duration) {
    use std::sync::{Arc, Barrier, Mutex};
    let m = Arc::new(Mutex::new(0u64));
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (m, start) = (Arc::clone(&m), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..holds {
                    let mut g = m.lock().unwrap();
                    *g += 1;
                    std::thread::sleep(hold);
                    drop(g);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Records this process's lock waits into `path` through a ring buffer too small for them
/// (4 KiB: 64 events, drained every 10 ms) while 8 threads sleep 300 × 50 µs each, so that
/// switches are lost; asserts that some were, and returns how many events the recording lost.
/// The tests that a lossy lock-wait recording is refused start from it.
pub fn record_lost_switches(path: &Path) -> u64 {
    use memtrack::{
        Scope, artifact::Backend, artifact::Metadata, encode::EncoderOptions, tracker::Capture,
        tracker::Tracker, tracker::TrackerOptions,
    };
    let tracker = Tracker::attach(
        std::process::id(),
        &TrackerOptions::new().ringbuf_bytes(4096),
    )
    .expect("load and attach");
    let meta = Metadata::now(std::process::id(), Backend::Ebpf).with_name("lost-switches");
    let rec = tracker
        .start_with(
            File::create(path).unwrap(),
            &meta,
            EncoderOptions::new(),
            2,
            Capture::new(Scope::Process).lock_waits(true),
        )
        .unwrap();
    let sleepers: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..300 {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            })
        })
        .collect();
    for s in sleepers {
        s.join().unwrap();
    }
    let recorded = rec.stop().unwrap();
    assert!(recorded.lost_events > 0, "4800 sleeps lost nothing");
    recorded.lost_events
}

/// A session's allocations whose number its code does not fix, because it depends on the other
/// threads of the process, by call site (read from the session's artifact).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProcessDependent {
    /// glibc's thread-local storage vector of a newly mapped thread stack (the innermost frame
    /// is in the dynamic linker: `allocate_dtv`, one `calloc` per new stack): `pthread_create`
    /// maps a stack only when no exited thread's stack is free for reuse.
    pub tls: u64,
    /// Of `tls`, blocks live at the session's end (glibc keeps them with the cached stack).
    pub tls_live: u64,
    /// Nodes of std's map of every live thread's stack guard (a `BTreeMap` in
    /// `stack_overflow::thread_info`): a starting thread allocates one only when its entry
    /// overflows a node, which depends on how many threads of the process are alive.
    pub thread_registry: u64,
}

impl ProcessDependent {
    /// Every one of them.
    pub fn allocations(&self) -> u64 {
        self.tls + self.thread_registry
    }
}

/// [`ProcessDependent`] of a session, from its artifact's call sites.
///
/// # Panics
/// If the session wrote no artifact (`in_memory`), or it cannot be read.
pub fn process_dependent(r: &memtrack::Report) -> ProcessDependent {
    use memtrack::{analysis::Sites, artifact::Reader, stack::Module};
    let path = r.path.as_ref().expect("a session that writes its artifact");
    let reader = Reader::open(path).expect("the session's artifact reads");
    let sites = Sites::read(&reader).expect("its sites read");
    let table = reader.stacks().expect("its stack table reads");
    let in_linker = |m: &Module| {
        let name = Path::new(&m.path).file_name().and_then(|n| n.to_str());
        name.is_some_and(|n| n.starts_with("ld-linux") || n == "ld.so")
    };
    let mut counts = ProcessDependent::default();
    let mut rest = Stacks::default();
    let mut blocks = Vec::new();
    for site in sites.sites.iter().filter(|s| !s.stack.is_none()) {
        let stack = reader.stack(site.stack).expect("a recorded site's stack");
        let innermost = stack.frames.first().and_then(|f| table.module(f.module));
        if innermost.is_some_and(in_linker) {
            counts.tls += site.blocks;
            counts.tls_live += site.blocks_at_end;
            continue;
        }
        for f in &stack.frames {
            if let Some(m) = table.module(f.module) {
                rest.modules.insert(f.module, m.clone());
            }
        }
        rest.stacks.push(stack.clone());
        blocks.push(site.blocks);
    }
    let registry = in_thread_registry(rest);
    counts.thread_registry = blocks
        .iter()
        .zip(registry)
        .filter(|&(_, r)| r)
        .map(|(b, _)| b)
        .sum();
    counts
}

/// Stacks to symbolize, with their modules.
#[derive(Default)]
struct Stacks {
    stacks: Vec<memtrack::stack::Stack>,
    modules: std::collections::HashMap<memtrack::stack::ModuleId, memtrack::stack::Module>,
}

/// Per stack, whether a frame is std's insert into its map of threads' stack guards.
/// Symbolized on one thread for the process (a `Symbolizer` is not `Send`), so that the test
/// binary's debug information, most of the cost, is read once.
fn in_thread_registry(stacks: Stacks) -> Vec<bool> {
    use std::sync::mpsc::{Sender, channel};
    use std::sync::{Mutex, OnceLock};
    type Request = (Stacks, Sender<Vec<bool>>);
    static SYMBOLIZER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    let to = SYMBOLIZER.get_or_init(|| {
        let (to, from) = channel::<Request>();
        std::thread::Builder::new()
            .name("symbolizer".into())
            .spawn(move || {
                let mut sym = memtrack::symbolize::Symbolizer::new();
                for (Stacks { stacks, modules }, reply) in from {
                    let refs: Vec<_> = stacks.iter().collect();
                    let named = sym.symbolize_stacks(&refs, |id| modules.get(&id));
                    let found = named.iter().map(|frames| {
                        frames.iter().flatten().any(|f| {
                            f.function.as_deref().is_some_and(|n| {
                                n.ends_with("stack_overflow::thread_info::set_current_info")
                            })
                        })
                    });
                    let _ = reply.send(found.collect());
                }
            })
            .expect("spawn the symbolizer");
        Mutex::new(to)
    });
    let (reply, answer) = channel();
    let sent = to
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((stacks, reply));
    sent.expect("the symbolizer runs");
    answer.recv().expect("the symbolizer answers")
}
