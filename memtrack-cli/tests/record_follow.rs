//! `memtrack record` follows the command's process tree, against the
//! real kernel: forked, posix_spawned and exec'd descendants are recorded from their first
//! instruction, an allocator loaded by LD_PRELOAD or dlopen misses nothing, a setuid exec is
//! not followed and is counted, and a tree's totals are the sum of its processes recorded
//! alone with `--no-follow`.
//!
//! `harness = false` (memtrack-test-support's runner): every test needs CAP_BPF + CAP_PERFMON
//! and a C compiler (some also python3, jemalloc, mimalloc or a static libc), and without them
//! is reported as ignored with what is missing, never as passed; CI runs them as root and
//! fails if one was not run. Each test records its own commands, so they may run in parallel.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use memtrack::{
    analysis::Analyzer, analysis::ProcessTotals, artifact::Final, artifact::Reader, event::Event,
    event::EventKind, tracker::CommandOptions, tracker::RecordOutcome, tracker::TrackerOptions,
    tracker::record_command_with,
};
use memtrack_test_support::{Need, TRACKER, requires};

/// What every test here needs: the tracker, and `cc` for the fixture.
const NEEDS: &[Need] = &[TRACKER, Need::Tool("cc")];

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";
/// What `cc -static` links a static program against.
const STATIC_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.a";

/// tests/fixtures/follow.c compiled into `dir`.
fn fixture(dir: &Path) -> PathBuf {
    let exe = dir.join("follow");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/follow.c");
    let st = Command::new("cc")
        .arg("-O1")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling follow.c failed");
    exe
}

struct Run {
    out: RecordOutcome,
    events: Vec<Event>,
    fin: Final,
}

impl Run {
    /// Allocations of exactly `size` bytes, and in how many processes.
    fn allocations_of(&self, size: u64) -> (usize, usize) {
        let mut pids: Vec<u32> = Vec::new();
        let n = self
            .events
            .iter()
            .filter(|e| alloc_size(e) == Some(size))
            .inspect(|e| pids.push(e.pid))
            .count();
        pids.sort_unstable();
        pids.dedup();
        (n, pids.len())
    }

    fn per_process(&self) -> BTreeMap<u32, ProcessTotals> {
        let mut a = Analyzer::new();
        a.update_all(&self.events);
        a.per_process()
    }
}

fn alloc_size(e: &Event) -> Option<u64> {
    match e.kind {
        EventKind::Malloc { size, .. }
        | EventKind::Calloc { size, .. }
        | EventKind::AlignedAlloc { size, .. }
        | EventKind::Realloc { size, .. } => Some(size),
        _ => None,
    }
}

fn record(dir: &Path, cmd: &[&str], follow: bool) -> Run {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("run-{n}.memtrack"));
    let file = std::fs::File::create(&path).unwrap();
    let cmd: Vec<OsString> = cmd.iter().map(OsString::from).collect();
    let out = record_command_with(
        &cmd,
        file,
        &TrackerOptions::new(),
        &CommandOptions::new().follow(follow),
    )
    .expect("record");
    let reader = Reader::open(&path).unwrap();
    let events: Vec<Event> = reader.events().collect::<Result<_, _>>().unwrap();
    let fin = reader.final_metadata().unwrap().clone();
    assert_eq!(
        out.recorded.lost_events, 0,
        "events lost: the counts are not exact"
    );
    Run { out, events, fin }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `sh -c 'ls; python3 …'` records python's allocations, not only sh's.
fn python_started_by_a_shell_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let run = record(
        dir.path(),
        &[
            "/bin/sh",
            "-c",
            "ls >/dev/null; python3 -c 'x=[bytearray(1000) for _ in range(1000)]'",
        ],
        true,
    );
    assert_eq!(run.out.exit_code, 0);
    let first = run.out.pid;
    let big = run
        .events
        .iter()
        .filter(|e| e.pid != first && alloc_size(e).is_some_and(|s| s >= 1000))
        .count();
    assert!(
        big >= 1000,
        "only {big} allocations of 1000 bytes or more outside sh"
    );
    let ps = &run.fin.processes;
    assert!(ps.len() >= 3, "sh, ls and python at least: {ps:?}");
    assert_eq!(ps[0].pid, first);
    assert!(ps.iter().any(|p| p.exe.ends_with("/ls")), "{ps:?}");
    assert!(ps.iter().any(|p| p.exe.contains("python")), "{ps:?}");
    // pyenv's shims run helpers that exit 1 (readlink of a missing link): only the ends.
    assert_eq!(ps[0].exit_code, Some(0));
    assert!(
        ps.iter()
            .any(|p| p.exe.contains("python") && p.exit_code == Some(0)),
        "{ps:?}"
    );
    assert_eq!(run.fin.uncovered_processes(), 0, "{ps:?}");
    assert_eq!(run.out.processes, *ps);
}

