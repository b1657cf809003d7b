//! Limits for tests: fail when a session allocated more than allowed (see [`Limits`]).

use std::fmt;

use crate::human;
use crate::totals::Totals;

/// What a session may allocate, for tests; empty (no limit) by default.
///
/// Set with `#[memtrack(max_allocations = N, max_bytes = B, max_peak = P, max_blocks = K,
/// no_leaks)]` (or `allocations = N`, `min_allocations = N`) or the same methods on
/// `SessionBuilder`, and checked against the session's totals (and lost events) when it ends.
/// The numbers are the report's (the accounting rules of [`Totals`]):
/// - `max_allocations`: [`Totals::allocations`](crate::totals::Totals::allocations), successful calls
///   returning a heap block (a `realloc` is one allocation);
/// - `allocations = N` (an expectation, [`Limits::expect_allocations`]): exactly `N` of them,
///   for tests that pin a count; `min_allocations`: at least `N` (e.g. that a cache was
///   bypassed). `allocations` cannot be combined with the other two, and `min_allocations`
///   may not exceed `max_allocations` (a compile error on the attribute,
///   `Error::InvalidOption` from the builder's `start`);
/// - `max_bytes`: [`Totals::bytes_allocated`](crate::totals::Totals::bytes_allocated), the sum of the
///   sizes of those allocations (bytes allocated in total, not net of frees);
/// - `max_peak`: [`Totals::peak_live_bytes`](crate::totals::Totals::peak_live_bytes), the maximum of
///   live heap bytes (blocks allocated during the session and not yet freed);
/// - `max_blocks`: [`Totals::peak_live_blocks`](crate::totals::Totals::peak_live_blocks), the most
///   heap blocks live at once;
/// - `no_leaks`: [`Totals::live_blocks_at_end`](crate::totals::Totals::live_blocks_at_end) is 0: every
///   heap block allocated during the session was freed by its end. Heap only: mapped regions
///   (`mmap`) are not counted, and a value a `#[memtrack]` function returns is still live when
///   its session ends (the caller frees it), so it counts.
///
/// A limit passes when the number equals it (`max_allocations = 3` allows 3). Every violated
/// limit is reported, not only the first, each with its measured number.
///
/// How a violation fails:
/// - `Session::finish` returns `Error::LimitExceeded`, which keeps the session's `Report`
///   (the artifact is written too). A session dropped without `finish` only prints that
///   error: `Drop` never panics.
/// - A `#[memtrack]` function panics when its body ends, with a message such as
///   `memtrack: parse — allocations 1,234 > max_allocations 1,000; live at end 3 blocks (96 B)
///   with no_leaks → target/memtrack/parse.memtrack`, so a `#[test]` fails. If the body is
///   already panicking, the message is printed on stderr instead (a second panic would abort).
///
/// Limits that cannot be proven fail, never pass silently:
/// - a session that lost events (the recorder's buffer overflowed) fails any limit
///   ([`Violation::Incomplete`]): its numbers are incomplete;
/// - a limited `#[memtrack]` function whose recording cannot start (no privileges, unwritable
///   output directory) panics with the reason and its fix before the body runs; only functions
///   without limits run unrecorded (with the error on stderr).
///
/// Parallel tests: sessions of one process take turns (`#[memtrack]` functions wait for the
/// running session to end), and by default each records only the thread that started it and
/// the threads spawned from it ([`Scope`](crate::Scope)), so exact limits hold beside other
/// tests that allocate at the same time. With the allocator recorder, spawn such threads
/// through [`in_session`](crate::in_session).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    max_allocations: Option<u64>,
    exact_allocations: Option<u64>,
    min_allocations: Option<u64>,
    max_blocks: Option<u64>,
    max_bytes: Option<u64>,
    max_peak: Option<u64>,
    no_leaks: bool,
}

/// Limits no session can keep (an exact count with a minimum or maximum, a minimum above the
/// maximum): the message names both and the fix. A session's `start` returns it as
/// `Error::InvalidOption`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid option: {0}")]
pub struct InvalidLimits(pub String);

