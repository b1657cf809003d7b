//! The totals a recording adds up to: plain numbers, stored in an artifact's trailer
//! (`Final::totals`) and computed by the analysis (`Analyzer`), which states the accounting
//! rules. A record of the event model, below both: the format stores it without depending on
//! the analysis that computes it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::KindTag;

/// Per-kind event counts, keyed by [`KindTag::name`] in JSON. The kinds that are not memory
/// events (scheduling kinds, recorded only for lock waits; iteration marks) are left out when
/// 0, so that the totals of a recording without them are those an older memtrack wrote.
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
        let shown = |k: &KindTag| k.is_memory() || self.get(*k) != 0;
        let mut m = s.serialize_map(Some(KindTag::ALL.iter().filter(|k| shown(k)).count()))?;
        for k in KindTag::ALL.into_iter().filter(shown) {
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

/// Totals over a sequence of events, under the accounting rules stated by the analysis
/// (`Analyzer`, which computes them).
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
    /// Per-iteration figures, when the events mark iterations (a session that accumulates the
    /// calls of a `#[memtrack]` function). Absent before format 1.8 and when none are marked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration_spread: Option<IterationSpread>,
}

/// The figures of one iteration (one call of a `#[memtrack]` function whose calls a session
/// accumulates), under the accounting rules of [`Totals`]: what its limits are checked against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Iteration {
    /// Allocations made during it.
    pub allocations: u64,
    /// Bytes allocated during it.
    pub bytes_allocated: u64,
    /// The most live heap bytes it added to those live when it began.
    pub peak_live_bytes: u64,
    /// The most live heap blocks it added to those live when it began.
    pub peak_live_blocks: u64,
    /// Heap blocks live at its end less those live at its start (0 if fewer): what it left.
    pub live_blocks: u64,
    /// Their bytes, likewise.
    pub live_bytes: u64,
}

impl Iteration {
    /// The iteration as totals of its own (the fields limits read; the rest 0).
    pub fn as_totals(&self) -> Totals {
        Totals {
            allocations: self.allocations,
            bytes_allocated: self.bytes_allocated,
            peak_live_bytes: self.peak_live_bytes,
            peak_live_blocks: self.peak_live_blocks,
            live_blocks_at_end: self.live_blocks,
            live_bytes_at_end: self.live_bytes,
            ..Totals::default()
        }
    }
}

/// Per-iteration figures of a recording whose events mark iterations (one per call of a
/// `#[memtrack]` function that a session accumulates): how many, and the spread of each figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IterationSpread {
    /// Iterations marked and finished.
    pub iterations: u64,
    /// Allocations made during one iteration.
    pub allocations: Spread,
    /// Bytes allocated during one iteration.
    pub bytes_allocated: Spread,
    /// The most live heap bytes an iteration added to those live when it began.
    pub peak_live_bytes: Spread,
}

/// The spread of a per-iteration figure: its smallest, median and largest value, and its sum.
/// The median of an even number of values is the lower of the two middle ones (a value some
/// iteration had).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Spread {
    /// The smallest value.
    pub min: u64,
    /// The median value.
    pub median: u64,
    /// The largest value.
    pub max: u64,
    /// The sum over every iteration.
    pub total: u64,
}

impl Spread {
    pub(crate) fn of(mut values: Vec<u64>) -> Spread {
        values.sort_unstable();
        Spread {
            min: values.first().copied().unwrap_or(0),
            median: values
                .get(values.len().saturating_sub(1) / 2)
                .copied()
                .unwrap_or(0),
            max: values.last().copied().unwrap_or(0),
            total: values.iter().fold(0u64, |a, &v| a.saturating_add(v)),
        }
    }
}

impl IterationSpread {
    /// `allocations 3 (1–5), allocated 900 B (100 B–2.4 KiB), peak 300 B (100 B–500 B)`: each
    /// figure's median, and its range when the iterations differ (the summary line's and
    /// `memtrack show`'s words).
    pub fn describe(&self) -> String {
        let spread = |s: &Spread, show: fn(u64) -> String| {
            if s.min == s.max {
                show(s.median)
            } else {
                format!("{} ({}–{})", show(s.median), show(s.min), show(s.max))
            }
        };
        format!(
            "allocations {}, allocated {}, peak {}",
            spread(&self.allocations, crate::human::count),
            spread(&self.bytes_allocated, crate::human::bytes),
            spread(&self.peak_live_bytes, crate::human::bytes),
        )
    }

    pub(crate) fn of(done: &[Iteration]) -> Option<IterationSpread> {
        if done.is_empty() {
            return None;
        }
        let column = |f: fn(&Iteration) -> u64| Spread::of(done.iter().map(f).collect());
        Some(IterationSpread {
            iterations: done.len() as u64,
            allocations: column(|i| i.allocations),
            bytes_allocated: column(|i| i.bytes_allocated),
            peak_live_bytes: column(|i| i.peak_live_bytes),
        })
    }
}
