//! The crate-wide error: what a session, and any API of the crate, can fail with. It composes
//! the errors of the layers below (format, encoder, tracker, allocator recorder) with `#[from]`
//! and adds the session's own; no lower layer's error contains it.

use std::io;

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in memtrack. Each variant carries enough context (path, frame,
/// byte offset) for its message to say what is wrong and what to do about it. The errors of
/// each layer are variants of their own ([`Format`](Error::Format), [`Encode`](Error::Encode),
/// [`Tracker`](Error::Tracker), [`Allocator`](Error::Allocator)), with their messages unchanged.
///
/// `Debug` prints the same message as `Display` (cause and fix), not the bare variant: that is
/// what `.unwrap()`, `.expect()` and `fn main() -> Result<…>` show. Match on the variants for
/// the structured fields.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation failed; `what` says which (with the path, where there is one).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. "reading /tmp/t.memtrack".
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An output file could not be created or put in place (refused, or an I/O error); the
    /// message names the file and the fix.
    #[error(transparent)]
    Output(#[from] crate::artifact::OutputError),
    /// An artifact's bytes are damaged, of another version, or could not be read or written;
    /// the message names the file and where in it.
    #[error(transparent)]
    Format(#[from] crate::artifact::FormatError),
    /// The encoder pipeline failed (its options, its threads, or writing the artifact).
    #[error(transparent)]
    Encode(#[from] crate::encode::EncodeError),
    /// A timeline was asked for with a number of columns out of range.
    #[error(transparent)]
    Timeline(#[from] crate::analysis::InvalidTimeline),
    /// A configuration value is out of range, or options contradict each other; the message
    /// names the option and the valid range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A session was asked for numbers after it finished: its report has them.
    #[error("the session is already finished: its Report has the final numbers")]
    SessionFinished,
    /// A session was started while another one of this process was running.
    #[error(
        "cannot start memtrack session {requested:?}: session {active:?} is still running in \
         this process, and sessions of one process take turns (one recorder per process); \
         finish or drop it first, or use SessionBuilder::start_waiting to wait for your turn"
    )]
    SessionActive {
        /// The session that was refused.
        requested: String,
        /// The session that is running.
        active: String,
    },
    /// A session was started, waiting for its turn, from a thread that the running session
    /// records: it would wait for itself forever.
    #[error(
        "cannot start memtrack session {requested:?} inside session {active:?}: this thread is \
         already recorded by {active:?}, so waiting for it to end would never return; its \
         allocations are part of {active:?} (a nested #[memtrack] function joins the outer \
         session), or start {requested:?} outside it"
    )]
    NestedSession {
        /// The session that was refused.
        requested: String,
        /// The running session whose scope the calling thread is in.
        active: String,
    },
    /// `auto` found neither backend usable.
    #[error(
        "memtrack cannot record here: the eBPF tracker needs root or the capabilities \
         CAP_BPF and CAP_PERFMON (run with sudo, or `sudo setcap cap_bpf,cap_perfmon+ep \
         <binary>`), and the allocator recorder needs `#[global_allocator] static A: \
         memtrack::Allocator = memtrack::Allocator::system();` in your program"
    )]
    NoBackend,
    /// The allocator recorder was asked for, but [`Allocator`](crate::Allocator) is not the
    /// global allocator.
    #[error(
        "the allocator recorder records through memtrack's global allocator, which this program \
         does not use: add `#[global_allocator] static A: memtrack::Allocator = \
         memtrack::Allocator::system();`, or use the eBPF tracker"
    )]
    AllocatorNotInstalled,
    /// The eBPF tracker failed (privileges, BTF, symbols, libbpf); the message says the fix.
    #[error(transparent)]
    Tracker(#[from] crate::tracker::TrackerError),
    /// A recording's lock waits cannot be given (not recorded, or not whole).
    #[error(transparent)]
    LockWaits(#[from] crate::locks::LockWaitsError),
    /// The allocator recorder failed (no invariant TSC, already recording, its threads).
    #[error(transparent)]
    Allocator(#[from] crate::allocator::AllocatorError),
    /// A session that may not replace a file (`SessionBuilder::replace(false)`,
    /// `MEMTRACK_NO_REPLACE`) found its artifact's path taken: two benchmarks of one run whose
    /// names give one file.
    #[error(
        "{} already holds {} of this run, and session {name:?} would replace it: give the two \
         distinct names (two bench targets or packages with one benchmark id?)",
        path.display(),
        holder.as_ref().map_or_else(|| "an artifact".to_string(), |h| format!("benchmark {h:?}"))
    )]
    ArtifactTaken {
        /// The artifact's path.
        path: std::path::PathBuf,
        /// The name of the recording it holds, if it can be read.
        holder: Option<String>,
        /// The session that would have replaced it.
        name: String,
    },
    /// A finished session did not keep its [`Limits`](crate::Limits) (or lost events, so
    /// it cannot prove them); the artifact is written and the report kept.
    #[error(
        "session {:?} exceeded its limits: {}",
        report.name,
        crate::limits::describe(violations)
    )]
    LimitExceeded {
        /// What the session measured.
        report: Box<crate::report::Report>,
        /// Every limit it did not keep, with the measured numbers.
        violations: Vec<crate::limits::Violation>,
    },
    /// A call of a recording that accumulates calls (`#[memtrack]`, `SessionBuilder::call`)
    /// did not keep its limits, checked against that call's figures; the recording goes on.
    #[error(
        "memtrack: {name} — call {call}: {} → {}",
        crate::limits::describe(violations),
        path.as_ref().map_or("not written (in-memory session)".into(), |p| p.display().to_string())
    )]
    CallLimitExceeded {
        /// The recording's name.
        name: String,
        /// Which call (1 for the first).
        call: u64,
        /// Where the recording's artifact will be when it is finished.
        path: Option<std::path::PathBuf>,
        /// What the call measured.
        iteration: Box<crate::totals::Iteration>,
        /// Every limit it did not keep, with the measured numbers.
        violations: Vec<crate::limits::Violation>,
    },
    /// A recording of calls whose artifact is written in place (a device or a FIFO) was set
    /// aside by calls of other names: its parts went to it as artifacts in a row, not joined.
    #[error(
        "{} is a device or a FIFO, so the {parts} parts of this recording (its calls, \
         interrupted by calls of another name) went to it as {parts} artifacts in a row, not \
         joined: call {name}'s calls together, or write its artifact to a regular file",
        path.display()
    )]
    PartsWrittenInPlace {
        /// The recording's name.
        name: String,
        /// Its artifact.
        path: std::path::PathBuf,
        /// How many parts went to it.
        parts: usize,
    },
    /// The parts of a recording of calls (set aside by calls of other names) could not be
    /// joined into its artifact; the parts' files are kept.
    #[error(
        "{name}: its {} could not be joined into one artifact ({source}); {} kept as {}, which \
         `memtrack show` reads one by one",
        crate::human::plural(kept.len() as u64, "part", "parts"),
        if kept.len() == 1 { "it is" } else { "they are" },
        kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    PartsNotJoined {
        /// The recording's name.
        name: String,
        /// The parts' files, in the order they were recorded.
        kept: Vec<std::path::PathBuf>,
        /// Why they could not be joined.
        source: Box<Error>,
    },
}