/// One limit a session did not keep, with the measured numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// The session lost events (the recorder's buffer overflowed): its numbers are incomplete,
    /// so no limit can be proven kept.
    Incomplete {
        /// Events lost.
        lost_events: u64,
    },
    /// More allocations than `max_allocations`.
    Allocations {
        /// Allocations made.
        measured: u64,
        /// The limit.
        limit: u64,
    },
    /// More bytes allocated than `max_bytes`.
    Bytes {
        /// Bytes allocated.
        measured: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// A peak of live heap bytes above `max_peak`.
    Peak {
        /// Peak live heap bytes.
        measured: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// Not exactly the expected number of allocations (`allocations = N`).
    AllocationsNotExpected {
        /// Allocations made.
        measured: u64,
        /// The expected number.
        expected: u64,
    },
    /// Fewer allocations than `min_allocations`.
    TooFewAllocations {
        /// Allocations made.
        measured: u64,
        /// The minimum.
        min: u64,
    },
    /// More heap blocks live at once than `max_blocks`.
    Blocks {
        /// The most live heap blocks at once.
        measured: u64,
        /// The limit.
        limit: u64,
    },
    /// Heap blocks still live at the end, with `no_leaks`.
    Leaks {
        /// Live heap blocks at the end.
        blocks: u64,
        /// Their bytes.
        bytes: u64,
    },
}

impl Limits {
    /// No limits.
    pub fn new() -> Self {
        Limits::default()
    }

    /// At most `n` allocations ([`Totals::allocations`](crate::totals::Totals::allocations); `n` passes).
    pub fn max_allocations(mut self, n: u64) -> Self {
        self.max_allocations = Some(n);
        self
    }

    /// Exactly `n` allocations ([`Totals::allocations`](crate::totals::Totals::allocations)): an expectation
    /// for tests that pin a count, `allocations = N` on `#[memtrack]`; see the type docs.
    pub fn expect_allocations(mut self, n: u64) -> Self {
        self.exact_allocations = Some(n);
        self
    }

    /// At least `n` allocations ([`Totals::allocations`](crate::totals::Totals::allocations)).
    pub fn min_allocations(mut self, n: u64) -> Self {
        self.min_allocations = Some(n);
        self
    }

    /// At most `n` heap blocks live at once ([`Totals::peak_live_blocks`](crate::totals::Totals::peak_live_blocks);
    /// `n` passes).
    pub fn max_blocks(mut self, n: u64) -> Self {
        self.max_blocks = Some(n);
        self
    }

    /// `Err` with the reason and the fix if no session can keep these limits: an exact count
    /// combined with a minimum or maximum, or a minimum above the maximum.
    ///
    /// # Errors
    ///
    /// [`InvalidLimits`], naming the two limits that conflict.
    ///
    /// # Examples
    ///
    /// ```
    /// use memtrack::Limits;
    ///
    /// assert!(Limits::new().max_allocations(10).no_leaks().validate().is_ok());
    /// assert!(Limits::new().expect_allocations(3).max_allocations(5).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), InvalidLimits> {
        let bad = |m: String| Err(InvalidLimits(m));
        if let Some(n) = self.exact_allocations {
            for (name, other) in [
                ("max_allocations", self.max_allocations),
                ("min_allocations", self.min_allocations),
            ] {
                if let Some(o) = other {
                    return bad(format!(
                        "expect_allocations({n}) and {name}({o}) are both set: an exact count \
                         already bounds the allocations; keep one"
                    ));
                }
            }
        }
        if let (Some(min), Some(max)) = (self.min_allocations, self.max_allocations)
            && min > max
        {
            return bad(format!(
                "min_allocations({min}) is above max_allocations({max}): no session can keep \
                 both; lower the minimum or raise the maximum"
            ));
        }
        Ok(())
    }

    /// At most `bytes` bytes allocated in total, not net of frees
    /// ([`Totals::bytes_allocated`](crate::totals::Totals::bytes_allocated)).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Live heap bytes never above `bytes`: checks the peak,
    /// [`Totals::peak_live_bytes`](crate::totals::Totals::peak_live_bytes).
    pub fn max_peak(mut self, bytes: u64) -> Self {
        self.max_peak = Some(bytes);
        self
    }

    /// No heap block allocated during the session may be live at its end
    /// ([`Totals::live_blocks_at_end`](crate::totals::Totals::live_blocks_at_end) is 0).
    pub fn no_leaks(mut self) -> Self {
        self.no_leaks = true;
        self
    }

    /// Whether no limit is set (then [`Limits::check`] never reports anything).
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The limits that `totals` (and `lost_events`, events the recorder dropped) violate, in
    /// the order incomplete, allocations (exact, minimum, maximum), bytes, peak, blocks, leaks;
    /// empty if they keep them all (or if there are none).
    pub fn check(&self, totals: &Totals, lost_events: u64) -> Vec<Violation> {
        let mut out = Vec::new();
        if self.is_empty() {
            return out;
        }
        let t = totals;
        if lost_events > 0 {
            out.push(Violation::Incomplete { lost_events });
        }
        let over = |limit: Option<u64>, measured: u64| limit.filter(|&l| measured > l);
        if let Some(expected) = self.exact_allocations.filter(|&n| n != t.allocations) {
            out.push(Violation::AllocationsNotExpected {
                measured: t.allocations,
                expected,
            });
        }
        if let Some(min) = self.min_allocations.filter(|&n| t.allocations < n) {
            out.push(Violation::TooFewAllocations {
                measured: t.allocations,
                min,
            });
        }
        if let Some(limit) = over(self.max_allocations, t.allocations) {
            out.push(Violation::Allocations {
                measured: t.allocations,
                limit,
            });
        }
        if let Some(limit) = over(self.max_bytes, t.bytes_allocated) {
            out.push(Violation::Bytes {
                measured: t.bytes_allocated,
                limit,
            });
        }
        if let Some(limit) = over(self.max_peak, t.peak_live_bytes) {
            out.push(Violation::Peak {
                measured: t.peak_live_bytes,
                limit,
            });
        }
        if let Some(limit) = over(self.max_blocks, t.peak_live_blocks) {
            out.push(Violation::Blocks {
                measured: t.peak_live_blocks,
                limit,
            });
        }
        if self.no_leaks && t.live_blocks_at_end > 0 {
            out.push(Violation::Leaks {
                blocks: t.live_blocks_at_end,
                bytes: t.live_bytes_at_end,
            });
        }
        out
    }
}

