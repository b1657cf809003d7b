//! The `#[repr(C)]` mirror of `src/bpf/memtrack.h` and the names of the object's maps/programs.

/// The compiled BPF program (`src/bpf/memtrack.bpf.o`), built by `memtrack-bpf-gen`.
///
/// Open it with libbpf (`ObjectBuilder::open_memory`), set [`RawConfig`] as the whole
/// `.rodata` and the ring buffer's size, load, then attach per ELF file one `uprobe_multi`
/// link of [`PROG_ENTRY`] over every [`crate::ProbeSite`] (cookie: [`crate::ProbeSite::cookie`]) and one of
/// [`PROG_RET`] (as return probes, each site's cookie again) over the sites with `ret`; attach
/// [`PROG_SYS_EXIT`] instead of the [`Entry::is_syscall`] sites to record raw syscalls.
/// The runtime switch is the whole `.bss`, a [`RawSwitch`]; attach [`PROG_FORK`] while a
/// recording with [`SCOPE_THREADS`] runs.
pub static OBJECT: &[u8] = include_bytes!("bpf/memtrack.bpf.o");

/// Switch bit (`MT_SWITCH_STREAM`): record events into the ring buffer, and count them.
pub const SWITCH_STREAM: u32 = 1;
/// Switch bit (`MT_SWITCH_COUNT`): only count allocations, frees and bytes in [`RawStats`].
pub const SWITCH_COUNT: u32 = 2;

/// [`RawSwitch::scope`] (`MT_SCOPE_PROCESS`): every thread of the target but memtrack's own.
pub const SCOPE_PROCESS: u32 = 0;
/// [`RawSwitch::scope`] (`MT_SCOPE_THREADS`): only threads whose per-thread state carries the
/// current [`RawSwitch::generation`], and the threads they spawn while recording.
pub const SCOPE_THREADS: u32 = 1;

