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
//!   through `free` again, ~435 per exiting thread. It is counted in
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

mod compare;
mod histogram;
mod timeline;

pub use compare::{Benchmark, Comparison, Metric, Row, Threshold, Verdict};
pub use histogram::{SizeClass, SizeHistogram};
pub use timeline::{Column, Extremes, Timeline};

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::event::{Event, EventKind, KindTag};

const PAGE: u64 = 4096;

/// `size` rounded up to whole pages, saturating for absurd sizes from damaged input.
fn pages(size: u64) -> u64 {
    size.div_ceil(PAGE).saturating_mul(PAGE)
}

/// Per-kind event counts, keyed by [`KindTag::name`] in JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindCounts(pub [u64; KindTag::ALL.len()]);

impl KindCounts {
    /// The count of events of `kind`.
    pub fn get(&self, kind: KindTag) -> u64 {
        self.0[kind.index()]
    }
}

impl Serialize for KindCounts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(KindTag::ALL.len()))?;
        for k in KindTag::ALL {
            m.serialize_entry(k.name(), &self.get(k))?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for KindCounts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = BTreeMap::<String, u64>::deserialize(d)?;
        let mut c = KindCounts::default();
        for k in KindTag::ALL {
            c.0[k.index()] = m.get(k.name()).copied().unwrap_or(0);
        }
        Ok(c)
    }
}

/// Totals of one thread. Frees are attributed to the freeing thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ThreadTotals {
    /// Events of this thread.
    pub events: u64,
    /// Allocations made by this thread.
    pub allocations: u64,
    /// Bytes allocated by this thread.
    pub bytes_allocated: u64,
    /// Blocks freed by this thread.
    pub frees: u64,
    /// Bytes freed by this thread (of blocks allocated while recording).
    pub bytes_freed: u64,
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
}

/// Totals over a sequence of events. See the module docs for the accounting rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Totals {
    /// Number of events.
    pub events: u64,
    /// Events per kind.
    pub kinds: KindCounts,
    /// Successful calls returning a heap block (malloc + calloc + realloc + aligned_alloc).
    pub allocations: u64,
    /// Heap blocks released (free events and the old blocks of reallocs).
    pub frees: u64,
    /// Frees of addresses not allocated while recording (no bytes counted for them).
    pub unmatched_frees: u64,
    /// Frees by the allocator of blocks already freed (e.g. glibc flushing an exiting
    /// thread's cache): not in `frees`. Absent before format 1.2 (read as 0; those files
    /// counted them in `frees` and `unmatched_frees`).
    #[serde(default)]
    pub allocator_internal_frees: u64,
    /// Sum of the sizes of all allocations.
    pub bytes_allocated: u64,
    /// Sum of the sizes of the blocks freed (of those allocated while recording).
    pub bytes_freed: u64,
    /// Maximum of live heap bytes over the event order.
    pub peak_live_bytes: u64,
    /// Timestamp (ns) of the event at which the peak was first reached.
    pub peak_ts: u64,
    /// Maximum number of live heap blocks over the event order (blocks allocated while
    /// recording and not yet freed). Absent from the totals of format 1.0 trailers (read as 0).
    #[serde(default)]
    pub peak_live_blocks: u64,
    /// Live heap bytes after the last event.
    pub live_bytes_at_end: u64,
    /// Live heap blocks after the last event.
    pub live_blocks_at_end: u64,
    /// Heap blocks still live when their process replaced its image (`Exec`): gone with the
    /// old image, so neither freed nor live at the end. Absent before format 1.3 (read as 0).
    #[serde(default)]
    pub blocks_discarded_at_exec: u64,
    /// Their bytes. Absent before format 1.3 (read as 0).
    #[serde(default)]
    pub bytes_discarded_at_exec: u64,
    /// Maximum of mapped bytes (page-rounded) over the event order.
    pub mapped_bytes_peak: u64,
    /// Mapped bytes (page-rounded) after the last event.
    pub mapped_bytes_at_end: u64,
    /// Number of distinct threads that produced events.
    pub threads: u64,
    /// Timestamp of the first event (ns, CLOCK_MONOTONIC); 0 if there were none.
    pub first_ts: u64,
    /// Timestamp of the last event (ns, CLOCK_MONOTONIC); 0 if there were none.
    pub last_ts: u64,
    /// Per-thread totals, by tid.
    pub per_thread: BTreeMap<u32, ThreadTotals>,
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
    /// A block of this many bytes is live there.
    Live(u64),
    /// Freed while recording, not allocated again since: a second free of it is the
    /// allocator's own (see the module docs).
    Freed,
}

/// One process's heap and mappings as the events describe them. One map for live and freed
/// addresses, so that an allocation and a free cost one hash-table operation each (a live map
/// plus a freed set cost two each).
#[derive(Default)]
struct Proc {
    blocks: FxHashMap<u64, Block>,
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
        self.blocks.values().fold((0, 0), |(n, b), x| match *x {
            Block::Live(size) => (n + 1, b.saturating_add(size)),
            Block::Freed => (n, b),
        })
    }
}

