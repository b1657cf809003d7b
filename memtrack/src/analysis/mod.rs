//! Streaming analysis: totals, peak, live set at the end, per-thread totals.
//!
//! # Accounting rules (shared by `memtrack show`, session reports and the trailer)
//! - The **heap** is the malloc family: `Malloc`, `Calloc`, `Realloc`, `AlignedAlloc`, `Free`.
//!   Mapped regions (`Mmap`, `Munmap`, `Mremap`) are accounted separately and never mixed into
//!   heap totals; `Brk` events are only counted.
//! - An **allocation** is a successful call returning a block (`malloc`, `calloc`, `realloc`,
//!   aligned family); it adds its size to `bytes_allocated`.
//! - A `Realloc` counts as one allocation of its new size and a free of its old block (when it
//!   had one: `realloc(NULL, n)` frees nothing) — the accounting of Valgrind DHAT.
//! - A **free** releases a block: a `Free` event or the old block of a `Realloc`. A free of a
//!   block allocated before recording began (unknown address) counts as a free but adds no bytes
//!   (counted in `unmatched_frees`); `free(NULL)` is not a free.
//! - A free of an address the recording saw freed, with no allocation there since, is the
//!   allocator returning a block from its own cache, not a user free: glibc's thread shutdown
//!   passes every block left in the thread's tcache (blocks the program had already freed)
//!   through `free` again, up to hundreds per exiting thread. It is counted in
//!   `allocator_internal_frees`, not in `frees` (so a program that frees everything has as
//!   many frees as allocations), and changes no live bytes.
//! - **Live** heap bytes change at every allocation and free; `peak_live_bytes` is their maximum
//!   over the event order (taken after each event, so a `Realloc` moves live bytes in one step).
//! - Mapped bytes are page-rounded (4 KiB) lengths; `munmap` of part of a mapping splits it.
//! - An `Exec` event ends the process image's heap: the blocks of that process still live are
//!   **discarded at exec** (`blocks_discarded_at_exec`, `bytes_discarded_at_exec`), neither
//!   freed nor live afterwards; the image's mappings and the addresses it had freed go too
//!   (the new image starts with an empty address space).
//! - Each **process** (pid) has a heap and mappings of its own: the same address in two
//!   processes is two blocks. A process's free of a block allocated before it was observed (a
//!   forked child freeing a block its parent allocated before the fork) is an unmatched free, as
//!   in a recording of that process alone ([`ProcessTotals`], [`Analyzer::per_process`]).

mod attribution;
mod blocks;
mod compare;
mod histogram;
mod offcpu;
mod runs;
mod sites;
mod timeline;

pub use attribution::{Attribution, SiteDelta, attribute};
pub use compare::{Benchmark, Comparison, Metric, Row, Threshold, Verdict};
pub use histogram::{SizeClass, SizeHistogram};
pub use offcpu::{Interval, OffCpu, OffCpuBuilder, ThreadTime};
pub use sites::{Site, SiteAnalyzer, SiteOrder, Sites, UnknownSiteOrder};
pub use timeline::{Column, Extremes, InvalidTimeline, Timeline};

use crate::totals::{Iteration, IterationSpread, ThreadTotals, Totals};

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use blocks::BlockMap;
use serde::{Deserialize, Serialize};

use crate::event::{Event, EventKind, HeapOps};

const PAGE: u64 = 4096;

/// `size` rounded up to whole pages, saturating for absurd sizes from damaged input.
fn pages(size: u64) -> u64 {
    size.div_ceil(PAGE).saturating_mul(PAGE)
}

/// The headline numbers of a recording at one moment (a mid-session snapshot), under the
/// accounting rules of [`Totals`]: a plain `Copy` value, so taking one allocates nothing on the
/// measured thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Stats {
    /// Allocations so far ([`Totals::allocations`]).
    pub allocations: u64,
    /// Bytes allocated so far, in total ([`Totals::bytes_allocated`]).
    pub bytes_allocated: u64,
    /// Heap blocks freed so far ([`Totals::frees`]).
    pub frees: u64,
    /// Heap blocks allocated while recording and live now.
    pub live_blocks: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Most heap blocks live at once so far ([`Totals::peak_live_blocks`]).
    pub peak_live_blocks: u64,
    /// Most heap bytes live at once so far ([`Totals::peak_live_bytes`]).
    pub peak_live_bytes: u64,
    /// Events recorded so far.
    pub events: u64,
    /// Iterations finished so far, when the events mark them ([`IterationSpread::iterations`]).
    pub iterations: u64,
    /// The last of them.
    pub last_iteration: Option<Iteration>,
}