/// The ring buffer of [`RawEvent`]s (its size is set at load; a power of two, in bytes).
pub const MAP_EVENTS: &str = "events";
/// Per-CPU [`RawStats`] (one slot, key 0).
pub const MAP_STATS: &str = "stats";
/// Per-thread state (task-local storage; from user space the key is a thread pidfd,
/// `pidfd_open(tid, PIDFD_THREAD)`). The value's first `u32` is the exclusion flag: write a
/// value of 1 followed by zeros to never record that thread (memtrack's own threads); the
/// third `u32` ([`CALLS_SCOPE_OFFSET`]) is the generation whose scope the thread is in; the
/// rest is the program's bookkeeping of nested allocator calls.
pub const MAP_CALLS: &str = "calls";
/// The same per-thread state in a hash map keyed by the thread's tid (`u32`), used instead of
/// [`MAP_CALLS`] with [`FALLBACK_TID_STATE`] (create only the one in use). Its entries are
/// deleted as threads exit by [`PROG_THREAD_EXIT`], attached for the loaded object's life.
pub const MAP_CALLS_TID: &str = "calls_tid";
/// The `tp_btf/sched_process_exit` program: deletes an exiting thread's [`MAP_CALLS_TID`]
/// entry (a later thread may get its tid). Needed only with [`FALLBACK_TID_STATE`].
pub const PROG_THREAD_EXIT: &str = "mt_thread_exit";
/// [`RawConfig::fallbacks`] bit (`MT_FALLBACK_TID_STATE`): per-thread state in
/// [`MAP_CALLS_TID`], keyed by tid, for kernels without thread pidfds (Linux 6.9) or without
/// task storage in uprobe programs.
pub const FALLBACK_TID_STATE: u32 = 1;
/// [`RawConfig::fallbacks`] bit (`MT_FALLBACK_NO_FIND_VMA`): the kernel has no
/// `bpf_find_vma` (Linux 5.17): a blocked switch-out's stack carries no scanned words.
pub const FALLBACK_NO_FIND_VMA: u32 = 2;
/// [`RawConfig::fallbacks`] bit (`MT_FALLBACK_NO_LOOP`): the kernel has no `bpf_loop` (Linux
/// 5.17): the stack walk's steps run in a bounded loop instead.
pub const FALLBACK_NO_LOOP: u32 = 4;
/// Byte offset of `scope_gen` in a [`MAP_CALLS`] value.
pub const CALLS_SCOPE_OFFSET: usize = 8;
/// Every entry probe (`uprobe.multi`): one link per file, each site's cookie an [`Entry`].
pub const PROG_ENTRY: &str = "mt_entry";
/// The return probe (`uretprobe.multi`) of every site whose [`Entry::needs_return`].
pub const PROG_RET: &str = "mt_ret";
/// A `uprobe.multi` program that returns at once: the uprobe floor, for benchmarks.
pub const PROG_NOP: &str = "mt_nop";
/// The `tp_btf/sys_exit` program (raw mmap, munmap, mremap, brk syscalls): attach it as is.
/// It runs for every syscall of every process on the machine; the default records these
/// syscalls through libc's wrappers ([`Entry::is_syscall`] sites) instead.
pub const PROG_SYS_EXIT: &str = "mt_sys_exit";
/// The `tp_btf/sched_process_exec` program: an [`kind::EXEC`] event when the target execs.
pub const PROG_EXEC: &str = "mt_exec";
/// [`RawConfig::follow`] (`MT_FOLLOW_NONE`): the target alone; its children are ignored.
pub const FOLLOW_NONE: u32 = 0;
/// [`RawConfig::follow`] (`MT_FOLLOW_TREE`): the processes of the [`MAP_FOLLOWED`] map.
pub const FOLLOW_TREE: u32 = 1;
/// [`RawConfig::follow`] (`MT_FOLLOW_COUNT`): the target alone, its children counted.
pub const FOLLOW_COUNT: u32 = 2;
/// The processes recorded when [`RawConfig::follow`] is [`FOLLOW_TREE`]: a hash map, key a tgid (`u32`),
/// value a `u32` (1). A process is recorded while its tgid is in it.
pub const MAP_FOLLOWED: &str = "followed";
/// A `uprobe.multi` program for ld.so's `_dl_debug_state` (attach it pid-scoped, with
/// [`RawConfig::follow`] set, only under a tracer): it stops the calling thread with a
/// `SIGSTOP` whose `si_code` is `SI_KERNEL`, for the tracer to probe the objects just mapped,
/// suppress the signal and resume the thread.
pub const PROG_DL_STATE: &str = "mt_dl_state";
/// The symbol of ld.so that [`PROG_DL_STATE`] is attached to.
pub const DL_STATE_SYMBOL: &str = "_dl_debug_state";
/// The `tp_btf/sched_process_fork` program: threads spawned by a thread in scope join it.
pub const PROG_FORK: &str = "mt_fork";
/// The `tp_btf/sched_switch` program (lock waits): a [`kind::SWITCH_OUT`] (its `size` 1 when
/// the thread was preempted, its stack the leaving thread's) and a [`kind::SWITCH_IN`] for
/// every context switch of a recorded thread. It runs for every context switch on the
/// machine: attach it only while a recording asks for lock waits.
pub const PROG_SWITCH: &str = "mt_switch";