/// The limits as written in `#[memtrack(...)]`: `max_allocations 1,000, no_leaks`.
impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.exact_allocations {
            parts.push(format!("allocations = {}", human::count(n)));
        }
        if let Some(n) = self.min_allocations {
            parts.push(format!("min_allocations {}", human::count(n)));
        }
        if let Some(n) = self.max_allocations {
            parts.push(format!("max_allocations {}", human::count(n)));
        }
        if let Some(n) = self.max_bytes {
            parts.push(format!("max_bytes {} B", human::count(n)));
        }
        if let Some(n) = self.max_peak {
            parts.push(format!("max_peak {} B", human::count(n)));
        }
        if let Some(n) = self.max_blocks {
            parts.push(format!("max_blocks {}", human::count(n)));
        }
        if self.no_leaks {
            parts.push("no_leaks".into());
        }
        if parts.is_empty() {
            parts.push("no limits".into());
        }
        f.write_str(&parts.join(", "))
    }
}

/// Exact numbers with thousands separators (a limit is exact, so `1.1 KiB` would not do):
/// `allocations 1,234 > max_allocations 1,000`.
impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = human::count;
        match *self {
            Violation::Incomplete { lost_events } => write!(
                f,
                "{} events LOST: the numbers are incomplete and cannot prove the limits \
                 (raise the ring buffer size)",
                c(lost_events)
            ),
            Violation::Allocations { measured, limit } => {
                write!(
                    f,
                    "allocations {} > max_allocations {}",
                    c(measured),
                    c(limit)
                )
            }
            Violation::AllocationsNotExpected { measured, expected } => write!(
                f,
                "allocations {}, expected exactly {} (allocations = {})",
                c(measured),
                c(expected),
                c(expected)
            ),
            Violation::TooFewAllocations { measured, min } => write!(
                f,
                "allocations {} < min_allocations {}",
                c(measured),
                c(min)
            ),
            Violation::Blocks { measured, limit } => write!(
                f,
                "peak live blocks {} > max_blocks {}",
                c(measured),
                c(limit)
            ),
            Violation::Bytes { measured, limit } => write!(
                f,
                "bytes allocated {} B > max_bytes {} B",
                c(measured),
                c(limit)
            ),
            Violation::Peak { measured, limit } => {
                write!(f, "peak {} B > max_peak {} B", c(measured), c(limit))
            }
            Violation::Leaks { blocks, bytes } => write!(
                f,
                "live at end {} block{} ({} B) with no_leaks",
                c(blocks),
                if blocks == 1 { "" } else { "s" },
                c(bytes)
            ),
        }
    }
}

