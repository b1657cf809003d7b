//! What a recording returns when it stops ([`Recorded`]): what the encoder wrote, and what the
//! recorder counted beside it. One type for both recorders, below both of them.

use crate::encode::Written;

/// What a recording wrote.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Recorded {
    /// The artifact's frames, events, bytes and totals.
    pub written: Written,
    /// Events lost because the ring buffer was full (also in the artifact's trailer).
    pub lost_events: u64,
    /// Allocation and free calls of threads outside a thread-scoped recording's scope, not
    /// recorded (0 for a process-wide recording).
    pub out_of_scope: u64,
    /// Processes the recorded process started and that were not followed (`record
    /// --no-follow`; also in the artifact's trailer).
    pub unfollowed_processes: u64,
    /// Distinct call stacks the program sent during the recording.
    pub stacks: u64,
    /// Heap allocations whose call stack stops early: no frame beyond the allocator's caller,
    /// or a frame outside the mapped code (built without frame pointers; also in the
    /// artifact's trailer, [`Final::short_stacks`](crate::artifact::Final::short_stacks)).
    pub short_stacks: u64,
    /// Of [`Recorded::short_stacks`], those whose call site is in the C library (its own
    /// allocations: no rebuild of the program gives them callers).
    pub short_stacks_in_libc: u64,
    /// Stacks cut at [`TrackerOptions::stack_depth`](crate::tracker::TrackerOptions::stack_depth) (or the session's) frames.
    pub truncated_stacks: u64,
    /// Stacks whose first hash matched another stack's: sent again under an id of their own
    /// (never confused with the other; only more ring-buffer traffic).
    pub stack_collisions: u64,
    /// New stacks the program could not remember (its map of sent stacks was full): sent
    /// again each time they recur (nothing lost; more ring-buffer traffic).
    pub stacks_not_remembered: u64,
}

impl Recorded {
    /// A recording of nothing but `totals` (nothing lost, no stacks): for tests of what reads
    /// a result.
    #[cfg(test)]
    pub(crate) fn of_totals(totals: crate::analysis::Totals) -> Self {
        Recorded {
            written: Written {
                frames: 0,
                events: 0,
                bytes: 0,
                totals,
                sizes: Vec::new(),
                timeline: crate::analysis::Timeline::growing(1).unwrap(),
                per_process: Default::default(),
            },
            lost_events: 0,
            out_of_scope: 0,
            unfollowed_processes: 0,
            stacks: 0,
            short_stacks: 0,
            short_stacks_in_libc: 0,
            truncated_stacks: 0,
            stack_collisions: 0,
            stacks_not_remembered: 0,
        }
    }
}