/// The event kinds, declared once. Each row is a kind: its name in Rust (memtrack's
/// `EventKind` and `KindTag` variant), its number (`MT_KIND_*` of `memtrack.h`, the artifact's
/// kind byte), its [`kind`] constant, its lower-case name (JSON keys, docs), its role in the
/// heap accounting (`alloc`: a new block; `realloc`: frees the old block and allocates the
/// new; `free`: releases a block; `other`: no heap block), and its fields, in `EventKind`'s
/// order (`old_addr, new_addr`: a move; a raw record's `addr` is the new address).
///
/// `for_each_kind!(m)` calls `m! { row; row; … }`: this crate derives [`kind`] from it, and
/// memtrack its `KindTag`, names, raw-record conversions and the allocation/free rule. A kind
/// added here without an `EventKind` variant (or the reverse) does not compile; one missing
/// from `memtrack.h` fails `kind::ALL`'s test. Not public API: its shape may change.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_kind {
    ($m:ident) => {
        $m! {
            Malloc = 1, MALLOC, "malloc", alloc { addr, size };
            Calloc = 2, CALLOC, "calloc", alloc { addr, size };
            Realloc = 3, REALLOC, "realloc", realloc { old_addr, new_addr, size };
            AlignedAlloc = 4, ALIGNED_ALLOC, "aligned_alloc", alloc { addr, size, align };
            Free = 5, FREE, "free", free { addr };
            Mmap = 6, MMAP, "mmap", other { addr, size };
            Munmap = 7, MUNMAP, "munmap", other { addr, size };
            Mremap = 8, MREMAP, "mremap", other { old_addr, new_addr, size };
            Brk = 9, BRK, "brk", other { addr };
            Exec = 10, EXEC, "exec", other {};
            SwitchOut = 11, SWITCH_OUT, "switch_out", other { preempted };
            SwitchIn = 12, SWITCH_IN, "switch_in", other {};
            ThreadStart = 13, THREAD_START, "thread_start", other {};
            ThreadExit = 14, THREAD_EXIT, "thread_exit", other {};
            IterationStart = 15, ITERATION_START, "iteration_start", other {};
            IterationEnd = 16, ITERATION_END, "iteration_end", other {};
        }
    };
}

macro_rules! abi_kinds {
    ($(
        $variant:ident = $tag:literal, $abi:ident, $name:literal, $role:ident { $($field:ident),* };
    )*) => {
        /// `MT_KIND_*` of `memtrack.h`, derived from [`for_each_kind!`](crate::for_each_kind):
        /// the same numbers as `memtrack::event::KindTag`.
        pub mod kind {
            $(
                #[doc = concat!("`MT_KIND_", stringify!($abi), "`: `", $name, "`.")]
                pub const $abi: u32 = $tag;
            )*
            /// Every kind: its name in `memtrack.h` (after `MT_KIND_`) and its number.
            pub const ALL: &[(&str, u32)] = &[$((stringify!($abi), $tag)),*];
        }
    };
}
crate::for_each_kind!(abi_kinds);

/// The shape of an allocator entry point (`MT_ENTRY_*` of memtrack.h): where its arguments
/// are and what it records. Its number is the BPF cookie of the entry-probe site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u64)]
pub enum Entry {
    /// `(size)` → Malloc.
    Malloc = 1,
    /// `(n, size)` → Calloc of `n * size`.
    Calloc = 2,
    /// `(size)` → Calloc (mimalloc's `mi_zalloc`).
    Zalloc = 3,
    /// `(n, size)` → Malloc of `n * size` (`mi_mallocn`).
    Mallocn = 4,
    /// `(p, size)` → Realloc; `(NULL, n)` → Malloc; `(p, 0)` returning NULL → Free.
    Realloc = 5,
    /// `(p, n, size)` → as Realloc with `n * size`.
    Reallocarray = 6,
    /// `(align, size)` → AlignedAlloc (`memalign`, `aligned_alloc`).
    Memalign = 7,
    /// `(size, align)` → AlignedAlloc (aligned `operator new`, `mi_malloc_aligned`).
    AlignedSizeFirst = 8,
    /// `(void **p, align, size)` → AlignedAlloc of `*p` when it returns 0.
    PosixMemalign = 9,
    /// `(size)` → AlignedAlloc to the page size (`valloc`, `pvalloc`).
    Valloc = 10,
    /// jemalloc `(size, flags)`: AlignedAlloc, Calloc (MALLOCX_ZERO) or Malloc.
    Mallocx = 11,
    /// jemalloc `(p, size, flags)` → Realloc.
    Rallocx = 12,
    /// `(p)` → Free, at entry; no return probe.
    Free = 13,
    /// `(p)` → Free, at entry; a return probe brackets the nested `free` (operator delete).
    FreeOuter = 14,
    /// libc's `mmap(addr, len, …)` → Mmap of the returned address (not `MAP_FAILED`).
    Mmap = 15,
    /// libc's `munmap(addr, len)` → Munmap when it returns 0.
    Munmap = 16,
    /// libc's `mremap(old, old_len, new_len, …)` → Mremap to the returned address.
    Mremap = 17,
    /// libc's `brk(addr)` → Brk to `addr` when it returns 0 (`sbrk` calls it).
    Brk = 18,
}

