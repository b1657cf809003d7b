//! The in-process eBPF tracker records this process only (least privilege): the
//! target pid is load-time read-only data of the BPF program (set before the program is loaded,
//! so no probe ever runs without it) and the uprobes are attached for this pid only. Here a
//! forked child — the same executable and libc, so the very same probed instructions — and an
//! unrelated shell allocate as fast as they can from before the tracker loads until after
//! recording stops; none of their allocations may reach the ring buffer or the counters.
//!
//! One test in this binary (`harness = false`): the tracker is process-global. Needs CAP_BPF +
//! CAP_PERFMON; without them it is reported as ignored, with why.

use std::io::Read;
use std::os::fd::FromRawFd;
use std::process::{Command, Stdio};

use memtrack::{
    artifact::Backend, artifact::Metadata, artifact::Reader, encode::EncoderOptions, event::Event,
    event::EventKind, tracker::Tracker, tracker::TrackerOptions,
};

/// The size the foreign processes allocate, and the one this process allocates.
const FOREIGN_SIZE: usize = 0x5eed;
const OWN_SIZE: usize = 0x5ee0;
const OWN_COUNT: usize = 500;

fn another_processs_allocations_never_reach_the_ring_buffer() {
    // A forked child that mallocs and frees FOREIGN_SIZE in a loop, saying once it runs.
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only calls malloc/free (glibc's fork handlers reset its arenas), write
    // and _exit; it never returns into the test harness.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork");
    if child == 0 {
        // SAFETY: child side, see above.
        unsafe {
            for i in 0u64.. {
                let p = libc::malloc(FOREIGN_SIZE);
                std::ptr::write_volatile(p.cast::<u8>(), 1);
                libc::free(p);
                if i == 1000 {
                    libc::write(fds[1], [1u8].as_ptr().cast(), 1);
                }
            }
            libc::_exit(0);
        }
    }
    // SAFETY: our end of the pipe, owned from here on; the write end is the child's.
    let mut ready = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    // SAFETY: closing the parent's copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut b = [0u8];
    ready.read_exact(&mut b).expect("the child runs");
    // And an unrelated program allocating too.
    let mut shell = Command::new("/bin/sh")
        .args(["-c", "while :; do x=$(printf %0900d 1); done"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();

    let tracker = Tracker::global(&TrackerOptions::new()).expect("load and attach");
    let before = tracker.counters().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("isolation.memtrack");
    let file = std::fs::File::create(&path).unwrap();
    let meta = Metadata::now(std::process::id(), Backend::Ebpf).with_name("isolation");
    let mut blocks = Vec::with_capacity(OWN_COUNT);
    let rec = tracker
        .start(file, &meta, EncoderOptions::new(), 1)
        .unwrap();
    for _ in 0..OWN_COUNT {
        // SAFETY: plain libc allocations, each freed below.
        blocks.push(unsafe { libc::malloc(OWN_SIZE) });
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    for p in blocks.drain(..) {
        // SAFETY: each came from malloc above and is freed once.
        unsafe { libc::free(p) };
    }
    let recorded = rec.stop().unwrap();
    let after = tracker.counters().unwrap();

    // The foreign processes ran the whole time.
    let mut status = 0;
    // SAFETY: polling our own child.
    let exited = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
    assert_eq!(exited, 0, "the forked child stopped early");
    assert!(
        shell.try_wait().unwrap().is_none(),
        "the shell stopped early"
    );
    // SAFETY: killing and reaping our own child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, &mut status, 0);
    }
    shell.kill().unwrap();
    shell.wait().unwrap();

    assert_eq!(recorded.lost_events, 0);
    let events: Vec<Event> = Reader::open(&path)
        .unwrap()
        .events()
        .collect::<Result<_, _>>()
        .unwrap();
    let me = std::process::id();
    let foreign: Vec<&Event> = events.iter().filter(|e| e.pid != me).collect();
    assert!(foreign.is_empty(), "events of other processes: {foreign:?}");
    let size_of = |e: &Event| match e.kind {
        EventKind::Malloc { size, .. } => Some(size as usize),
        _ => None,
    };
    assert_eq!(
        events
            .iter()
            .filter(|e| size_of(e) == Some(FOREIGN_SIZE))
            .count(),
        0,
        "the forked child's allocations"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| size_of(e) == Some(OWN_SIZE))
            .count(),
        OWN_COUNT
    );
    // The BPF counters, too, saw this process only: the forked child alone made far more
    // allocations than this process in the same time.
    let allocs = events
        .iter()
        .filter(|e| {
            !matches!(
                e.kind,
                EventKind::Free { .. }
                    | EventKind::Mmap { .. }
                    | EventKind::Munmap { .. }
                    | EventKind::Mremap { .. }
                    | EventKind::Brk { .. }
            )
        })
        .count() as u64;
    assert_eq!(after.allocations - before.allocations, allocs);
}

fn main() {
    memtrack_test_support::run_sequential(vec![memtrack_test_support::requires(
        "another_processs_allocations_never_reach_the_ring_buffer",
        &[memtrack_test_support::TRACKER],
        another_processs_allocations_never_reach_the_ring_buffer,
    )]);
}
