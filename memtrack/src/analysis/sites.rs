//! Call sites: Valgrind DHAT's numbers per program point, here per allocating call stack.
//!
//! A site is a [`StackId`]: every heap block is attributed, for its whole life, to the stack of
//! the event that allocated it (`malloc`, `calloc`, `realloc`'s new block, the aligned family).
//! Events without a stack (a recorder that captures none, a stack the recorder could not walk)
//! fall in one site, [`StackId::NONE`], counted like the others. Mappings are not heap blocks
//! and are in no site, as in the [`Totals`](crate::Totals).
//!
//! Computed from the events in a pass of its own ([`SiteAnalyzer`], [`Sites::read`]), not by
//! the encoder's writer: the per-block work (a hash map of the live blocks with their site) is
//! paid only by who asks.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::Analyzer;
use crate::artifact::{FormatError, Reader};
use crate::event::{Event, EventKind, HeapOps};
use crate::stack::StackId;

/// One call site's numbers (DHAT's "program point"): bytes are heap bytes as requested.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Site {
    /// The allocating stack; [`StackId::NONE`] for the events without one.
    pub stack: StackId,
    /// Blocks allocated at this site (allocations, as [`Totals::allocations`](crate::Totals)
    /// counts them: a `realloc` is one).
    pub blocks: u64,
    /// Their bytes, in total.
    pub bytes: u64,
    /// Blocks of this site live at the instant of the recording's peak ([`Sites::peak_ts`]).
    pub blocks_at_peak: u64,
    /// Their bytes: the site's share of [`Sites::peak_live_bytes`].
    pub bytes_at_peak: u64,
    /// Blocks of this site still live at the end (not freed, not discarded by an exec).
    pub blocks_at_end: u64,
    /// Their bytes.
    pub bytes_at_end: u64,
    /// The most blocks of this site live at once (DHAT's `mbk`; not in `show --json`).
    #[serde(skip)]
    pub max_blocks: u64,
    /// The most bytes of this site live at once, at any instant, not only at the global peak
    /// (DHAT's `mb`; not in `show --json`).
    #[serde(skip)]
    pub max_bytes: u64,
    /// The lifetimes of its blocks summed, ns: from the allocation to the free (or the exec
    /// that discarded the block, or the replacing allocation at its address), and to the last
    /// event of the recording for the blocks live at the end (DHAT's `tl`; not in
    /// `show --json`).
    #[serde(skip)]
    pub lifetimes_ns: u128,
}

/// What to rank sites by (`memtrack show --top N --by …`), largest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SiteOrder {
    /// [`Site::bytes`].
    Bytes,
    /// [`Site::blocks`].
    Allocations,
    /// [`Site::bytes_at_peak`].
    Peak,
    /// [`Site::bytes_at_end`].
    Leaked,
}

impl SiteOrder {
    /// The value a site is ranked by.
    pub fn key(self, s: &Site) -> u64 {
        match self {
            SiteOrder::Bytes => s.bytes,
            SiteOrder::Allocations => s.blocks,
            SiteOrder::Peak => s.bytes_at_peak,
            SiteOrder::Leaked => s.bytes_at_end,
        }
    }
}

/// Every call site of a recording, with the instant of its peak.
///
/// **The peak** is the global one of [`Totals::peak_live_bytes`](crate::Totals): the live heap
/// bytes summed over every process of the recording, after the event that first reached their
/// maximum. A recording that followed a process tree has one heap per process, and the peak is
/// the instant the sum of their live bytes was highest; the "at peak" numbers of a site are
/// its blocks live at that instant, in whichever process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Sites {
    /// Every site that allocated, by increasing stack id ([`StackId::NONE`], if present, first).
    pub sites: Vec<Site>,
    /// The recording's peak live heap bytes (the sum of [`Site::bytes_at_peak`]).
    pub peak_live_bytes: u64,
    /// When it was reached (ns, CLOCK_MONOTONIC); 0 if the heap never held a byte.
    pub peak_ts: u64,
}

impl Sites {
    /// The site of the allocations without a stack, if there were any.
    pub fn no_stack(&self) -> Option<&Site> {
        self.sites.first().filter(|s| s.stack.is_none())
    }

    /// Whether some allocation carries a stack.
    pub fn has_stacks(&self) -> bool {
        self.sites.iter().any(|s| !s.stack.is_none())
    }

