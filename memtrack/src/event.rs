//! The event model: one definition of every kind of event memtrack records.
//!
//! The numeric tags of [`EventKind`] are shared by the BPF program (`memtrack-bpf`'s
//! `memtrack.h`), the artifact format (FORMAT.md) and the CLI's JSON keys ([`EventKind::name`]).

/// One recorded event: when, who, and what happened.
///
/// `#[non_exhaustive]` leaves room for later fields (a stack id) without a breaking change;
/// build one with [`Event::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Event {
    /// Nanoseconds on `CLOCK_MONOTONIC` (the clock `bpf_ktime_get_ns` reads).
    pub ts: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid of the thread).
    pub tid: u32,
    /// What happened.
    pub kind: EventKind,
}

impl Event {
    /// An event at `ts` nanoseconds (CLOCK_MONOTONIC) in thread `tid` of process `pid`.
    pub const fn new(ts: u64, pid: u32, tid: u32, kind: EventKind) -> Self {
        Self { ts, pid, tid, kind }
    }
}

/// What an [`Event`] records. Addresses are user-space virtual addresses; sizes are in bytes.
///
/// Only successful calls are events: a `malloc` that returned NULL is not an allocation.
/// `#[non_exhaustive]`: non-memory kinds (off-CPU intervals) are planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// `malloc`-like: a new block of `size` bytes at `addr` (also C++ `new`, `mallocx`, `mi_malloc`).
    Malloc {
        /// Address of the block.
        addr: u64,
        /// Requested size in bytes.
        size: u64,
    },
    /// `calloc`-like: a new zeroed block of `size` bytes (the product `nmemb * size`).
    Calloc {
        /// Address of the block.
        addr: u64,
        /// Requested size in bytes.
        size: u64,
    },
    /// `realloc`: the block at `old_addr` (0 for `realloc(NULL, n)`) now lives at `new_addr`
    /// with `size` bytes. Counted as one allocation of `size` and a free of the old block.
    Realloc {
        /// Address of the block before the call; 0 if there was none.
        old_addr: u64,
        /// Address of the block after the call.
        new_addr: u64,
        /// New size in bytes.
        size: u64,
    },
    /// `aligned_alloc`, `posix_memalign`, `memalign`, `valloc`, `pvalloc`, aligned `new`.
    AlignedAlloc {
        /// Address of the block.
        addr: u64,
        /// Requested size in bytes.
        size: u64,
        /// Requested alignment in bytes.
        align: u64,
    },
    /// `free`-like: the block at `addr` is released (also `delete`, `dallocx`, `mi_free`).
    Free {
        /// Address of the released block.
        addr: u64,
    },
    /// A successful `mmap` of `size` bytes at `addr`.
    Mmap {
        /// Start of the mapping.
        addr: u64,
        /// Length in bytes, as requested (the kernel rounds up to pages).
        size: u64,
    },
    /// A successful `munmap` of `size` bytes at `addr`.
    Munmap {
        /// Start of the unmapped range.
        addr: u64,
        /// Length in bytes.
        size: u64,
    },
    /// A successful `mremap`: the mapping at `old_addr` now lives at `new_addr` with `size` bytes.
    Mremap {
        /// Start of the mapping before the call.
        old_addr: u64,
        /// Start of the mapping after the call.
        new_addr: u64,
        /// New length in bytes.
        size: u64,
    },
    /// A successful `brk`: the program break is now `addr`.
    Brk {
        /// The new program break.
        addr: u64,
    },
    /// The process replaced its image (a successful `execve`): the heap of the old image
    /// is gone. Its blocks still live are neither live afterwards nor freed (the analysis
    /// counts them as discarded at exec). Since format 1.3.
    Exec,
}

/// The numeric tag of each [`EventKind`], as stored in artifacts and sent by the BPF program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum KindTag {
    /// [`EventKind::Malloc`]
    Malloc = 1,
    /// [`EventKind::Calloc`]
    Calloc = 2,
    /// [`EventKind::Realloc`]
    Realloc = 3,
    /// [`EventKind::AlignedAlloc`]
    AlignedAlloc = 4,
    /// [`EventKind::Free`]
    Free = 5,
    /// [`EventKind::Mmap`]
    Mmap = 6,
    /// [`EventKind::Munmap`]
    Munmap = 7,
    /// [`EventKind::Mremap`]
    Mremap = 8,
    /// [`EventKind::Brk`]
    Brk = 9,
    /// [`EventKind::Exec`]
    Exec = 10,
}

impl KindTag {
    /// Every tag, in numeric order.
    pub const ALL: [KindTag; 10] = [
        KindTag::Malloc,
        KindTag::Calloc,
        KindTag::Realloc,
        KindTag::AlignedAlloc,
        KindTag::Free,
        KindTag::Mmap,
        KindTag::Munmap,
        KindTag::Mremap,
        KindTag::Brk,
        KindTag::Exec,
    ];

    /// The tag with numeric value `v`, if it is one this version knows.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => KindTag::Malloc,
            2 => KindTag::Calloc,
            3 => KindTag::Realloc,
            4 => KindTag::AlignedAlloc,
            5 => KindTag::Free,
            6 => KindTag::Mmap,
            7 => KindTag::Munmap,
            8 => KindTag::Mremap,
            9 => KindTag::Brk,
            10 => KindTag::Exec,
            _ => return None,
        })
    }

    /// The lower-case name used in JSON output and docs (`"aligned_alloc"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            KindTag::Malloc => "malloc",
            KindTag::Calloc => "calloc",
            KindTag::Realloc => "realloc",
            KindTag::AlignedAlloc => "aligned_alloc",
            KindTag::Free => "free",
            KindTag::Mmap => "mmap",
            KindTag::Munmap => "munmap",
            KindTag::Mremap => "mremap",
            KindTag::Brk => "brk",
            KindTag::Exec => "exec",
        }
    }

    /// Index into per-kind arrays (`0..10`).
    pub const fn index(self) -> usize {
        self as usize - 1
    }
}

impl EventKind {
    /// This kind's numeric tag.
    pub const fn tag(&self) -> KindTag {
        match self {
            EventKind::Malloc { .. } => KindTag::Malloc,
            EventKind::Calloc { .. } => KindTag::Calloc,
            EventKind::Realloc { .. } => KindTag::Realloc,
            EventKind::AlignedAlloc { .. } => KindTag::AlignedAlloc,
            EventKind::Free { .. } => KindTag::Free,
            EventKind::Mmap { .. } => KindTag::Mmap,
            EventKind::Munmap { .. } => KindTag::Munmap,
            EventKind::Mremap { .. } => KindTag::Mremap,
            EventKind::Brk { .. } => KindTag::Brk,
            EventKind::Exec => KindTag::Exec,
        }
    }

    /// The lower-case name of this kind (`"malloc"`, `"aligned_alloc"`, ...).
    pub const fn name(&self) -> &'static str {
        self.tag().name()
    }
}
