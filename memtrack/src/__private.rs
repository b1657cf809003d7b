//! What `#[memtrack]` expands to. Not public API: no SemVer guarantees.

pub use crate::limits::Limits;
use crate::session::{Session, SessionBuilder};

/// The guard a `#[memtrack]` function holds for the duration of its body; dropping it
/// finishes the session (see [`Session`]'s `Drop`) and, with limits, fails the function.
pub struct Guard {
    session: Option<Session>,
    limits: Limits,
    /// The session's name, for messages when the limits cannot be checked; cloned only when
    /// there are limits, and before recording starts, so that it is not counted.
    limited_name: Option<String>,
}

/// Starts the session of a `#[memtrack]` function, after any session running in this process
/// ends (so parallel tests take turns). Never panics: if recording cannot start, it says why
/// on stderr and the function runs unrecorded.
pub fn start(name: &str, output: Option<&str>, backend: Option<&str>) -> Guard {
    start_limited(name, output, backend, Limits::new())
}

/// [`start`] for a `#[memtrack(max_allocations = …, …)]` function: when the guard is dropped,
/// a violated limit panics with the measured numbers (so a `#[test]` fails), unless the thread
/// is already panicking (then it is printed on stderr: a second panic would abort). Limits
/// that cannot be checked fail too, never pass silently: if recording cannot start, this
/// panics with the reason instead of running the function unrecorded.
pub fn start_limited(
    name: &str,
    output: Option<&str>,
    backend: Option<&str>,
    limits: Limits,
) -> Guard {
    let mut b = SessionBuilder::new(name).limits(limits);
    if let Some(dir) = output {
        b = b.output_dir(dir);
    }
    // The attribute checked the spelling at compile time.
    if let Some(choice) = backend.and_then(|s| crate::BackendChoice::parse(s).ok()) {
        b = b.backend(choice);
    }
    let limited_name = (!limits.is_empty()).then(|| name.to_string());
    match b.start_waiting() {
        Ok(s) => Guard {
            session: Some(s),
            limits,
            limited_name,
        },
        Err(e) if !limits.is_empty() => {
            fail(format!(
                "memtrack: {name}: the limits ({limits}) cannot be checked: recording did not \
                 start: {e}. Fix that, or remove the limits (a #[memtrack] function without \
                 limits runs unrecorded when recording cannot start)"
            ));
            Guard {
                session: None,
                limits,
                limited_name,
            }
        }
        Err(e) => {
            eprintln!("memtrack: {name}: not recorded: {e}");
            Guard {
                session: None,
                limits,
                limited_name,
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (Some(session), Some(name)) = (self.session.take(), &self.limited_name) else {
            // No limits: the session's own `Drop` finishes it and prints any error.
            return;
        };
        match session.finish() {
            Ok(_) => {}
            Err(crate::Error::LimitExceeded { report, violations }) => {
                fail(crate::limits::message(&report, &violations))
            }
            Err(e) => fail(format!(
                "memtrack: {name}: the limits ({}) cannot be checked: finishing the session \
                 failed: {e}",
                self.limits
            )),
        }
    }
}

/// Panics with `message`, or prints it if this thread is already panicking (a panic during
/// unwinding aborts the process; the first panic already fails the test).
fn fail(message: String) {
    if std::thread::panicking() {
        eprintln!("{message}");
    } else {
        panic!("{message}");
    }
}

/// The path of the function a `#[memtrack]` expansion is in, from the type name of an item
/// nested in it (`crate::module::Type::method::__memtrack_here`).
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
    use crate::artifact::{FrameScratch, encode_frame};
    use crate::error::Result;
    use crate::event::Event;

    /// Encodes frames as the encoder's workers do: events to a finished frame record (columns,
    /// zstd compression, header and CRC), with reusable scratch buffers.
    pub struct FrameEncoder(FrameScratch);

    impl FrameEncoder {
        /// Scratch for zstd `level` (1 ..= 19).
        pub fn new(level: i32) -> Result<Self> {
            FrameScratch::new(level).map(FrameEncoder)
        }

        /// Encodes `events` into one frame record in `out` (cleared first).
        pub fn encode(&mut self, events: &[Event], out: &mut Vec<u8>) -> Result<()> {
            encode_frame(events, &mut self.0, out)
        }
    }

    /// What the eBPF tracker's poller makes of one ring-buffer record (`None`: malformed).
    #[inline]
    pub fn bpf_record_to_event(data: &[u8]) -> Option<Event> {
        crate::tracker::record_to_event(data)
    }

    /// Events the allocator backend's threads wrote that its collector has not drained yet.
    pub fn alloc_undrained() -> usize {
        crate::recorder::undrained()
    }
}
