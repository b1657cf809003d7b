//! A sequential test runner for `harness = false` test binaries: the recorders see every
//! thread of the process, so exact-count tests run one after another on the main thread,
//! with no libtest threads around. Prints libtest-like lines and `N passed, N failed`.
//! Also the checks those binaries share.

use memtrack::{Event, EventKind};

/// Asserts that for each of `threads` worker threads, which made `per_thread` mallocs of size
/// `base + i` (a size no one else uses), all of them are in `evs`, from one thread that is not
/// the main thread, and that the workers are distinct threads.
#[allow(dead_code)] // not every binary spawns workers
pub fn assert_one_thread_per_size(evs: &[Event], threads: u64, base: u64, per_thread: usize) {
    let mut tids = std::collections::BTreeSet::new();
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

/// Makes two blocks (100 and 200 bytes) in `s`, takes a snapshot after each step, and checks
/// the snapshots count exactly what came before them and that taking them allocated nothing.
#[allow(dead_code)] // not every binary takes snapshots
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
        (r.allocations(), r.totals.frees, r.totals.live_blocks_at_end),
        (2, 2, 0),
        "{}",
        r.summary_line()
    );
}

/// Runs `tests` in order in a fresh `$MEMTRACK_DIR`; with `skip`, reports each as skipped
/// and why. Exits with status 1 if any failed.
pub fn run(tests: &[(&str, fn())], skip: Option<String>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    // SAFETY: called first thing in `main`: no other thread exists yet.
    unsafe { std::env::set_var("MEMTRACK_DIR", tmp.path()) };
    println!(
        "running {} tests as uid {}",
        tests.len(),
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    );
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, test) in tests {
        if let Some(why) = &skip {
            println!("test {name} ... SKIPPED: {why}");
            skipped += 1;
            continue;
        }
        match std::panic::catch_unwind(test) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!("\n{passed} passed, {failed} failed, {skipped} skipped");
    drop(tmp);
    if failed > 0 {
        std::process::exit(1);
    }
}
