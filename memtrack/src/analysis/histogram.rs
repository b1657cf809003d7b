//! Allocations by size class: how many blocks of which sizes a program asks for.
//!
//! Classes are powers of two: class 0 holds sizes `0..=16` bytes, class `k ≥ 1` holds
//! `2^(k+3) + 1 ..= 2^(k+4)` (`17..=32`, `33..=64`, …), the last class ends at `u64::MAX`.
//! Every allocation of [`Totals`](super::Totals) (malloc, calloc, aligned family, the new block
//! of a realloc) falls in exactly one class, so the classes' allocations add up to
//! `Totals::allocations` and their bytes to `Totals::bytes_allocated`.

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// Number of size classes: `[0, 16]`, then `(16, 32]` … `(2^63, 2^64 - 1]`.
const CLASSES: usize = 61;

/// The class of an allocation of `size` bytes.
#[inline]
fn class_of(size: u64) -> usize {
    if size <= 16 {
        0
    } else {
        // (size - 1) has its top bit at position b (0-based): size is in (2^b, 2^(b+1)].
        (64 - (size - 1).leading_zeros() as usize) - 4
    }
}

/// The inclusive byte bounds `(min, max)` of class `k`.
fn bounds(k: usize) -> (u64, u64) {
    if k == 0 {
        (0, 16)
    } else {
        let max = if k + 4 >= 64 {
            u64::MAX
        } else {
            1u64 << (k + 4)
        };
        ((1u64 << (k + 3)) + 1, max)
    }
}

/// One non-empty size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SizeClass {
    /// Smallest size in the class, bytes (inclusive).
    pub min: u64,
    /// Largest size in the class, bytes (inclusive).
    pub max: u64,
    /// Allocations whose size is in `min..=max`.
    pub allocations: u64,
    /// Sum of their sizes, bytes (saturating).
    pub bytes: u64,
}

/// Counts allocations per size class from events fed in order. Kept apart from
/// [`Analyzer`](super::Analyzer) so that computing totals alone pays nothing for it.
#[derive(Debug, Clone)]
pub struct SizeHistogram {
    allocations: [u64; CLASSES],
    bytes: [u64; CLASSES],
}

impl Default for SizeHistogram {
    fn default() -> Self {
        Self {
            allocations: [0; CLASSES],
            bytes: [0; CLASSES],
        }
    }
}

impl SizeHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one event; only allocations (by the rules of [`Totals`](super::Totals)) count.
    #[inline]
    pub fn update(&mut self, e: &Event) {
        if let Some((_, size)) = e.kind.heap().allocated {
            self.add(size);
        }
    }

    /// Counts one allocation of `size` bytes.
    #[inline(always)]
    pub(crate) fn add(&mut self, size: u64) {
        let k = class_of(size);
        self.allocations[k] += 1;
        self.bytes[k] = self.bytes[k].saturating_add(size);
    }

    /// Feeds a slice of events, in order.
    pub fn update_all(&mut self, events: &[Event]) {
        for e in events {
            self.update(e);
        }
    }

    /// The non-empty classes, smallest sizes first.
    pub fn classes(&self) -> Vec<SizeClass> {
        (0..CLASSES)
            .filter(|&k| self.allocations[k] > 0)
            .map(|k| {
                let (min, max) = bounds(k);
                SizeClass {
                    min,
                    max,
                    allocations: self.allocations[k],
                    bytes: self.bytes[k],
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    #[test]
    fn class_bounds_tile_the_sizes() {
        for k in 0..CLASSES {
            let (min, max) = bounds(k);
            assert_eq!(class_of(min), k, "min of class {k}");
            assert_eq!(class_of(max), k, "max of class {k}");
            if k + 1 < CLASSES {
                assert_eq!(
                    bounds(k + 1).0,
                    max + 1,
                    "class {k} ends where {} starts",
                    k + 1
                );
            }
        }
        assert_eq!(bounds(CLASSES - 1).1, u64::MAX);
        assert_eq!(bounds(1), (17, 32));
        assert_eq!(bounds(7), (1025, 2048));
    }

    #[test]
    fn counts_allocations_only() {
        let mut h = SizeHistogram::new();
        let ev = |kind| Event::new(0, 1, 1, kind);
        h.update(&ev(EventKind::Malloc { addr: 1, size: 0 }));
        h.update(&ev(EventKind::Calloc { addr: 2, size: 16 }));
        h.update(&ev(EventKind::Malloc { addr: 3, size: 17 }));
        h.update(&ev(EventKind::Realloc {
            old_addr: 3,
            new_addr: 4,
            size: 1024,
        }));
        h.update(&ev(EventKind::Realloc {
            old_addr: 4,
            new_addr: 0,
            size: 0,
        }));
        h.update(&ev(EventKind::Free { addr: 2 }));
        h.update(&ev(EventKind::Mmap {
            addr: 0x1000,
            size: 1 << 20,
        }));
        let c = h.classes();
        let rows: Vec<(u64, u64, u64, u64)> = c
            .iter()
            .map(|c| (c.min, c.max, c.allocations, c.bytes))
            .collect();
        assert_eq!(
            rows,
            vec![(0, 16, 2, 16), (17, 32, 1, 17), (513, 1024, 1, 1024)]
        );
    }
}
