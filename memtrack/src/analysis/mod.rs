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
//!   (the new image starts with an empty address space). Mappings and freed addresses are not
//!   kept per process yet: a recording covers one process.

mod compare;
mod histogram;
mod timeline;

pub use compare::{Benchmark, Comparison, Metric, Row, Threshold, Verdict};
pub use histogram::{SizeClass, SizeHistogram};
pub use timeline::{Column, Extremes, InvalidTimeline, Timeline};

pub use crate::totals::{KindCounts, ThreadTotals, Totals};

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
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
}

/// What the analysis knows of an address of the heap.
#[derive(Clone, Copy)]
enum Block {
    /// A block of this many bytes is live there, allocated by this process.
    Live(u64, u32),
    /// Freed while recording, not allocated again since: a second free of it is the
    /// allocator's own (see the module docs).
    Freed,
}

/// The heap as the events describe it. One map for live and freed addresses, so that an
/// allocation and a free cost one hash-table operation each (a live map plus a freed set cost
/// two each).
#[derive(Default)]
struct Heap {
    blocks: FxHashMap<u64, Block>,
    /// Live blocks (the `Live` entries of `blocks`) and their bytes.
    live_blocks: u64,
    live_bytes: u64,
}

/// The heap's part of [`Analyzer::update`]: what the kind table's rule calls for one event.
struct HeapUpdate<'a> {
    t: &'a mut Totals,
    th: &'a mut ThreadTotals,
    heap: &'a mut Heap,
    pid: u32,
}

impl HeapOps for HeapUpdate<'_> {
    #[inline(always)]
    fn alloc(&mut self, addr: u64, size: u64) {
        Analyzer::alloc(self.t, self.th, self.heap, (addr, size, self.pid));
    }

    #[inline(always)]
    fn free(&mut self, addr: u64) {
        Analyzer::free(self.t, self.th, self.heap, addr);
    }
}

