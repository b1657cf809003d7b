//! In-process recording with the eBPF tracker: the numbers must be the user's code alone,
//! none of memtrack's own threads (poller, encoder writer and workers).
//!
//! One test in this binary, run on the main thread (`harness = false`): the tracker is
//! process-global (loaded once per process) and a harness's other threads would otherwise
//! allocate concurrently. Needs CAP_BPF + CAP_PERFMON; without them it is reported as ignored,
//! with why.

use memtrack::{
    artifact::Backend, artifact::Metadata, artifact::Reader, encode::EncoderOptions, event::Event,
    event::EventKind, tracker::Tracker, tracker::TrackerOptions,
};

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn records_this_threads_allocations_exactly() {
    let tracker = Tracker::global(&TrackerOptions::new()).expect("load and attach");
    assert!(tracker.probe_sites() >= 9, "libc's entry points at least");
    let before = tracker.counters().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in-process.memtrack");
    let file = std::fs::File::create(&path).unwrap();
    let meta = Metadata::now(std::process::id(), Backend::Ebpf).with_name("in-process");
    // Sized before recording so that it does not grow (realloc) while recording.
    let mut blocks = Vec::with_capacity(300);
    let rec = tracker
        .start(file, &meta, EncoderOptions::new(), 2)
        .unwrap();

    // Exactly 300 allocations (sizes 1..=100, three kinds) and 300 frees, through libc.
    for i in 1..=100usize {
        // SAFETY: plain libc allocation calls; every block is freed below.
        unsafe {
            blocks.push(libc::malloc(i));
            blocks.push(libc::calloc(i, 2));
            let p = libc::malloc(8);
            blocks.push(libc::realloc(p, 1000 + i));
        }
    }
    for p in blocks.drain(..) {
        // SAFETY: each pointer came from malloc/calloc/realloc above and is freed once.
        unsafe { libc::free(p) };
    }
    // Rust's global allocator goes through libc too: one Vec of 4096 bytes.
    let v: Vec<u8> = Vec::with_capacity(4096);
    drop(std::hint::black_box(v));

    let recorded = rec.stop().unwrap();
    assert_eq!(recorded.lost_events, 0);
    let after = tracker.counters().unwrap();

    let reader = Reader::open(&path).unwrap();
    let events: Vec<Event> = reader.events().collect::<Result<_, _>>().unwrap();
    let me = gettid();
    let mine: Vec<&Event> = events.iter().filter(|e| e.tid == me).collect();
    let others: Vec<&Event> = events.iter().filter(|e| e.tid != me).collect();
    // Nothing from memtrack's threads (the runner has no other thread).
    assert!(others.is_empty(), "events of other threads: {others:?}");
    let heap: Vec<EventKind> = mine
        .iter()
        .map(|e| e.kind)
        .filter(|k| {
            !matches!(
                k,
                EventKind::Mmap { .. } | EventKind::Munmap { .. } | EventKind::Brk { .. }
            )
        })
        .collect();
    let count = |f: &dyn Fn(&EventKind) -> bool| heap.iter().filter(|k| f(k)).count();
    let mallocs = count(&|k| matches!(k, EventKind::Malloc { .. }));
    let callocs = count(&|k| matches!(k, EventKind::Calloc { .. }));
    let reallocs = count(&|k| matches!(k, EventKind::Realloc { .. }));
    let frees = count(&|k| matches!(k, EventKind::Free { .. }));
    // malloc(1..=100) + malloc(8) + the Vec; calloc; realloc; 300 frees + the Vec's.
    assert_eq!((mallocs, callocs, reallocs, frees), (201, 100, 100, 301));
    assert_eq!(heap.len(), 702, "no other kinds");
    let bytes: u64 = heap
        .iter()
        .map(|k| match *k {
            EventKind::Malloc { size, .. }
            | EventKind::Calloc { size, .. }
            | EventKind::Realloc { size, .. } => size,
            _ => 0,
        })
        .sum();
    // sum(1..=100) + 100*8 + 4096 + 2*sum(1..=100) + sum(1001..=1100)
    assert_eq!(bytes, 5050 + 800 + 4096 + 10100 + 105050);
    // The BPF counters agree with the stream.
    let allocs = heap
        .iter()
        .filter(|k| !matches!(k, EventKind::Free { .. }))
        .count() as u64;
    assert_eq!(after.allocations - before.allocations, allocs);
}

fn main() {
    memtrack_test_support::run_sequential(vec![memtrack_test_support::requires(
        "records_this_threads_allocations_exactly",
        &[memtrack_test_support::TRACKER],
        records_this_threads_allocations_exactly,
    )]);
}
