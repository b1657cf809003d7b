//! The eBPF tracker against the real kernel, through `record_command` (a spawned fixture per
//! test, so the tests may run in parallel: each loads its own program for its own pid).
//!
//! `harness = false` (memtrack-test-support's runner): each test needs CAP_BPF + CAP_PERFMON
//! and a C compiler, and without them is reported as ignored with what is missing; CI runs
//! them as root and fails if one was not run.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use memtrack::{
    artifact::Reader, event::Event, event::EventKind, tracker::TrackerOptions,
    tracker::record_command,
};
use memtrack_test_support::{Need, TRACKER, Trial, requires};

// Below glibc's mmap threshold: the markers stay on the heap and add no syscalls.
const MARK_BEGIN: u64 = 0xbe01;
const MARK_END: u64 = 0xbe02;

/// What every test here needs: the tracker, and the C and C++ compilers for the fixtures.
const NEEDS: &[Need] = &[TRACKER, Need::Tool("cc"), Need::Tool("c++")];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Compiles `src` (in tests/fixtures) into `dir` with `cc` and `args`.
fn build(dir: &Path, src: &str, out: &str, args: &[&str]) -> PathBuf {
    let exe = dir.join(out);
    let cc = if src.ends_with(".cc") { "c++" } else { "cc" };
    let st = Command::new(cc)
        .arg("-O1")
        .arg(fixtures().join(src))
        .arg("-o")
        .arg(&exe)
        .args(args)
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling {src} failed");
    exe
}

struct Run {
    pid: u32,
    exit_code: i32,
    events: Vec<Event>,
    lost: u64,
}

fn record(dir: &Path, cmd: &[&OsString], opts: &TrackerOptions) -> Run {
    let path = dir.join(format!("run-{}.memtrack", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    let cmd: Vec<OsString> = cmd.iter().map(|s| (*s).clone()).collect();
    let out = record_command(&cmd, file, opts).expect("record");
    let reader = Reader::open(&path).unwrap();
    let events: Vec<Event> = reader.events().collect::<Result<_, _>>().unwrap();
    assert_eq!(
        reader.final_metadata().unwrap().lost_events,
        out.recorded.lost_events
    );
    assert_eq!(events.len() as u64, out.recorded.written.events);
    Run {
        pid: out.pid,
        exit_code: out.exit_code,
        events,
        lost: out.recorded.lost_events,
    }
}

fn os(s: impl Into<OsString>) -> OsString {
    s.into()
}

/// The events of the main thread strictly between the two marker allocations (and their
/// frees), in order.
fn between_markers(run: &Run) -> Vec<EventKind> {
    let main: Vec<&Event> = run.events.iter().filter(|e| e.tid == run.pid).collect();
    let pos = |size| {
        main.iter()
            .position(|e| matches!(e.kind, EventKind::Malloc { size: s, .. } if s == size))
            .unwrap_or_else(|| panic!("marker {size:#x} missing"))
    };
    let (b, e) = (pos(MARK_BEGIN), pos(MARK_END));
    // Skip the begin marker's free; stop before the end marker's malloc.
    main[b + 2..e].iter().map(|e| e.kind).collect()
}

/// [`between_markers`] without the syscall events (the heap may grow with `brk`).
fn heap_between_markers(run: &Run) -> Vec<EventKind> {
    between_markers(run)
        .into_iter()
        .filter(|k| {
            !matches!(
                k,
                EventKind::Mmap { .. }
                    | EventKind::Munmap { .. }
                    | EventKind::Mremap { .. }
                    | EventKind::Brk { .. }
            )
        })
        .collect()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn libc_family_exact_sequence() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("basic")],
        &TrackerOptions::new(),
    );
    assert_eq!(run.exit_code, 0);
    assert!(
        run.events.iter().all(|e| e.pid == run.pid),
        "an event of another process"
    );
    let got = heap_between_markers(&run);

    // Build the expected sequence from the addresses actually returned.
    let mut exp = Vec::new();
    let mut it = got.iter();
    let mut next = || *it.next().expect("sequence too short");
    for i in 0..1000u64 {
        let m = next();
        let EventKind::Malloc { addr, size } = m else {
            panic!("#{i}: {m:?}")
        };
        assert_eq!(size, i % 100 + 1);
        exp.push(m);
        let f = next();
        assert_eq!(f, EventKind::Free { addr }, "#{i}");
        exp.push(f);
    }
    let c = next();
    let EventKind::Calloc {
        addr: ca,
        size: 240,
    } = c
    else {
        panic!("calloc: {c:?}")
    };
    assert_eq!(next(), EventKind::Free { addr: ca });
    let m = next();
    let EventKind::Malloc { addr: a0, size: 16 } = m else {
        panic!("malloc 16: {m:?}")
    };
    let r1 = next();
    let EventKind::Realloc {
        old_addr,
        new_addr: a1,
        size: 1024,
    } = r1
    else {
        panic!("{r1:?}")
    };
    assert_eq!(old_addr, a0);
    let r2 = next();
    let EventKind::Realloc {
        old_addr,
        new_addr: a2,
        size: 8,
    } = r2
    else {
        panic!("{r2:?}")
    };
    assert_eq!(old_addr, a1);
    assert_eq!(
        next(),
        EventKind::Free { addr: a2 },
        "realloc(p, 0) is a free"
    );
    let m = next();
    let EventKind::Malloc { addr: a3, size: 40 } = m else {
        panic!("realloc(NULL, 40): {m:?}")
    };
    assert_eq!(next(), EventKind::Free { addr: a3 });
    for (size, align) in [(256, 64), (100, 128), (50, 32), (10, 4096), (10, 4096)] {
        let e = next();
        let EventKind::AlignedAlloc {
            addr,
            size: s,
            align: al,
        } = e
        else {
            panic!("{e:?}")
        };
        assert_eq!((s, al), (size, align));
        assert_eq!(addr % align, 0);
        assert_eq!(next(), EventKind::Free { addr });
    }
    // The failed malloc is absent; reallocarray(NULL, 10, 10) is a malloc of 100.
    let m = next();
    let EventKind::Malloc { addr, size: 100 } = m else {
        panic!("reallocarray: {m:?}")
    };
    assert_eq!(next(), EventKind::Free { addr });
    assert!(
        it.next().is_none(),
        "unexpected extra events: {:?}",
        it.collect::<Vec<_>>()
    );
}

