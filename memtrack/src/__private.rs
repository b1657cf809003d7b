//! What `#[memtrack]` expands to. Not public API: no SemVer guarantees.

use crate::limits::Limits;
use crate::session::{Call, SessionBuilder};

/// The guard a `#[memtrack]` function holds for the duration of its body; dropping it ends
/// the call (see [`Call`]) and, with limits that this call broke, fails the function.
pub struct Guard {
    call: Option<Call>,
    limits: Limits,
    /// The session's name, for messages when the limits cannot be checked; cloned only when
    /// there are limits, and before recording starts, so that it is not counted.
    limited_name: Option<String>,
    /// Panics with its message, at the location of the user's function (the expansion makes
    /// it with that span: the panic happens in `Drop`, where `#[track_caller]` does not reach).
    fail: fn(String),
}

/// Begins a call of a `#[memtrack]` function: [`SessionBuilder::call`] of
/// `SessionBuilder::new(name)` with `limits`, then `options` (the attribute's other options, as
/// the builder's own calls): the function's calls in this process are one recording, one
/// artifact, limits checked per call; a call waits for one running on another thread (so
/// parallel tests take turns). Called inside a
/// session that records this thread (a `#[memtrack]` function calling another), it joins that
/// session without calling `options` or allocating: the inner function's allocations are the
/// outer session's, and it writes no artifact of its own.
///
/// Without limits it never panics: if recording cannot start, it says why on stderr and the
/// function runs unrecorded. With limits, when the guard is dropped a violated limit panics
/// with the measured numbers (so a `#[test]` fails), unless the thread is already panicking
/// (then it is printed on stderr: a second panic would abort). Limits that cannot be checked
/// fail too, never pass silently: if recording cannot start, this panics with the reason;
/// nested in a session that records this thread, its limits could only be checked against
/// the outer session's numbers, so it panics saying so. Every panic goes through `fail`, so
/// that its location is the user's function.
pub fn start(
    name: &str,
    limits: Limits,
    options: impl FnOnce(SessionBuilder) -> SessionBuilder,
    fail: fn(String),
) -> Guard {
    let unrecorded = |limited_name| Guard {
        call: None,
        limits,
        limited_name,
        fail,
    };
    // Nested: join the running session, allocating nothing (it counts this thread).
    if crate::session::recorded_here() {
        if !limits.is_empty() {
            let active = crate::session::active_name().unwrap_or_default();
            fail_with(
                fail,
                format!(
                    "memtrack: {name}: the limits ({limits}) cannot be checked: this #[memtrack] \
                     function runs inside session {active:?}, which records its allocations as \
                     part of its own; put the limits on the outer function, or call {name} \
                     outside it"
                ),
            );
        }
        return unrecorded(None);
    }
    let limited_name = (!limits.is_empty()).then(|| name.to_string());
    // The next call of a function whose recording is open: no builder to make.
    let called = match crate::session::resume_open(name, limits) {
        Some(called) => called,
        None => options(SessionBuilder::new(name).limits(limits)).call(),
    };
    match called {
        Ok(c) => Guard {
            call: Some(c),
            limits,
            limited_name,
            fail,
        },
        // Nested after all (the running session began while this one was being set up).
        Err(e @ crate::Error::NestedSession { .. }) if !limits.is_empty() => {
            fail_with(
                fail,
                format!("memtrack: {name}: the limits ({limits}) cannot be checked: {e}"),
            );
            unrecorded(None)
        }
        Err(crate::Error::NestedSession { .. }) => unrecorded(None),
        Err(e) if !limits.is_empty() => {
            fail_with(
                fail,
                format!(
                    "memtrack: {name}: the limits ({limits}) cannot be checked: recording did not \
                     start: {e}. Fix that, or remove the limits (a #[memtrack] function without \
                     limits runs unrecorded when recording cannot start)"
                ),
            );
            unrecorded(limited_name)
        }
        Err(e) => {
            eprintln!("memtrack: {name}: not recorded: {e}");
            unrecorded(limited_name)
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (Some(call), Some(name)) = (self.call.take(), &self.limited_name) else {
            // No limits: the call's own `Drop` ends it and prints any error.
            return;
        };
        match call.end() {
            Ok(()) => {}
            Err(e @ crate::Error::CallLimitExceeded { .. }) => fail_with(self.fail, e.to_string()),
            Err(e) => fail_with(
                self.fail,
                format!(
                    "memtrack: {name}: the limits ({}) cannot be checked: ending the call \
                     failed: {e}",
                    self.limits
                ),
            ),
        }
    }
}

/// Panics with `message` through `fail`, or prints it if this thread is already panicking (a
/// panic during unwinding aborts the process; the first panic already fails the test).
fn fail_with(fail: fn(String), message: String) {
    if std::thread::panicking() {
        eprintln!("{message}");
    } else {
        fail(message);
    }
}

/// The path of the function a `#[memtrack]` expansion is in, from the type name of an item
/// nested in it (`my_crate::module::Type::method::__memtrack_here`).
pub fn fn_path(type_name: &'static str) -> &'static str {
    type_name
        .strip_suffix("::__memtrack_here")
        .unwrap_or(type_name)
}

/// The name of the session running in this process (for tests of the attribute).
pub fn active_session() -> Option<String> {
    crate::session::active_name()
}

/// Hooks for the hot-path gate (`benches/ir/driver.rs`): each calls the real code path of one
/// operation that is otherwise reachable only through private items. Not public API.
pub mod hotpath {
    use crate::artifact::{FormatError, FrameScratch, encode_frame};
    use crate::event::Event;

    /// Encodes frames as the encoder's workers do: events to a finished frame record (columns,
    /// zstd compression, header and CRC), with reusable scratch buffers.
    pub struct FrameEncoder(FrameScratch);

    impl FrameEncoder {
        /// Scratch for zstd `level` (1 ..= 19).
        pub fn new(level: i32) -> Result<Self, FormatError> {
            FrameScratch::new(level).map(FrameEncoder)
        }

        /// Encodes `events` into one frame record in `out` (cleared first).
        pub fn encode(&mut self, events: &[Event], out: &mut Vec<u8>) -> Result<(), FormatError> {
            encode_frame(events, None, &mut self.0, out)
        }
    }

    /// What the eBPF tracker's poller makes of one ring-buffer record (`None`: malformed).
    #[inline]
    pub fn bpf_record_to_event(data: &[u8]) -> Option<Event> {
        crate::tracker::record_to_event(data)
    }

    /// Events the allocator recorder's threads wrote that its collector has not drained yet.
    pub fn alloc_undrained() -> usize {
        crate::allocator::undrained()
    }
}