/// Totals of one process (by pid) of a recording: each process has a heap of its own (the
/// same address in two processes is two blocks), and a process's frees of blocks allocated
/// before it was observed (a forked child freeing its parent's blocks) are unmatched frees, as
/// a recording of that process alone would count them. The rows add up to [`Totals`]. Counted
/// off the per-event path: events, allocations and frees from the process's threads, live
/// blocks from its heap when asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProcessTotals {
    /// Events of this process.
    pub events: u64,
    /// Allocations made by this process.
    pub allocations: u64,
    /// Bytes allocated by this process.
    pub bytes_allocated: u64,
    /// Heap blocks this process freed.
    pub frees: u64,
    /// Bytes freed (of blocks this process allocated while recorded).
    pub bytes_freed: u64,
    /// Frees of blocks not allocated while this process was recorded.
    pub unmatched_frees: u64,
    /// Frees by the allocator of blocks already freed (see [`Totals::allocator_internal_frees`]).
    pub allocator_internal_frees: u64,
    /// Heap blocks of this process live after its last event.
    pub live_blocks_at_end: u64,
    /// Their bytes.
    pub live_bytes_at_end: u64,
    /// Blocks still live when this process replaced its image (exec).
    pub blocks_discarded_at_exec: u64,
    /// Their bytes.
    pub bytes_discarded_at_exec: u64,
}

/// What the analysis knows of an address of a process's heap.
#[derive(Clone, Copy)]
enum Block {
    /// A block of this many bytes is live there, with the tag its [`HeapObserver`] gave it
    /// (the site analysis: the block's site; 0 otherwise). One map serves the totals and the
    /// sites: a second map would cost every allocation and free another look-up.
    Live(u64, u32),
    /// Freed while recording, not allocated again since: a second free of it is the
    /// allocator's own (see the module docs).
    Freed,
}

/// One process's heap and mappings as the events describe them. One map for live and freed
/// addresses, so that an allocation and a free cost one hash-table operation each (a live map
/// plus a freed set cost two each).
#[derive(Default)]
struct Proc {
    blocks: BlockMap,
    /// Mapped regions: start -> page-rounded length.
    maps: BTreeMap<u64, u64>,
    mapped: u64,
    /// What the per-event path counts per process: the rare cases only.
    unmatched_frees: u64,
    allocator_internal_frees: u64,
    blocks_discarded_at_exec: u64,
    bytes_discarded_at_exec: u64,
}

impl Proc {
    /// Its live blocks and their bytes (a walk of its heap: for exec and the end, not per event).
    fn live(&self) -> (u64, u64) {
        self.live_each(|_, _| {})
    }

    /// [`Proc::live`], telling `each` every live block's size and tag on the way.
    fn live_each(&self, mut each: impl FnMut(u64, u32)) -> (u64, u64) {
        self.blocks.values().fold((0, 0), |(n, b), x| match *x {
            Block::Live(size, tag) => {
                each(size, tag);
                (n + 1, b.saturating_add(size))
            }
            Block::Freed => (n, b),
        })
    }
}

/// Live heap blocks and bytes over all processes.
#[derive(Default)]
struct Live {
    blocks: u64,
    bytes: u64,
    /// The most live bytes and blocks since the open iteration began (see [`Iteration`]):
    /// raised where live bytes and blocks grow, at an allocation.
    iteration_peak: (u64, u64),
}

/// What the heap's changes feed besides the totals: nothing ([`Analyzer::update`]), a size
/// histogram counted in the same pass ([`Analyzer::update_sized`]), or the call sites
/// ([`SiteAnalyzer`]), which tag each block with its site and are told when it ends.
pub(crate) trait HeapObserver {
    /// The tag to keep with the block an allocation is about to make (before its accounting).
    #[inline(always)]
    fn tag(&mut self) -> u32 {
        0
    }
    /// One allocation of `size` bytes tagged `tag`, by the accounting rules.
    fn on_alloc(&mut self, size: u64, tag: u32);
    /// A live block of `size` bytes tagged `tag` ended: freed, replaced by an allocation at
    /// its address, or discarded with its process's image.
    #[inline(always)]
    fn on_end(&mut self, _size: u64, _tag: u32) {}
}

impl HeapObserver for () {
    #[inline(always)]
    fn on_alloc(&mut self, _size: u64, _tag: u32) {}
}

