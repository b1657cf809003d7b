//! Limits for tests: fail when a session allocated more than allowed (see [`Limits`]).

use std::fmt;

use crate::human;
use crate::session::Report;

/// What a session may allocate, for tests; empty (no limit) by default.
///
/// Set with `#[memtrack(max_allocations = N, max_bytes = B, max_peak = P, no_leaks)]` or the
/// same methods on [`SessionBuilder`](crate::SessionBuilder), and checked against the session's
/// [`Report`] when it ends. The numbers are the report's (the accounting rules of
/// [`Totals`](crate::Totals)):
/// - `max_allocations`: [`Totals::allocations`](crate::Totals::allocations), successful calls
///   returning a heap block (a `realloc` is one allocation);
/// - `max_bytes`: [`Totals::bytes_allocated`](crate::Totals::bytes_allocated), the sum of the
///   sizes of those allocations (bytes allocated in total, not net of frees);
/// - `max_peak`: [`Totals::peak_live_bytes`](crate::Totals::peak_live_bytes), the maximum of
///   live heap bytes (blocks allocated during the session and not yet freed);
/// - `no_leaks`: [`Totals::live_blocks_at_end`](crate::Totals::live_blocks_at_end) is 0: every
///   heap block allocated during the session was freed by its end. Heap only: mapped regions
///   (`mmap`) are not counted, and a value a `#[memtrack]` function returns is still live when
///   its session ends (the caller frees it), so it counts.
///
/// A limit passes when the number equals it (`max_allocations = 3` allows 3). Every violated
/// limit is reported, not only the first, each with its measured number.
///
/// How a violation fails:
/// - [`Session::finish`](crate::Session::finish) returns
///   [`Error::LimitExceeded`](crate::Error::LimitExceeded), which keeps the [`Report`] (the
///   artifact is written too). A session dropped without `finish` only prints that error:
///   `Drop` never panics.
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
/// running session to end), but the eBPF backend records the whole process, so allocations of
/// other threads during a session (libtest's, tests without `#[memtrack]`) are counted. Give
/// limits in parallel tests headroom, or run exact limits with `--test-threads=1` or in a
/// `harness = false` test binary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    max_allocations: Option<u64>,
    max_bytes: Option<u64>,
    max_peak: Option<u64>,
    no_leaks: bool,
}

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

    /// At most `n` allocations (`n` passes).
    pub fn max_allocations(mut self, n: u64) -> Self {
        self.max_allocations = Some(n);
        self
    }

    /// At most `bytes` bytes allocated in total (not net of frees).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Live heap bytes never above `bytes`.
    pub fn max_peak(mut self, bytes: u64) -> Self {
        self.max_peak = Some(bytes);
        self
    }

    /// No heap block allocated during the session may be live at its end.
    pub fn no_leaks(mut self) -> Self {
        self.no_leaks = true;
        self
    }

    /// Whether no limit is set (then [`Limits::check`] never reports anything).
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The limits `report` violates, in the order incomplete, allocations, bytes, peak, leaks;
    /// empty if it keeps them all (or if there are no limits).
    pub fn check(&self, report: &Report) -> Vec<Violation> {
        let mut out = Vec::new();
        if self.is_empty() {
            return out;
        }
        let t = &report.totals;
        if report.lost_events > 0 {
            out.push(Violation::Incomplete {
                lost_events: report.lost_events,
            });
        }
        let over = |limit: Option<u64>, measured: u64| limit.filter(|&l| measured > l);
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
        if self.no_leaks && t.live_blocks_at_end > 0 {
            out.push(Violation::Leaks {
                blocks: t.live_blocks_at_end,
                bytes: t.live_bytes_at_end,
            });
        }
        out
    }

    /// `Ok(report)` if it keeps the limits, else [`Error::LimitExceeded`](crate::Error) with it.
    pub(crate) fn enforce(&self, report: Report) -> crate::Result<Report> {
        let violations = self.check(&report);
        if violations.is_empty() {
            Ok(report)
        } else {
            Err(crate::Error::LimitExceeded {
                report: Box::new(report),
                violations,
            })
        }
    }
}

