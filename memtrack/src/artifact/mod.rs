//! The artifact format, version 1: see `FORMAT.md` beside this file for the byte layout.
//!
//! ```text
//! header (magic, version, metadata JSON, CRC)
//! frame 0 .. frame N-1   (fixed 40-byte frame header + zstd-compressed column payload)
//! trailer (frame index + final metadata JSON, CRC)
//! tail    (trailer offset + end magic: 16 bytes)
//! ```

pub(crate) mod codec;
mod error;
mod output;
mod read;
mod write;

use serde::{Deserialize, Serialize};

use crate::totals::Totals;

pub use codec::Definitions;
pub use error::FormatError;
pub use output::{Output, OutputError, create_dir_all};
pub use read::{Completeness, FrameInfo, Reader, StackTable};
pub(crate) use write::{FrameScratch, FrameWriter, encode_frame};

/// First 8 bytes of every artifact.
pub const MAGIC: [u8; 8] = *b"\x89MTRACK\n";
/// Last 8 bytes of a finished artifact.
pub const END_MAGIC: [u8; 8] = *b"MTRKEND\n";
/// First 4 bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"MTFR";
/// First 4 bytes of the trailer.
pub const TRAILER_MAGIC: [u8; 4] = *b"MTIX";
/// The format's major version: readers reject any other.
pub const VERSION_MAJOR: u16 = 1;
/// The format's minor version: additions readers of the same major version may ignore.
/// 1 added the optional `iterations` key of the final metadata; 4 the `processes` and
/// `unfollowed_processes` keys; 5 call stacks (frame flags for a stack-id column and a
/// definitions block); 6 the context-switch kinds `SwitchOut` and `SwitchIn` (lock waits); 7
/// the thread kinds `ThreadStart` and `ThreadExit` (lock waits); 8 the kinds `IterationStart`
/// and `IterationEnd` and the totals' `iteration_spread` (sessions that accumulate calls); 9
/// frees named by refs (a frame flag and a ref column) and the addr column stored plainly; 10
/// the ts column stored plainly (a frame flag).
pub const VERSION_MINOR: u16 = 10;
/// Size of the fixed part of the header before the metadata JSON.
pub(crate) const HEADER_FIXED: usize = 20;
/// Size of a frame header.
pub(crate) const FRAME_HEADER: usize = 40;
/// Size of the tail after the trailer.
pub(crate) const TAIL: usize = 16;
/// Size of one trailer index entry.
pub(crate) const INDEX_ENTRY: usize = 32;
/// Largest event count one frame may hold (bounds the reader's allocations on bad input).
pub const MAX_FRAME_EVENTS: u32 = 1 << 22;
/// Largest uncompressed frame payload (bounds the reader's allocations on bad input).
pub(crate) const MAX_RAW_LEN: u32 = MAX_FRAME_EVENTS * 64;
/// Largest uncompressed definitions block of one frame (bounds the reader's allocations).
pub(crate) const MAX_DEFINITIONS_LEN: u64 = 64 << 20;

/// Which recorder produced an artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Backend {
    /// The eBPF tracker (uprobes + syscall tracepoints).
    Ebpf,
    /// The in-process recorder of the Rust global allocator.
    Alloc,
    /// `memtrack synth`: a seeded model, not a real process.
    Synth,
    /// Something else (an external tool's import, a test).
    Other,
}

/// Metadata known when recording starts, stored in the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Metadata {
    /// The tool that wrote the file, e.g. `memtrack 0.1.0`.
    pub tool: String,
    /// The benchmark or session name, if any.
    #[serde(default)]
    pub name: Option<String>,
    /// The recorded command line, if a command was spawned.
    #[serde(default)]
    pub command: Vec<String>,
    /// The recorded process id.
    pub pid: u32,
    /// Wall-clock start, in nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// `CLOCK_MONOTONIC` at start, in nanoseconds: event timestamps are on this clock.
    pub start_monotonic_ns: u64,
    /// The clock of the event timestamps; always `"monotonic"` in format 1.
    pub clock: String,
    /// Which recorder produced the events.
    pub backend: Backend,
}

