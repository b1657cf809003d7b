//! `#[memtrack]` on `#[test]` functions, in either attribute order, under libtest's parallel
//! runner: each test body runs inside its own session (sessions take turns), and the attribute
//! keeps the test a test. Artifacts go to the default `target/memtrack/`.
//!
//! These tests are about libtest and the attribute, not a recorder: this binary installs
//! `memtrack::Allocator`, so they run everywhere, for real (`auto`: the eBPF tracker with
//! CAP_BPF + CAP_PERFMON, as in CI, else the allocator recorder), and never need to skip.

use std::hint::black_box;
use std::path::Path;

use memtrack::{artifact::Reader, memtrack};

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

#[memtrack(name = "memtrack_first")]
#[test]
fn memtrack_then_test() {
    assert_eq!(
        memtrack::__private::active_session().as_deref(),
        Some("memtrack_first")
    );
    black_box(Vec::<u8>::with_capacity(100));
}

#[test]
#[memtrack(name = "test_first")]
fn test_then_memtrack() {
    assert_eq!(
        memtrack::__private::active_session().as_deref(),
        Some("test_first")
    );
    black_box(Vec::<u8>::with_capacity(100));
}

#[test]
#[memtrack]
fn default_name_is_the_fn_path() -> Result<(), String> {
    let name = memtrack::__private::active_session().ok_or("no session")?;
    assert_eq!(name, "test_attribute::default_name_is_the_fn_path");
    Ok(())
}

/// Where the sessions of `sessions_of_parallel_tests_take_turns` write (relative to the
/// package, where `cargo test` runs a test binary).
const TURNS: &str = "target/memtrack/test_attribute_turns";

/// Three `#[memtrack]` functions, each its own session with a name of its own: `turns_N` makes
/// `10 + N` allocations of `1000 + N` bytes, plus the 7-byte copy of its name that
/// `active_session` returns; all freed.
macro_rules! turns {
    ($($name:ident = $named:literal: $n:literal;)*) => {$(
        #[memtrack(name = $named, output = "target/memtrack/test_attribute_turns")]
        fn $name() {
            assert_eq!(
                memtrack::__private::active_session().as_deref(),
                Some($named)
            );
            for _ in 0..10 + $n {
                black_box(Vec::<u8>::with_capacity(1000 + $n));
            }
        }
    )*};
}

turns! {
    turns_0 = "turns_0": 0;
    turns_1 = "turns_1": 1;
    turns_2 = "turns_2": 2;
}

#[test]
fn sessions_of_parallel_tests_take_turns() {
    let dir = Path::new(TURNS);
    for n in 0..3 {
        let _ = std::fs::remove_file(dir.join(format!("turns_{n}.memtrack")));
    }
    // Started at once, while the tests above may be running their sessions: each waits its
    // turn, and each records only its own thread.
    std::thread::scope(|s| {
        s.spawn(turns_0);
        s.spawn(turns_1);
        s.spawn(turns_2);
    });
    // The last of them may still be open, accumulating calls.
    memtrack::finish_calls().expect("finishing the open recording");
    for n in 0..3u64 {
        let path = dir.join(format!("turns_{n}.memtrack"));
        let r = Reader::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            r.completeness(),
            &memtrack::artifact::Completeness::Complete
        );
        assert_eq!(
            r.metadata().name.as_deref(),
            Some(format!("turns_{n}").as_str())
        );
        let events: Vec<memtrack::event::Event> = r.events().collect::<Result<_, _>>().unwrap();
        // Counted from the events, not by memtrack's analysis: exactly this function's
        // blocks, none of the other two sessions' (sizes 1000..=1002), and the name's copy.
        let counted = memtrack_test_support::count(&events);
        assert_eq!(
            (counted.allocations, counted.bytes_allocated, counted.frees),
            (11 + n, (10 + n) * (1000 + n) + 7, 11 + n),
            "{}: {events:?}",
            path.display()
        );
        let fin = r.final_metadata().expect("trailer");
        assert_eq!(fin.lost_events, 0);
        assert_eq!(
            (fin.totals.allocations, fin.totals.bytes_allocated),
            (counted.allocations, counted.bytes_allocated),
            "the trailer agrees with the events"
        );
    }
}

/// Limits under libtest's parallel runner: a violation panics in the test's own thread, which
/// fails the test. Other threads of this process (libtest's, tests without #[memtrack]) are
/// counted too, so only the limit is asserted here, not the count; exact numbers are in
/// `tests/session.rs` (harness = false).
#[test]
fn limits_fail_the_test_that_violates_them() {
    kept_limit();
    let err = std::panic::catch_unwind(violated_limit).expect_err("3 allocations > 2");
    let msg = err.downcast_ref::<String>().expect("a formatted message");
    assert!(
        msg.starts_with("memtrack: violated — call 1: allocations "),
        "{msg}"
    );
    assert!(msg.contains(" > max_allocations 2 → "), "{msg}");
}

#[memtrack(name = "kept", max_allocations = 100_000, max_bytes = 100_000_000)]
fn kept_limit() {
    black_box(Vec::<u8>::with_capacity(100));
}

#[memtrack(name = "violated", max_allocations = 2)]
fn violated_limit() {
    for _ in 0..3 {
        black_box(Vec::<u8>::with_capacity(100));
    }
}

/// The attribute directly on a `#[test]`: the violation fails it.
#[memtrack(name = "should_panic_limit", max_allocations = 0)]
#[test]
#[should_panic(expected = "max_allocations 0")]
fn a_violated_limit_fails_a_test() {
    black_box(Vec::<u8>::with_capacity(100));
}