/// The limits as written in `#[memtrack(...)]`: `max_allocations 1,000, no_leaks`.
impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.max_allocations {
            parts.push(format!("max_allocations {}", human::count(n)));
        }
        if let Some(n) = self.max_bytes {
            parts.push(format!("max_bytes {} B", human::count(n)));
        }
        if let Some(n) = self.max_peak {
            parts.push(format!("max_peak {} B", human::count(n)));
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

/// The message a `#[memtrack]` function fails with:
/// `memtrack: parse — allocations 1,234 > max_allocations 1,000; live at end 3 blocks (96 B) with no_leaks → target/memtrack/parse.memtrack`.
pub(crate) fn message(report: &Report, violations: &[Violation]) -> String {
    format!(
        "memtrack: {} — {} → {}",
        report.name,
        describe(violations),
        report.path.display()
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::Totals;

    fn report(allocations: u64, bytes: u64, peak: u64, live: (u64, u64), lost: u64) -> Report {
        let totals = Totals {
            allocations,
            bytes_allocated: bytes,
            peak_live_bytes: peak,
            live_blocks_at_end: live.0,
            live_bytes_at_end: live.1,
            ..Totals::default()
        };
        Report {
            name: "parse".into(),
            path: PathBuf::from("t/parse.memtrack"),
            totals,
            lost_events: lost,
            duration: Duration::ZERO,
            events: 0,
            artifact_bytes: 0,
            backend: crate::Backend::Ebpf,
            iterations: None,
        }
    }

    #[test]
    fn the_limit_itself_passes_one_more_fails() {
        let l = Limits::new()
            .max_allocations(3)
            .max_bytes(1164)
            .max_peak(1000)
            .no_leaks();
        assert_eq!(l.check(&report(3, 1164, 1000, (0, 0), 0)), vec![]);
        assert_eq!(
            l.check(&report(4, 1165, 1001, (2, 96), 0)),
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
        assert_eq!(Limits::new().check(&r), vec![]);
        // Only the limits that are set: a leak is no violation without `no_leaks`.
        assert_eq!(
            Limits::new()
                .max_peak(u64::MAX)
                .check(&report(1, 1, 1, (5, 5), 0)),
            vec![]
        );
        assert_eq!(
            Limits::new()
                .max_allocations(0)
                .check(&report(0, 0, 0, (0, 0), 0)),
            vec![]
        );
    }

    #[test]
    fn lost_events_fail_any_limit() {
        let r = report(1, 10, 10, (0, 0), 5);
        let v = Limits::new().max_allocations(100).check(&r);
        assert_eq!(v, vec![Violation::Incomplete { lost_events: 5 }]);
        assert!(v[0].to_string().contains("5 events LOST"), "{}", v[0]);
        assert!(v[0].to_string().contains("incomplete"), "{}", v[0]);
    }

    #[test]
    fn message_shows_every_violation_with_exact_numbers() {
        let r = report(1234, 2_000_000, 10, (3, 96), 0);
        let l = Limits::new()
            .max_allocations(1000)
            .max_bytes(1_048_576)
            .no_leaks();
        assert_eq!(
            message(&r, &l.check(&r)),
            "memtrack: parse — allocations 1,234 > max_allocations 1,000; \
             bytes allocated 2,000,000 B > max_bytes 1,048,576 B; \
             live at end 3 blocks (96 B) with no_leaks → t/parse.memtrack"
        );
        let one = report(0, 0, 0, (1, 8), 0);
        assert_eq!(
            describe(&Limits::new().no_leaks().check(&one)),
            "live at end 1 block (8 B) with no_leaks"
        );
        assert_eq!(
            l.max_peak(4096).to_string(),
            "max_allocations 1,000, max_bytes 1,048,576 B, max_peak 4,096 B, no_leaks"
        );
    }

    #[test]
    fn enforce_keeps_the_report() {
        let r = report(2, 10, 10, (0, 0), 0);
        assert!(Limits::new().max_allocations(2).enforce(r.clone()).is_ok());
        match Limits::new().max_allocations(1).enforce(r) {
            Err(crate::Error::LimitExceeded { report, violations }) => {
                assert_eq!(report.allocations(), 2);
                assert_eq!(
                    violations,
                    vec![Violation::Allocations {
                        measured: 2,
                        limit: 1
                    }]
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
