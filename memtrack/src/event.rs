//! The event model: one definition of every kind of event memtrack records.
//!
//! The numeric tags of [`EventKind`] are shared by the BPF program (`memtrack-bpf`'s
//! `memtrack.h`), the artifact format (FORMAT.md) and the CLI's JSON keys ([`EventKind::name`]).

use crate::stack::StackId;

/// One recorded event: when, who, and what happened.
///
/// `#[non_exhaustive]` leaves room for later fields without a breaking change; build one with
/// [`Event::new`] (and [`Event::with_stack`] for an allocation whose call stack was recorded).
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
    /// The call stack that made an allocation ([`StackId::NONE`] when none was recorded, and
    /// always for frees, mappings and `exec`): an id into the recording's stack table.
    pub stack: StackId,
}

impl Event {
    /// An event at `ts` nanoseconds (CLOCK_MONOTONIC) in thread `tid` of process `pid`.
    /// It carries no stack ([`StackId::NONE`]).
    pub const fn new(ts: u64, pid: u32, tid: u32, kind: EventKind) -> Self {
        Self {
            ts,
            pid,
            tid,
            kind,
            stack: StackId::NONE,
        }
    }

    /// This event with the call stack `stack` (an id into the recording's stack table).
    pub const fn with_stack(self, stack: StackId) -> Self {
        Self { stack, ..self }
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
    /// The thread left its CPU (a context switch; recorded only when lock waits are asked
    /// for). Its stack ([`Event::stack`]) is the thread's user stack as it left: where it
    /// waited. The thread is off the CPU until its next [`EventKind::SwitchIn`]. Since format
    /// 1.6.
    SwitchOut {
        /// Whether it was preempted (still runnable: an involuntary switch, not a wait);
        /// `false` when it blocked (a futex, I/O, a sleep).
        preempted: bool,
    },
    /// The thread got a CPU again (a context switch; recorded only when lock waits are asked
    /// for). Since format 1.6.
    SwitchIn,
    /// The thread was created (recorded only when lock waits are asked for, as its first
    /// [`EventKind::SwitchIn`] is): stamped when it was created, before that switch-in, so it
    /// comes in the stream after events stamped later. Since format 1.7.
    ThreadStart,
    /// The thread ended: it left the CPU for the last time (recorded, instead of that
    /// [`EventKind::SwitchOut`], only when lock waits are asked for). Since format 1.7.
    ThreadExit,
    /// A call of a measured routine begins on this thread: the events up to the next
    /// [`EventKind::IterationEnd`] are one iteration (one call of a `#[memtrack]` function
    /// whose calls a session accumulates). Written by the session, not by a recorder's probe.
    /// Since format 1.8.
    IterationStart,
    /// The call that the last [`EventKind::IterationStart`] began has returned. Since format
    /// 1.8.
    IterationEnd,
}

// Everything per kind below is derived from the one kind table, memtrack-bpf's
// `for_each_kind!` (shared with the BPF ABI's `kind` constants and checked against memtrack.h):
// the tags, the names, the conversions of raw records, and the allocation/free rule. The
// matches on `EventKind` it generates are exhaustive, so a kind in the table without a variant
// above (or the reverse) does not compile.
macro_rules! derive_kinds {
    ($(
        $variant:ident = $tag:literal, $abi:ident, $name:literal, $role:ident { $($field:ident),* };
    )*) => {
        /// The numeric tag of each [`EventKind`], as stored in artifacts and sent by the BPF
        /// program (`MT_KIND_*` of memtrack.h).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum KindTag {
            $(
                #[doc = concat!("[`EventKind::", stringify!($variant), "`]")]
                $variant = $tag,
            )*
        }

        impl KindTag {
            /// Every tag, in numeric order.
            pub const ALL: [KindTag; [$($tag),*].len()] = [$(KindTag::$variant),*];

            /// The tag with numeric value `v`, if it is one this version knows.
            pub const fn from_u8(v: u8) -> Option<Self> {
                Some(match v {
                    $($tag => KindTag::$variant,)*
                    _ => return None,
                })
            }

            /// The lower-case name used in JSON output and docs (`"aligned_alloc"`, ...).
            pub const fn name(self) -> &'static str {
                match self {
                    $(KindTag::$variant => $name,)*
                }
            }
        }

