//! Which threads of the process a session records.

use std::fmt;

/// Which threads of the process a session records.
///
/// - [`Scope::Threads`] (the default): the thread that starts the session and every thread
///   spawned while it records by a thread already in the scope. Threads that existed before
///   the session (libtest's other tests, a thread pool started earlier) are left out, so
///   parallel `#[test]`s with exact limits do not count each other's allocations. The eBPF
///   recorder follows thread creation in the kernel; the allocator recorder cannot see a
///   spawn, so a thread joins its parent's scope only through `memtrack::in_session`.
///   What threads outside the scope did is counted, not recorded
///   (the report's `out_of_scope`).
/// - [`Scope::Process`]: every thread of the process but memtrack's own (for a benchmark
///   whose work runs on threads that exist before the session, such as a rayon pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// The session's thread and the threads spawned from it while it records.
    #[default]
    Threads,
    /// Every thread of the process but memtrack's own.
    Process,
}

/// A scope spelling that is neither `threads` nor `process`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope {0:?}: expected \"threads\" or \"process\"")]
pub struct InvalidScope(pub String);

impl std::str::FromStr for Scope {
    type Err = InvalidScope;

    /// Parses `threads` or `process` (the `scope` option of `#[memtrack]`).
    fn from_str(s: &str) -> Result<Self, InvalidScope> {
        match s.trim() {
            "threads" => Ok(Scope::Threads),
            "process" => Ok(Scope::Process),
            other => Err(InvalidScope(other.to_string())),
        }
    }
}

impl Scope {
    /// The option's spelling: `threads` or `process`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Threads => "threads",
            Scope::Process => "process",
        }
    }
}

impl fmt::Display for Scope {
    /// What the summary line says: `this thread and the threads it spawned` or `whole process`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Threads => "this thread and the threads it spawned",
            Scope::Process => "whole process",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_names_parse_back_and_typos_say_the_choices() {
        for s in [Scope::Threads, Scope::Process] {
            assert_eq!(s.as_str().parse::<Scope>().unwrap(), s);
        }
        let msg = "proces".parse::<Scope>().unwrap_err().to_string();
        assert!(
            msg.contains("\"proces\"") && msg.contains("\"threads\""),
            "{msg}"
        );
    }
}