impl Entry {
    /// The BPF cookie of a site of this shape.
    pub const fn cookie(self) -> u64 {
        self as u64
    }

    /// Whether the site also gets [`PROG_RET`] (the result is known at return, or the call
    /// brackets a nested one).
    pub const fn needs_return(self) -> bool {
        !matches!(self, Entry::Free)
    }

    /// How many of the leading argument registers (rdi, rsi, rdx, rcx, r8, r9) the entry
    /// program reads for a site of this shape (`mt_entry` in memtrack.bpf.c: change both
    /// together). A probe may be placed past instructions that write none of them (and not
    /// rsp): see [`crate::place_probe`].
    pub const fn args_read(self) -> usize {
        match self {
            Entry::Malloc | Entry::Zalloc | Entry::Valloc | Entry::Free | Entry::FreeOuter => 1,
            Entry::Brk => 1,
            Entry::Calloc
            | Entry::Mallocn
            | Entry::Realloc
            | Entry::Memalign
            | Entry::AlignedSizeFirst
            | Entry::Mallocx
            | Entry::Rallocx
            | Entry::Mmap
            | Entry::Munmap => 2,
            // mremap's program reads rdi and rdx.
            Entry::Reallocarray | Entry::PosixMemalign | Entry::Mremap => 3,
        }
    }

    /// The two arguments the program reads only as their product (`n * size`), which a
    /// placement may therefore read as one already-multiplied value: see
    /// [`crate::place_probe_for`].
    pub const fn product_args(self) -> Option<(usize, usize)> {
        match self {
            Entry::Calloc | Entry::Mallocn => Some((0, 1)),
            Entry::Reallocarray => Some((1, 2)),
            _ => None,
        }
    }

    /// Whether this is one of libc's syscall wrappers (mmap, munmap, mremap, brk) rather than
    /// an allocator entry point: attached only when syscalls are recorded through them.
    pub const fn is_syscall(self) -> bool {
        matches!(
            self,
            Entry::Mmap | Entry::Munmap | Entry::Mremap | Entry::Brk
        )
    }
}

/// Where an argument of a probed call is at the probed offset (`MT_REG_*` of memtrack.h): a
/// prologue skipped by [`crate::place_probe`] may have copied it to another register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ArgReg {
    /// rdi (the first argument's own register).
    Rdi = 1,
    /// rsi (the second's).
    Rsi = 2,
    /// rdx (the third's).
    Rdx = 3,
    /// rcx.
    Rcx = 4,
    /// r8.
    R8 = 5,
    /// r9.
    R9 = 6,
    /// rax.
    Rax = 7,
    /// Not a register: the constant 1 (the second factor of an argument pair a prologue
    /// multiplied, whose product is read as the first).
    One = 8,
}

impl ArgReg {
    /// The registers of the first three arguments at a function's entry.
    pub const ENTRY: [ArgReg; 3] = [ArgReg::Rdi, ArgReg::Rsi, ArgReg::Rdx];

    /// The cookie bits (`MT_COOKIE_ARG`) saying that argument `i` (0-2) is in `self`: 0 when
    /// it is its own register, so that an unmoved site's cookie is its [`Entry::cookie`].
    pub const fn cookie_bits(self, i: usize) -> u64 {
        if i >= 3 || self as u8 == Self::ENTRY[i] as u8 {
            0
        } else {
            (self as u64) << (8 + 4 * i)
        }
    }
}

/// One ring-buffer record (`struct memtrack_event`).
///
/// Field use per kind: Malloc/Calloc/Mmap/Munmap: `addr`, `size`; Realloc/Mremap: `addr` (new),
/// `old_addr`, `size` (new); AlignedAlloc: `addr`, `size`, `align`; Free: `addr`; Brk: `addr`
/// (the new break). Unused fields are 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct RawEvent {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// One of [`kind`].
    pub kind: u32,
    /// The id of its call stack (a [`RawStack`] sent before it), 0 for none: allocations and
    /// new mappings carry one when [`RawConfig::stack_depth`] is not 0; frees never do.
    pub stack: u32,
    /// Block or mapping address (the new one for Realloc/Mremap).
    pub addr: u64,
    /// Previous address (Realloc/Mremap), else 0.
    pub old_addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// Alignment in bytes (AlignedAlloc), else 0.
    pub align: u64,
}

