//! The encoder writer's pass: totals, sizes and timeline of a frame in one walk, with a fast
//! path for what most of a recording is, runs of heap events of one thread within one column of
//! the timeline.
//!
//! An event of the general path is fed as [`Analyzer::update_sized`] and [`Timeline::push`]
//! feed it. The events after it that are heap events (malloc family, free) of the same thread,
//! stamped inside the timeline's current column, form a run: each changes only the block map,
//! the histogram and counters that [`Run`] keeps in locals, and the run's figures are added to
//! the analyzer's and the column's once at its end. The result is exactly the general path's
//! (the test below compares them on mixed streams):
//! - counters and saturating byte sums add up the same in one step (a saturating sum of
//!   non-negative values is associative);
//! - live bytes grow only at an allocation, so the peak (and its timestamp), the most live
//!   blocks and the iteration's peak need a look after allocations only; they shrink only at a
//!   free or at an allocation replacing a live block, so the column's minimum needs a look
//!   there only (an event that changes nothing adds the column's `last` value again, which
//!   changes no extreme);
//! - mapped bytes do not change in a run, so the column's mapped extremes do not either.

use super::blocks::BlockMap;
use super::{Analyzer, Block, SizeHistogram, Timeline};
use crate::event::{Event, EventKind, KindTag};

/// What a run changes, in locals (written back by [`Analyzer::end_run`]).
struct Run {
    allocations: u64,
    bytes_allocated: u64,
    frees: u64,
    bytes_freed: u64,
    unmatched_frees: u64,
    allocator_internal_frees: u64,
    live_bytes: u64,
    live_blocks: u64,
    /// The least live bytes after an event that frees, the most after one that allocates (and
    /// the most blocks).
    min_live: u64,
    max_live: u64,
    max_blocks: u64,
    /// The analyzer's peak, raised as the general path raises it.
    peak: u64,
    peak_ts: u64,
    /// Events per kind, in the order of [`RUN_KINDS`].
    kinds: [u64; RUN_KINDS.len()],
}

/// The kinds a run takes.
const RUN_KINDS: [KindTag; 5] = [
    KindTag::Malloc,
    KindTag::Free,
    KindTag::Calloc,
    KindTag::Realloc,
    KindTag::AlignedAlloc,
];

impl Run {
    #[inline(always)]
    fn alloc(
        &mut self,
        blocks: &mut BlockMap,
        sizes: &mut SizeHistogram,
        (addr, size): (u64, u64),
        ts: u64,
    ) {
        self.allocations += 1;
        self.bytes_allocated = self.bytes_allocated.saturating_add(size);
        match blocks.insert(addr, Block::Live(size, 0)) {
            Some(Block::Live(old, _)) => self.replace(old, size),
            Some(Block::Freed) | None => {
                self.live_blocks += 1;
                self.live_bytes = self.live_bytes.saturating_add(size);
            }
        }
        sizes.add(size);
        self.max_live = self.max_live.max(self.live_bytes);
        self.max_blocks = self.max_blocks.max(self.live_blocks);
        if self.live_bytes > self.peak {
            self.peak = self.live_bytes;
            self.peak_ts = ts;
        }
    }

    /// An allocation at the address of a live block (its free was not seen): may shrink.
    #[cold]
    #[inline(never)]
    fn replace(&mut self, old: u64, size: u64) {
        self.live_bytes = self.live_bytes.saturating_sub(old).saturating_add(size);
        self.min_live = self.min_live.min(self.live_bytes);
    }

    #[inline(always)]
    fn free(&mut self, blocks: &mut BlockMap, addr: u64) {
        match blocks.get_mut(addr) {
            Some(b @ &mut Block::Live(size, _)) => {
                *b = Block::Freed;
                self.bytes_freed = self.bytes_freed.saturating_add(size);
                self.live_bytes = self.live_bytes.saturating_sub(size);
                self.live_blocks -= 1;
                self.frees += 1;
            }
            Some(Block::Freed) => self.allocator_internal_frees += 1,
            None => {
                self.unmatched_frees += 1;
                self.frees += 1;
            }
        }
    }

