//! The command line's error: the library's [`memtrack::Error`] composed with the causes of the
//! commands' own, and the exit code each maps to. `main` prints it, as one
//! `memtrack: error: …` line per problem, and exits with its code: the one place both happen.

use std::path::PathBuf;

use crate::whole::NotWhole;

/// Everything a command can fail with. The message of each names the problem and the fix.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The library failed (reading or writing an artifact, the tracker, a symbolizer…).
    #[error(transparent)]
    Memtrack(#[from] memtrack::Error),
    /// An option's value, or options together, the command cannot use; the message names the
    /// option and what to give instead.
    #[error("{0}")]
    Usage(String),
    /// A recording not whole enough for the command (see [`crate::whole`]): `verb` is what it
    /// would be ("compared", "diffed").
    #[error("{}: {}, so it cannot be {verb}; {}", file.display(), why.reason(), why.fix())]
    NotWhole {
        /// The artifact.
        file: PathBuf,
        /// What it misses.
        why: NotWhole,
        /// What the command would do with it.
        verb: &'static str,
    },
    /// A recording that allocated without call stacks, given to a command that needs them;
    /// `note` says why it has none and how to record them.
    #[error("{}: {note}", file.display())]
    NoStacks {
        /// The artifact.
        file: PathBuf,
        /// Why, and the fix (`show::no_stacks_note`).
        note: String,
    },
    /// A recording without a single event, given to a command that draws them.
    #[error("{}: the artifact has no events: there is nothing to {verb}", file.display())]
    NoEvents {
        /// The artifact.
        file: PathBuf,
        /// What the command would do ("plot").
        verb: &'static str,
    },
    /// An artifact whose trailer's totals are not those of its decoded events.
    #[error(
        "{}: the totals stored in the trailer differ from the decoded events: the artifact is \
         corrupt",
        file.display()
    )]
    TotalsDisagree {
        /// The artifact.
        file: PathBuf,
    },
    /// An artifact that cannot be opened, by a command that would compare it.
    #[error("{0}; it cannot be compared")]
    Uncomparable(#[source] memtrack::Error),
    /// A side of a comparison that names a directory without artifacts.
    #[error("{side} {}: the directory holds no *.memtrack artifacts", path.display())]
    NoArtifacts {
        /// "base", "head", "bench".
        side: String,
        /// The directory.
        path: PathBuf,
    },
    /// A side of a comparison that cannot be listed.
    #[error("{side} {}: {source}", path.display())]
    Unlisted {
        /// "base", "head", "bench".
        side: String,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Two artifacts of one side of a comparison that hold the same benchmark.
    #[error(
        "{side}: {} and {} both hold benchmark {name:?}: keep one per name",
        first.display(),
        second.display()
    )]
    SameBenchmark {
        /// "base", "head", "bench".
        side: String,
        /// The artifacts.
        first: PathBuf,
        /// The artifacts.
        second: PathBuf,
        /// The benchmark.
        name: String,
    },
    /// Two sides of a comparison without a benchmark in common; the message names each
    /// side's.
    #[error("{0}")]
    NothingInCommon(String),
    /// A benchmark with per-iteration figures on one side of a comparison and plain totals on
    /// the other; the message names both recordings.
    #[error("{0}")]
    Mismatched(String),
    /// A benchmark recorded by the eBPF tracker on one side of a comparison and by the
    /// allocator recorder on the other; the message names both recordings.
    #[error("{0}")]
    MixedRecorders(String),
    /// Inputs refused, all of them reported (one line each), then `summary` when there is
    /// one: a run reports every bad input, not only the first.
    #[error("{}", refused(problems, summary.as_deref()))]
    Refused {
        /// Each problem.
        problems: Vec<Error>,
        /// A closing line ("refusing to compare: 2 input problems").
        summary: Option<String>,
    },
    /// A program memtrack runs for `bench` (git, cargo, the suite) could not start or failed;
    /// the message names the command and what it printed.
    #[error("{0}")]
    Command(String),
    /// Instructions could not be counted, read or compared (`bench --measure instructions`):
    /// no valgrind ([`InstructionsError::NoValgrind`]), counts of another toolchain
    /// ([`InstructionsError::Incomparable`]), a callgrind or result file.
    ///
    /// [`InstructionsError::NoValgrind`]: memtrack::instructions::InstructionsError::NoValgrind
    /// [`InstructionsError::Incomparable`]: memtrack::instructions::InstructionsError::Incomparable
    #[error(transparent)]
    Instructions(#[from] memtrack::instructions::InstructionsError),
    /// A bench executable that failed under callgrind (a benchmark panicked, or the suite
    /// refused its arguments); what it printed is above.
    #[error(
        "{} failed under callgrind ({side}): {status}; its messages are above",
        exe.display()
    )]
    FailedUnderCallgrind {
        /// The bench executable.
        exe: PathBuf,
        /// Which side ("head", "base main, 0123abcd").
        side: String,
        /// How it ended.
        status: std::process::ExitStatus,
    },
    /// A suite whose bench executables ran under callgrind without counting one benchmark.
    #[error(
        "no benchmark was counted ({side}): is the suite on memtrack-criterion (`criterion = \
         {{ package = \"memtrack-criterion\", … }}`), and does the filter match?"
    )]
    NothingCounted {
        /// Which side.
        side: String,
    },
    /// A suite that no package of its workspace builds on memtrack-criterion (`bench
    /// --measure memory` or `instructions`): on criterion itself it would run its whole timing
    /// and record or count nothing. Refused before it is built.
    #[error(
        "the suite ({side}) is not on memtrack-criterion, so it has no {mode} mode: {}",
        on_memtrack_criterion(.at_head)
    )]
    NotOnMemtrackCriterion {
        /// Which side ("head", "base main, 0123abcd", "commit 0123abcd").
        side: String,
        /// The measure refused: "memory" or "instructions".
        mode: &'static str,
        /// Whether the side is the user's checkout, which they can change (a base or a commit
        /// of `--chain` is history: the fix is another commit).
        at_head: bool,
    },
    /// `bench`'s git worktree is not (or no longer) the one it made; the message names it.
    #[error("{0}")]
    Worktree(String),
    /// Another `memtrack bench` holds the target directory's lock; the message names it and
    /// the way round.
    #[error("{0}")]
    Busy(String),
    /// A copy of an executable that `bench` keeps beside its artifacts could not be made.
    #[error("cannot keep a copy of {}: {source}", file.display())]
    KeepCopy {
        /// The executable.
        file: PathBuf,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// memtrack runs setuid or setgid.
    #[error(
        "memtrack runs setuid or setgid here (real uid {ruid}, effective uid {euid}; real gid \
         {rgid}, effective gid {egid}), which would let any user write any file and run any \
         command as its owner: remove the bit (`chmod u-s,g-s`) and use sudo, or file \
         capabilities (see the guide's Security page)"
    )]
    Setuid {
        /// Real user id.
        ruid: u32,
        /// Effective user id.
        euid: u32,
        /// Real group id.
        rgid: u32,
        /// Effective group id.
        egid: u32,
    },
}

