//! Heap and mapped bytes over time, downsampled to a fixed number of columns (one per pixel of
//! a plot) without losing extremes.
//!
//! The time range `[first_ts, last_ts]` is cut into `n` equal columns. For each column that has
//! events, [`Column`] keeps, for live heap bytes and for mapped bytes, the value on entering the
//! column, the minimum and maximum after each of its events, and the value after its last event.
//! Drawing each column as a vertical line from `min` to `max` and holding `last` until the next
//! column gives the step line of the full-resolution series as it would look at that width: every
//! peak survives (the column holding [`Totals::peak_live_bytes`](super::Totals) has it as `max`).
//! Memory is `O(n)` whatever the number of events.
//!
//! When the time range is not known in advance (a session streaming its events),
//! [`Timeline::growing`] starts at 1 ns per column from the first sample and doubles the span
//! whenever a sample falls past it, merging columns pairwise (column `k` of the doubled span
//! covers exactly columns `2k` and `2k + 1` of the old one, and extremes merge exactly): the
//! result is the timeline [`Timeline::new`] gives over `[first_ts, first_ts + span_ns)`,
//! with at least half of its columns inside the recorded range.

use crate::analysis::Analyzer;
use crate::event::Event;

/// One series' values within a column, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Extremes {
    /// The value before the column's first event.
    pub enter: u64,
    /// The minimum after any event of the column.
    pub min: u64,
    /// The maximum after any event of the column.
    pub max: u64,
    /// The value after the column's last event.
    pub last: u64,
}

impl Extremes {
    /// `self` followed by `next` (a later stretch of the same series).
    fn then(self, next: Extremes) -> Extremes {
        Extremes {
            enter: self.enter,
            min: self.min.min(next.min),
            max: self.max.max(next.max),
            last: next.last,
        }
    }

    #[inline]
    fn start(enter: u64, v: u64) -> Self {
        Extremes {
            enter,
            min: v,
            max: v,
            last: v,
        }
    }

    #[inline]
    fn add(&mut self, v: u64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.last = v;
    }
}

/// A column of the timeline that has at least one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Column {
    /// Index of the column, `0..n`.
    pub index: usize,
    /// Start of the column, nanoseconds after the timeline's `first_ts`.
    pub start_ns: u64,
    /// Events in the column.
    pub events: u64,
    /// Live heap bytes.
    pub heap: Extremes,
    /// Mapped bytes (page-rounded).
    pub mapped: Extremes,
}

/// Most columns a [`Timeline`] may have.
const MAX_COLUMNS: usize = 1 << 20;

/// A [`Timeline`] was asked for with no columns, or more than 1 Mi.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid option: a timeline needs between 1 and {max} columns (got {columns})",
    max = MAX_COLUMNS
)]
pub struct InvalidTimeline {
    /// The number of columns asked for.
    pub columns: usize,
}

/// Downsampled heap and mapped bytes over time; see the module docs.
#[derive(Debug, Clone)]
pub struct Timeline {
    first_ts: u64,
    span_ns: u64,
    /// Columns per nanosecond.
    scale: f64,
    cols: Vec<Option<Column>>,
    heap: u64,
    mapped: u64,
    /// The column of the previous sample and the timestamps it covers, `[lo, hi)`.
    cur: usize,
    cur_lo: u64,
    cur_hi: u64,
    /// Doubles its span instead of folding late samples into the last column.
    growing: bool,
    /// Whether a sample has set `first_ts` (growing timelines start at their first sample).
    started: bool,
}

/// A growing timeline stops doubling here (and keeps later samples in its last column).
const MAX_GROWING_SPAN: u64 = 1 << 62;

impl Timeline {
    /// A timeline of `columns` columns over `[first_ts, last_ts]` (nanoseconds). Samples outside
    /// the range go to the first or last column. Errors if `columns` is 0 or above 1 Mi.
    pub fn new(first_ts: u64, last_ts: u64, columns: usize) -> Result<Self, InvalidTimeline> {
        if columns == 0 || columns > MAX_COLUMNS {
            return Err(InvalidTimeline { columns });
        }
        // An instant still gets a span, so that every sample lands in a column.
        let span_ns = last_ts.saturating_sub(first_ts).max(1);
        let mut t = Timeline {
            first_ts,
            span_ns,
            scale: columns as f64 / span_ns as f64,
            cols: vec![None; columns],
            heap: 0,
            mapped: 0,
            cur: 0,
            cur_lo: 0,
            cur_hi: 0,
            growing: false,
            started: true,
        };
        t.set_current(0);
        Ok(t)
    }

    /// A timeline of `columns` columns whose range starts at the first sample pushed and grows
    /// to cover the last (see the module docs). Errors as [`Timeline::new`].
    pub fn growing(columns: usize) -> Result<Self, InvalidTimeline> {
        let mut t = Timeline::new(0, columns as u64, columns)?;
        t.growing = true;
        t.started = false;
        Ok(t)
    }