    /// The sites ranked by `order`, largest first (ties by increasing stack id), at most `n`.
    pub fn top(&self, order: SiteOrder, n: usize) -> Vec<&Site> {
        let mut v: Vec<&Site> = self.sites.iter().collect();
        v.sort_by(|a, b| order.key(b).cmp(&order.key(a)).then(a.stack.cmp(&b.stack)));
        v.truncate(n);
        v
    }

    /// The sites of the events of `reader`, decoded in parallel ([`SiteAnalyzer::read`]).
    pub fn read(reader: &Reader) -> Result<Sites, FormatError> {
        Ok(SiteAnalyzer::read(reader, |_| {})?.sites())
    }
}

/// A site while the events stream.
#[derive(Clone, Copy, Default)]
struct SiteState {
    site: Site,
    /// Its live blocks and bytes now.
    live_blocks: u64,
    live_bytes: u64,
    /// The event (1-based) that last changed its live blocks; 0 if none did.
    changed: u64,
    /// The timestamps of its allocations and of the ends of its blocks, summed (ns): the
    /// lifetimes are their difference, the live blocks ending at the last event.
    alloc_ts: u128,
    end_ts: u128,
}

/// Computes [`Sites`] from events fed in order (the accounting rules of
/// [`Analyzer`], whose peak it uses).
///
/// The blocks live at the peak are found in one pass without copying every site at every new
/// peak: a site's live numbers are copied when it first changes after the latest peak (they
/// are then still those of the peak), and at the end for the sites that did not change since.
#[derive(Default)]
pub struct SiteAnalyzer {
    analyzer: Analyzer,
    /// The sites' own accounting, which follows the analyzer's peak.
    acc: SiteAccount,
}

/// One process's live blocks: address -> (size, index of the block's site).
type Blocks = FxHashMap<u64, (u64, usize)>;

/// The per-site half of a [`SiteAnalyzer`]: every block's site and every site's numbers. Fed
/// the same events as the analyzer, told after which of them its peak rose.
///
/// The live blocks are kept per process in a short list searched from the last process seen
/// (a recording has few processes, and runs of events of one): no hash of the pid per event.
#[derive(Default)]
struct SiteAccount {
    /// Per process (by pid): live block address -> (size, index in `sites`).
    heaps: Vec<(u32, Blocks)>,
    /// The index in `heaps` of the last process seen.
    last_heap: usize,
    sites: Vec<SiteState>,
    index: FxHashMap<StackId, usize>,
    /// Events fed so far.
    events: u64,
    /// The event (1-based) after which the live heap was at its peak; 0 before any.
    peak_event: u64,
    /// The timestamp of the event being fed (ns), the last one's after.
    ts: u64,
}

/// The heap rule of one event, applied to the sites.
struct SiteOps<'a> {
    a: &'a mut SiteAccount,
    pid: u32,
    stack: StackId,
}

impl HeapOps for SiteOps<'_> {
    fn alloc(&mut self, addr: u64, size: u64) {
        let slot = self.a.slot(self.stack);
        let old = self.a.heap(self.pid).insert(addr, (size, slot));
        // A block at an address already live means its free was not seen: it is replaced.
        if let Some((old_size, old_slot)) = old {
            self.a.change(old_slot, -1, old_size);
        }
        let ts = self.a.ts;
        let st = &mut self.a.sites[slot];
        st.alloc_ts += u128::from(ts);
        st.site.blocks += 1;
        st.site.bytes = st.site.bytes.saturating_add(size);
        self.a.change(slot, 1, size);
    }

    fn free(&mut self, addr: u64) {
        let removed = self.a.heap(self.pid).remove(&addr);
        if let Some((size, slot)) = removed {
            self.a.change(slot, -1, size);
        }
    }
}

impl SiteAnalyzer {
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
    pub fn update(&mut self, e: &Event) {
        self.acc.apply(e);
        let before = self.analyzer.t.peak_live_bytes;
        self.analyzer.update(e);
        if self.analyzer.t.peak_live_bytes > before {
            self.acc.peak_event = self.acc.events;
        }
    }

    /// Feeds every event of `reader` (its frames decoded in parallel, as
    /// [`Reader::for_each_frame`] does) and calls `per_frame` with each frame's events, in
    /// order, after feeding them: what `show --top`, the exports and `compare` read a recording
    /// with.
    ///
    /// The analysis stays on one thread, beside the decoding: running the totals and the site
    /// accounting of a frame on two threads (the sites a frame behind, told where the peak
    /// rose) cost 14 % more CPU for a copy of every frame and the hand-offs, and on this
    /// shared 2-core machine under load that made `show --top 20` slower, not faster.
    pub fn read(
        reader: &Reader,
        mut per_frame: impl FnMut(&[Event]) + Send,
    ) -> Result<SiteAnalyzer, FormatError> {
        let mut a = SiteAnalyzer::new();
        reader.for_each_frame(|_, events| {
            a.update_all(events);
            per_frame(events);
            Ok(())
        })?;
        Ok(a)
    }