fn mmap_munmap_mremap() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("maps")],
        &TrackerOptions::new(),
    );
    let got = between_markers(&run);
    let page = 4096;
    let maps: Vec<_> = got
        .iter()
        .filter(|k| {
            matches!(
                k,
                EventKind::Mmap { .. } | EventKind::Munmap { .. } | EventKind::Mremap { .. }
            )
        })
        .collect();
    // printf may map its stdout buffer after munmap: look at the first three.
    let EventKind::Mmap {
        addr: m,
        size: 12288,
    } = *maps[0]
    else {
        panic!("{maps:?}")
    };
    let EventKind::Mremap {
        old_addr,
        new_addr: r,
        size,
    } = *maps[1]
    else {
        panic!("{maps:?}")
    };
    assert_eq!((old_addr, size), (m, 5 * page));
    assert_eq!(
        *maps[2],
        EventKind::Munmap {
            addr: r,
            size: 5 * page
        }
    );
}

fn cxx_new_delete_counted_once() {
    let dir = tmp();
    let exe = build(dir.path(), "cxx.cc", "cxx", &[]);
    let run = record(dir.path(), &[&os(&exe)], &TrackerOptions::new());
    let got = heap_between_markers(&run);
    let allocs: Vec<_> = got
        .iter()
        .filter(|k| !matches!(k, EventKind::Free { .. }))
        .collect();
    let frees = got.len() - allocs.len();
    assert_eq!(allocs.len(), 4, "{got:?}");
    assert_eq!(frees, 4, "{got:?}");
    assert!(
        matches!(got[0], EventKind::Malloc { size: 4, .. }),
        "{got:?}"
    );
    assert!(
        matches!(got[2], EventKind::Malloc { size: 40, .. }),
        "{got:?}"
    );
    assert!(
        matches!(
            got[4],
            EventKind::AlignedAlloc {
                size: 128,
                align: 64,
                ..
            }
        ),
        "{got:?}"
    );
    assert!(
        matches!(got[6], EventKind::Malloc { size: 48, .. }),
        "{got:?}"
    );
    for pair in got.chunks(2) {
        let addr = match pair[0] {
            EventKind::Malloc { addr, .. } | EventKind::AlignedAlloc { addr, .. } => addr,
            other => panic!("{other:?}"),
        };
        assert_eq!(pair[1], EventKind::Free { addr });
    }
}