/// The violations joined by `; `.
pub(crate) fn describe(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a session measured, as far as limits are concerned.
    struct Sample {
        totals: Totals,
        lost_events: u64,
    }

    fn report(allocations: u64, bytes: u64, peak: u64, live: (u64, u64), lost: u64) -> Sample {
        let totals = Totals {
            allocations,
            bytes_allocated: bytes,
            peak_live_bytes: peak,
            live_blocks_at_end: live.0,
            live_bytes_at_end: live.1,
            ..Totals::default()
        };
        Sample {
            totals,
            lost_events: lost,
        }
    }

    impl Limits {
        fn check_sample(&self, s: &Sample) -> Vec<Violation> {
            self.check(&s.totals, s.lost_events)
        }
    }

    #[test]
    fn the_limit_itself_passes_one_more_fails() {
        let l = Limits::new()
            .max_allocations(3)
            .max_bytes(1164)
            .max_peak(1000)
            .no_leaks();
        assert_eq!(l.check_sample(&report(3, 1164, 1000, (0, 0), 0)), vec![]);
        assert_eq!(
            l.check_sample(&report(4, 1165, 1001, (2, 96), 0)),
            vec![
                Violation::Allocations {
                    measured: 4,
                    limit: 3
                },
                Violation::Bytes {
                    measured: 1165,
                    limit: 1164
                },
                Violation::Peak {
                    measured: 1001,
                    limit: 1000
                },
                Violation::Leaks {
                    blocks: 2,
                    bytes: 96
                },
            ]
        );
    }

    #[test]
    fn unset_limits_check_nothing() {
        let r = report(u64::MAX, u64::MAX, u64::MAX, (9, 9), 7);
        assert!(Limits::new().is_empty());
        assert_eq!(Limits::new().check_sample(&r), vec![]);
        // Only the limits that are set: a leak is no violation without `no_leaks`.
        assert_eq!(
            Limits::new()
                .max_peak(u64::MAX)
                .check_sample(&report(1, 1, 1, (5, 5), 0)),
            vec![]
        );
        assert_eq!(
            Limits::new()
                .max_allocations(0)
                .check_sample(&report(0, 0, 0, (0, 0), 0)),
            vec![]
        );
    }

    #[test]
    fn lost_events_fail_any_limit() {
        let r = report(1, 10, 10, (0, 0), 5);
        let v = Limits::new().max_allocations(100).check_sample(&r);
        assert_eq!(v, vec![Violation::Incomplete { lost_events: 5 }]);
        assert!(v[0].to_string().contains("5 events LOST"), "{}", v[0]);
        assert!(v[0].to_string().contains("incomplete"), "{}", v[0]);
    }

    #[test]
    fn every_violation_is_described_with_exact_numbers() {
        let r = report(1234, 2_000_000, 10, (3, 96), 0);
        let l = Limits::new()
            .max_allocations(1000)
            .max_bytes(1_048_576)
            .no_leaks();
        assert_eq!(
            describe(&l.check_sample(&r)),
            "allocations 1,234 > max_allocations 1,000; \
             bytes allocated 2,000,000 B > max_bytes 1,048,576 B; \
             live at end 3 blocks (96 B) with no_leaks"
        );
        let one = report(0, 0, 0, (1, 8), 0);
        assert_eq!(
            describe(&Limits::new().no_leaks().check_sample(&one)),
            "live at end 1 block (8 B) with no_leaks"
        );
        assert_eq!(
            l.max_peak(4096).to_string(),
            "max_allocations 1,000, max_bytes 1,048,576 B, max_peak 4,096 B, no_leaks"
        );
    }

    #[test]
    fn expectations_and_max_blocks() {
        let mut r = report(3, 10, 10, (0, 0), 0);
        r.totals.peak_live_blocks = 5;
        let exact = Limits::new().expect_allocations(3).max_blocks(5);
        assert_eq!(exact.check_sample(&r), vec![]);
        assert_eq!(
            Limits::new()
                .expect_allocations(4)
                .max_blocks(4)
                .check_sample(&r),
            vec![
                Violation::AllocationsNotExpected {
                    measured: 3,
                    expected: 4
                },
                Violation::Blocks {
                    measured: 5,
                    limit: 4
                },
            ]
        );
        let v = Limits::new()
            .min_allocations(4)
            .max_allocations(9)
            .check_sample(&r);
        assert_eq!(
            describe(&v),
            "allocations 3 < min_allocations 4",
            "min passes at its value, fails below"
        );
        assert_eq!(Limits::new().min_allocations(3).check_sample(&r), vec![]);
        assert_eq!(
            describe(
                &Limits::new()
                    .expect_allocations(2)
                    .max_blocks(1)
                    .check_sample(&r)
            ),
            "allocations 3, expected exactly 2 (allocations = 2); peak live blocks 5 > max_blocks 1"
        );
        assert_eq!(exact.to_string(), "allocations = 3, max_blocks 5");
    }

    #[test]
    fn contradictory_limits_are_refused_with_the_fix() {
        let msg = |l: Limits| l.validate().unwrap_err().to_string();
        assert_eq!(
            msg(Limits::new().expect_allocations(3).max_allocations(2)),
            "invalid option: expect_allocations(3) and max_allocations(2) are both set: an exact \
             count already bounds the allocations; keep one"
        );
        assert!(msg(Limits::new().expect_allocations(3).min_allocations(3)).contains("keep one"));
        assert_eq!(
            msg(Limits::new().min_allocations(5).max_allocations(4)),
            "invalid option: min_allocations(5) is above max_allocations(4): no session can keep \
             both; lower the minimum or raise the maximum"
        );
        assert!(
            Limits::new()
                .min_allocations(4)
                .max_allocations(4)
                .validate()
                .is_ok()
        );
    }
}