        impl EventKind {
            /// This kind's numeric tag.
            pub const fn tag(&self) -> KindTag {
                match self {
                    $(EventKind::$variant { .. } => KindTag::$variant,)*
                }
            }

            /// The event a raw record (of the BPF program or the allocator recorder) stands
            /// for: `kind` its `MT_KIND_*` number; `None` for a number this build does not know.
            /// Reads only the fields the kind has.
            #[inline(always)]
            pub(crate) fn from_raw<R: RawRecord>(kind: u32, r: &R) -> Option<EventKind> {
                Some(match kind {
                    $($tag => EventKind::$variant { $($field: raw_field!(r, $field)),* },)*
                    _ => return None,
                })
            }

            /// Applies the heap's accounting rule, by the role of this event's kind: calls
            /// `ops.free` for the block it frees, then `ops.alloc` for the block it allocates
            /// (see the accounting rules of the analysis). `false` for a kind that is not of
            /// the heap (mappings, `brk`, `exec`).
            #[inline(always)]
            pub(crate) fn apply_heap<H: HeapOps>(&self, ops: &mut H) -> bool {
                match *self {
                    $(EventKind::$variant { $($field),* } => heap_role!($role, ops; $($field),*),)*
                }
            }
        }
    };
}

/// A raw record's field `$field` (a move's new address is its `addr`; a switch-out's
/// `preempted` flag is its `size`, 0 or 1).
macro_rules! raw_field {
    ($r:ident, preempted) => {
        $r.size() != 0
    };
    ($r:ident, new_addr) => {
        $r.addr()
    };
    ($r:ident, $field:ident) => {
        $r.$field()
    };
}

/// The heap rule of a kind of role `alloc`, `realloc`, `free` or `other`, from its fields.
macro_rules! heap_role {
    (alloc, $ops:ident; $addr:ident, $size:ident $(, $rest:ident)*) => {{
        $(let _ = $rest;)*
        $ops.alloc($addr, $size);
        true
    }};
    // `realloc(NULL, n)` frees nothing; a realloc that returned NULL allocates nothing.
    (realloc, $ops:ident; $old:ident, $new:ident, $size:ident) => {{
        if $old != 0 {
            $ops.free($old);
        }
        if $new != 0 {
            $ops.alloc($new, $size);
        }
        true
    }};
    // `free(NULL)` is not a free.
    (free, $ops:ident; $addr:ident) => {{
        if $addr != 0 {
            $ops.free($addr);
        }
        true
    }};
    (other, $ops:ident; $($field:ident),*) => {{
        $(let _ = $field;)*
        false
    }};
}

memtrack_bpf::for_each_kind!(derive_kinds);

/// A raw record, as the BPF program and the allocator recorder write them: a kind reads the
/// fields its variant has (`addr` is a move's new address).
pub(crate) trait RawRecord {
    /// The block's (or mapping's) address; a move's new address.
    fn addr(&self) -> u64;
    /// A move's old address.
    fn old_addr(&self) -> u64;
    /// The size in bytes.
    fn size(&self) -> u64;
    /// The requested alignment in bytes.
    fn align(&self) -> u64;
}

/// What the heap's accounting rule does with an event ([`EventKind::apply_heap`]).
pub(crate) trait HeapOps {
    /// A block of `size` bytes at `addr` is allocated.
    fn alloc(&mut self, addr: u64, size: u64);
    /// The block at `addr` is freed.
    fn free(&mut self, addr: u64);
}