impl RawEvent {
    /// Size of one record in bytes.
    pub const SIZE: usize = size_of::<Self>();

    /// Reads a record from the ring buffer's bytes; `None` if `bytes` is not exactly
    /// [`RawEvent::SIZE`] long (a [`RawStack`] is never that long: see [`RawStack::is_stack`]).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let b: &[u8; Self::SIZE] = bytes.try_into().ok()?;
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Some(Self {
            ts: u64_at(0),
            pid: u32_at(8),
            tid: u32_at(12),
            kind: u32_at(16),
            stack: u32_at(20),
            addr: u64_at(24),
            old_addr: u64_at(32),
            size: u64_at(40),
            align: u64_at(48),
        })
    }
}

/// One CPU's counters (`struct memtrack_stats`); sum them over CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct RawStats {
    /// Malloc + Calloc + Realloc + AlignedAlloc events (counted even if the event was dropped).
    pub allocs: u64,
    /// Their sizes, in bytes.
    pub alloc_bytes: u64,
    /// Free events, including `realloc(p, 0)`.
    pub frees: u64,
    /// Events lost because the ring buffer was full.
    pub drops: u64,
    /// Allocation and free calls of the target's threads outside the recording's scope
    /// ([`SCOPE_THREADS`]), not recorded.
    pub out_of_scope: u64,
    /// Processes the target started while recording and not followed
    /// ([`RawConfig::follow`] = [`FOLLOW_COUNT`]).
    pub unfollowed: u64,
    /// [`RawStack`] records sent.
    pub stacks: u64,
    /// Of them, stacks cut at [`RawConfig::stack_depth`] frames.
    pub stacks_truncated: u64,
    /// Stacks whose first hash matched a remembered stack's and whose second did not: sent
    /// again under a new id (nothing aliased).
    pub stack_collisions: u64,
    /// New stacks not remembered because the [`MAP_STACK_IDS`] map was full: each is sent
    /// again whenever it is seen (nothing lost, more ring-buffer traffic).
    pub stack_map_full: u64,
    /// Stacks not sent because the ring buffer was full (also counted in `drops`): their event
    /// carries no stack.
    pub stacks_lost: u64,
}

impl RawStats {
    /// Size of one CPU's slot in bytes.
    pub const SIZE: usize = size_of::<Self>();

    /// Reads one CPU's slot; `None` if `bytes` is not exactly [`RawStats::SIZE`] long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let b: &[u8; Self::SIZE] = bytes.try_into().ok()?;
        let at = |i: usize| u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Some(Self {
            allocs: at(0),
            alloc_bytes: at(1),
            frees: at(2),
            drops: at(3),
            out_of_scope: at(4),
            unfollowed: at(5),
            stacks: at(6),
            stacks_truncated: at(7),
            stack_collisions: at(8),
            stack_map_full: at(9),
            stacks_lost: at(10),
        })
    }
}

/// The field-wise sum (wrapping, as the kernel's counters do): sums the CPUs' slots.
impl std::ops::Add for RawStats {
    type Output = Self;

    fn add(self, o: Self) -> Self {
        Self {
            allocs: self.allocs.wrapping_add(o.allocs),
            alloc_bytes: self.alloc_bytes.wrapping_add(o.alloc_bytes),
            frees: self.frees.wrapping_add(o.frees),
            drops: self.drops.wrapping_add(o.drops),
            out_of_scope: self.out_of_scope.wrapping_add(o.out_of_scope),
            unfollowed: self.unfollowed.wrapping_add(o.unfollowed),
            stacks: self.stacks.wrapping_add(o.stacks),
            stacks_truncated: self.stacks_truncated.wrapping_add(o.stacks_truncated),
            stack_collisions: self.stack_collisions.wrapping_add(o.stack_collisions),
            stack_map_full: self.stack_map_full.wrapping_add(o.stack_map_full),
            stacks_lost: self.stacks_lost.wrapping_add(o.stacks_lost),
        }
    }
}