fn threads_carry_their_tids() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &["-pthread"]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("threads")],
        &TrackerOptions::new(),
    );
    let mut by_size: BTreeMap<u64, (BTreeSet<u32>, u64)> = BTreeMap::new();
    let mut addr_tid = BTreeMap::new();
    for e in &run.events {
        if let EventKind::Malloc { addr, size } = e.kind {
            if (1000..1004).contains(&size) {
                let ent = by_size.entry(size).or_default();
                ent.0.insert(e.tid);
                ent.1 += 1;
                addr_tid.insert(addr, e.tid);
            }
        }
    }
    assert_eq!(by_size.len(), 4);
    let tids: BTreeSet<u32> = by_size.values().flat_map(|v| v.0.iter().copied()).collect();
    assert_eq!(tids.len(), 4, "four distinct threads");
    assert!(!tids.contains(&run.pid));
    for (size, (t, n)) in &by_size {
        assert_eq!((t.len(), *n), (1, 100), "size {size}");
    }
}

fn dlopened_library_allocations() {
    let dir = tmp();
    let lib = build(dir.path(), "lib.c", "libfix.so", &["-shared", "-fPIC"]);
    let exe = build(dir.path(), "alloc.c", "alloc", &["-ldl"]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("dlopen"), &os(&lib)],
        &TrackerOptions::new(),
    );
    let got = heap_between_markers(&run);
    let n77 = got
        .iter()
        .filter(|k| matches!(k, EventKind::Malloc { size: 77, .. }))
        .count();
    assert_eq!((n77, got.len()), (5, 6), "{got:?}");
}

fn dlopened_allocator_is_found_while_running() {
    let dir = tmp();
    let lib = build(
        dir.path(),
        "myalloc.c",
        "libmyalloc.so",
        &["-shared", "-fPIC"],
    );
    let exe = build(dir.path(), "alloc.c", "alloc", &["-ldl"]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("dlalloc"), &os(&lib)],
        &TrackerOptions::new(),
    );
    let got = heap_between_markers(&run);
    let [
        EventKind::Malloc { addr, size: 333 },
        EventKind::Free { addr: freed },
    ] = got[..]
    else {
        panic!("{got:?}");
    };
    assert_eq!(addr, freed);
}

fn last_allocation_before_exit_and_exit_code() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("exit")],
        &TrackerOptions::new(),
    );
    assert_eq!(run.exit_code, 7);
    let last_heap = run.events.iter().rev().find(|e| {
        !matches!(
            e.kind,
            EventKind::Munmap { .. } | EventKind::Mmap { .. } | EventKind::Brk { .. }
        )
    });
    assert!(
        matches!(
            last_heap.map(|e| e.kind),
            Some(EventKind::Malloc { size: 4242, .. })
        ),
        "{last_heap:?}"
    );
}

fn unrelated_concurrent_process_is_not_recorded() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    // The same binary, untracked, allocating 24-byte blocks while the tracked one runs.
    let mut other = Command::new(&exe)
        .args(["spin", "3000000"])
        .spawn()
        .unwrap();
    let run = record(
        dir.path(),
        &[&os(&exe), &os("burst"), &os("200000")],
        &TrackerOptions::new(),
    );
    let other_pid = other.id();
    assert!(other.wait().unwrap().success());
    assert!(
        run.events
            .iter()
            .all(|e| e.pid == run.pid && e.pid != other_pid)
    );
    let n24 = run
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Malloc { size: 24, .. }))
        .count();
    assert_eq!(n24, 0);
    let n16 = run
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Malloc { size: 16, .. }))
        .count();
    assert_eq!(n16, 200_000);
}

fn ten_million_events_none_lost() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("burst"), &os("5000000")],
        &TrackerOptions::new(),
    );
    assert_eq!(run.lost, 0);
    let got = heap_between_markers(&run);
    assert_eq!(got.len(), 10_000_000);
    assert!(got.chunks(2).all(|p| matches!(
        (p[0], p[1]),
        (EventKind::Malloc { addr, size: 16 }, EventKind::Free { addr: f }) if addr == f
    )));
}

fn tiny_ring_buffer_reports_losses() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let opts = TrackerOptions::new().ringbuf_bytes(16 * 1024);
    let n = 1_000_000u64;
    let run = record(
        dir.path(),
        &[&os(&exe), &os("burst"), &os(n.to_string())],
        &opts,
    );
    assert!(
        run.lost > 0,
        "a 16 KiB ring buffer cannot hold a 2 M-event burst"
    );
    let burst = run.events.iter().filter(|e| match e.kind {
        EventKind::Malloc { size, .. } => size == 16,
        EventKind::Free { .. } => true,
        _ => false,
    });
    let seen = burst.count() as u64;
    assert!(seen < 2 * n);
    // Every burst event is either in the artifact or counted as lost.
    assert!(
        seen + run.lost >= 2 * n,
        "seen {seen} + lost {} < {}",
        run.lost,
        2 * n
    );
}