/// What an event does to the heap (the malloc family's blocks), as plain values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heap {
    /// The address of the block it frees.
    pub freed: Option<u64>,
    /// The address and size of the block it allocates.
    pub allocated: Option<(u64, u64)>,
}

impl HeapOps for Heap {
    #[inline(always)]
    fn alloc(&mut self, addr: u64, size: u64) {
        self.allocated = Some((addr, size));
    }

    #[inline(always)]
    fn free(&mut self, addr: u64) {
        self.freed = Some(addr);
    }
}

// `index` relies on the tags being 1, 2, … in the order of `ALL`.
const _: () = {
    let mut i = 0;
    while i < KindTag::ALL.len() {
        assert!(
            KindTag::ALL[i] as usize == i + 1,
            "kind tags are 1..=N in order"
        );
        i += 1;
    }
};

impl KindTag {
    /// Index into per-kind arrays (`0..ALL.len()`).
    pub const fn index(self) -> usize {
        self as usize - 1
    }

    /// Whether an event of this kind may carry a call stack ([`Event::stack`]): the calls
    /// that make a block or a mapping, and a thread leaving its CPU (where it waited). Frees,
    /// unmappings, `brk`, `exec` and switch-ins never do (DHAT's accounting attributes a
    /// block's whole life to the stack that allocated it). The artifact stores a stack id for
    /// these kinds only.
    pub const fn carries_stack(self) -> bool {
        matches!(
            self,
            KindTag::Malloc
                | KindTag::Calloc
                | KindTag::Realloc
                | KindTag::AlignedAlloc
                | KindTag::Mmap
                | KindTag::Mremap
                | KindTag::SwitchOut
        )
    }
}

impl KindTag {
    /// Whether this is a scheduling kind (`SwitchOut`, `SwitchIn`, `ThreadStart`,
    /// `ThreadExit`: recorded for lock waits), not a memory event.
    pub const fn is_scheduling(self) -> bool {
        matches!(
            self,
            KindTag::SwitchOut | KindTag::SwitchIn | KindTag::ThreadStart | KindTag::ThreadExit
        )
    }

    /// Whether this is a call of the heap's allocator that makes a block (`Malloc`,
    /// `Calloc`, `Realloc`, `AlignedAlloc`).
    pub const fn is_heap_allocation(self) -> bool {
        matches!(
            self,
            KindTag::Malloc | KindTag::Calloc | KindTag::Realloc | KindTag::AlignedAlloc
        )
    }

    /// Whether this marks an iteration's bounds (`IterationStart`, `IterationEnd`).
    pub const fn is_iteration_mark(self) -> bool {
        matches!(self, KindTag::IterationStart | KindTag::IterationEnd)
    }

    /// Whether this is a memory event (the heap, mappings, `brk`, `exec`): neither a
    /// scheduling kind nor an iteration mark, which totals and `show` list only when recorded.
    pub const fn is_memory(self) -> bool {
        !self.is_scheduling() && !self.is_iteration_mark()
    }
}