    /// Timestamp of the start of column 0, nanoseconds (CLOCK_MONOTONIC for recordings).
    pub fn first_ts(&self) -> u64 {
        self.first_ts
    }

    /// Doubles the span: column `k` becomes the merge of columns `2k` and `2k + 1`.
    #[cold]
    fn double(&mut self) {
        let n = self.cols.len();
        let old = std::mem::replace(&mut self.cols, vec![None; n]);
        self.span_ns *= 2;
        self.scale = n as f64 / self.span_ns as f64;
        for (k, c) in old.into_iter().enumerate() {
            let Some(c) = c else { continue };
            let j = k / 2;
            let start_ns = self.col_start(j);
            self.cols[j] = Some(match self.cols[j].take() {
                None => Column {
                    index: j,
                    start_ns,
                    ..c
                },
                Some(a) => Column {
                    index: j,
                    start_ns,
                    events: a.events + c.events,
                    heap: a.heap.then(c.heap),
                    mapped: a.mapped.then(c.mapped),
                },
            });
        }
    }

    /// Number of columns.
    pub fn width(&self) -> usize {
        self.cols.len()
    }

    /// The time range the columns cover, nanoseconds (`last_ts - first_ts`, at least 1).
    pub fn span_ns(&self) -> u64 {
        self.span_ns
    }

    /// Start of column `k`, nanoseconds after `first_ts` (exact integer division).
    fn col_start(&self, k: usize) -> u64 {
        (k as u128 * self.span_ns as u128 / self.cols.len() as u128) as u64
    }

    fn set_current(&mut self, k: usize) {
        self.cur = k;
        self.cur_lo = self.first_ts.saturating_add(self.col_start(k));
        self.cur_hi = if k + 1 == self.cols.len() {
            if self.growing {
                self.first_ts.saturating_add(self.span_ns)
            } else {
                u64::MAX
            }
        } else {
            self.first_ts.saturating_add(self.col_start(k + 1))
        };
    }

    #[cold]
    fn locate(&mut self, ts: u64) {
        if !self.started {
            self.started = true;
            self.first_ts = ts;
        }
        let off = ts.saturating_sub(self.first_ts);
        while self.growing && off >= self.span_ns {
            if self.span_ns >= MAX_GROWING_SPAN {
                self.growing = false;
            } else {
                self.double();
            }
        }
        let mut k = ((off as f64 * self.scale) as usize).min(self.cols.len() - 1);
        // The float estimate can be one off at a boundary: settle it with the exact starts.
        while k > 0 && self.col_start(k) > off {
            k -= 1;
        }
        while k + 1 < self.cols.len() && self.col_start(k + 1) <= off {
            k += 1;
        }
        self.set_current(k);
    }

    /// Records that after the event at `ts` there were `heap` live heap bytes and `mapped`
    /// mapped bytes.
    #[inline]
    pub fn push(&mut self, ts: u64, heap: u64, mapped: u64) {
        if ts < self.cur_lo || ts >= self.cur_hi {
            self.locate(ts);
        }
        let (enter_heap, enter_mapped) = (self.heap, self.mapped);
        // Cheaper than `col_start` (a u128 division) on every event.
        let start_ns = self.cur_lo.saturating_sub(self.first_ts);
        let index = self.cur;
        match &mut self.cols[index] {
            Some(c) => {
                c.events += 1;
                c.heap.add(heap);
                // Mapped bytes rarely change (never with the allocator recorder): the column's
                // `last` value again changes nothing (min <= last <= max).
                if mapped != c.mapped.last {
                    c.mapped.add(mapped);
                }
            }
            slot @ None => {
                *slot = Some(Column {
                    index,
                    start_ns,
                    events: 1,
                    heap: Extremes::start(enter_heap, heap),
                    mapped: Extremes::start(enter_mapped, mapped),
                })
            }
        }
        self.heap = heap;
        self.mapped = mapped;
    }

    /// The timestamps `[lo, hi)` of the column the last sample went to: a sample stamped in
    /// them goes to that column too.
    pub(super) fn current_range(&self) -> (u64, u64) {
        (self.cur_lo, self.cur_hi)
    }

    /// Records `events` samples in the current column, after one [`Timeline::push`] there, with
    /// mapped bytes unchanged and heap bytes whose least is `min`, most `max` and last `last`:
    /// what pushing each of them gives (the writer's runs, `runs.rs`). `min` may be `u64::MAX`
    /// and `max` 0 (no sample went below or above the column's extremes).
    pub(super) fn extend_current(&mut self, events: u64, min: u64, max: u64, last: u64) {
        let c = self.cols[self.cur]
            .as_mut()
            .expect("a run follows a sample in its column");
        c.events += events;
        c.heap.min = c.heap.min.min(min);
        c.heap.max = c.heap.max.max(max);
        c.heap.last = last;
        self.heap = last;
    }