/// A fixture that calls an allocator's own API between the markers (not through malloc).
struct AllocatorApi {
    /// The trial's name.
    name: &'static str,
    /// The fixture in tests/fixtures and the library it links.
    fixture: &'static str,
    lib: &'static str,
    /// The tracker, a compiler, and the allocator's header (CI installs it).
    needs: &'static [Need],
    /// The heap events it makes, in order, as (kind, size, alignment).
    expected: &'static [(&'static str, u64, u64)],
}

const APT: &str = "apt-get install -y libjemalloc-dev libmimalloc-dev";

const ALLOCATOR_APIS: &[AllocatorApi] = &[
    AllocatorApi {
        name: "jemalloc_api",
        fixture: "jemalloc.c",
        lib: "-ljemalloc",
        needs: &[
            TRACKER,
            Need::Tool("cc"),
            Need::File("/usr/include/jemalloc/jemalloc.h", APT),
        ],
        expected: &[
            ("aligned", 100, 64),
            ("realloc", 200, 0),
            ("free", 0, 0),
            ("calloc", 50, 0),
            ("free", 0, 0),
            ("malloc", 30, 0),
            ("free", 0, 0),
            ("calloc", 16, 0),
            ("free", 0, 0),
        ],
    },
    AllocatorApi {
        name: "mimalloc_api",
        fixture: "mimalloc.c",
        lib: "-lmimalloc",
        needs: &[
            TRACKER,
            Need::Tool("cc"),
            Need::File("/usr/include/mimalloc.h", APT),
        ],
        expected: &[
            ("malloc", 10, 0),
            ("free", 0, 0),
            ("calloc", 20, 0),
            ("free", 0, 0),
            ("calloc", 30, 0),
            ("free", 0, 0),
            ("malloc", 32, 0),
            ("realloc", 1000, 0),
            ("free", 0, 0),
            ("aligned", 64, 128),
            ("free", 0, 0),
        ],
    },
];

fn allocator_api(api: &AllocatorApi) {
    let dir = tmp();
    let out = api.fixture.trim_end_matches(".c");
    let exe = build(dir.path(), api.fixture, out, &[api.lib]);
    let run = record(dir.path(), &[&os(&exe)], &TrackerOptions::new());
    let got = heap_between_markers(&run);
    let shapes: Vec<_> = got.iter().map(shape).collect();
    assert_eq!(shapes, api.expected, "{got:?}");
}

fn syscalls_can_be_left_out() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let opts = TrackerOptions::new().syscalls(false);
    let run = record(dir.path(), &[&os(&exe), &os("maps")], &opts);
    let syscalls = run.events.iter().filter(|e| {
        matches!(
            e.kind,
            EventKind::Mmap { .. }
                | EventKind::Munmap { .. }
                | EventKind::Mremap { .. }
                | EventKind::Brk { .. }
        )
    });
    assert_eq!(syscalls.count(), 0);
    // The heap is still recorded (this panics if the two marker allocations are missing).
    between_markers(&run);
}