impl EventKind {
    /// The lower-case name of this kind (`"malloc"`, `"aligned_alloc"`, ...).
    pub const fn name(&self) -> &'static str {
        self.tag().name()
    }

    /// What this event does to the heap by the analysis's accounting rules: the block it
    /// frees, the block it allocates (a `realloc` both). An `exec`, which discards its
    /// process's blocks, is not of the heap here: nothing.
    #[inline(always)]
    pub fn heap(&self) -> Heap {
        let mut heap = Heap::default();
        self.apply_heap(&mut heap);
        heap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fields;

    impl RawRecord for Fields {
        fn addr(&self) -> u64 {
            0x2000
        }
        fn old_addr(&self) -> u64 {
            0x1000
        }
        fn size(&self) -> u64 {
            96
        }
        fn align(&self) -> u64 {
            64
        }
    }

    fn fields() -> &'static Fields {
        &Fields
    }

    /// Every tag of the table converts from its raw number to the variant of the same tag and
    /// name, and numbers outside the table convert to nothing (never to a default kind).
    #[test]
    fn raw_numbers_convert_to_their_kind_only() {
        let mut names = std::collections::BTreeSet::new();
        for tag in KindTag::ALL {
            let kind = EventKind::from_raw(tag as u32, fields()).expect("a kind of the table");
            assert_eq!(kind.tag(), tag);
            assert_eq!(KindTag::from_u8(tag as u8), Some(tag));
            assert_eq!(kind.name(), tag.name());
            assert!(names.insert(tag.name()), "{} twice", tag.name());
        }
        let after = KindTag::ALL.len() as u32 + 1;
        for n in [0, after, 255, u32::MAX] {
            assert_eq!(EventKind::from_raw(n, fields()), None, "{n}");
        }
        assert_eq!(KindTag::from_u8(0), None);
        assert_eq!(KindTag::from_u8(after as u8), None);
        assert_eq!(
            EventKind::from_raw(KindTag::Mremap as u32, fields()),
            Some(EventKind::Mremap {
                old_addr: 0x1000,
                new_addr: 0x2000,
                size: 96
            })
        );
        assert_eq!(
            EventKind::from_raw(KindTag::SwitchOut as u32, fields()),
            Some(EventKind::SwitchOut { preempted: true })
        );
        assert_eq!(
            EventKind::from_raw(KindTag::AlignedAlloc as u32, fields()),
            Some(EventKind::AlignedAlloc {
                addr: 0x2000,
                size: 96,
                align: 64
            })
        );
    }

    /// The allocation/free rule, kind by kind, as the analysis' docs state it.
    #[test]
    fn heap_effects_follow_the_accounting_rules() {
        let none = Heap {
            freed: None,
            allocated: None,
        };
        let alloc = |addr, size| Heap {
            freed: None,
            allocated: Some((addr, size)),
        };
        let free = |addr| Heap {
            freed: Some(addr),
            allocated: None,
        };
        let cases = [
            (EventKind::Malloc { addr: 8, size: 3 }, alloc(8, 3)),
            (EventKind::Calloc { addr: 8, size: 3 }, alloc(8, 3)),
            (
                EventKind::AlignedAlloc {
                    addr: 8,
                    size: 3,
                    align: 64,
                },
                alloc(8, 3),
            ),
            (
                EventKind::Realloc {
                    old_addr: 8,
                    new_addr: 16,
                    size: 5,
                },
                Heap {
                    freed: Some(8),
                    allocated: Some((16, 5)),
                },
            ),
            (
                EventKind::Realloc {
                    old_addr: 0,
                    new_addr: 16,
                    size: 5,
                },
                alloc(16, 5),
            ),
            (
                EventKind::Realloc {
                    old_addr: 8,
                    new_addr: 0,
                    size: 0,
                },
                free(8),
            ),
            (EventKind::Free { addr: 8 }, free(8)),
            (EventKind::Free { addr: 0 }, none),
            (EventKind::Mmap { addr: 8, size: 3 }, none),
            (EventKind::Munmap { addr: 8, size: 3 }, none),
            (
                EventKind::Mremap {
                    old_addr: 8,
                    new_addr: 16,
                    size: 5,
                },
                none,
            ),
            (EventKind::Brk { addr: 8 }, none),
            (EventKind::Exec, none),
            (EventKind::SwitchOut { preempted: true }, none),
            (EventKind::SwitchIn, none),
            (EventKind::ThreadStart, none),
            (EventKind::ThreadExit, none),
            (EventKind::IterationStart, none),
            (EventKind::IterationEnd, none),
        ];
        for (kind, heap) in cases {
            assert_eq!(kind.heap(), heap, "{kind:?}");
        }
        let covered: std::collections::BTreeSet<_> = cases.iter().map(|(k, _)| k.tag()).collect();
        assert_eq!(covered.len(), KindTag::ALL.len(), "a kind without a case");
    }
}
