//! Sessions that accumulate calls: the calls of a `#[memtrack]` function in a process are one
//! recording, one artifact holding every call, limits checked per call; on both recorders.
//!
//! `harness = false`: exact counts need libtest's threads out of the way; the tests run one
//! after another on the main thread. `memtrack::Allocator` is the global allocator, so the
//! allocator recorder can run (its tests need no privileges); the eBPF tracker's tests need
//! CAP_BPF + CAP_PERFMON and are reported as ignored, with why, without them.
//!
//! Each call's figures are checked against numbers computed here from what the function does,
//! and against the artifact's events cut at their iteration marks and counted by
//! memtrack-test-support (not by memtrack's analysis).

use std::hint::black_box;
use std::path::PathBuf;

use memtrack::artifact::Reader;
use memtrack::event::{Event, EventKind};
use memtrack::totals::Spread;
use memtrack::{BackendChoice, Report, SessionBuilder, memtrack};
use memtrack_test_support::{TRACKER, requires, test};

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

fn dir() -> PathBuf {
    PathBuf::from(std::env::var_os("MEMTRACK_DIR").expect("set by main"))
}

/// Allocations right outside the calls, which must not be counted.
fn noise() {
    for n in [24usize, 4000] {
        black_box(Vec::<u8>::with_capacity(n));
    }
}

/// What call `i` of [`work`] allocates: `i % 5 + 1` blocks of `100 × (i % 5 + 1)` bytes, each
/// freed before the next (so the call's peak is one block).
fn blocks_of_call(i: u64) -> (u64, u64) {
    let k = i % 5 + 1;
    (k, 100 * k)
}

fn allocate(i: u64) {
    let (n, size) = blocks_of_call(i);
    for _ in 0..n {
        black_box(Vec::<u8>::with_capacity(size as usize));
    }
}

#[memtrack(name = "calls_ebpf", backend = "ebpf")]
fn work_ebpf(i: u64) {
    allocate(i);
}

#[memtrack(name = "calls_alloc", backend = "alloc")]
fn work_alloc(i: u64) {
    allocate(i);
}

/// The spread of `values` as the artifact states it: the lower median.
fn spread(mut values: Vec<u64>) -> Spread {
    values.sort_unstable();
    let mut s = Spread::default();
    s.min = values[0];
    s.median = values[(values.len() - 1) / 2];
    s.max = *values.last().unwrap();
    s.total = values.iter().sum();
    s
}

/// The events of each iteration of `tid`, cut at its marks.
fn iterations(events: &[Event]) -> Vec<Vec<Event>> {
    let mut out = Vec::new();
    let mut open: Option<Vec<Event>> = None;
    for e in events {
        match e.kind {
            EventKind::IterationStart => open = Some(Vec::new()),
            EventKind::IterationEnd => out.extend(open.take()),
            _ => match &mut open {
                Some(v) => v.push(*e),
                None => panic!("an event outside every call: {e:?}"),
            },
        }
    }
    assert!(open.is_none(), "an iteration without its end");
    out
}

fn read(name: &str) -> (Reader, Vec<Event>) {
    memtrack_test_support::read_complete(&dir().join(format!("{name}.memtrack")))
}

/// Twenty calls with noise between them: one artifact, written when finished; every call's
/// allocations, bytes and peak exact; nothing between the calls recorded.
fn twenty_calls_are_one_recording(name: &str, work: fn(u64)) {
    const CALLS: u64 = 20;
    let path = dir().join(format!("{name}.memtrack"));
    for i in 0..CALLS {
        noise();
        work(i);
    }
    noise();
    assert!(!path.exists(), "written before the recording is finished");
    let report: Report = memtrack::finish_calls()
        .expect("finishes")
        .expect("a recording was open");
    assert_eq!(report.iterations, Some(CALLS));
    // memtrack's own threads (the idle watcher) are never seen, not even as other threads.
    assert_eq!(report.out_of_scope(), 0, "{}", report.summary_line());
    let per_call: Vec<(u64, u64)> = (0..CALLS).map(blocks_of_call).collect();
    let expected = (
        spread(per_call.iter().map(|&(n, _)| n).collect()),
        spread(per_call.iter().map(|&(n, size)| n * size).collect()),
        spread(per_call.iter().map(|&(_, size)| size).collect()),
    );
    let p = report.totals().iteration_spread.expect("per-call figures");
    assert_eq!(p.iterations, CALLS);
    assert_eq!(
        (p.allocations, p.bytes_allocated, p.peak_live_bytes),
        expected
    );
    assert_eq!(report.allocations(), expected.0.total);
    // The artifact says the same, counted from its events by another implementation.
    let (r, events) = read(name);
    let fin = r.final_metadata().expect("trailer");
    assert_eq!(fin.iterations, Some(CALLS));
    assert_eq!(fin.totals.iteration_spread, Some(p));
    let counted: Vec<(u64, u64, u64)> = iterations(&events)
        .iter()
        .map(|evs| {
            let c = memtrack_test_support::count(evs);
            (c.allocations, c.bytes_allocated, c.peak_live_bytes)
        })
        .collect();
    let from_program: Vec<(u64, u64, u64)> = per_call
        .iter()
        .map(|&(n, size)| (n, n * size, size))
        .collect();
    assert_eq!(counted, from_program);
    // Finished: the next call starts a new recording.
    assert!(memtrack::finish_calls().unwrap().is_none());
}