/// `Result` with the command line's [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Error::NotOnMemtrackCriterion`]'s fix: the user's checkout they can change; a base or a
/// commit of a chain is history, so they compare from another.
fn on_memtrack_criterion(at_head: &bool) -> &'static str {
    if *at_head {
        "point its criterion line at it (`criterion = { package = \"memtrack-criterion\", … }`)"
    } else {
        "compare from a commit whose criterion line points at it (`criterion = { package = \
         \"memtrack-criterion\", … }`)"
    }
}

/// [`Error::Refused`]'s message on one line.
fn refused(problems: &[Error], summary: Option<&str>) -> String {
    let mut parts: Vec<String> = problems.iter().map(ToString::to_string).collect();
    parts.extend(summary.map(str::to_string));
    parts.join("; ")
}

/// The I/O error `source` of `what` was being done ("cannot read /tmp/x"); its message is
/// `what: source`.
pub(crate) fn io(what: String, source: std::io::Error) -> Error {
    Error::Memtrack(memtrack::Error::Io { what, source })
}

/// The library's layers' errors reach [`Error`] through [`memtrack::Error`], as they would
/// through `?` in the library.
macro_rules! through_memtrack {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Memtrack(e.into())
            }
        }
    )*};
}
through_memtrack!(
    memtrack::artifact::FormatError,
    memtrack::artifact::OutputError,
    memtrack::EncodeError,
    memtrack::analysis::InvalidTimeline,
    memtrack::tracker::TrackerError,
    memtrack::locks::LockWaitsError
);

/// Which exit codes a command's errors map to: the commands differ in what their own codes
/// mean (see each command's `--help`).
#[derive(Clone, Copy)]
pub(crate) enum Codes {
    /// Exit 1 on any error (`show`, `verify`, `plot`, `export`, …).
    Plain,
    /// A gate's: 1 is a regression, so every error exits 2 (`compare`, `bench`,
    /// `flamegraph --diff`).
    Gate,
    /// `record`'s, apart from any code the command it runs can exit with (as `timeout` and
    /// `env` do): 127 the command was not found, 126 it cannot be executed, 2 bad usage (an
    /// option's value), 125 memtrack failed (privileges, the output file, the tracker).
    Record,
}

impl Error {
    /// The exit code of this error under `codes`.
    pub(crate) fn exit_code(&self, codes: Codes) -> u8 {
        use memtrack::tracker::TrackerError as T;
        match codes {
            Codes::Plain => 1,
            Codes::Gate => 2,
            Codes::Record => match self {
                Error::Usage(_)
                | Error::Memtrack(
                    memtrack::Error::InvalidOption(_)
                    | memtrack::Error::Tracker(
                        T::InvalidOption(_) | T::UnknownUser { .. } | T::KernelTooOld { .. },
                    ),
                ) => 2,
                // Reported as invalid options until they got variants of their own: the same
                // code.
                Error::Memtrack(memtrack::Error::Tracker(
                    T::ObjectMismatch(_)
                    | T::PollerDied
                    | T::Internal(_)
                    | T::Encode(memtrack::encode::EncodeError::InvalidOption(_)),
                )) => 2,
                Error::Memtrack(memtrack::Error::Tracker(T::CommandNotFound { .. })) => 127,
                Error::Memtrack(memtrack::Error::Tracker(T::NotExecutable { .. })) => 126,
                Error::Memtrack(memtrack::Error::Tracker(T::Spawn { source, .. }))
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    127
                }
                Error::Memtrack(memtrack::Error::Tracker(T::Spawn { .. })) => 126,
                _ => 125,
            },
        }
    }

    /// Prints the error on standard error: one `memtrack: error: …` line per problem (and
    /// [`Error::Refused`]'s summary line after them).
    pub(crate) fn report(&self) {
        let line = |e: &dyn std::fmt::Display| {
            eprintln!(
                "memtrack: error: {}",
                memtrack::human::terminal(&e.to_string())
            );
        };
        match self {
            Error::Refused { problems, summary } => {
                for p in problems {
                    p.report();
                }
                if let Some(s) = summary {
                    eprintln!("memtrack: {}", memtrack::human::terminal(s));
                }
            }
            e => line(e),
        }
    }
}