/// The message of `Display`: `NoBackend` alone tells a user nothing, its message says the fix.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Contradictory limits are an invalid option of the session (as documented on `start`).
impl From<crate::backend::RecordingError> for Error {
    fn from(e: crate::backend::RecordingError) -> Self {
        match e {
            crate::backend::RecordingError::Tracker(e) => Error::Tracker(e),
            crate::backend::RecordingError::Allocator(e) => Error::Allocator(e),
        }
    }
}

impl From<crate::limits::InvalidLimits> for Error {
    fn from(e: crate::limits::InvalidLimits) -> Self {
        Error::InvalidOption(e.0)
    }
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `.unwrap()` prints is `Debug`: it must say the cause and the fix, as `Display` does.
    #[test]
    fn debug_says_the_cause_and_the_fix() {
        for e in [Error::NoBackend, Error::AllocatorNotInstalled] {
            let debug = format!("{e:?}");
            assert_eq!(debug, e.to_string());
            assert!(debug.contains("#[global_allocator]"), "{debug}");
        }
        assert!(format!("{:?}", Error::NoBackend).contains("CAP_BPF and CAP_PERFMON"));
        #[allow(clippy::unnecessary_literal_unwrap)] // the point: what `.unwrap()` prints
        let unwrapped = std::panic::catch_unwind(|| {
            Err::<(), _>(Error::InvalidOption(
                "workers must be at least 1 (got 0)".into(),
            ))
            .unwrap()
        })
        .expect_err("unwrap of an Err panics");
        let msg = unwrapped
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert!(
            msg.ends_with("invalid option: workers must be at least 1 (got 0)"),
            "{msg}"
        );
    }

    /// A lower layer's error keeps its message in the crate-wide one, and contradictory limits
    /// are still `InvalidOption` (as documented for `start`).
    #[test]
    fn layers_errors_compose_with_their_messages() {
        let format = || crate::artifact::FormatError::NotAnArtifact {
            path: "t.memtrack".into(),
        };
        let e = Error::from(format());
        assert!(matches!(e, Error::Format(_)));
        assert_eq!(e.to_string(), format().to_string());
        assert!(e.to_string().contains("not a memtrack artifact"), "{e}");
        let stopped = Error::from(crate::tracker::TrackerError::from(
            crate::encode::EncodeError::Stopped,
        ));
        assert_eq!(
            stopped.to_string(),
            "the encoder stopped early; `finish()` reports why"
        );
        let limits = crate::Limits::new()
            .min_allocations(2)
            .max_allocations(1)
            .validate()
            .unwrap_err();
        let e = Error::from(limits.clone());
        assert!(matches!(e, Error::InvalidOption(_)));
        assert_eq!(e.to_string(), limits.to_string());
    }
}