    /// Feeds `e` if it is a heap event; `false` (nothing changed) otherwise.
    #[inline(always)]
    fn event(&mut self, blocks: &mut BlockMap, sizes: &mut SizeHistogram, e: &Event) -> bool {
        match e.kind {
            EventKind::Malloc { addr, size } => {
                self.kinds[0] += 1;
                self.alloc(blocks, sizes, (addr, size), e.ts);
            }
            EventKind::Free { addr } => {
                self.kinds[1] += 1;
                if addr != 0 {
                    self.free(blocks, addr);
                    self.min_live = self.min_live.min(self.live_bytes);
                }
            }
            EventKind::Calloc { addr, size } => {
                self.kinds[2] += 1;
                self.alloc(blocks, sizes, (addr, size), e.ts);
            }
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            } => {
                self.kinds[3] += 1;
                if old_addr != 0 {
                    self.free(blocks, old_addr);
                }
                if new_addr != 0 {
                    self.alloc(blocks, sizes, (new_addr, size), e.ts);
                }
                // After the whole event (not between its free and its allocation).
                self.min_live = self.min_live.min(self.live_bytes);
            }
            EventKind::AlignedAlloc { addr, size, .. } => {
                self.kinds[4] += 1;
                self.alloc(blocks, sizes, (addr, size), e.ts);
            }
            _ => return false,
        }
        true
    }
}

impl Analyzer {
    /// Feeds `events` in order to the analyzer, `sizes` and `timeline`: what
    /// [`Analyzer::update_sized`] and a [`Timeline::push`] of the live and mapped bytes after
    /// each event give, with runs of heap events taken in one go (see the module docs).
    pub(crate) fn update_timed(
        &mut self,
        events: &[Event],
        sizes: &mut SizeHistogram,
        timeline: &mut Timeline,
    ) {
        let mut rest = events;
        while let Some((e, after)) = rest.split_first() {
            self.update_sized(e, sizes);
            timeline.push(e.ts, self.live.bytes, self.mapped);
            let n = self.heap_run(after, sizes, timeline);
            rest = &after[n..];
        }
    }

    /// Takes the run at the start of `events` (after an event of the general path, whose
    /// thread and column it continues); returns its length.
    fn heap_run(
        &mut self,
        events: &[Event],
        sizes: &mut SizeHistogram,
        timeline: &mut Timeline,
    ) -> usize {
        let Some((key, slot)) = self.last_thread else {
            return 0;
        };
        let (pid, tid) = ((key >> 32) as u32, key as u32);
        let (lo, hi) = timeline.current_range();
        let width = hi.wrapping_sub(lo);
        let mut r = Run {
            allocations: 0,
            bytes_allocated: 0,
            frees: 0,
            bytes_freed: 0,
            unmatched_frees: 0,
            allocator_internal_frees: 0,
            live_bytes: self.live.bytes,
            live_blocks: self.live.blocks,
            min_live: u64::MAX,
            max_live: 0,
            max_blocks: 0,
            peak: self.t.peak_live_bytes,
            peak_ts: self.t.peak_ts,
            kinds: [0; RUN_KINDS.len()],
        };
        let pslot = self.threads[slot].1;
        let blocks = &mut self.procs[pslot].1.blocks;
        // Thread and process in one compare (one load: the fields are adjacent).
        let who = |tid: u32, pid: u32| u64::from(tid) << 32 | u64::from(pid);
        let run_who = who(tid, pid);
        let mut n = 0;
        for e in events {
            let ours = (who(e.tid, e.pid) == run_who) & (e.ts.wrapping_sub(lo) < width);
            if !ours || !r.event(blocks, sizes, e) {
                break;
            }
            n += 1;
        }
        if n > 0 {
            self.end_run(&r, n as u64, events[n - 1].ts, slot, pslot);
            timeline.extend_current(n as u64, r.min_live, r.max_live, r.live_bytes);
        }
        n
    }