/// By default mmap/munmap are recorded through libc's wrappers (pid-scoped uprobes, no cost
/// to other processes), so a raw `syscall(SYS_mmap)` is not seen; the raw option's global
/// tracepoint sees both.
fn syscalls_through_libc_by_default_raw_on_request() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let page = 4096;
    let maps = |opts: &TrackerOptions| {
        let run = record(dir.path(), &[&os(&exe), &os("rawmaps")], opts);
        assert_eq!(run.exit_code, 0);
        between_markers(&run)
            .into_iter()
            .filter_map(|k| match k {
                EventKind::Mmap { size, .. } => Some(("mmap", size)),
                EventKind::Munmap { size, .. } => Some(("munmap", size)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        maps(&TrackerOptions::new()),
        [("mmap", 3 * page), ("munmap", 3 * page)]
    );
    assert_eq!(
        maps(&TrackerOptions::new().raw_syscalls(true)),
        [
            ("mmap", 3 * page),
            ("munmap", 3 * page),
            ("mmap", 7 * page),
            ("munmap", 7 * page)
        ]
    );
    let bad = record_command(
        &[exe.clone().into_os_string()],
        std::io::sink(),
        &TrackerOptions::new().syscalls(false).raw_syscalls(true),
    );
    assert!(
        matches!(&bad, Err(e) if e.to_string().contains("raw syscalls")),
        "{:?}",
        bad.err()
    );
}

/// (kind, size, alignment) of a heap event: what two runs of the same code share (addresses
/// differ).
fn shape(k: &EventKind) -> (&'static str, u64, u64) {
    match *k {
        EventKind::Malloc { size, .. } => ("malloc", size, 0),
        EventKind::Calloc { size, .. } => ("calloc", size, 0),
        EventKind::Realloc { size, .. } => ("realloc", size, 0),
        EventKind::AlignedAlloc { size, align, .. } => ("aligned", size, align),
        EventKind::Free { .. } => ("free", 0, 0),
        _ => ("other", 0, 0),
    }
}

fn shapes(kinds: &[EventKind]) -> Vec<(&'static str, u64, u64)> {
    kinds.iter().map(shape).collect()
}

/// A script, and a script whose interpreter is itself a script (a shim), record what
/// actually runs: the interpreter named by the `#!` lines, found as the kernel does (not a
/// "no allocator symbols … statically linked?" refusal, a wrong cause).
fn scripts_and_shims_record_their_interpreter() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let direct = record(
        dir.path(),
        &[&os(&exe), &os("basic")],
        &TrackerOptions::new(),
    );
    let want = shapes(&heap_between_markers(&direct));
    assert!(!want.is_empty());
    let script = |name: &str, text: String| {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    // `#!ALLOC basic`: the kernel runs `ALLOC basic SCRIPT`.
    let s = script("s", format!("#!{} basic\n", exe.display()));
    // A shim whose interpreter is the script above: `ALLOC basic S SHIM`.
    let shim = script("shim", format!("#!{}\n", s.display()));
    // A shell script that execs the program: the same process, a new image.
    let sh = script("s.sh", format!("#!/bin/sh\nexec {} basic\n", exe.display()));
    for cmd in [&s, &shim, &sh] {
        let run = record(dir.path(), &[&os(cmd)], &TrackerOptions::new());
        assert_eq!(run.exit_code, 0, "{}", cmd.display());
        assert_eq!(run.lost, 0);
        assert_eq!(
            shapes(&heap_between_markers(&run)),
            want,
            "{}",
            cmd.display()
        );
    }
    // A file that is neither ELF nor a script is refused as not executable, with the fix.
    let text = script("notes", "just text\n".into());
    let e = record_command(&[os(&text)], std::io::sink(), &TrackerOptions::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("neither an ELF program nor a script"), "{e}");
}

/// glibc's thread shutdown returns the blocks left in the exiting thread's
/// cache through `free`; they were freed by the program already and are not user frees. Four
/// workers each malloc+free one size 100 times: each leaves exactly one block in its tcache.
fn thread_exit_cache_flush_is_not_counted_as_frees() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &["-lpthread"]);
    let run = record(
        dir.path(),
        &[&os(&exe), &os("threads")],
        &TrackerOptions::new(),
    );
    assert_eq!(run.exit_code, 0);
    let mut a = memtrack::analysis::Analyzer::new();
    a.update_all(&run.events);
    let t = a.totals();
    assert_eq!(t.allocator_internal_frees, 4, "{t:?}");
    for (tid, th) in &t.per_thread {
        if *tid == run.pid {
            continue;
        }
        // Each worker: its 100 blocks, plus the free of its cache's own struct (allocated
        // inside glibc, so unmatched); the flushed block is not a free.
        assert_eq!((th.allocations, th.frees), (100, 101), "thread {tid}");
    }
    assert_eq!(t.unmatched_frees, 4, "one cache struct per worker: {t:?}");
}