/// A forked child's allocations, exactly, in the child's pid; `--no-follow` sees none of them
/// and counts the child as not followed.
fn a_forked_child_is_recorded_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixture(dir.path());
    let run = record(dir.path(), &[s(&exe), "fork", "1000", "4321"], true);
    assert_eq!(run.out.exit_code, 0);
    assert_eq!(run.allocations_of(4321), (1000, 1));
    let child = run
        .events
        .iter()
        .find(|e| alloc_size(e) == Some(4321))
        .unwrap()
        .pid;
    assert_ne!(child, run.out.pid);
    let ps = &run.fin.processes;
    assert_eq!(ps.len(), 2, "{ps:?}");
    assert_eq!((ps[1].pid, ps[1].parent), (child, Some(run.out.pid)));
    assert_eq!(ps[1].exit_code, Some(0));
    assert_eq!(run.fin.uncovered_processes(), 0);

    let alone = record(dir.path(), &[s(&exe), "fork", "1000", "4321"], false);
    assert_eq!(alone.allocations_of(4321), (0, 0));
    assert!(alone.fin.processes.is_empty());
    assert_eq!(alone.fin.unfollowed_processes, 1);
    assert_eq!(alone.fin.uncovered_processes(), 1);
}

/// posix_spawn (clone with CLONE_VM | CLONE_VFORK, then exec): the spawned program, exactly.
fn a_posix_spawned_program_is_recorded_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixture(dir.path());
    let run = record(
        dir.path(),
        &[s(&exe), "spawn", s(&exe), "700", "3210"],
        true,
    );
    assert_eq!(run.out.exit_code, 0);
    assert_eq!(run.allocations_of(3210), (700, 1));
    assert_eq!(run.fin.processes.len(), 2, "{:?}", run.fin.processes);
    assert_eq!(run.fin.uncovered_processes(), 0);
}

/// `env LD_PRELOAD=libjemalloc.so.2 prog` records every allocation: the exec'd program is
/// resolved with its own environment before it runs.
fn an_ld_preload_allocator_is_recorded_from_the_first_call() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixture(dir.path());
    let preload = format!("LD_PRELOAD={JEMALLOC}");
    let run = record(
        dir.path(),
        &["env", &preload, s(&exe), "alloc", "5000", "5555"],
        true,
    );
    assert_eq!(run.out.exit_code, 0);
    assert_eq!(run.allocations_of(5555), (5000, 1));
    assert_eq!(run.fin.uncovered_processes(), 0);
}

/// A program that dlopens its allocator loses none of its calls to the 20 ms rescan: ld.so's
/// `_dl_debug_state` stop probes it before dlopen returns.
fn a_dlopened_allocator_is_probed_before_its_first_call() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixture(dir.path());
    let run = record(
        dir.path(),
        &[s(&exe), "dlopen", MIMALLOC, "20000", "6666"],
        true,
    );
    assert_eq!(run.out.exit_code, 0);
    assert_eq!(run.allocations_of(6666), (20000, 1));
    assert_eq!(run.fin.uncovered_processes(), 0);
}