    /// Adds a run of `n` events, the last stamped `last_ts`, of thread `threads[slot]` (of
    /// process `procs[pslot]`) to the figures.
    fn end_run(&mut self, r: &Run, n: u64, last_ts: u64, slot: usize, pslot: usize) {
        let t = &mut self.t;
        t.events += n;
        t.last_ts = last_ts;
        for (tag, k) in RUN_KINDS.iter().zip(r.kinds) {
            t.kinds.0[tag.index()] += k;
        }
        t.allocations += r.allocations;
        t.bytes_allocated = t.bytes_allocated.saturating_add(r.bytes_allocated);
        t.frees += r.frees;
        t.bytes_freed = t.bytes_freed.saturating_add(r.bytes_freed);
        t.unmatched_frees += r.unmatched_frees;
        t.allocator_internal_frees += r.allocator_internal_frees;
        t.peak_live_blocks = t.peak_live_blocks.max(r.max_blocks);
        t.peak_live_bytes = r.peak;
        t.peak_ts = r.peak_ts;
        let th = &mut self.threads[slot].2;
        th.events += n;
        th.allocations += r.allocations;
        th.bytes_allocated = th.bytes_allocated.saturating_add(r.bytes_allocated);
        th.frees += r.frees;
        th.bytes_freed = th.bytes_freed.saturating_add(r.bytes_freed);
        let p = &mut self.procs[pslot].1;
        p.unmatched_frees += r.unmatched_frees;
        p.allocator_internal_frees += r.allocator_internal_frees;
        let live = &mut self.live;
        live.bytes = r.live_bytes;
        live.blocks = r.live_blocks;
        live.iteration_peak.0 = live.iteration_peak.0.max(r.max_live);
        live.iteration_peak.1 = live.iteration_peak.1.max(r.max_blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The general path: each event on its own, as the writer fed them before runs.
    fn one_by_one(events: &[Event]) -> (Analyzer, SizeHistogram, Timeline) {
        let (mut a, mut sizes) = (Analyzer::new(), SizeHistogram::new());
        let mut timeline = Timeline::growing(16).unwrap();
        for e in events {
            a.update_sized(e, &mut sizes);
            timeline.push(e.ts, a.live_bytes(), a.mapped_bytes());
        }
        (a, sizes, timeline)
    }

    fn in_runs(chunks: &[&[Event]]) -> (Analyzer, SizeHistogram, Timeline) {
        let (mut a, mut sizes) = (Analyzer::new(), SizeHistogram::new());
        let mut timeline = Timeline::growing(16).unwrap();
        for c in chunks {
            a.update_timed(c, &mut sizes, &mut timeline);
        }
        (a, sizes, timeline)
    }

    /// A stream of every case a run meets and breaks on: threads and processes switching, every
    /// heap kind, frees of unknown, freed and NULL addresses, an allocation over a live block,
    /// realloc to and from NULL, mappings, an exec, iteration marks, a timestamp going back and
    /// columns changing (the timeline doubles several times).
    fn mixed() -> Vec<Event> {
        let mut x: u64 = 0x9e37_79b9;
        let mut ts: u64 = 1_000;
        let mut out = Vec::new();
        for i in 0..20_000u64 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = x >> 33;
            let addr = 0x1000 + (r % 97) * 16;
            let size = r % 3000;
            // Mostly small steps, sometimes a jump or a step back.
            ts = match r % 211 {
                0 => ts + 50_000,
                1 => ts.saturating_sub(700),
                _ => ts + r % 5,
            };
            // Two execs: more would keep the columns' minimum at 0.
            let kind = match (r >> 8) % 40 {
                _ if i % 9000 == 8999 => EventKind::Exec,
                0..=14 => EventKind::Malloc { addr, size },
                15..=29 => EventKind::Free { addr },
                30 => EventKind::Free { addr: 0 },
                31 => EventKind::Calloc { addr, size },
                32 => EventKind::AlignedAlloc {
                    addr,
                    size,
                    align: 64,
                },
                33 => EventKind::Realloc {
                    old_addr: addr,
                    new_addr: addr + 16,
                    size,
                },
                34 => EventKind::Realloc {
                    old_addr: 0,
                    new_addr: addr,
                    size,
                },
                35 => EventKind::Realloc {
                    old_addr: addr,
                    new_addr: 0,
                    size: 0,
                },
                36 => EventKind::Mmap {
                    addr: 0x100_0000 + (r % 7) * 4096,
                    size,
                },
                37 => EventKind::Munmap {
                    addr: 0x100_0000 + (r % 7) * 4096,
                    size,
                },
                38 => EventKind::IterationStart,
                _ => EventKind::IterationEnd,
            };
            // One thread most of the time; bursts of others, and another process.
            let (pid, tid) = match (r >> 20) % 64 {
                0 => (1, 2),
                1 => (2, 2),
                2 => (2, 7),
                _ => (1, 1),
            };
            out.push(Event::new(ts, pid, tid, kind));
        }
        out
    }

    fn assert_same(a: (Analyzer, SizeHistogram, Timeline), b: (Analyzer, SizeHistogram, Timeline)) {
        assert_eq!(a.0.totals(), b.0.totals());
        assert_eq!(a.0.per_process(), b.0.per_process());
        assert_eq!(a.0.stats(), b.0.stats());
        assert_eq!(a.0.mapped_bytes(), b.0.mapped_bytes());
        assert_eq!(a.1.classes(), b.1.classes());
        assert_eq!(
            (a.2.first_ts(), a.2.span_ns()),
            (b.2.first_ts(), b.2.span_ns())
        );
        let cols = |t: &Timeline| t.columns().copied().collect::<Vec<_>>();
        assert_eq!(cols(&a.2), cols(&b.2));
    }

    #[test]
    fn runs_give_the_general_paths_figures() {
        let events = mixed();
        let general = one_by_one(&events);
        assert!(general.0.totals().iteration_spread.is_some());
        assert!(general.0.totals().unmatched_frees > 0);
        assert!(general.0.totals().allocator_internal_frees > 0);
        assert!(general.0.totals().blocks_discarded_at_exec > 0);
        assert_same(in_runs(&[&events]), one_by_one(&events));
        // Frames of any length: a run never crosses one.
        let chunks: Vec<&[Event]> = events.chunks(333).collect();
        assert_same(in_runs(&chunks), general);
    }

    /// A later event in a run that reaches the peak again leaves the peak's time at the first.
    #[test]
    fn the_peak_keeps_the_time_it_was_first_reached() {
        let malloc = |ts, addr, size| Event::new(ts, 1, 1, EventKind::Malloc { addr, size });
        let free = |ts, addr| Event::new(ts, 1, 1, EventKind::Free { addr });
        // Columns of 64 ns once the span covers 1000 ns; then back to column 1, for a run of
        // the free and the malloc after the malloc at 105 (the peak's first time).
        let events = [
            malloc(5, 0x10, 1),
            free(1005, 0x10),
            malloc(105, 0x20, 100),
            free(106, 0x20),
            malloc(107, 0x30, 100),
        ];
        let (a, _, _) = in_runs(&[&events]);
        assert_eq!((a.totals().peak_live_bytes, a.totals().peak_ts), (100, 105));
        assert_same(in_runs(&[&events]), one_by_one(&events));
    }

    /// One thread, one column: the whole stream after its first event is one run.
    #[test]
    fn a_single_thread_stream_is_one_run() {
        let events: Vec<Event> = (0..1000u64)
            .map(|i| {
                let addr = 0x10 + (i / 2 % 13) * 32;
                let kind = if i % 2 == 0 {
                    EventKind::Malloc { addr, size: i }
                } else {
                    EventKind::Free { addr }
                };
                Event::new(5, 3, 4, kind)
            })
            .collect();
        assert_same(in_runs(&[&events]), one_by_one(&events));
        let (a, _, t) = in_runs(&[&events]);
        assert_eq!(a.totals().allocations, 500);
        assert_eq!(t.columns().count(), 1);
    }
}