/// A process image's heap ends at exec: under `sh -c 'exec ./prog'` what the program leaves
/// live is the same as when it is recorded alone, and the shell's blocks live at the exec are
/// counted as discarded, not as live at the end.
fn exec_ends_the_images_heap() {
    let dir = tmp();
    let exe = build(dir.path(), "alloc.c", "alloc", &[]);
    let totals = |run: &Run| {
        let mut a = memtrack::analysis::Analyzer::new();
        a.update_all(&run.events);
        a.totals()
    };
    let alone = record(
        dir.path(),
        &[&os(&exe), &os("basic")],
        &TrackerOptions::new(),
    );
    let script = os(format!("exec {} basic", exe.display()));
    let via_sh = record(
        dir.path(),
        &[&os("/bin/sh"), &os("-c"), &script],
        &TrackerOptions::new(),
    );
    assert_eq!((alone.exit_code, via_sh.exit_code), (0, 0));
    let execs: Vec<usize> = (via_sh.events.iter().enumerate())
        .filter(|(_, e)| e.kind == EventKind::Exec)
        .map(|(i, _)| i)
        .collect();
    // memtrack's forked child -> sh (recording is on before it execs), then sh -> alloc.
    assert_eq!(execs.len(), 2, "{execs:?}");
    assert_eq!(execs[0], 0, "the command's own exec comes first");
    assert!(execs.iter().all(|&i| via_sh.events[i].pid == via_sh.pid));
    // What the shell left live at the exec, replayed independently of the Exec handling.
    let mut shell = memtrack::analysis::Analyzer::new();
    shell.update_all(&via_sh.events[..execs[1]]);
    let shell = shell.totals();
    assert!(shell.live_blocks_at_end > 0, "the shell allocated nothing?");
    let (a, s) = (totals(&alone), totals(&via_sh));
    assert_eq!(
        (s.blocks_discarded_at_exec, s.bytes_discarded_at_exec),
        (shell.live_blocks_at_end, shell.live_bytes_at_end)
    );
    assert_eq!(
        (s.live_blocks_at_end, s.live_bytes_at_end),
        (a.live_blocks_at_end, a.live_bytes_at_end)
    );
}

fn main() {
    let tests: &[(&str, fn())] = &[
        ("libc_family_exact_sequence", libc_family_exact_sequence),
        ("mmap_munmap_mremap", mmap_munmap_mremap),
        ("cxx_new_delete_counted_once", cxx_new_delete_counted_once),
        ("threads_carry_their_tids", threads_carry_their_tids),
        ("dlopened_library_allocations", dlopened_library_allocations),
        (
            "dlopened_allocator_is_found_while_running",
            dlopened_allocator_is_found_while_running,
        ),
        (
            "last_allocation_before_exit_and_exit_code",
            last_allocation_before_exit_and_exit_code,
        ),
        (
            "unrelated_concurrent_process_is_not_recorded",
            unrelated_concurrent_process_is_not_recorded,
        ),
        ("ten_million_events_none_lost", ten_million_events_none_lost),
        (
            "tiny_ring_buffer_reports_losses",
            tiny_ring_buffer_reports_losses,
        ),
        ("syscalls_can_be_left_out", syscalls_can_be_left_out),
        (
            "syscalls_through_libc_by_default_raw_on_request",
            syscalls_through_libc_by_default_raw_on_request,
        ),
        (
            "scripts_and_shims_record_their_interpreter",
            scripts_and_shims_record_their_interpreter,
        ),
        (
            "thread_exit_cache_flush_is_not_counted_as_frees",
            thread_exit_cache_flush_is_not_counted_as_frees,
        ),
        ("exec_ends_the_images_heap", exec_ends_the_images_heap),
    ];
    // Each test records a fixture of its own (its own program for its own pid): they may run
    // in parallel, but for the ten-million-event burst, which runs alone (see `ALONE`).
    let mut trials: Vec<Trial> = tests
        .iter()
        .map(|&(name, f)| {
            let exclusive = name == "ten_million_events_none_lost";
            requires(name, NEEDS, move || with_alone(exclusive, f))
        })
        .collect();
    trials.extend(ALLOCATOR_APIS.iter().map(|api| {
        requires(api.name, api.needs, move || {
            with_alone(false, || allocator_api(api))
        })
    }));
    memtrack_test_support::run(trials);
}

/// Runs `f` holding [`ALONE`], exclusively or shared.
fn with_alone(exclusive: bool, f: impl FnOnce()) {
    if exclusive {
        let _alone = ALONE.write().unwrap_or_else(|e| e.into_inner());
        f()
    } else {
        let _beside = ALONE.read().unwrap_or_else(|e| e.into_inner());
        f()
    }
}

/// Held shared by every test, exclusively by `ten_million_events_none_lost`: a burst of 10 M
/// events as fast as a C loop makes them checks that memtrack keeps up with it, which on 2
/// cores it cannot be asked to do while another test's program and recording take one of
/// them: beside the others, on a host with slow uprobes, its 8 MiB ring overflows while the
/// poller is behind (the lost events counted, as they must be).
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());
