//! Errors of the tracker, each saying how to fix it.

use std::path::PathBuf;

/// Why the eBPF tracker could not load, attach or record.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum TrackerError {
    /// The kernel refused to load BPF programs or create uprobes for lack of privileges.
    #[error(
        "{what}: permission denied. memtrack's eBPF tracker needs root, or the capabilities \
         CAP_BPF and CAP_PERFMON: run it with sudo, or grant them once with \
         `sudo setcap cap_bpf,cap_perfmon+ep <path to the binary>`"
    )]
    NotPrivileged {
        /// What was refused.
        what: String,
    },
    /// The running kernel lacks what the tracker needs (Linux 5.15 or newer with BTF): the
    /// features are probed, not read from the version.
    #[error(
        "Linux {release} lacks what memtrack's eBPF tracker needs: {missing}. The tracker \
         needs Linux 5.15 or newer built with BTF (CONFIG_DEBUG_INFO_BTF=y); on this kernel \
         use the allocator recorder (`--backend alloc`, MEMTRACK_BACKEND=alloc)"
    )]
    KernelTooOld {
        /// The kernel's release (`uname -r`).
        release: String,
        /// What it lacks, for a user (each with the release that added it).
        missing: String,
    },
    /// None of the target's objects defines an allocator entry point.
    #[error(
        "no allocator entry point (malloc, free, operator new, je_*/mi_* ...) is defined in \
         {}{files:?}: memtrack finds the allocator by its symbols, so a program statically \
         linked with a stripped allocator cannot be recorded; build it with symbols",
        program.as_ref().map_or(String::new(), |p| format!("{} or the libraries it loads: ", p.display()))
    )]
    NoAllocatorSymbols {
        /// The program that runs (for a script, its interpreter), if known.
        program: Option<PathBuf>,
        /// The files searched.
        files: Vec<PathBuf>,
    },
    /// A file of the target could not be read as ELF.
    #[error(transparent)]
    Elf(#[from] memtrack_bpf::Error),
    /// Another libbpf operation failed.
    #[error("{what}: {source}")]
    Bpf {
        /// What was being done.
        what: String,
        /// libbpf's error.
        #[source]
        source: libbpf_rs::Error,
    },
    /// A recording is already running in this process.
    #[error("a memtrack recording is already running in this process: stop it first")]
    AlreadyRecording,
    /// An option is out of range, or options contradict each other.
    #[error("invalid tracker option: {0}")]
    InvalidOption(String),
    /// The embedded BPF object does not have what this build of memtrack expects (a map, a
    /// program, a layout): the object and the Rust mirror of its ABI were built apart.
    #[error(
        "memtrack's BPF object does not match this build: {0}; regenerate it \
         (`cargo run -p memtrack-bpf --bin memtrack-bpf-gen`) and rebuild memtrack"
    )]
    ObjectMismatch(String),
    /// The poller thread, which drains the ring buffer, is gone: nothing more can be recorded
    /// by this tracker.
    #[error(
        "memtrack's ring-buffer poller thread died, so the tracker cannot record: a bug in \
         memtrack; please report it (with the output above, if any)"
    )]
    PollerDied,
    /// An invariant of the tracker does not hold: a bug in memtrack.
    #[error(
        "memtrack's tracker is in an unexpected state ({0}): a bug in memtrack; please report it"
    )]
    Internal(&'static str),
    /// The encoder the recording writes to failed (its options, its threads, or writing).
    #[error(transparent)]
    Encode(#[from] crate::encode::EncodeError),
    /// Starting the command to record failed.
    #[error("cannot run {command:?}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command is not a path to a file, and no directory of `PATH` holds it (a shell
    /// exits 127 for this).
    #[error("command not found: {command:?} {where_}: check its spelling, or give its path")]
    CommandNotFound {
        /// The program as given.
        command: String,
        /// Where it was looked for ("does not exist", "is in no directory of PATH").
        where_: String,
    },
    /// The command names a file that cannot be executed (a shell exits 126 for this).
    #[error("cannot run {path:?}: {why}")]
    NotExecutable {
        /// The file found.
        path: PathBuf,
        /// Why it cannot run, and the fix.
        why: String,
    },
    /// `--user` names no user of the password database.
    #[error("no user {user:?} in the password database: give a user name or uid that exists")]
    UnknownUser {
        /// The name or uid given.
        user: String,
    },
    /// The recorded command's credentials could not be set up (switching user, dropping
    /// capabilities).
    #[error("cannot run the command {what}: {source}")]
    Credentials {
        /// How it was to run, e.g. `as user "bob"`.
        what: String,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// Following the recorded command's processes with ptrace failed.
    #[error(
        "{what}: {source} (memtrack follows the command's processes with ptrace: is it already \
         being traced, or does a security module forbid ptrace? `--no-follow` records the \
         first process only, without ptrace)"
    )]
    Ptrace {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading /proc or another system file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl TrackerError {
    /// Wraps a libbpf error, recognising missing privileges.
    pub(crate) fn bpf(what: impl Into<String>, source: libbpf_rs::Error) -> Self {
        let mut what = what.into();
        let log = std::mem::take(&mut *LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner()));
        // EPERM/EACCES also come from the verifier; for root they are not about privileges.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if source.kind() == libbpf_rs::ErrorKind::PermissionDenied && !root {
            return TrackerError::NotPrivileged { what };
        }
        if !log.is_empty() {
            what = format!("{what} (libbpf: {})", log.join(" | "));
        }
        TrackerError::Bpf { what, source }
    }
}

/// libbpf's messages while a [`LibbpfLog`] guard lives: reported in errors, never printed
/// (the library prints nothing the user did not ask for).
static LIBBPF_LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn collect(_: libbpf_rs::PrintLevel, msg: String) {
    let mut log = LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner());
    if log.len() < 16 {
        log.push(msg.trim_end().to_owned());
    }
}

/// Routes libbpf's warnings into [`LIBBPF_LOG`] until dropped, then restores the previous
/// printer.
pub(crate) struct LibbpfLog(Option<(libbpf_rs::PrintLevel, libbpf_rs::PrintCallback)>);

impl LibbpfLog {
    pub(crate) fn capture() -> Self {
        LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Self(libbpf_rs::set_print(Some((
            libbpf_rs::PrintLevel::Warn,
            collect,
        ))))
    }
}

impl Drop for LibbpfLog {
    fn drop(&mut self) {
        libbpf_rs::set_print(self.0.take());
    }
}

/// The message of `Display` (cause and fix), which `.unwrap()` prints (as the crate-wide `Error` does).
impl std::fmt::Debug for TrackerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl From<crate::lifecycle::WrongStage> for TrackerError {
    /// A transition of the tracker's lifecycle from the wrong stage: a bug of memtrack's.
    fn from(e: crate::lifecycle::WrongStage) -> Self {
        TrackerError::Internal(e.transition)
    }
}