#[memtrack(name = "limited", backend = "alloc", max_allocations = 3)]
fn limited(n: u64) {
    for _ in 0..n {
        black_box(Vec::<u8>::with_capacity(8));
    }
}

fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> Option<String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(f);
    std::panic::set_hook(hook);
    r.err()
        .map(|e| e.downcast_ref::<String>().cloned().unwrap_or_default())
}

/// Limits hold per call: the calls within them pass, each call over them fails with its own
/// number and figures, and the recording goes on with every call.
fn a_call_over_its_limits_fails_at_that_call() {
    for n in 1..=3 {
        assert_eq!(panic_message(move || limited(n)), None, "call {n}");
    }
    let path = dir().join("limited.memtrack");
    assert_eq!(
        panic_message(|| limited(4)).as_deref(),
        Some(
            format!(
                "memtrack: limited — call 4: allocations 4 > max_allocations 3 → {}",
                path.display()
            )
            .as_str()
        )
    );
    assert!(panic_message(|| limited(5)).is_some_and(|m| m.contains("call 5: allocations 5 >")));
    let report = memtrack::finish_calls().unwrap().expect("open");
    assert_eq!(report.iterations, Some(5));
    assert_eq!(report.allocations(), 1 + 2 + 3 + 4 + 5);
}

#[memtrack(name = "first_name", backend = "alloc")]
fn first_name() {
    black_box(Vec::<u8>::with_capacity(10));
}

#[memtrack(name = "second_name", backend = "alloc")]
fn second_name() {
    black_box(Vec::<u8>::with_capacity(20));
}

/// A call of another name sets the open recording aside, and so does a session started by
/// hand, which then runs: no artifact until the recordings finish, then each name's holds
/// every call of it.
fn another_name_or_a_session_sets_the_open_recording_aside() {
    for _ in 0..3 {
        first_name();
    }
    second_name();
    let artifact = |name: &str| dir().join(format!("{name}.memtrack"));
    assert!(!artifact("first_name").exists());
    let s = SessionBuilder::new("by_hand")
        .backend(BackendChoice::Alloc)
        .quiet(true)
        .start()
        .expect("a session started by hand makes way");
    s.finish().unwrap();
    first_name();
    assert!(!artifact("second_name").exists());
    let report = memtrack::finish_calls().unwrap().expect("open");
    assert_eq!(
        (
            report.name.as_str(),
            report.iterations,
            report.allocations()
        ),
        ("first_name", Some(4), 4)
    );
    for (name, calls) in [("first_name", 4), ("second_name", 1)] {
        let (r, _) = read(name);
        let fin = r.final_metadata().unwrap();
        assert_eq!(
            (fin.iterations, fin.totals.allocations),
            (Some(calls), calls)
        );
    }
    assert!(memtrack::finish_calls().unwrap().is_none());
}

#[memtrack(name = "first_in_memory", backend = "alloc", in_memory)]
fn first_in_memory() {
    black_box(Vec::<u8>::with_capacity(10));
}

#[memtrack(name = "second_in_memory", backend = "alloc", in_memory)]
fn second_in_memory() {
    black_box(Vec::<u8>::with_capacity(20));
}