impl HeapObserver for SizeHistogram {
    #[inline(always)]
    fn on_alloc(&mut self, size: u64, _tag: u32) {
        self.add(size);
    }
}

/// The heap's part of [`Analyzer::update`]: what the kind table's rule calls for one event.
struct HeapUpdate<'a, S> {
    t: &'a mut Totals,
    th: &'a mut ThreadTotals,
    p: &'a mut Proc,
    live: &'a mut Live,
    sizes: &'a mut S,
}

impl<S: HeapObserver> HeapOps for HeapUpdate<'_, S> {
    #[inline(always)]
    fn alloc(&mut self, addr: u64, size: u64) {
        Analyzer::alloc(self.t, self.th, self.p, self.live, (addr, size), self.sizes);
    }

    #[inline(always)]
    fn free(&mut self, addr: u64) {
        Analyzer::free(self.t, self.th, self.p, self.live, addr, self.sizes);
    }
}

/// How many events ahead [`Analyzer::update_all`] prefetches the heap slots they will look
/// up: on a large heap the analysis otherwise waits mostly on the block table's cache misses.
const PREFETCH_AHEAD: usize = 8;

/// The block-table size above which [`Analyzer::update_all`] prefetches: a table that fits a
/// typical core's L2 cache (1 MiB) stays cached.
const PREFETCH_ABOVE_BYTES: usize = 1 << 20;

/// Asks the CPU to bring `x` into its cache: a hint, with no effect on what the program reads.
#[inline(always)]
fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and cannot fault (`x` is a reference
    // anyway). SSE is part of x86_64's baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// The heap rule of an event, as prefetches of the addresses it will look up.
struct Prefetch<'a>(&'a BlockMap);

impl HeapOps for Prefetch<'_> {
    #[inline(always)]
    fn alloc(&mut self, addr: u64, _size: u64) {
        self.0.prefetch(addr);
    }

    #[inline(always)]
    fn free(&mut self, addr: u64) {
        self.0.prefetch(addr);
    }
}

/// Computes [`Totals`] from events fed in order.
#[derive(Default)]
pub struct Analyzer {
    t: Totals,
    live: Live,
    /// Mapped bytes over all processes.
    mapped: u64,
    /// Per-process state, in order of first appearance, and where each pid is in it.
    procs: Vec<(u32, Proc)>,
    proc_index: FxHashMap<u32, usize>,
    /// Per-thread totals, in order of first appearance, each with its process's slot in
    /// `procs`, and where each thread (pid << 32 | tid) is in it.
    threads: Vec<(u32, usize, ThreadTotals)>,
    thread_index: FxHashMap<u64, usize>,
    /// The last event's thread: threads run in bursts, so this skips most index lookups.
    last_thread: Option<(u64, usize)>,
    /// The iterations the events marked.
    iterations: Iterations,
}

/// The iterations marked by [`EventKind::IterationStart`] and [`EventKind::IterationEnd`].
#[derive(Default)]
struct Iterations {
    /// The open one's allocations, bytes, live bytes and live blocks when it began.
    open: Option<(u64, u64, u64, u64)>,
    /// Each finished one.
    done: Vec<Iteration>,
}

impl Analyzer {
    /// A fresh analyzer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a slice of events, in order.
    pub fn update_all(&mut self, events: &[Event]) {
        if !self.heap_outgrows_cache() {
            for e in events {
                self.update(e);
            }
            return;
        }
        for (i, e) in events.iter().enumerate() {
            if let Some(ahead) = events.get(i + PREFETCH_AHEAD) {
                self.prefetch(ahead);
            }
            self.update(e);
        }
    }

    /// Whether a process's block table has outgrown a core's cache, so that a slice of events
    /// is worth [`prefetch`](Self::prefetch)ing (asked once per slice: a smaller table stays
    /// cached, and the prefetches would only add instructions).
    pub(super) fn heap_outgrows_cache(&self) -> bool {
        self.procs
            .iter()
            .any(|(_, p)| p.blocks.table_bytes() > PREFETCH_ABOVE_BYTES)
    }

    /// Brings the heap slots event `e` will look up into the cache, if its process is the
    /// last event's (see [`BlockMap::prefetch`]).
    #[inline(always)]
    pub(super) fn prefetch(&self, e: &Event) {
        let Some((_, slot)) = self.last_thread else {
            return;
        };
        let (pid, p) = &self.procs[self.threads[slot].1];
        if *pid == e.pid {
            e.kind.apply_heap(&mut Prefetch(&p.blocks));
        }
    }

