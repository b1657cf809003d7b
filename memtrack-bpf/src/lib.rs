//! memtrack's BPF side: the compiled program, its event ABI, and where to put the probes.
//!
//! - [`OBJECT`]: the BPF object built from `src/bpf/memtrack.bpf.c`, checked in so that no
//!   downstream build needs clang (regenerate: `cargo run -p memtrack-bpf --bin memtrack-bpf-gen`).
//! - [`RawEvent`], [`RawStack`], [`RawStats`], [`RawConfig`]: `#[repr(C)]` mirrors of `src/bpf/memtrack.h`, the
//!   one definition of the ABI; sizes and alignments are asserted at compile time.
//! - [`probe_sites`]: reads an ELF file (an executable or a shared library), finds the allocator
//!   entry points it defines ([`PROBES`]) and chooses each probe's offset ([`place_probe`]).
//!
//! Loading and attaching (libbpf-rs) live in `memtrack`'s tracker; this crate has no
//! dependency on libbpf so it builds anywhere.
//!
//! ```text
//! ELF file ──probe_sites──▶ [ProbeSite {symbol, entry, offset, ret}]
//!                                    │ (memtrack: one uprobe_multi link per file, pid-scoped)
//! OBJECT ──load(RawConfig)──▶ programs ──RawEvent ring buffer──▶ memtrack::event::Event
//! ```

mod abi;
mod elf;
mod placement;
mod probes;

pub use abi::ArgReg;
pub use abi::CALLS_SCOPE_OFFSET;
pub use abi::DL_STATE_SYMBOL;
pub use abi::Entry;
pub use abi::MAP_CALLS;
pub use abi::MAP_CALLS_TID;
pub use abi::MAP_EVENTS;
pub use abi::MAP_FOLLOWED;
pub use abi::MAP_STACK_IDS;
pub use abi::MAP_STATS;
pub use abi::OBJECT;
pub use abi::PROG_DL_STATE;
pub use abi::PROG_ENTRY;
pub use abi::PROG_EXEC;
pub use abi::PROG_FORK;
pub use abi::PROG_NOP;
pub use abi::PROG_RET;
pub use abi::PROG_SWITCH;
pub use abi::PROG_SYS_EXIT;
pub use abi::PROG_THREAD_EXIT;
pub use abi::RawConfig;
pub use abi::RawEvent;
pub use abi::RawStack;
pub use abi::RawStats;
pub use abi::RawSwitch;
pub use abi::kind;
pub use abi::{DEFAULT_STACK_DEPTH, RECORD_STACK, STACK_MAX, STACK_TRUNCATED};
pub use abi::{FALLBACK_NO_FIND_VMA, FALLBACK_NO_LOOP, FALLBACK_TID_STATE};
pub use abi::{FOLLOW_COUNT, FOLLOW_NONE, FOLLOW_TREE};
pub use abi::{SCOPE_PROCESS, SCOPE_THREADS, SWITCH_COUNT, SWITCH_STREAM};
pub use elf::Elf;
pub use elf::ElfSymbol;
pub use placement::Placement;
pub use placement::PlacementRule;
pub use placement::place_probe;
pub use placement::place_probe_for;
pub use probes::PROBES;
pub use probes::ProbeSite;
pub use probes::ProbeSpec;
pub use probes::probe_sites;
pub use probes::probe_sites_in;

/// Errors of this crate: reading and parsing ELF files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes are not a little-endian ELF64 file, or a header points outside the file.
    #[error("{path}: not a valid little-endian ELF64 file: {what}")]
    BadElf {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong (the `object` crate's message).
        what: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