/// In-memory recordings set aside keep their parts in memory: joined, the open one's report
/// has its three calls, each its one allocation.
fn in_memory_names_in_turn_keep_every_call() {
    for _ in 0..3 {
        second_in_memory();
        first_in_memory();
    }
    let report = memtrack::finish_calls().unwrap().expect("open");
    assert_eq!(report.path, None);
    assert_eq!(
        (
            report.name.as_str(),
            report.iterations,
            report.allocations()
        ),
        ("first_in_memory", Some(3), 3)
    );
    let p = report.totals().iteration_spread.unwrap();
    assert_eq!(
        (
            p.allocations.min,
            p.allocations.max,
            p.bytes_allocated.total
        ),
        (1, 1, 30)
    );
}

#[memtrack(name = "from_threads", backend = "alloc")]
fn from_threads() {
    black_box(Vec::<u8>::with_capacity(48));
    black_box(Vec::<u8>::with_capacity(16));
}

/// Calls from four threads take turns in one recording: forty calls of two blocks each.
fn calls_from_threads_take_turns() {
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| (0..10).for_each(|_| from_threads()));
        }
    });
    let report = memtrack::finish_calls().unwrap().expect("open");
    assert_eq!(report.iterations, Some(40));
    let p = report.totals().iteration_spread.unwrap();
    assert_eq!(
        (
            p.allocations.min,
            p.allocations.max,
            p.bytes_allocated.total
        ),
        (2, 2, 40 * 64)
    );
}

/// memtrack's lines of a child's stderr.
fn summary_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("memtrack:"))
        .collect()
}

/// The names of the files in `dir`, sorted.
fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}

/// A child process that calls `work_alloc` three times and ends (`exit` by returning from
/// main, or `std::process::exit`): its recording is finished at exit, with one summary line.
fn the_recording_is_finished_at_exit() {
    for how in ["--calls-child-return", "--calls-child-exit"] {
        let out_dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .arg(how)
            .env("MEMTRACK_DIR", out_dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{how}: {stderr}");
        let lines = summary_lines(&stderr);
        assert_eq!(lines.len(), 1, "{how}: {stderr}");
        assert!(
            lines[0].starts_with("memtrack: calls_alloc — 3 calls"),
            "{lines:?}"
        );
        let r = Reader::open(out_dir.path().join("calls_alloc.memtrack")).unwrap();
        assert_eq!(
            r.completeness(),
            &memtrack::artifact::Completeness::Complete
        );
        assert_eq!(r.final_metadata().unwrap().iterations, Some(3));
    }
}

#[memtrack(name = "first_ebpf", backend = "ebpf")]
fn first_ebpf() {
    black_box(Vec::<u8>::with_capacity(10));
}

#[memtrack(name = "second_ebpf", backend = "ebpf")]
fn second_ebpf() {
    black_box(Vec::<u8>::with_capacity(20));
}

/// Calls of two names in turn, three times, in a child process: each name's artifact holds its
/// three calls (its parts joined at exit), each call exactly its one allocation from one call
/// site, with one summary line per name and no file left beside the artifacts.
fn alternating_names_each_keep_every_call(backend: &str) {
    let out_dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg(format!("--calls-child-alternate-{backend}"))
        .env("MEMTRACK_DIR", out_dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines = summary_lines(&stderr);
    let (first, second) = match backend {
        "alloc" => ("first_name", "second_name"),
        _ => ("first_ebpf", "second_ebpf"),
    };
    assert_eq!(lines.len(), 2, "{stderr}");
    for (line, name) in lines.iter().zip([first, second]) {
        assert!(
            line.starts_with(&format!("memtrack: {name} — 3 calls")),
            "{stderr}"
        );
    }
    let files = files_in(out_dir.path());
    assert_eq!(
        files,
        [format!("{first}.memtrack"), format!("{second}.memtrack")]
    );
    for (name, size) in [(first, 10), (second, 20)] {
        let (r, events) =
            memtrack_test_support::read_complete(&out_dir.path().join(format!("{name}.memtrack")));
        assert_eq!(r.final_metadata().unwrap().iterations, Some(3), "{name}");
        let calls = iterations(&events);
        let counted: Vec<(u64, u64)> = calls
            .iter()
            .map(|evs| {
                let c = memtrack_test_support::count(evs);
                (c.allocations, c.bytes_allocated)
            })
            .collect();
        assert_eq!(counted, [(1, size); 3], "{name}");
        // One call site: the parts' stacks are one stack of the joined table.
        let mut stacks: Vec<_> = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Malloc { .. }))
            .map(|e| e.stack)
            .collect();
        stacks.dedup();
        assert_eq!(stacks.len(), 1, "{name}: {stacks:?}");
        assert!(r.stack(stacks[0]).is_ok(), "{name}");
    }
}