/// Computes [`Totals`] from events fed in order.
#[derive(Default)]
pub struct Analyzer {
    t: Totals,
    /// Live blocks and bytes over all processes.
    live_blocks: u64,
    live_bytes: u64,
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
}

impl Analyzer {
    /// A fresh analyzer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a slice of events, in order.
    pub fn update_all(&mut self, events: &[Event]) {
        for e in events {
            self.update(e);
        }
    }

    /// Feeds one event.
    #[inline(always)]
    pub fn update(&mut self, e: &Event) {
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
        let t = &mut self.t;
        let (_, pslot, th) = &mut self.threads[slot];
        th.events += 1;
        let p = &mut self.procs[*pslot].1;
        let live = (&mut self.live_blocks, &mut self.live_bytes);
        match e.kind {
            EventKind::Malloc { addr, size }
            | EventKind::Calloc { addr, size }
            | EventKind::AlignedAlloc { addr, size, .. } => {
                Self::alloc(t, th, p, live, (addr, size));
            }
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            } => {
                if old_addr != 0 {
                    Self::free(t, th, p, (&mut *live.0, &mut *live.1), old_addr);
                }
                if new_addr != 0 {
                    Self::alloc(t, th, p, live, (new_addr, size));
                }
            }
            EventKind::Free { addr } => {
                if addr != 0 {
                    Self::free(t, th, p, live, addr);
                }
            }
            EventKind::Mmap { addr, size } => Self::map(t, p, &mut self.mapped, addr, size),
            EventKind::Munmap { addr, size } => Self::unmap(p, &mut self.mapped, addr, size),
            EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            } => {
                let old = p.maps.get(&old_addr).copied().unwrap_or(0);
                Self::unmap(p, &mut self.mapped, old_addr, old);
                Self::map(t, p, &mut self.mapped, new_addr, size);
            }
            EventKind::Brk { .. } => {}
            EventKind::Exec => Self::exec(t, p, live, &mut self.mapped),
        }
        if self.live_bytes > self.t.peak_live_bytes {
            self.t.peak_live_bytes = self.live_bytes;
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

    #[inline]
    fn alloc(
        t: &mut Totals,
        th: &mut ThreadTotals,
        p: &mut Proc,
        (live_blocks, live_bytes): (&mut u64, &mut u64),
        (addr, size): (u64, u64),
    ) {
        t.allocations += 1;
        t.bytes_allocated = t.bytes_allocated.saturating_add(size);
        th.allocations += 1;
        th.bytes_allocated = th.bytes_allocated.saturating_add(size);
        match p.blocks.insert(addr, Block::Live(size)) {
            // A block at an address that is already live means its free was not seen: replace it.
            Some(Block::Live(old)) => *live_bytes = live_bytes.saturating_sub(old),
            Some(Block::Freed) | None => *live_blocks += 1,
        }
        *live_bytes = live_bytes.saturating_add(size);
        t.peak_live_blocks = t.peak_live_blocks.max(*live_blocks);
    }

    #[inline]
    fn free(
        t: &mut Totals,
        th: &mut ThreadTotals,
        p: &mut Proc,
        (live_blocks, live_bytes): (&mut u64, &mut u64),
        addr: u64,
    ) {
        match p.blocks.get_mut(&addr) {
            Some(b @ Block::Live(..)) => {
                let Block::Live(size) = std::mem::replace(b, Block::Freed) else {
                    unreachable!("matched Live")
                };
                t.bytes_freed = t.bytes_freed.saturating_add(size);
                th.bytes_freed = th.bytes_freed.saturating_add(size);
                *live_bytes = live_bytes.saturating_sub(size);
                *live_blocks -= 1;
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
        (live_blocks, live_bytes): (&mut u64, &mut u64),
        mapped: &mut u64,
    ) {
        let (blocks, bytes) = p.live();
        t.blocks_discarded_at_exec += blocks;
        t.bytes_discarded_at_exec = t.bytes_discarded_at_exec.saturating_add(bytes);
        p.blocks_discarded_at_exec += blocks;
        p.bytes_discarded_at_exec = p.bytes_discarded_at_exec.saturating_add(bytes);
        *live_blocks -= blocks;
        *live_bytes = live_bytes.saturating_sub(bytes);
        // The freed addresses go with the image too.
        p.blocks = FxHashMap::default();
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
        self.live_bytes
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
            live_blocks: self.live_blocks,
            live_bytes: self.live_bytes,
            peak_live_blocks: self.t.peak_live_blocks,
            peak_live_bytes: self.t.peak_live_bytes,
            events: self.t.events,
        }
    }

    /// The totals so far.
    pub fn totals(&self) -> Totals {
        let mut t = self.t.clone();
        t.live_bytes_at_end = self.live_bytes;
        t.live_blocks_at_end = self.live_blocks;
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
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(tid: u32, kind: EventKind) -> Event {
        Event::new(0, 1, tid, kind)
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

    /// Issue 12, item 12: a process image's heap ends at exec. The blocks the old image left
    /// live are discarded (not freed, not live at the end), another process's are kept, and
    /// the new image's blocks count as usual.
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