/// The runtime switch (`struct memtrack_switch`): the program's whole `.bss`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct RawSwitch {
    /// [`SWITCH_STREAM`] | [`SWITCH_COUNT`] bits; 0 = off.
    pub enabled: u32,
    /// [`SCOPE_PROCESS`] or [`SCOPE_THREADS`].
    pub scope: u32,
    /// The current recording's number: per-thread marks of other generations are stale.
    pub generation: u32,
    /// With [`SCOPE_THREADS`]: the thread of the session's running call (its tid), in the
    /// scope with the threads marked in it; 0: none. A call begins and ends with one write.
    pub caller: u32,
}

impl RawSwitch {
    /// Size of `.bss` in bytes.
    pub const SIZE: usize = size_of::<Self>();

    /// The bytes to write over `.bss`.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&self.enabled.to_ne_bytes());
        b[4..8].copy_from_slice(&self.scope.to_ne_bytes());
        b[8..12].copy_from_slice(&self.generation.to_ne_bytes());
        b[12..16].copy_from_slice(&self.caller.to_ne_bytes());
        b
    }
}

/// Load-time settings (`struct memtrack_config`): the program's whole `.rodata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct RawConfig {
    /// The only process (tgid) recorded, when `follow` is 0.
    pub target_tgid: u32,
    /// What to do with the processes the target starts: [`FOLLOW_NONE`] (an in-process
    /// session), [`FOLLOW_TREE`] (record the tgids in the [`MAP_FOLLOWED`] map instead of
    /// `target_tgid` alone; [`PROG_DL_STATE`] stops threads for the tracer) or
    /// [`FOLLOW_COUNT`] (record `target_tgid` only and count the processes it starts in
    /// [`RawStats::unfollowed`], with [`PROG_FORK`] attached).
    pub follow: u32,
    /// A wakeup is forced once this many bytes are unconsumed in the ring buffer.
    pub wakeup_bytes: u64,
    /// Alignment reported for `valloc`/`pvalloc`, in bytes.
    pub page_size: u64,
    /// Frames per call stack, at most [`STACK_MAX`]; 0: events carry no stacks.
    pub stack_depth: u32,
    /// [`FALLBACK_TID_STATE`], [`FALLBACK_NO_FIND_VMA`], [`FALLBACK_NO_LOOP`]: the older ways taken where the
    /// running kernel lacks a feature (0 on a kernel that has them all).
    pub fallbacks: u32,
}

impl RawConfig {
    /// Size of `.rodata` in bytes.
    pub const SIZE: usize = size_of::<Self>();

    /// Settings for `tgid` with the default 64 KiB wakeup watermark, a 4096-byte page size
    /// (the loader sets `page_size` to the running machine's) and stacks of up to
    /// [`DEFAULT_STACK_DEPTH`] frames.
    pub fn new(tgid: u32) -> Self {
        Self {
            target_tgid: tgid,
            follow: 0,
            wakeup_bytes: 64 * 1024,
            page_size: 4096,
            stack_depth: DEFAULT_STACK_DEPTH,
            fallbacks: 0,
        }
    }

    /// The bytes to write over `.rodata` before load.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&self.target_tgid.to_ne_bytes());
        b[4..8].copy_from_slice(&self.follow.to_ne_bytes());
        b[8..16].copy_from_slice(&self.wakeup_bytes.to_ne_bytes());
        b[16..24].copy_from_slice(&self.page_size.to_ne_bytes());
        b[24..28].copy_from_slice(&self.stack_depth.to_ne_bytes());
        b[28..32].copy_from_slice(&self.fallbacks.to_ne_bytes());
        b
    }
}