/// The totals of a tree are the sum of its processes recorded alone (`--no-follow`), and each
/// process's own totals are what recording it alone gives. A forked child runs the shell's
/// code until it execs (dash allocates the program's path there): that part is no program's
/// own recording, and the analysis discards what it left live at exec, so it is set apart.
fn a_trees_totals_are_the_sum_of_its_processes_recorded_alone() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixture(dir.path());
    let (a, b) = (
        [s(&exe), "alloc", "300", "1111"],
        [s(&exe), "alloc", "500", "2222"],
    );
    let script = format!("{}; {}", a.join(" "), b.join(" "));
    let tree = record(dir.path(), &["/bin/sh", "-c", &script], true);
    let ps = &tree.fin.processes;
    assert_eq!(ps.len(), 3, "{ps:?}");
    let alone: Vec<Run> = [&["/bin/sh", "-c", &script][..], &a[..], &b[..]]
        .iter()
        .map(|cmd| record(dir.path(), cmd, false))
        .collect();
    // The children's events before their exec: the shell's code in the forked child.
    let mut exec_seen: std::collections::HashSet<u32> = [ps[0].pid].into();
    let images: Vec<Event> = tree
        .events
        .iter()
        .filter(|e| {
            if e.kind == EventKind::Exec {
                exec_seen.insert(e.pid);
                return false;
            }
            exec_seen.contains(&e.pid)
        })
        .copied()
        .collect();
    let mut an = Analyzer::new();
    an.update_all(&images);
    let per = an.per_process();
    let key = |t: &memtrack::totals::Totals| {
        (
            t.allocations,
            t.bytes_allocated,
            t.frees,
            t.live_blocks_at_end,
        )
    };
    for (p, r) in ps.iter().zip(&alone) {
        let t = &per[&p.pid];
        assert_eq!(
            (
                t.allocations,
                t.bytes_allocated,
                t.frees,
                t.live_blocks_at_end
            ),
            key(&r.fin.totals),
            "process {p:?}"
        );
    }
    let sum = alone
        .iter()
        .map(|r| key(&r.fin.totals))
        .fold((0, 0, 0, 0), |x, k| {
            (x.0 + k.0, x.1 + k.1, x.2 + k.2, x.3 + k.3)
        });
    assert_eq!(key(&an.totals()), sum);
    // What the forked children did before exec is nothing's live block at the end.
    let whole = tree.per_process();
    for p in &ps[1..] {
        let (w, i) = (&whole[&p.pid], &per[&p.pid]);
        assert_eq!(w.live_blocks_at_end, i.live_blocks_at_end, "{p:?}");
        assert_eq!(
            w.allocations - i.allocations,
            w.blocks_discarded_at_exec + (w.frees - i.frees),
            "{p:?}"
        );
    }
}

/// A setuid program a followed process executes is never followed: it stays unobserved, and
/// the recording says so: a descendant that gains privileges is never observed.
fn a_setuid_exec_is_not_followed_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixture(dir.path());
    let setuid = dir.path().join("follow-setuid");
    std::fs::copy(&exe, &setuid).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let script = format!("{} alloc 10 1234; {} alloc 10 3333", s(&exe), s(&setuid));
    let run = record(dir.path(), &["/bin/sh", "-c", &script], true);
    assert_eq!(run.out.exit_code, 0);
    assert_eq!(run.allocations_of(1234), (10, 1));
    assert_eq!(run.allocations_of(3333), (0, 0));
    let ps = &run.fin.processes;
    let p = ps
        .iter()
        .find(|p| p.exe.ends_with("follow-setuid"))
        .unwrap_or_else(|| panic!("{ps:?}"));
    assert!(
        p.uncovered.as_deref().is_some_and(|w| w.contains("setuid")),
        "{p:?}"
    );
    assert_eq!(run.fin.uncovered_processes(), 1, "{ps:?}");
}