    /// Feeds one event.
    #[inline(always)]
    pub fn update(&mut self, e: &Event) {
        self.update_with(e, &mut ());
    }

    /// Feeds one event, and its allocation (if it makes one) to `sizes`: what
    /// [`SizeHistogram::update`] counts, without matching the event's kind a second time
    /// (the encoder's writer thread).
    #[inline(always)]
    pub(crate) fn update_sized(&mut self, e: &Event, sizes: &mut SizeHistogram) {
        self.update_with(e, sizes);
    }

    #[inline(always)]
    pub(super) fn update_with<S: HeapObserver>(&mut self, e: &Event, sizes: &mut S) {
        let t = &mut self.t;
        if t.events == 0 {
            t.first_ts = e.ts;
        }
        t.events += 1;
        t.last_ts = e.ts;
        let tag = e.kind.tag();
        t.kinds.0[tag.index()] += 1;
        // A thread is keyed with its process: a tid reused by another process is another row.
        let key = (e.pid as u64) << 32 | e.tid as u64;
        let slot = match self.last_thread {
            Some((k, slot)) if k == key => slot,
            _ => self.thread_slot(key, e.pid, e.tid),
        };
        let (_, pslot, th) = &mut self.threads[slot];
        let pslot = *pslot;
        th.events += 1;
        // The heap's rule is the kind table's (a realloc frees its old block first).
        let mut ops = HeapUpdate {
            t: &mut self.t,
            th,
            p: &mut self.procs[pslot].1,
            live: &mut self.live,
            sizes,
        };
        if !e.kind.apply_heap(&mut ops) {
            self.other(e, pslot, sizes);
        }
        if self.live.bytes > self.t.peak_live_bytes {
            self.t.peak_live_bytes = self.live.bytes;
            self.t.peak_ts = e.ts;
        }
    }

    /// The slot of thread `key` (and of its process), created on first sight: the slow path
    /// of [`Analyzer::update`], taken when the thread changes.
    #[inline(never)]
    fn thread_slot(&mut self, key: u64, pid: u32, tid: u32) -> usize {
        let next = self.threads.len();
        let slot = *self.thread_index.entry(key).or_insert(next);
        if slot == next {
            let pnext = self.procs.len();
            let pslot = *self.proc_index.entry(pid).or_insert(pnext);
            if pslot == pnext {
                self.procs.push((pid, Proc::default()));
            }
            self.threads.push((tid, pslot, ThreadTotals::default()));
        }
        self.last_thread = Some((key, slot));
        slot
    }