    /// Feeds `e` to `analyzer` and records the live heap and mapped bytes after it.
    #[inline]
    pub fn update(&mut self, analyzer: &mut Analyzer, e: &Event) {
        analyzer.update(e);
        self.push(e.ts, analyzer.live_bytes(), analyzer.mapped_bytes());
    }

    /// The columns that have events, in time order.
    pub fn columns(&self) -> impl Iterator<Item = &Column> {
        self.cols.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_visited_again_keeps_its_mapped_extremes() {
        // Back to column 0 with the mapped bytes of column 5: unchanged since the previous
        // sample, yet new to column 0.
        let mut t = Timeline::new(1_000, 1_999, 10).unwrap();
        t.push(1_000, 1, 4096);
        t.push(1_500, 1, 0);
        t.push(1_001, 1, 0);
        let first = t.columns().next().copied().unwrap();
        assert_eq!((first.index, first.events), (0, 2));
        assert_eq!(
            first.mapped,
            Extremes {
                enter: 0,
                min: 0,
                max: 4096,
                last: 0
            }
        );
    }

    #[test]
    fn keeps_extremes_and_steps() {
        let mut t = Timeline::new(1_000, 1_999, 10).unwrap();
        // Column 0: [1000, 1099) (column k starts 999*k/10 ns in); a spike to 500.
        t.push(1_000, 10, 0);
        t.push(1_050, 500, 4096);
        t.push(1_098, 20, 4096);
        // Column 5: [1499, 1598).
        t.push(1_500, 5, 0);
        // Last column, and a late sample beyond the range.
        t.push(1_999, 7, 0);
        t.push(5_000, 3, 0);
        let cols: Vec<_> = t.columns().copied().collect();
        assert_eq!(cols.len(), 3);
        assert_eq!((cols[0].index, cols[0].start_ns, cols[0].events), (0, 0, 3));
        assert_eq!(
            cols[0].heap,
            Extremes {
                enter: 0,
                min: 10,
                max: 500,
                last: 20
            }
        );
        assert_eq!((cols[0].mapped.max, cols[0].mapped.last), (4096, 4096));
        assert_eq!((cols[1].index, cols[1].start_ns), (5, 499));
        assert_eq!(
            cols[1].heap,
            Extremes {
                enter: 20,
                min: 5,
                max: 5,
                last: 5
            }
        );
        assert_eq!((cols[2].index, cols[2].events), (9, 2));
        assert_eq!(
            (cols[2].heap.enter, cols[2].heap.min, cols[2].heap.last),
            (5, 3, 3)
        );
    }

    /// Growing from the first sample gives the timeline of the final range, column for column.
    #[test]
    fn growing_equals_the_fixed_timeline_of_its_final_span() {
        let samples: Vec<(u64, u64, u64)> = (0..5_000u64)
            .map(|i| {
                (
                    1_000_000 + i * i * 37 % 9_999_991 + i,
                    (i * 7919) % 100_003,
                    i % 4 * 4096,
                )
            })
            .collect();
        let mut sorted = samples.clone();
        sorted.sort();
        let mut g = Timeline::growing(64).unwrap();
        for &(ts, h, m) in &sorted {
            g.push(ts, h, m);
        }
        let first = sorted[0].0;
        let last = sorted.last().unwrap().0;
        assert_eq!(g.first_ts(), first);
        assert!(g.span_ns() > last - first && g.span_ns() <= 2 * (last - first));
        assert!(
            g.columns().count() >= 32,
            "at least half of the columns are in range"
        );
        let mut f = Timeline::new(first, first + g.span_ns(), 64).unwrap();
        for &(ts, h, m) in &sorted {
            f.push(ts, h, m);
        }
        let (gc, fc): (Vec<_>, Vec<_>) = (
            g.columns().copied().collect(),
            f.columns().copied().collect(),
        );
        assert_eq!(gc, fc);
        let peak = sorted.iter().map(|s| s.1).max().unwrap();
        assert_eq!(gc.iter().map(|c| c.heap.max).max(), Some(peak));
        // One sample: an instant, in column 0.
        let mut one = Timeline::growing(8).unwrap();
        one.push(42, 1, 0);
        assert_eq!((one.first_ts(), one.columns().count()), (42, 1));
    }

    #[test]
    fn boundaries_are_exact() {
        // 3 columns over 10 ns: starts 0, 3, 6 (10*k/3 rounded down).
        let mut t = Timeline::new(0, 10, 3).unwrap();
        for ts in 0..=10 {
            t.push(ts, ts, 0);
        }
        let got: Vec<(usize, u64, u64)> = t
            .columns()
            .map(|c| (c.index, c.heap.min, c.heap.max))
            .collect();
        assert_eq!(got, vec![(0, 0, 2), (1, 3, 5), (2, 6, 10)]);
        assert!(Timeline::new(0, 10, 0).is_err());
    }
}
