//! `#[memtrack]` on `#[test]` functions, in either attribute order, under libtest's parallel
//! runner: each test body runs inside its own session (sessions take turns), and the attribute
//! keeps the test a test. Artifacts go to the default `target/memtrack/`. Needs root (or
//! CAP_BPF + CAP_PERFMON), else each test says it skipped.

use std::hint::black_box;

use memtrack::memtrack;

fn skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    let skip = unsafe { libc::geteuid() } != 0;
    if skip {
        eprintln!("SKIPPED: not root (the eBPF tracker needs CAP_BPF + CAP_PERFMON)");
    }
    skip
}

#[memtrack(name = "memtrack_first")]
#[test]
fn memtrack_then_test() {
    if skip() {
        return;
    }
    assert_eq!(
        memtrack::__private::active_session().as_deref(),
        Some("memtrack_first")
    );
    black_box(Vec::<u8>::with_capacity(100));
}

#[test]
#[memtrack(name = "test_first")]
fn test_then_memtrack() {
    if skip() {
        return;
    }
    assert_eq!(
        memtrack::__private::active_session().as_deref(),
        Some("test_first")
    );
    black_box(Vec::<u8>::with_capacity(100));
}

#[test]
#[memtrack]
fn default_name_is_the_fn_path() -> Result<(), String> {
    if skip() {
        return Ok(());
    }
    let name = memtrack::__private::active_session().ok_or("no session")?;
    assert_eq!(name, "test_attribute::default_name_is_the_fn_path");
    Ok(())
}

#[test]
fn sessions_of_parallel_tests_take_turns() {
    if skip() {
        return;
    }
    // Started while the tests above may be running their sessions: waits its turn.
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(waiting_session);
        }
    });
}

#[memtrack(name = "turns")]
fn waiting_session() {
    assert_eq!(
        memtrack::__private::active_session().as_deref(),
        Some("turns")
    );
}

/// Limits under libtest's parallel runner: a violation panics in the test's own thread, which
/// fails the test. Other threads of this process (libtest's, tests without #[memtrack]) are
/// counted too, so only the limit is asserted here, not the count; exact numbers are in
/// `tests/session.rs` (harness = false).
#[test]
fn limits_fail_the_test_that_violates_them() {
    if skip() {
        return;
    }
    kept_limit();
    let err = std::panic::catch_unwind(violated_limit).expect_err("3 allocations > 2");
    let msg = err.downcast_ref::<String>().expect("a formatted message");
    assert!(
        msg.starts_with("memtrack: violated — allocations "),
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

/// The attribute directly on a `#[test]`: the violation fails it. Without privileges it fails
/// too (the limit cannot be checked), and that message also names `max_allocations 0`.
#[memtrack(name = "should_panic_limit", max_allocations = 0)]
#[test]
#[should_panic(expected = "max_allocations 0")]
fn a_violated_limit_fails_a_test() {
    black_box(Vec::<u8>::with_capacity(100));
}