    /// The [`Analyzer`] it feeds with the same events (whose peak it uses): the totals of
    /// those events, without a second analysis.
    pub fn analyzer(&self) -> &Analyzer {
        &self.analyzer
    }

    /// The sites so far.
    pub fn sites(&self) -> Sites {
        self.acc.sites(&self.analyzer)
    }
}

impl SiteAccount {
    /// Applies one event to the blocks and sites (the peak, if it rose after it, is the
    /// caller's to set).
    fn apply(&mut self, e: &Event) {
        self.events += 1;
        self.ts = e.ts;
        let mut ops = SiteOps {
            a: self,
            pid: e.pid,
            stack: e.stack,
        };
        if !e.kind.apply_heap(&mut ops) && matches!(e.kind, EventKind::Exec) {
            // The image's blocks are discarded: live neither now nor at the end.
            if let Some(i) = self.heaps.iter().position(|(pid, _)| *pid == e.pid) {
                let (_, heap) = self.heaps.swap_remove(i);
                self.last_heap = 0;
                for (size, slot) in heap.into_values() {
                    self.change(slot, -1, size);
                }
            }
        }
    }

    /// The live blocks of process `pid`, made on first sight.
    #[inline]
    fn heap(&mut self, pid: u32) -> &mut Blocks {
        let i = match self.heaps.get(self.last_heap) {
            Some((p, _)) if *p == pid => self.last_heap,
            _ => {
                let i = match self.heaps.iter().position(|(p, _)| *p == pid) {
                    Some(i) => i,
                    None => {
                        self.heaps.push((pid, Blocks::default()));
                        self.heaps.len() - 1
                    }
                };
                self.last_heap = i;
                i
            }
        };
        &mut self.heaps[i].1
    }

    /// The index of the site of `stack`, made on first sight.
    fn slot(&mut self, stack: StackId) -> usize {
        let next = self.sites.len();
        let slot = *self.index.entry(stack).or_insert(next);
        if slot == next {
            self.sites.push(SiteState {
                site: Site {
                    stack,
                    ..Site::default()
                },
                ..SiteState::default()
            });
        }
        slot
    }

    /// Changes site `slot`'s live numbers by one block of `size` bytes (`dir` +1 or -1),
    /// first keeping them as its numbers at the peak if they have not changed since it.
    fn change(&mut self, slot: usize, dir: i8, size: u64) {
        let (peak, now) = (self.peak_event, self.events);
        let s = &mut self.sites[slot];
        if s.changed <= peak {
            s.site.blocks_at_peak = s.live_blocks;
            s.site.bytes_at_peak = s.live_bytes;
        }
        s.changed = now;
        if dir > 0 {
            s.live_blocks += 1;
            s.live_bytes = s.live_bytes.saturating_add(size);
            s.site.max_blocks = s.site.max_blocks.max(s.live_blocks);
            s.site.max_bytes = s.site.max_bytes.max(s.live_bytes);
        } else {
            s.end_ts += u128::from(self.ts);
            s.live_blocks -= 1;
            s.live_bytes = s.live_bytes.saturating_sub(size);
        }
    }

    /// The sites so far, with `analyzer`'s peak.
    fn sites(&self, analyzer: &Analyzer) -> Sites {
        let mut sites: Vec<Site> = self
            .sites
            .iter()
            .map(|s| {
                let mut site = s.site;
                if s.changed <= self.peak_event {
                    site.blocks_at_peak = s.live_blocks;
                    site.bytes_at_peak = s.live_bytes;
                }
                site.blocks_at_end = s.live_blocks;
                site.bytes_at_end = s.live_bytes;
                let ended = s.end_ts + u128::from(s.live_blocks) * u128::from(self.ts);
                site.lifetimes_ns = ended.saturating_sub(s.alloc_ts);
                site
            })
            .collect();
        sites.sort_by_key(|s| s.stack);
        Sites {
            sites,
            peak_live_bytes: analyzer.t.peak_live_bytes,
            peak_ts: analyzer.t.peak_ts,
        }
    }
}
