//! `memtrack compare` (and `memtrack locks`) refuse a recording whose context-switch events
//! were lost, as they refuse one that lost allocation events: a real recording of lock waits
//! through a 4 KiB ring buffer, of two threads ping-ponging a byte over two pipes (no
//! allocation in the loop: what is dropped is context switches).
//!
//! `harness = false` (memtrack-test-support's runner), its own binary: the tracker is loaded
//! once per process, and this one must be loaded with the tiny ring buffer. Needs CAP_BPF +
//! CAP_PERFMON; without them the test is reported as ignored with what is missing.

mod common;

use common::{memtrack, s, text};
use memtrack::{
    Backend, Capture, EncoderOptions, EventKind, Metadata, Reader, Scope, Tracker, TrackerOptions,
};
use memtrack_test_support::{TRACKER, requires, run_sequential};

/// `rounds` round trips of one byte between this thread and another, over two pipes.
fn ping_pong(rounds: u32) {
    let mut a = [0i32; 2];
    let mut b = [0i32; 2];
    // SAFETY: each pipe() writes two descriptors into its array.
    assert_eq!(unsafe { libc::pipe(a.as_mut_ptr()) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::pipe(b.as_mut_ptr()) }, 0);
    let (a_read, b_write) = (a[0], b[1]);
    let echo = std::thread::spawn(move || {
        let mut byte = 0u8;
        for _ in 0..rounds {
            // SAFETY: one byte into and out of a live local, on descriptors open until joined.
            unsafe {
                assert_eq!(libc::read(a_read, (&raw mut byte).cast(), 1), 1);
                assert_eq!(libc::write(b_write, (&raw const byte).cast(), 1), 1);
            }
        }
    });
    let mut byte = 1u8;
    for _ in 0..rounds {
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::write(a[1], (&raw const byte).cast(), 1), 1);
            assert_eq!(libc::read(b[0], (&raw mut byte).cast(), 1), 1);
        }
    }
    echo.join().unwrap();
    for fd in a.into_iter().chain(b) {
        // SAFETY: closing descriptors this function opened, once.
        unsafe { libc::close(fd) };
    }
}

fn lost_switches_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = Tracker::global(&TrackerOptions::new().ringbuf_bytes(4096)).expect("load");
    let path = dir.path().join("lossy-locks.memtrack");
    let file = std::fs::File::create(&path).unwrap();
    let meta = Metadata::now(std::process::id(), Backend::Ebpf).with_name("lossy-locks");
    let rec = tracker
        .start_with(
            file,
            &meta,
            EncoderOptions::new(),
            1,
            Capture::new(Scope::Process).lock_waits(true),
        )
        .unwrap();
    ping_pong(20_000);
    let recorded = rec.stop().unwrap();
    assert!(
        recorded.lost_events > 0,
        "80,000 context switches in a 4 KiB ring buffer lost none"
    );
    // What got through is mostly context switches: the loop allocates nothing.
    let reader = Reader::open(&path).unwrap();
    let (mut switches, mut others) = (0u64, 0u64);
    for e in reader.events() {
        match e.unwrap().kind {
            EventKind::SwitchOut { .. } | EventKind::SwitchIn => switches += 1,
            _ => others += 1,
        }
    }
    assert!(
        switches > 10 * others,
        "{switches} switches, {others} others"
    );

    let out = memtrack(&["compare", s(&path), s(&path)]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = text(&out);
    assert!(
        err.contains(&format!(
            "{}: {} events were lost",
            path.display(),
            memtrack::human::count(recorded.lost_events)
        )) && err.contains("cannot be compared"),
        "{err}"
    );
    let out = memtrack(&["locks", s(&path)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("events lost"), "{}", text(&out));
}

fn main() {
    run_sequential(vec![requires(
        "lost_switches_are_refused",
        &[TRACKER],
        lost_switches_are_refused,
    )]);
}
