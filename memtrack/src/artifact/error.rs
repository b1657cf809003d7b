//! The errors of the artifact format: reading, checking and writing artifact bytes.

use std::io;
use std::path::PathBuf;

/// What is wrong with an artifact's bytes, or with reading or writing them. Each variant
/// carries the file (or `<memory>`) and where in it, so that its message says what is wrong.
///
/// `Debug` prints the same message as `Display` (as the crate-wide `Error` does).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Reading or writing the bytes failed; `what` says which (with the path, where there is
    /// one).
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. "reading /tmp/t.memtrack".
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The input does not start with the memtrack magic bytes.
    #[error(
        "{path}: not a memtrack artifact (the file does not start with the memtrack magic bytes)"
    )]
    NotAnArtifact {
        /// The file, or `<memory>`.
        path: PathBuf,
    },
    /// The artifact's major version is not one this build reads.
    #[error(
        "{path}: artifact format version {major}.{minor} is not supported: this memtrack ({tool}) \
         reads format {supported}.x; open it with a memtrack release that writes format {major}"
    )]
    UnsupportedVersion {
        /// The file, or `<memory>`.
        path: PathBuf,
        /// Major version found in the file.
        major: u16,
        /// Minor version found in the file.
        minor: u16,
        /// The major version this build reads.
        supported: u16,
        /// This build's version string.
        tool: &'static str,
    },
    /// The header (magic, version, metadata) is damaged.
    #[error("{path}: corrupt artifact header: {problem}")]
    CorruptHeader {
        /// The file, or `<memory>`.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A frame is damaged or cut short.
    #[error("{path}: corrupt frame {frame} at byte offset {offset}: {problem}")]
    CorruptFrame {
        /// The file, or `<memory>`.
        path: PathBuf,
        /// Index of the frame (0-based).
        frame: u64,
        /// Byte offset of the frame's header in the file.
        offset: u64,
        /// What is wrong.
        problem: String,
    },
    /// Events given to the writer that the format cannot store (a stack on a free): a bug of
    /// the recorder that made them.
    #[error("cannot write the artifact: {problem}")]
    Unwritable {
        /// What cannot be stored.
        problem: String,
    },
    /// Events name a call stack that no frame of the file defines.
    #[error(
        "{path}: events name call stack {stack}, which no frame of the file defines (a damaged \
         recording, or a bug of the recorder that wrote it)"
    )]
    UndefinedStack {
        /// The file, or `<memory>`.
        path: PathBuf,
        /// The stack id.
        stack: u32,
    },
    /// The trailer (frame index and final metadata) is damaged.
    #[error("{path}: corrupt trailer at byte offset {offset}: {problem}")]
    CorruptTrailer {
        /// The file, or `<memory>`.
        path: PathBuf,
        /// Byte offset of the trailer.
        offset: u64,
        /// What is wrong.
        problem: String,
    },
}

impl FormatError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        FormatError::Io {
            what: what.into(),
            source,
        }
    }
}

/// The message of `Display` (cause and fix), which `.unwrap()` prints.
impl std::fmt::Debug for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