/// Computes [`Totals`] from events fed in order.
#[derive(Default)]
pub struct Analyzer {
    t: Totals,
    heap: Heap,
    /// Per-thread totals, in order of first appearance, and where each tid is in it.
    threads: Vec<(u32, ThreadTotals)>,
    thread_index: FxHashMap<u32, usize>,
    /// The last event's thread: threads run in bursts, so this skips most index lookups.
    last_thread: Option<(u32, usize)>,
    /// Mapped regions: start -> page-rounded length.
    maps: BTreeMap<u64, u64>,
    mapped: u64,
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
        let slot = match self.last_thread {
            Some((tid, slot)) if tid == e.tid => slot,
            _ => {
                let next = self.threads.len();
                let slot = *self.thread_index.entry(e.tid).or_insert(next);
                if slot == next {
                    self.threads.push((e.tid, ThreadTotals::default()));
                }
                self.last_thread = Some((e.tid, slot));
                slot
            }
        };
        let th = &mut self.threads[slot].1;
        th.events += 1;
        // The heap's rule is the kind table's (a realloc frees its old block first).
        let mut ops = HeapUpdate {
            t,
            th,
            heap: &mut self.heap,
            pid: e.pid,
        };
        if !e.kind.apply_heap(&mut ops) {
            self.other(e);
        }
        if self.heap.live_bytes > self.t.peak_live_bytes {
            self.t.peak_live_bytes = self.heap.live_bytes;
            self.t.peak_ts = e.ts;
        }
    }

    /// Feeds an event that is not of the heap.
    #[inline]
    fn other(&mut self, e: &Event) {
        match e.kind {
            EventKind::Mmap { addr, size } => self.map(addr, size),
            EventKind::Munmap { addr, size } => self.unmap(addr, size),
            EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            } => {
                let old = self.maps.get(&old_addr).copied().unwrap_or(0);
                self.unmap(old_addr, old);
                self.map(new_addr, size);
            }
            EventKind::Exec => self.exec(e.pid),
            // `brk` is only counted; the heap's kinds are `apply_heap`'s.
            _ => {}
        }
    }

    #[inline]
    fn alloc(
        t: &mut Totals,
        th: &mut ThreadTotals,
        heap: &mut Heap,
        (addr, size, pid): (u64, u64, u32),
    ) {
        t.allocations += 1;
        t.bytes_allocated = t.bytes_allocated.saturating_add(size);
        th.allocations += 1;
        th.bytes_allocated = th.bytes_allocated.saturating_add(size);
        match heap.blocks.insert(addr, Block::Live(size, pid)) {
            // A block at an address that is already live means its free was not seen: replace it.
            Some(Block::Live(old, _)) => heap.live_bytes = heap.live_bytes.saturating_sub(old),
            Some(Block::Freed) | None => heap.live_blocks += 1,
        }
        heap.live_bytes = heap.live_bytes.saturating_add(size);
        t.peak_live_blocks = t.peak_live_blocks.max(heap.live_blocks);
    }

    #[inline]
    fn free(t: &mut Totals, th: &mut ThreadTotals, heap: &mut Heap, addr: u64) {
        match heap.blocks.get_mut(&addr) {
            Some(b @ Block::Live(..)) => {
                let Block::Live(size, _) = std::mem::replace(b, Block::Freed) else {
                    unreachable!("matched Live")
                };
                t.bytes_freed = t.bytes_freed.saturating_add(size);
                th.bytes_freed = th.bytes_freed.saturating_add(size);
                heap.live_bytes = heap.live_bytes.saturating_sub(size);
                heap.live_blocks -= 1;
            }
            Some(Block::Freed) => {
                t.allocator_internal_frees += 1;
                return;
            }
            None => t.unmatched_frees += 1,
        }
        t.frees += 1;
        th.frees += 1;
    }

    /// Process `pid` replaced its image: its heap and address space are gone.
    fn exec(&mut self, pid: u32) {
        let t = &mut self.t;
        let heap = &mut self.heap;
        heap.blocks.retain(|_, b| match *b {
            // The freed addresses go with the image (they are not kept per process yet).
            Block::Freed => false,
            Block::Live(_, p) if p != pid => true,
            Block::Live(size, _) => {
                t.blocks_discarded_at_exec += 1;
                t.bytes_discarded_at_exec = t.bytes_discarded_at_exec.saturating_add(size);
                heap.live_bytes = heap.live_bytes.saturating_sub(size);
                heap.live_blocks -= 1;
                false
            }
        });
        self.maps.clear();
        self.mapped = 0;
    }

    fn map(&mut self, addr: u64, size: u64) {
        let len = pages(size).min(u64::MAX - addr);
        if len == 0 {
            return;
        }
        // A new mapping replaces whatever it overlaps (MAP_FIXED semantics).
        self.unmap(addr, len);
        self.maps.insert(addr, len);
        self.mapped = self.mapped.saturating_add(len);
        self.t.mapped_bytes_peak = self.t.mapped_bytes_peak.max(self.mapped);
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(pages(size));
        if end <= addr {
            return;
        }
        // Regions overlapping [addr, end): the one starting before addr, and those inside.
        let mut hit = Vec::new();
        if let Some((&s, &l)) = self.maps.range(..addr).next_back()
            && s + l > addr
        {
            hit.push((s, l));
        }
        hit.extend(self.maps.range(addr..end).map(|(&s, &l)| (s, l)));
        for (s, l) in hit {
            // Stored regions never wrap (`map` caps them), so `s + l` cannot overflow.
            self.maps.remove(&s);
            self.mapped = self.mapped.saturating_sub(l);
            if s < addr {
                self.maps.insert(s, addr - s);
                self.mapped = self.mapped.saturating_add(addr - s);
            }
            if s + l > end {
                self.maps.insert(end, s + l - end);
                self.mapped = self.mapped.saturating_add(s + l - end);
            }
        }
    }

    /// Live heap bytes now.
    pub fn live_bytes(&self) -> u64 {
        self.heap.live_bytes
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
            live_blocks: self.heap.live_blocks,
            live_bytes: self.heap.live_bytes,
            peak_live_blocks: self.t.peak_live_blocks,
            peak_live_bytes: self.t.peak_live_bytes,
            events: self.t.events,
        }
    }

    /// The totals so far.
    pub fn totals(&self) -> Totals {
        let mut t = self.t.clone();
        t.live_bytes_at_end = self.heap.live_bytes;
        t.live_blocks_at_end = self.heap.live_blocks;
        t.mapped_bytes_at_end = self.mapped;
        t.threads = self.threads.len() as u64;
        t.per_thread = self.threads.iter().copied().collect();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::KindTag;

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
