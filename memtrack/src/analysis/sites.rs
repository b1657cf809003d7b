//! Call sites: Valgrind DHAT's numbers per program point, here per allocating call stack.
//!
//! A site is a [`StackId`]: every heap block is attributed, for its whole life, to the stack of
//! the event that allocated it (`malloc`, `calloc`, `realloc`'s new block, the aligned family).
//! Events without a stack (a recorder that captures none, a stack the recorder could not walk)
//! fall in one site, [`StackId::NONE`], counted like the others. Mappings are not heap blocks
//! and are in no site, as in the [`Totals`](crate::totals::Totals).
//!
//! Computed from the events in a pass of its own ([`SiteAnalyzer`], [`Sites::read`]), not by
//! the encoder's writer: the per-block work (each live block tagged with its site, in the
//! [`Analyzer`]'s own map of the heap) is paid only by who asks.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::{Analyzer, HeapObserver};
use crate::artifact::{FormatError, Reader};
use crate::event::Event;
use crate::stack::StackId;

/// One call site's numbers (DHAT's "program point"): bytes are heap bytes as requested.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Site {
    /// The allocating stack; [`StackId::NONE`] for the events without one.
    pub stack: StackId,
    /// Blocks allocated at this site (allocations, as [`Totals::allocations`](crate::totals::Totals)
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
    /// Every order, as the command line names them (`--by`, `--metric`).
    pub const ALL: [SiteOrder; 4] = [
        SiteOrder::Bytes,
        SiteOrder::Allocations,
        SiteOrder::Peak,
        SiteOrder::Leaked,
    ];

    /// Its name on the command line: `bytes`, `allocations`, `peak` or `leaked`.
    pub fn name(self) -> &'static str {
        match self {
            SiteOrder::Bytes => "bytes",
            SiteOrder::Allocations => "allocations",
            SiteOrder::Peak => "peak",
            SiteOrder::Leaked => "leaked",
        }
    }

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

/// [`SiteOrder::name`]'s text that names no order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown site order {0:?}: expected bytes, allocations, peak or leaked")]
pub struct UnknownSiteOrder(pub String);

impl std::str::FromStr for SiteOrder {
    type Err = UnknownSiteOrder;

    /// Parses a [`SiteOrder::name`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SiteOrder::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| UnknownSiteOrder(s.to_string()))
    }
}

/// Every call site of a recording, with the instant of its peak.
///
/// **The peak** is the global one of [`Totals::peak_live_bytes`](crate::totals::Totals): the live heap
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

/// The per-site half of a [`SiteAnalyzer`]: every site's numbers, told by the [`Analyzer`]
/// (which keeps each live block's site with it) when a block of a site starts and ends, and
/// after which event its peak rose.
#[derive(Default)]
struct SiteAccount {
    sites: Vec<SiteState>,
    /// Stack id -> index in `sites` + 1 (0: not seen), for the ids below its length: a
    /// recorder numbers its stacks from 1, so this is every id of a well-formed recording,
    /// looked up without hashing (the look-up runs for every allocation).
    dense: Vec<u32>,
    /// The same for the ids `dense` does not cover (a sparse numbering).
    sparse: FxHashMap<StackId, u32>,
    /// Events fed so far.
    events: u64,
    /// The event (1-based) after which the live heap was at its peak; 0 before any.
    peak_event: u64,
    /// The timestamp of the event being fed (ns), the last one's after.
    ts: u64,
}

/// One event's view of the sites for the [`Analyzer`]: its allocation (if any) is of `stack`.
struct SiteOps<'a> {
    a: &'a mut SiteAccount,
    stack: StackId,
}

impl HeapObserver for SiteOps<'_> {
    #[inline(always)]
    fn tag(&mut self) -> u32 {
        self.a.slot(self.stack)
    }

    #[inline(always)]
    fn on_alloc(&mut self, size: u64, slot: u32) {
        let ts = self.a.ts;
        let st = &mut self.a.sites[slot as usize];
        st.alloc_ts += u128::from(ts);
        st.site.blocks += 1;
        st.site.bytes = st.site.bytes.saturating_add(size);
        self.a.change(slot, 1, size);
    }

    #[inline(always)]
    fn on_end(&mut self, size: u64, slot: u32) {
        self.a.change(slot, -1, size);
    }
}

impl SiteAnalyzer {
    /// A fresh analyzer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a slice of events, in order.
    pub fn update_all(&mut self, events: &[Event]) {
        if !self.analyzer.heap_outgrows_cache() {
            for e in events {
                self.update(e);
            }
            return;
        }
        for (i, e) in events.iter().enumerate() {
            if let Some(ahead) = events.get(i + super::PREFETCH_AHEAD) {
                self.analyzer.prefetch(ahead);
            }
            self.update(e);
        }
    }

    /// Feeds one event.
    pub fn update(&mut self, e: &Event) {
        self.acc.events += 1;
        self.acc.ts = e.ts;
        let before = self.analyzer.t.peak_live_bytes;
        let mut ops = SiteOps {
            a: &mut self.acc,
            stack: e.stack,
        };
        self.analyzer.update_with(e, &mut ops);
        if self.analyzer.t.peak_live_bytes > before {
            self.acc.peak_event = self.acc.events;
        }
    }

    /// Feeds every event of `reader` (its frames decoded in parallel, as
    /// [`Reader::for_each_frame`] does) and calls `per_frame` with each frame's events, in
    /// order, after feeding them: what `show --top`, the exports and `compare` read a recording
    /// with.
    ///
    /// The analysis stays on one thread, beside the decoding: splitting the totals and the
    /// site accounting over two threads costs a copy of every frame and the hand-offs.
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
    /// The index of the site of `stack`, made on first sight.
    #[inline(always)]
    fn slot(&mut self, stack: StackId) -> u32 {
        match self.dense.get(stack.0 as usize) {
            Some(&s) if s != 0 => s - 1,
            _ => self.new_slot(stack),
        }
    }

    /// [`slot`](Self::slot)'s slow path: a site not seen yet, or an id `dense` does not cover.
    #[inline(never)]
    fn new_slot(&mut self, stack: StackId) -> u32 {
        let id = stack.0 as usize;
        let known = if id < self.dense.len() {
            None
        } else {
            self.sparse.get(&stack).copied()
        };
        if let Some(s) = known {
            return s - 1;
        }
        let slot = u32::try_from(self.sites.len()).expect("fewer sites than stack ids");
        self.sites.push(SiteState {
            site: Site {
                stack,
                ..Site::default()
            },
            ..SiteState::default()
        });
        // Dense while the ids stay near the number of sites (an id far past it, as a crafted
        // file may give, goes to the hash map instead of growing the table to it).
        if id < self.dense.len() {
            self.dense[id] = slot + 1;
        } else if id <= 2 * self.sites.len() + 4096 && self.sparse.is_empty() {
            self.dense.resize(id + 1, 0);
            self.dense[id] = slot + 1;
        } else {
            self.sparse.insert(stack, slot + 1);
        }
        slot
    }

    /// Changes site `slot`'s live numbers by one block of `size` bytes (`dir` +1 or -1),
    /// first keeping them as its numbers at the peak if they have not changed since it.
    #[inline(always)]
    fn change(&mut self, slot: u32, dir: i8, size: u64) {
        let (peak, now) = (self.peak_event, self.events);
        let s = &mut self.sites[slot as usize];
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