/// `MT_RECORD_STACK`: the `u32` at offset 16 of a [`RawStack`] record, where a [`RawEvent`] has
/// its `kind` (no kind takes this number).
pub const RECORD_STACK: u32 = 0x100;
/// `MT_STACK_MAX`: the deepest [`RawConfig::stack_depth`] (the kernel's
/// `kernel.perf_event_max_stack` default, 127).
pub const STACK_MAX: u32 = 127;
/// The default [`RawConfig::stack_depth`]: 64 frames.
pub const DEFAULT_STACK_DEPTH: u32 = 64;
/// [`RawStack::flags`] bit (`MT_STACK_TRUNCATED`): the walk went on past
/// [`RawConfig::stack_depth`] frames and was cut there.
pub const STACK_TRUNCATED: u32 = 1;
/// The hash map of stacks already sent (key the first 64-bit hash, value the second and the
/// id); its size (entries) may be set before load.
pub const MAP_STACK_IDS: &str = "stack_ids";

/// The header of a stack record (`struct memtrack_stack`), followed in the ring buffer by
/// `nframes` `u64` absolute addresses of process `pid`, innermost first (the first is the
/// return address into the allocator's caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct RawStack {
    /// `bpf_ktime_get_ns()` when it was sent.
    pub ts: u64,
    /// Process id (tgid) whose addresses these are.
    pub pid: u32,
    /// Its id (≥ 1), which later [`RawEvent::stack`]s name; unique for the loaded program.
    pub id: u32,
    /// [`RECORD_STACK`].
    pub record: u32,
    /// Frames following the header.
    pub nframes: u32,
    /// [`STACK_TRUNCATED`] or 0.
    pub flags: u32,
    /// Bit k (1..15) set: the word 8k bytes above the stack pointer is one of the frames after
    /// frame 1, in the order of k, and frame 1 is the word at the stack pointer (a blocked
    /// thread's switch-out). They are the words that point into frame 0's code mapping: which
    /// one is the return address of frame 0's function, if any, its unwind info says.
    pub scanned: u32,
}

impl RawStack {
    /// Size of the header in bytes.
    pub const SIZE: usize = size_of::<Self>();

    /// Whether a ring-buffer record is a stack record (its `u32` at offset 16 is
    /// [`RECORD_STACK`]) rather than a [`RawEvent`].
    pub fn is_stack(bytes: &[u8]) -> bool {
        bytes.len() >= Self::SIZE
            && u32::from_ne_bytes(bytes[16..20].try_into().expect("4 bytes")) == RECORD_STACK
    }

    /// Reads a stack record: its header and its frames (an iterator over the addresses);
    /// `None` if it is not a stack record or its length disagrees with `nframes`.
    pub fn from_bytes(bytes: &[u8]) -> Option<(Self, impl ExactSizeIterator<Item = u64> + '_)> {
        if !Self::is_stack(bytes) {
            return None;
        }
        let u64_at = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let h = Self {
            ts: u64_at(0),
            pid: u32_at(8),
            id: u32_at(12),
            record: u32_at(16),
            nframes: u32_at(20),
            flags: u32_at(24),
            scanned: u32_at(28),
        };
        if bytes.len() != Self::SIZE + h.nframes as usize * 8 {
            return None;
        }
        let frames = bytes[Self::SIZE..]
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")));
        Some((h, frames))
    }
}

// The C side's layout (memtrack.h): change both together.
const _: () = assert!(size_of::<RawStack>() == 32);
const _: () =
    assert!(core::mem::offset_of!(RawStack, record) == core::mem::offset_of!(RawEvent, kind));
const _: () = assert!(size_of::<RawEvent>() == 56);
const _: () = assert!(align_of::<RawEvent>() == 8);
const _: () = assert!(core::mem::offset_of!(RawEvent, kind) == 16);
const _: () = assert!(core::mem::offset_of!(RawEvent, addr) == 24);
const _: () = assert!(core::mem::offset_of!(RawEvent, align) == 48);
const _: () = assert!(size_of::<RawStats>() == 88);
const _: () = assert!(size_of::<RawSwitch>() == 16);
const _: () = assert!(align_of::<RawStats>() == 8);
const _: () = assert!(size_of::<RawConfig>() == 32);
const _: () = assert!(core::mem::offset_of!(RawConfig, wakeup_bytes) == 8);