    /// Feeds an event that is not of the heap, of the process in `procs[pslot]`.
    #[inline]
    fn other<S: HeapObserver>(&mut self, e: &Event, pslot: usize, obs: &mut S) {
        let (t, mapped) = (&mut self.t, &mut self.mapped);
        let p = &mut self.procs[pslot].1;
        match e.kind {
            EventKind::Mmap { addr, size } => Self::map(t, p, mapped, addr, size),
            EventKind::Munmap { addr, size } => Self::unmap(p, mapped, addr, size),
            EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            } => {
                let old = p.maps.get(&old_addr).copied().unwrap_or(0);
                Self::unmap(p, mapped, old_addr, old);
                Self::map(t, p, mapped, new_addr, size);
            }
            EventKind::Exec => Self::exec(t, p, &mut self.live, mapped, obs),
            EventKind::IterationStart => self.begin_iteration(),
            EventKind::IterationEnd => self.end_iteration(),
            // `brk` is only counted; the heap's kinds are `apply_heap`'s.
            _ => {}
        }
    }

    /// An iteration begins (one still open ends here: the marks come from one thread at a
    /// time, so an unended one is a call that did not return, such as a panic's).
    #[cold]
    fn begin_iteration(&mut self) {
        self.end_iteration();
        let (t, live) = (&self.t, &self.live);
        self.iterations.open = Some((t.allocations, t.bytes_allocated, live.bytes, live.blocks));
        self.live.iteration_peak = (self.live.bytes, self.live.blocks);
    }

    /// The open iteration, if any, ends: its allocations, bytes, and the most live bytes it
    /// added to those live when it began.
    #[cold]
    fn end_iteration(&mut self) {
        if let Some((allocations, bytes, live_bytes, live_blocks)) = self.iterations.open.take() {
            let (t, live) = (&self.t, &self.live);
            let peak = live.iteration_peak;
            self.iterations.done.push(Iteration {
                allocations: t.allocations - allocations,
                bytes_allocated: t.bytes_allocated.saturating_sub(bytes),
                peak_live_bytes: peak.0.saturating_sub(live_bytes),
                peak_live_blocks: peak.1.saturating_sub(live_blocks),
                live_blocks: live.blocks.saturating_sub(live_blocks),
                live_bytes: live.bytes.saturating_sub(live_bytes),
            });
        }
    }

    /// The last finished iteration, if the events marked any.
    pub fn last_iteration(&self) -> Option<Iteration> {
        self.iterations.done.last().copied()
    }

    /// The figures of the finished iterations; `None` if the events marked none.
    pub fn iteration_spread(&self) -> Option<IterationSpread> {
        IterationSpread::of(&self.iterations.done)
    }

    /// Always inlined: left to the compiler, the choice changes with unrelated code, and an
    /// outlined call per allocation is a cost of the encoder's writer.
    #[inline(always)]
    fn alloc(
        t: &mut Totals,
        th: &mut ThreadTotals,
        p: &mut Proc,
        live: &mut Live,
        (addr, size): (u64, u64),
        obs: &mut impl HeapObserver,
    ) {
        t.allocations += 1;
        t.bytes_allocated = t.bytes_allocated.saturating_add(size);
        th.allocations += 1;
        th.bytes_allocated = th.bytes_allocated.saturating_add(size);
        let tag = obs.tag();
        match p.blocks.insert(addr, Block::Live(size, tag)) {
            // A block at an address that is already live means its free was not seen: replace it.
            Some(Block::Live(old, old_tag)) => {
                live.bytes = live.bytes.saturating_sub(old);
                obs.on_end(old, old_tag);
            }
            Some(Block::Freed) | None => live.blocks += 1,
        }
        obs.on_alloc(size, tag);
        live.bytes = live.bytes.saturating_add(size);
        t.peak_live_blocks = t.peak_live_blocks.max(live.blocks);
        live.iteration_peak.0 = live.iteration_peak.0.max(live.bytes);
        live.iteration_peak.1 = live.iteration_peak.1.max(live.blocks);
    }

    #[inline(always)]
    fn free(
        t: &mut Totals,
        th: &mut ThreadTotals,
        p: &mut Proc,
        live: &mut Live,
        addr: u64,
        obs: &mut impl HeapObserver,
    ) {
        match p.blocks.get_mut(addr) {
            Some(b @ Block::Live(..)) => {
                let Block::Live(size, tag) = std::mem::replace(b, Block::Freed) else {
                    unreachable!("matched Live")
                };
                obs.on_end(size, tag);
                t.bytes_freed = t.bytes_freed.saturating_add(size);
                th.bytes_freed = th.bytes_freed.saturating_add(size);
                live.bytes = live.bytes.saturating_sub(size);
                live.blocks -= 1;
            }
            Some(Block::Freed) => {
                t.allocator_internal_frees += 1;
                p.allocator_internal_frees += 1;
                return;
            }
            None => {
                t.unmatched_frees += 1;
                p.unmatched_frees += 1;
            }
        }
        t.frees += 1;
        th.frees += 1;
    }

    /// The process replaced its image: its heap and address space are gone.
    fn exec(
        t: &mut Totals,
        p: &mut Proc,
        live: &mut Live,
        mapped: &mut u64,
        obs: &mut impl HeapObserver,
    ) {
        let (blocks, bytes) = p.live_each(|size, tag| obs.on_end(size, tag));
        t.blocks_discarded_at_exec += blocks;
        t.bytes_discarded_at_exec = t.bytes_discarded_at_exec.saturating_add(bytes);
        p.blocks_discarded_at_exec += blocks;
        p.bytes_discarded_at_exec = p.bytes_discarded_at_exec.saturating_add(bytes);
        live.blocks -= blocks;
        live.bytes = live.bytes.saturating_sub(bytes);
        // The freed addresses go with the image too.
        p.blocks = BlockMap::default();
        *mapped = mapped.saturating_sub(p.mapped);
        p.maps.clear();
        p.mapped = 0;
    }

    fn map(t: &mut Totals, p: &mut Proc, mapped: &mut u64, addr: u64, size: u64) {
        let len = pages(size).min(u64::MAX - addr);
        if len == 0 {
            return;
        }
        // A new mapping replaces whatever it overlaps (MAP_FIXED semantics).
        Self::unmap(p, mapped, addr, len);
        p.maps.insert(addr, len);
        p.mapped = p.mapped.saturating_add(len);
        *mapped = mapped.saturating_add(len);
        t.mapped_bytes_peak = t.mapped_bytes_peak.max(*mapped);
    }

    fn unmap(p: &mut Proc, mapped: &mut u64, addr: u64, size: u64) {
        let end = addr.saturating_add(pages(size));
        if end <= addr {
            return;
        }
        // Regions overlapping [addr, end): the one starting before addr, and those inside.
        let mut hit = Vec::new();
        if let Some((&s, &l)) = p.maps.range(..addr).next_back()
            && s + l > addr
        {
            hit.push((s, l));
        }
        hit.extend(p.maps.range(addr..end).map(|(&s, &l)| (s, l)));
        let before = p.mapped;
        for (s, l) in hit {
            // Stored regions never wrap (`map` caps them), so `s + l` cannot overflow.
            p.maps.remove(&s);
            p.mapped = p.mapped.saturating_sub(l);
            if s < addr {
                p.maps.insert(s, addr - s);
                p.mapped = p.mapped.saturating_add(addr - s);
            }
            if s + l > end {
                p.maps.insert(end, s + l - end);
                p.mapped = p.mapped.saturating_add(s + l - end);
            }
        }
        *mapped = mapped.saturating_sub(before).saturating_add(p.mapped);
    }

    /// Per-process totals so far, by pid (one row for a single-process recording). Walks
    /// every process's heap: call it at the end, not per event.
    pub fn per_process(&self) -> BTreeMap<u32, ProcessTotals> {
        let mut out: Vec<ProcessTotals> = self
            .procs
            .iter()
            .map(|(_, p)| {
                let (live_blocks_at_end, live_bytes_at_end) = p.live();
                ProcessTotals {
                    unmatched_frees: p.unmatched_frees,
                    allocator_internal_frees: p.allocator_internal_frees,
                    live_blocks_at_end,
                    live_bytes_at_end,
                    blocks_discarded_at_exec: p.blocks_discarded_at_exec,
                    bytes_discarded_at_exec: p.bytes_discarded_at_exec,
                    ..ProcessTotals::default()
                }
            })
            .collect();
        for (_, pslot, th) in &self.threads {
            let p = &mut out[*pslot];
            p.events += th.events;
            p.allocations += th.allocations;
            p.bytes_allocated = p.bytes_allocated.saturating_add(th.bytes_allocated);
            p.frees += th.frees;
            p.bytes_freed = p.bytes_freed.saturating_add(th.bytes_freed);
        }
        self.procs
            .iter()
            .zip(out)
            .map(|((pid, _), t)| (*pid, t))
            .collect()
    }

    /// Live heap bytes now.
    pub fn live_bytes(&self) -> u64 {
        self.live.bytes
    }

    /// Mapped bytes (page-rounded) now.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped
    }

    /// The headline numbers so far, without the per-thread map ([`Analyzer::totals`] builds
    /// one): what a mid-session `Session::stats` returns.
    pub fn stats(&self) -> Stats {
        Stats {
            allocations: self.t.allocations,
            bytes_allocated: self.t.bytes_allocated,
            frees: self.t.frees,
            live_blocks: self.live.blocks,
            live_bytes: self.live.bytes,
            peak_live_blocks: self.t.peak_live_blocks,
            peak_live_bytes: self.t.peak_live_bytes,
            events: self.t.events,
            iterations: self.iterations.done.len() as u64,
            last_iteration: self.last_iteration(),
        }
    }

    /// The totals so far.
    pub fn totals(&self) -> Totals {
        let mut t = self.t.clone();
        t.live_bytes_at_end = self.live.bytes;
        t.live_blocks_at_end = self.live.blocks;
        t.mapped_bytes_at_end = self.mapped;
        t.threads = self.threads.len() as u64;
        let mut per_thread = BTreeMap::new();
        for &(tid, _, th) in &self.threads {
            // A tid reused by another process: one row, as before processes were told apart.
            let row: &mut ThreadTotals = per_thread.entry(tid).or_default();
            row.events += th.events;
            row.allocations += th.allocations;
            row.bytes_allocated = row.bytes_allocated.saturating_add(th.bytes_allocated);
            row.frees += th.frees;
            row.bytes_freed = row.bytes_freed.saturating_add(th.bytes_freed);
        }
        t.per_thread = per_thread;
        t.iteration_spread = self.iteration_spread();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::KindTag;
    use crate::totals::Spread;

    fn ev(tid: u32, kind: EventKind) -> Event {
        Event::new(0, 1, tid, kind)
    }

    /// Each marked iteration's figures: its allocations and bytes, and the most live bytes it
    /// added; what comes before the first mark is in the totals only.
    #[test]
    fn iteration_marks_give_per_iteration_figures() {
        let mut a = Analyzer::new();
        let malloc = |addr, size| ev(1, EventKind::Malloc { addr, size });
        for e in [
            malloc(0x100, 100),
            ev(1, EventKind::IterationStart),
            malloc(0x200, 10),
            malloc(0x300, 20),
            ev(1, EventKind::Free { addr: 0x200 }),
            ev(1, EventKind::IterationEnd),
            ev(1, EventKind::IterationStart),
            malloc(0x400, 5),
            ev(1, EventKind::IterationEnd),
            ev(1, EventKind::IterationEnd),
        ] {
            a.update(&e);
        }
        let p = a.totals().iteration_spread.expect("two iterations");
        let spread = |min, median, max, total| Spread {
            min,
            median,
            max,
            total,
        };
        assert_eq!(p.iterations, 2);
        assert_eq!(p.allocations, spread(1, 1, 2, 3));
        assert_eq!(p.bytes_allocated, spread(5, 5, 30, 35));
        assert_eq!(p.peak_live_bytes, spread(5, 5, 30, 35));
        assert_eq!(a.totals().allocations, 4);
        assert_eq!(Analyzer::new().totals().iteration_spread, None);
    }

    #[test]
    fn realloc_is_one_allocation_and_one_free() {
        let mut a = Analyzer::new();
        a.update(&ev(
            1,
            EventKind::Malloc {
                addr: 0x10,
                size: 100,
            },
        ));
        a.update(&ev(
            1,
            EventKind::Realloc {
                old_addr: 0x10,
                new_addr: 0x20,
                size: 300,
            },
        ));
        a.update(&ev(
            2,
            EventKind::Realloc {
                old_addr: 0,
                new_addr: 0x30,
                size: 5,
            },
        ));
        a.update(&ev(2, EventKind::Free { addr: 0x999 }));
        a.update(&ev(2, EventKind::Free { addr: 0 }));
        let t = a.totals();
        assert_eq!((t.allocations, t.bytes_allocated), (3, 405));
        assert_eq!((t.frees, t.bytes_freed, t.unmatched_frees), (2, 100, 1));
        assert_eq!(
            (t.peak_live_bytes, t.live_bytes_at_end, t.live_blocks_at_end),
            (305, 305, 2)
        );
        assert_eq!(t.peak_live_blocks, 2);
        assert_eq!(
            t.per_thread[&1].allocations + t.per_thread[&2].allocations,
            3
        );
        assert_eq!(t.threads, 2);
    }

    /// A process image's heap ends at exec. The blocks the old image left live are discarded
    /// (not freed, not live at the end), another process's are kept, and the new image's
    /// blocks count as usual.
    #[test]
    fn exec_discards_the_old_images_live_blocks() {
        let mut a = Analyzer::new();
        let at = |pid, kind| Event::new(0, pid, pid, kind);
        a.update(&at(
            1,
            EventKind::Malloc {
                addr: 0x10,
                size: 40,
            },
        ));
        a.update(&at(
            1,
            EventKind::Malloc {
                addr: 0x20,
                size: 2,
            },
        ));
        a.update(&at(1, EventKind::Free { addr: 0x20 }));
        a.update(&at(
            2,
            EventKind::Malloc {
                addr: 0x90,
                size: 7,
            },
        ));
        a.update(&at(
            1,
            EventKind::Mmap {
                addr: 0x10000,
                size: PAGE,
            },
        ));
        a.update(&at(1, EventKind::Exec));
        // The new image's allocator may hand out the old addresses again.
        a.update(&at(
            1,
            EventKind::Malloc {
                addr: 0x20,
                size: 5,
            },
        ));
        a.update(&at(1, EventKind::Free { addr: 0x10 }));
        let t = a.totals();
        assert_eq!(
            (t.blocks_discarded_at_exec, t.bytes_discarded_at_exec),
            (1, 40)
        );
        assert_eq!((t.live_blocks_at_end, t.live_bytes_at_end), (2, 12));
        assert_eq!((t.allocations, t.frees, t.bytes_freed), (4, 2, 2));
        // 0x10 went with the old image: freeing it in the new one is unmatched.
        assert_eq!(t.unmatched_frees, 1);
        assert_eq!((t.mapped_bytes_at_end, t.mapped_bytes_peak), (0, PAGE));
        assert_eq!(t.peak_live_bytes, 47);
        assert_eq!(t.kinds.get(KindTag::Exec), 1);
    }

    /// Each process has a heap of its own: the same address in two processes is two blocks,
    /// and a forked child's free of its parent's block is unmatched (as a recording of the
    /// child alone counts it). The per-process rows add up to the totals.
    #[test]
    fn every_process_has_a_heap_of_its_own() {
        let mut a = Analyzer::new();
        let at = |pid, kind| Event::new(0, pid, pid, kind);
        a.update(&at(
            1,
            EventKind::Malloc {
                addr: 0x10,
                size: 40,
            },
        ));
        // The child (pid 2) was forked after that malloc: same address, its own block.
        a.update(&at(
            2,
            EventKind::Malloc {
                addr: 0x10,
                size: 8,
            },
        ));
        a.update(&at(2, EventKind::Free { addr: 0x10 }));
        a.update(&at(2, EventKind::Free { addr: 0x20 }));
        a.update(&at(1, EventKind::Free { addr: 0x10 }));
        let t = a.totals();
        assert_eq!((t.allocations, t.frees, t.unmatched_frees), (2, 3, 1));
        assert_eq!((t.bytes_freed, t.live_blocks_at_end), (48, 0));
        assert_eq!(t.peak_live_bytes, 48);
        let per = a.per_process();
        assert_eq!(
            (per[&1].allocations, per[&1].frees, per[&1].bytes_freed),
            (1, 1, 40)
        );
        assert_eq!(
            (
                per[&2].allocations,
                per[&2].frees,
                per[&2].unmatched_frees,
                per[&2].bytes_freed
            ),
            (1, 2, 1, 8)
        );
    }

    /// The writer's one pass (`update_sized`) counts the same sizes as `SizeHistogram::update`
    /// and the same totals as `update`, for every kind (a realloc to NULL allocates nothing).
    #[test]
    fn sizes_counted_in_the_analyzers_pass_are_the_histograms() {
        let events: Vec<Event> = [
            EventKind::Malloc {
                addr: 0x10,
                size: 7,
            },
            EventKind::Calloc {
                addr: 0x20,
                size: 40,
            },
            EventKind::AlignedAlloc {
                addr: 0x40,
                size: 5000,
                align: 64,
            },
            EventKind::Realloc {
                old_addr: 0x10,
                new_addr: 0x80,
                size: 300,
            },
            EventKind::Realloc {
                old_addr: 0x80,
                new_addr: 0,
                size: 0,
            },
            EventKind::Free { addr: 0x20 },
            EventKind::Mmap {
                addr: 0x10000,
                size: PAGE,
            },
            EventKind::Brk { addr: 0x9000 },
            EventKind::Exec,
            EventKind::SwitchOut { preempted: false },
            EventKind::SwitchIn,
            EventKind::ThreadStart,
            EventKind::ThreadExit,
            EventKind::IterationStart,
            EventKind::IterationEnd,
            EventKind::Malloc {
                addr: 0x10,
                size: 17,
            },
        ]
        .into_iter()
        .map(|k| ev(1, k))
        .collect();
        assert_eq!(events.len(), KindTag::ALL.len());
        let (mut a, mut b, mut sizes, mut reference) = (
            Analyzer::new(),
            Analyzer::new(),
            SizeHistogram::new(),
            SizeHistogram::new(),
        );
        for e in &events {
            a.update_sized(e, &mut sizes);
            b.update(e);
            reference.update(e);
        }
        assert_eq!(sizes.classes(), reference.classes());
        assert_eq!(
            sizes.classes().iter().map(|c| c.allocations).sum::<u64>(),
            5
        );
        assert_eq!(a.totals(), b.totals());
    }

    #[test]
    fn partial_munmap_splits_a_mapping() {
        let mut a = Analyzer::new();
        a.update(&ev(
            1,
            EventKind::Mmap {
                addr: 0x10000,
                size: 5 * PAGE - 1,
            },
        ));
        a.update(&ev(
            1,
            EventKind::Munmap {
                addr: 0x10000 + PAGE,
                size: PAGE,
            },
        ));
        assert_eq!(a.totals().mapped_bytes_at_end, 4 * PAGE);
        a.update(&ev(
            1,
            EventKind::Mremap {
                old_addr: 0x10000,
                new_addr: 0x90000,
                size: 3 * PAGE,
            },
        ));
        let t = a.totals();
        assert_eq!(
            (t.mapped_bytes_peak, t.mapped_bytes_at_end),
            (6 * PAGE, 6 * PAGE)
        );
        assert_eq!(t.live_bytes_at_end, 0);
    }
}