/// The CLI says which processes were covered (`record`, `show`, `show --json`), and `verify`
/// and `compare` refuse a recording that left some out, as they refuse lost events.
fn the_cli_shows_coverage_and_refuses_an_uncovered_recording() {
    let dir = tempfile::tempdir().unwrap();
    let exe = fixture(dir.path());
    let memtrack = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memtrack"))
            .args(args)
            .output()
            .unwrap()
    };
    let text = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };
    let (tree, alone) = (
        dir.path().join("tree.memtrack"),
        dir.path().join("alone.memtrack"),
    );
    let o = memtrack(&[
        "record",
        "-o",
        s(&tree),
        "--",
        s(&exe),
        "fork",
        "100",
        "4321",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("2 processes recorded"), "{}", text(&o));
    let o = memtrack(&["verify", s(&tree)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = memtrack(&["show", "--json", s(&tree)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["uncovered_processes"], 0);
    let ps = v["processes"].as_array().unwrap();
    assert_eq!(ps.len(), 2);
    assert_eq!(ps[1]["allocations"], 100);
    assert_eq!(ps[1]["bytes_allocated"], 432_100);
    assert_eq!(ps[1]["exit_code"], 0);

    let o = memtrack(&[
        "record",
        "--no-follow",
        "-o",
        s(&alone),
        "--",
        s(&exe),
        "fork",
        "100",
        "4321",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("NOT COVERED: 1 process started by the command and not followed"),
        "{}",
        text(&o)
    );
    let o = memtrack(&["show", s(&alone)]);
    assert!(text(&o).contains("NOT COVERED"), "{}", text(&o));
    let o = memtrack(&["verify", s(&alone)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("1 process was not covered"),
        "{}",
        text(&o)
    );
    let o = memtrack(&["verify", "--structure-only", s(&alone)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = memtrack(&["compare", s(&alone), s(&tree)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not covered"), "{}", text(&o));
}

/// A program with no allocator the probes can find (static and stripped) is flagged, not
/// reported as a process that allocated nothing.
fn a_program_without_a_probeable_allocator_is_not_covered() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("follow-static");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/follow.c");
    let built = Command::new("cc")
        .args(["-O1", "-static", "-s"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        built,
        "cc -static could not link follow.c although {STATIC_LIBC} exists"
    );
    let script = format!("{} alloc 10 1234", s(&exe));
    let run = record(dir.path(), &["/bin/sh", "-c", &script], true);
    assert_eq!(run.out.exit_code, 0);
    let ps = &run.fin.processes;
    let p = ps
        .iter()
        .find(|p| p.exe.ends_with("follow-static"))
        .unwrap_or_else(|| panic!("{ps:?}"));
    assert!(
        p.uncovered
            .as_deref()
            .is_some_and(|w| w.contains("no allocator entry point")),
        "{p:?}"
    );
    assert_eq!(run.fin.uncovered_processes(), 1, "{ps:?}");
}

fn main() {
    const JEMALLOC_NEED: Need = Need::File(JEMALLOC, "apt-get install libjemalloc-dev");
    const MIMALLOC_NEED: Need = Need::File(MIMALLOC, "apt-get install libmimalloc-dev");
    const STATIC_NEED: Need = Need::File(STATIC_LIBC, "apt-get install libc6-dev");
    memtrack_test_support::run(vec![
        requires(
            "python_started_by_a_shell_is_recorded",
            &[TRACKER, Need::Tool("cc"), Need::Tool("python3")],
            python_started_by_a_shell_is_recorded,
        ),
        requires(
            "a_forked_child_is_recorded_exactly",
            NEEDS,
            a_forked_child_is_recorded_exactly,
        ),
        requires(
            "a_posix_spawned_program_is_recorded_exactly",
            NEEDS,
            a_posix_spawned_program_is_recorded_exactly,
        ),
        requires(
            "an_ld_preload_allocator_is_recorded_from_the_first_call",
            &[TRACKER, Need::Tool("cc"), JEMALLOC_NEED],
            an_ld_preload_allocator_is_recorded_from_the_first_call,
        ),
        requires(
            "a_dlopened_allocator_is_probed_before_its_first_call",
            &[TRACKER, Need::Tool("cc"), MIMALLOC_NEED],
            a_dlopened_allocator_is_probed_before_its_first_call,
        ),
        requires(
            "a_trees_totals_are_the_sum_of_its_processes_recorded_alone",
            NEEDS,
            a_trees_totals_are_the_sum_of_its_processes_recorded_alone,
        ),
        requires(
            "a_setuid_exec_is_not_followed_and_is_counted",
            NEEDS,
            a_setuid_exec_is_not_followed_and_is_counted,
        ),
        requires(
            "the_cli_shows_coverage_and_refuses_an_uncovered_recording",
            NEEDS,
            the_cli_shows_coverage_and_refuses_an_uncovered_recording,
        ),
        requires(
            "a_program_without_a_probeable_allocator_is_not_covered",
            &[TRACKER, Need::Tool("cc"), STATIC_NEED],
            a_program_without_a_probeable_allocator_is_not_covered,
        ),
    ]);
}