impl Metadata {
    /// Metadata for a recording of `pid` by `backend`, starting now.
    pub fn now(pid: u32, backend: Backend) -> Self {
        let start_unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Metadata {
            tool: concat!("memtrack ", env!("CARGO_PKG_VERSION")).to_string(),
            name: None,
            command: Vec::new(),
            pid,
            start_unix_ns,
            start_monotonic_ns: monotonic_ns(),
            clock: "monotonic".to_string(),
            backend,
        }
    }

    /// Sets the benchmark or session name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the recorded command line.
    pub fn with_command(mut self, command: Vec<String>) -> Self {
        self.command = command;
        self
    }
}

/// Metadata known only when recording ends, stored in the trailer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Final {
    /// Events the recorder could not deliver (ring buffer full); non-zero makes the artifact
    /// unusable as a comparison baseline.
    pub lost_events: u64,
    /// `CLOCK_MONOTONIC` when recording stopped, in nanoseconds.
    pub end_monotonic_ns: u64,
    /// Totals over every event of the file, computed by the writer while streaming.
    pub totals: Totals,
    /// Iterations of the measured routine the recording covers, when the writer counted them
    /// (criterion's `memtrack::criterion::Profiler` with `memtrack::criterion::iteration`): its
    /// allocations and bytes are then compared per iteration, since the number of iterations
    /// varies from run to run. Absent (format 1.0, or a plain session): the totals are the
    /// figures. Since format 1.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
    /// The processes of a recording that followed a process tree (`memtrack record`), in the
    /// order they started; empty for a single-process recording. Since format 1.4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessInfo>,
    /// Processes the recorded ones started that were not followed at all (`record
    /// --no-follow`): none of their events are in the file. Since format 1.4.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unfollowed_processes: u64,
    /// Events whose call stack stops early: no frame beyond the allocator's caller, or a frame
    /// outside every executable mapping (code built without frame pointers breaks the chain).
    /// Their sites are known, their callers are not. Since format 1.5.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub short_stacks: u64,
    /// Of [`Final::short_stacks`], those whose call site is in the C library or its loader
    /// (what it allocates for itself: no rebuild of the program gives them callers). Since
    /// format 1.7.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub short_stacks_in_libc: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Final {
    /// Processes whose events are not all in the file: followed ones with a reason
    /// ([`ProcessInfo::uncovered`]), plus [`Final::unfollowed_processes`]. Non-zero makes the
    /// recording not whole, like lost events.
    pub fn uncovered_processes(&self) -> u64 {
        self.processes
            .iter()
            .filter(|p| p.uncovered.is_some())
            .count() as u64
            + self.unfollowed_processes
    }
}

/// One process of a recording that followed a process tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProcessInfo {
    /// Its process id (the `pid` of its events).
    pub pid: u32,
    /// The followed process that started it (`None` for the first one).
    pub parent: Option<u32>,
    /// The program it ran last (`/proc/PID/exe`: the interpreter of a script).
    pub exe: String,
    /// Its command line when it last executed a program (or when it started).
    pub command: Vec<String>,
    /// Its exit code, 128 + N if signal N ended it; `None` if it was not seen ending.
    pub exit_code: Option<i32>,
    /// Why some or all of its events are not in the file (a setuid program it executed,
    /// an allocator that could not be probed); `None` when it was recorded whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncovered: Option<String>,
}

impl ProcessInfo {
    /// A process seen starting, not ended yet.
    pub fn new(pid: u32, parent: Option<u32>, exe: String, command: Vec<String>) -> Self {
        Self {
            pid,
            parent,
            exe,
            command,
            exit_code: None,
            uncovered: None,
        }
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of every event timestamp.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
