//! Errors of the allocator recorder, each saying how to fix it.

/// Why the allocator recorder could not start, answer or finish a recording.
///
/// `Debug` prints the same message as `Display` (cause and fix), which `.unwrap()` prints.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum AllocatorError {
    /// The CPU's time-stamp counter cannot time events (it is not invariant, or does not
    /// advance): the recorder timestamps events with it.
    #[error("{0}")]
    UnsupportedCpu(&'static str),
    /// One of the recorder's threads could not start or did not answer in time.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The encoder the recording writes to failed (its options, its threads, or writing).
    #[error(transparent)]
    Encode(#[from] crate::encode::EncodeError),
    /// An invariant of the recorder does not hold: a bug in memtrack.
    #[error(
        "memtrack's allocator recorder is in an unexpected state ({0}): a bug in memtrack; \
         please report it"
    )]
    Internal(&'static str),
}

impl std::fmt::Debug for AllocatorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