/// Calls of two names in turn where the first's artifact is a FIFO: its parts were written in
/// place, to the FIFO's reader, so they cannot be joined. One line says so and what to do; the
/// other name's artifact holds its three calls.
fn a_name_written_to_a_fifo_is_not_joined() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let out_dir = tempfile::tempdir().unwrap();
    let fifo = out_dir.path().join("first_name.memtrack");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Opened before the child so that its open for writing does not wait; non-blocking, so a
    // read before the child opens it returns at once.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drain = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let (mut bytes, mut buf) = (0usize, [0u8; 1 << 16]);
            loop {
                match reader.read(&mut buf) {
                    Ok(0) if done.load(std::sync::atomic::Ordering::SeqCst) => return bytes,
                    Ok(n) => bytes += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("reading the FIFO: {e}"),
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--calls-child-alternate-alloc")
        .env("MEMTRACK_DIR", out_dir.path())
        .output()
        .unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let read = drain.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(read > 0, "nothing went to the FIFO");
    let lines = summary_lines(&stderr);
    assert_eq!(lines.len(), 2, "{stderr}");
    assert_eq!(
        lines[0],
        format!(
            "memtrack: first_name: {} is a device or a FIFO, so the 3 parts of this recording \
             (its calls, interrupted by calls of another name) went to it as 3 artifacts in a \
             row, not joined: call first_name's calls together, or write its artifact to a \
             regular file",
            fifo.display()
        )
    );
    assert!(
        lines[1].starts_with("memtrack: second_name — 3 calls"),
        "{stderr}"
    );
    // No part is left beside them.
    let files = files_in(out_dir.path());
    assert_eq!(files, ["first_name.memtrack", "second_name.memtrack"]);
    let (r, _) = memtrack_test_support::read_complete(&out_dir.path().join("second_name.memtrack"));
    assert_eq!(r.final_metadata().unwrap().iterations, Some(3));
}

fn main() {
    let child = std::env::args().nth(1);
    if child.as_deref() == Some("--calls-child-alternate-alloc") {
        for _ in 0..3 {
            first_name();
            second_name();
        }
        return;
    }
    if child.as_deref() == Some("--calls-child-alternate-ebpf") {
        for _ in 0..3 {
            first_ebpf();
            second_ebpf();
        }
        return;
    }
    if let Some(how) = child.as_deref().filter(|a| a.starts_with("--calls-child")) {
        for i in 0..3 {
            work_alloc(i);
        }
        if how == "--calls-child-exit" {
            std::process::exit(0);
        }
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    // SAFETY: set before any thread is started.
    unsafe { std::env::set_var("MEMTRACK_DIR", d.path()) };
    memtrack_test_support::run_sequential(vec![
        test("twenty_calls_are_one_recording_alloc", || {
            twenty_calls_are_one_recording("calls_alloc", work_alloc)
        }),
        requires("twenty_calls_are_one_recording_ebpf", &[TRACKER], || {
            twenty_calls_are_one_recording("calls_ebpf", work_ebpf)
        }),
        test(
            "a_call_over_its_limits_fails_at_that_call",
            a_call_over_its_limits_fails_at_that_call,
        ),
        test(
            "another_name_or_a_session_sets_the_open_recording_aside",
            another_name_or_a_session_sets_the_open_recording_aside,
        ),
        test(
            "in_memory_names_in_turn_keep_every_call",
            in_memory_names_in_turn_keep_every_call,
        ),
        test(
            "calls_from_threads_take_turns",
            calls_from_threads_take_turns,
        ),
        test(
            "the_recording_is_finished_at_exit",
            the_recording_is_finished_at_exit,
        ),
        test("alternating_names_each_keep_every_call_alloc", || {
            alternating_names_each_keep_every_call("alloc")
        }),
        test(
            "a_name_written_to_a_fifo_is_not_joined",
            a_name_written_to_a_fifo_is_not_joined,
        ),
        requires(
            "alternating_names_each_keep_every_call_ebpf",
            &[TRACKER],
            || alternating_names_each_keep_every_call("ebpf"),
        ),
    ]);
}
