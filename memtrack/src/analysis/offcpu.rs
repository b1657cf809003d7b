//! Exact off-CPU intervals per thread, from the context-switch events of a recording of lock
//! waits ([`EventKind::SwitchOut`], [`EventKind::SwitchIn`]): each switch-out paired with the
//! same thread's next switch-in, not samples. Pure numbers; classifying an interval by its
//! stack needs the symbolizer and lives above.
//!
//! Accounting, per thread, over the recording's window `[start, end]` (one clock: the events'
//! `CLOCK_MONOTONIC`):
//! - an **off-CPU interval** runs from a switch-out to the thread's next switch-in; one still
//!   open at the end closes at `end` ([`Interval::open_at_end`]);
//! - **CPU time** is the rest of the thread's window: from a switch-in (or the window's start,
//!   if the thread was seen running first) to the next switch-out (or `end`);
//! - a thread whose first switch event is a switch-in was off the CPU from the window's start
//!   (or from its creation, which the events do not show) until then: that time is
//!   [`ThreadTime::before_first_switch_in_ns`], no interval and no stack;
//! - a thread known to exist ([`OffCpuBuilder::known_thread`]) with no event at all slept
//!   through the whole window: it is [`ThreadTime::idle`], off the CPU for all of it;
//! - a thread's time covers its own life, [`ThreadTime::start`] to [`ThreadTime::end`]: from
//!   its [`EventKind::ThreadStart`] (its creation; runnable, so preempted, until its first
//!   switch-in), else the window's start, to its [`EventKind::ThreadExit`] (it left the CPU for
//!   the last time), else the window's end. CPU time, off-CPU intervals and the time before a
//!   first switch-in add up to it.
//!
//! Events that contradict the pairing (two switch-outs in a row, a switch-in of a thread on a
//! CPU, an event of a thread that is off the CPU) mean events were lost: they are counted in
//! [`OffCpu::inconsistent`], never guessed at.
//!
//! A switch-in the kernel did not report is recovered by the eBPF program before the thread's
//! next memory event or when it next leaves the CPU, whichever comes first (see `mt_switch` in
//! memtrack.bpf.c). Earlier builds recovered it only when the thread left the CPU: in their
//! recordings it comes after the memory events the thread made meanwhile, stamped before them.
//! So a memory event of a thread that is off the CPU is held, not counted: a
//! switch-in stamped between the switch-out and that event must follow before the thread's
//! next switch event (or the window's end), else it is counted.

use std::collections::BTreeMap;

use crate::event::{Event, EventKind};
use crate::stack::StackId;

/// One off-CPU interval of a thread: from its switch-out to its next switch-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Interval {
    /// When the thread left the CPU (ns, CLOCK_MONOTONIC).
    pub start: u64,
    /// When it got a CPU again, or the window's end if it had not ([`Interval::open_at_end`]).
    pub end: u64,
    /// It was preempted (still runnable: an involuntary switch, not a wait).
    pub preempted: bool,
    /// Its user stack as it left the CPU (where it waited); [`StackId::NONE`] if none was
    /// recorded.
    pub stack: StackId,
    /// No switch-in came before the window's end: the interval closes there.
    pub open_at_end: bool,
}

impl Interval {
    /// Its length in nanoseconds.
    pub fn ns(&self) -> u64 {
        self.end - self.start
    }
}

/// One thread's time over the window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ThreadTime {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Nanoseconds on a CPU.
    pub cpu_ns: u64,
    /// Nanoseconds off the CPU in [`ThreadTime::intervals`] (preempted or not).
    pub off_cpu_ns: u64,
    /// Nanoseconds off the CPU before the thread's first switch-in when no switch-out came
    /// first: a wait begun before the window (or the time before the thread existed); not
    /// an interval, no stack.
    pub before_first_switch_in_ns: u64,
    /// The thread was known to exist and had no event: off the CPU for the whole window.
    pub idle: bool,
    /// When its time begins (ns, CLOCK_MONOTONIC): its creation, or the window's start if
    /// it existed then.
    pub start: u64,
    /// When its time ends: its exit, or the window's end if it was alive then.
    pub end: u64,
    /// Its off-CPU intervals, in time order.
    pub intervals: Vec<Interval>,
}

/// Every thread's time over a window: what [`OffCpuBuilder::finish`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OffCpu {
    /// The window's start (ns, CLOCK_MONOTONIC).
    pub start: u64,
    /// The window's end.
    pub end: u64,
    /// Per thread, by (pid, tid).
    pub threads: Vec<ThreadTime>,
    /// Switch events that contradict the pairing (a sign of lost events): a result with any
    /// is not exact.
    pub inconsistent: u64,
}

/// Where a thread is, as its events last said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Known, no event yet.
    Unseen,
    /// On a CPU since `since`.
    On { since: u64 },
    /// Off since its switch-out at `since`; `ran` is the time of its first memory event since
    /// then, if any (its switch-in must be stamped before it).
    Off {
        since: u64,
        preempted: bool,
        stack: StackId,
        ran: Option<u64>,
    },
    /// Ended at its [`EventKind::ThreadExit`].
    Ended,
}

#[derive(Debug, Clone)]
struct Thread {
    state: State,
    time: ThreadTime,
    /// When it was created, if its [`EventKind::ThreadStart`] came.
    created: Option<u64>,
    /// When it ended, if its [`EventKind::ThreadExit`] came.
    exited: Option<u64>,
    /// An [`EventKind::Exec`] of it came.
    execed: bool,
}

impl Thread {
    /// A thread that existed before the window and executes a program: what ran before is
    /// the recorder's own child waiting to be released (`record`'s fork); the program's
    /// life, and the row, begin at its first exec (then `true`). A thread created in the
    /// window (a followed fork) keeps its time before the exec: the program ran it.
    fn begins_at_exec(&mut self, e: &Event, start: u64) -> bool {
        if e.kind != EventKind::Exec
            || self.created.is_some()
            || self.execed
            || !matches!(self.state, State::Unseen | State::On { .. })
        {
            return false;
        }
        self.time = ThreadTime {
            pid: e.pid,
            tid: e.tid,
            ..ThreadTime::default()
        };
        self.created = Some(e.ts.max(start));
        self.execed = true;
        self.state = State::On {
            since: e.ts.max(start),
        };
        true
    }

    /// The state `e` leads to, its time counted, and whether `e` agrees with the pairing.
    fn next(&mut self, e: &Event, start: u64) -> (State, bool) {
        match self.state {
            // Runnable from its creation until its first switch-in: an interval with no stack,
            // preempted (waiting for a CPU). A thread id used again after an exit goes on in
            // the same row.
            State::Unseen | State::Ended if e.kind == EventKind::ThreadStart => {
                let at = e.ts.max(start);
                self.created.get_or_insert(at);
                let off = State::Off {
                    since: at,
                    preempted: true,
                    stack: StackId::NONE,
                    ran: None,
                };
                (off, true)
            }
            State::Unseen => (self.first_event(e, start), true),
            State::On { since } => self.next_on(since, e),
            State::Off {
                since,
                preempted,
                stack,
                ran,
            } => self.next_off(since, preempted, stack, ran, e),
            // An event of an ended thread, other than a new start: one was lost.
            State::Ended => (State::Ended, false),
        }
    }

    /// The state after the thread's first event, which is not its creation.
    fn first_event(&mut self, e: &Event, start: u64) -> State {
        let t = &mut self.time;
        match e.kind {
            EventKind::ThreadExit => {
                t.cpu_ns += e.ts - start;
                self.exited = Some(e.ts);
                State::Ended
            }
            EventKind::SwitchOut { preempted } => {
                t.cpu_ns += e.ts - start;
                State::Off {
                    since: e.ts,
                    preempted,
                    stack: e.stack,
                    ran: None,
                }
            }
            EventKind::SwitchIn => {
                t.before_first_switch_in_ns += e.ts - start;
                State::On { since: e.ts }
            }
            _ => State::On { since: start },
        }
    }

    /// The state after `e` of a thread on a CPU since `since`.
    fn next_on(&mut self, since: u64, e: &Event) -> (State, bool) {
        let t = &mut self.time;
        match e.kind {
            EventKind::ThreadExit => {
                t.cpu_ns += e.ts.saturating_sub(since);
                self.exited = Some(e.ts);
                (State::Ended, true)
            }
            EventKind::SwitchOut { preempted } => {
                t.cpu_ns += e.ts.saturating_sub(since);
                let off = State::Off {
                    since: e.ts,
                    preempted,
                    stack: e.stack,
                    ran: None,
                };
                (off, true)
            }
            _ if !e.kind.tag().is_scheduling() => (State::On { since }, true),
            // A switch-in of a running thread: an event between them was lost. Keep the
            // earlier state.
            _ => (self.state, false),
        }
    }

    /// The state after `e` of a thread off the CPU since `since`.
    fn next_off(
        &mut self,
        since: u64,
        preempted: bool,
        stack: StackId,
        ran: Option<u64>,
        e: &Event,
    ) -> (State, bool) {
        match e.kind {
            EventKind::SwitchIn => {
                // Stamped after the switch-out and before any memory event held meanwhile;
                // else counted (the pairing goes on).
                let bad = e.ts < since || ran.is_some_and(|r| e.ts > r);
                let t = &mut self.time;
                t.off_cpu_ns += e.ts.saturating_sub(since);
                t.intervals.push(Interval {
                    start: since,
                    end: e.ts.max(since),
                    preempted,
                    stack,
                    open_at_end: false,
                });
                (State::On { since: e.ts }, !bad)
            }
            // A memory event of a thread off the CPU: held until its switch-in (see the module
            // docs).
            _ if !e.kind.tag().is_scheduling() => {
                let held = State::Off {
                    since,
                    preempted,
                    stack,
                    ran: Some(ran.map_or(e.ts, |r| r.min(e.ts))),
                };
                (held, true)
            }
            // A switch-out of a thread off the CPU: an event between them was lost. Keep the
            // earlier state.
            _ => (self.state, false),
        }
    }
}

/// Pairs switch events into [`OffCpu`]: feed every event of a recording in time order with
/// [`update`](Self::update), then [`finish`](Self::finish) at the window's end.
#[derive(Debug, Clone)]
pub struct OffCpuBuilder {
    start: u64,
    threads: BTreeMap<(u32, u32), Thread>,
    inconsistent: u64,
}

impl OffCpuBuilder {
    /// A window starting at `start` (ns, CLOCK_MONOTONIC: the recording's
    /// `start_monotonic_ns`). Events before it move the start back to them.
    pub fn new(start: u64) -> Self {
        Self {
            start,
            threads: BTreeMap::new(),
            inconsistent: 0,
        }
    }

    /// Thread `tid` of process `pid` existed during the window: if no event of it comes, it
    /// slept through the window ([`ThreadTime::idle`]).
    pub fn known_thread(&mut self, pid: u32, tid: u32) {
        self.thread(pid, tid);
    }

    fn thread(&mut self, pid: u32, tid: u32) -> &mut Thread {
        self.threads.entry((pid, tid)).or_insert_with(|| Thread {
            state: State::Unseen,
            time: ThreadTime {
                pid,
                tid,
                ..ThreadTime::default()
            },
            created: None,
            exited: None,
            execed: false,
        })
    }

    /// Feeds one event (events in time order; any kind: a memory event says its thread was
    /// on a CPU).
    pub fn update(&mut self, e: &Event) {
        // A thread created before the window (its first switch-in inside it) starts with it.
        if e.ts < self.start && e.kind != EventKind::ThreadStart {
            self.start = e.ts;
        }
        let start = self.start;
        let th = self.thread(e.pid, e.tid);
        if th.begins_at_exec(e, start) {
            return;
        }
        if e.kind == EventKind::Exec {
            th.execed = true;
        }
        let (state, consistent) = th.next(e, start);
        th.state = state;
        if !consistent {
            self.inconsistent += 1;
        }
    }

    /// The result, the window closing at `end` (ns, CLOCK_MONOTONIC: the recording's
    /// `end_monotonic_ns`; a later event moves it).
    pub fn finish(self, end: u64) -> OffCpu {
        let start = self.start;
        // A thread that ran while off the CPU and whose switch-in never came.
        let unpaired = self
            .threads
            .values()
            .filter(|th| matches!(th.state, State::Off { ran: Some(_), .. }))
            .count() as u64;
        let end = self
            .threads
            .values()
            .map(|th| match th.state {
                State::Unseen | State::Ended => th.exited.unwrap_or(0),
                State::On { since } | State::Off { since, .. } => since,
            })
            .fold(end.max(start), u64::max);
        let threads = self
            .threads
            .into_values()
            .map(|th| {
                let mut t = th.time;
                t.start = th.created.unwrap_or(start);
                t.end = th.exited.unwrap_or(end);
                match th.state {
                    State::Ended => {}
                    State::Unseen => {
                        t.idle = true;
                        t.before_first_switch_in_ns = end - start;
                    }
                    State::On { since } => t.cpu_ns += end - since,
                    State::Off {
                        since,
                        preempted,
                        stack,
                        ..
                    } => {
                        t.off_cpu_ns += end - since;
                        t.intervals.push(Interval {
                            start: since,
                            end,
                            preempted,
                            stack,
                            open_at_end: true,
                        });
                    }
                }
                t
            })
            .collect();
        OffCpu {
            start,
            end,
            threads,
            inconsistent: self.inconsistent + unpaired,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(ts: u64, tid: u32, preempted: bool, stack: u32) -> Event {
        Event::new(ts, 1, tid, EventKind::SwitchOut { preempted }).with_stack(StackId(stack))
    }

    fn inn(ts: u64, tid: u32) -> Event {
        Event::new(ts, 1, tid, EventKind::SwitchIn)
    }

    fn run(start: u64, events: &[Event], end: u64) -> OffCpu {
        let mut b = OffCpuBuilder::new(start);
        for e in events {
            b.update(e);
        }
        b.finish(end)
    }

    /// Each switch-out pairs with the thread's next switch-in, threads apart; CPU time is the
    /// rest of the window, and the two add up to it.
    #[test]
    fn intervals_pair_per_thread_and_cpu_time_is_the_rest() {
        let r = run(
            100,
            &[
                out(110, 7, false, 3),
                out(115, 8, true, 4),
                inn(130, 8),
                inn(150, 7),
                out(160, 7, false, 5),
                inn(190, 7),
            ],
            200,
        );
        assert_eq!(r.inconsistent, 0);
        let t7 = &r.threads[0];
        assert_eq!(
            (t7.tid, t7.cpu_ns, t7.off_cpu_ns),
            (7, 10 + 10 + 10, 40 + 30)
        );
        assert_eq!(t7.intervals.len(), 2);
        assert_eq!(
            t7.intervals[0],
            Interval {
                start: 110,
                end: 150,
                preempted: false,
                stack: StackId(3),
                open_at_end: false
            }
        );
        assert_eq!(t7.intervals[1].stack, StackId(5));
        let t8 = &r.threads[1];
        assert_eq!((t8.cpu_ns, t8.off_cpu_ns), (15 + 70, 15));
        assert!(t8.intervals[0].preempted);
        for t in &r.threads {
            assert_eq!(t.cpu_ns + t.off_cpu_ns + t.before_first_switch_in_ns, 100);
        }
    }

    /// A wait still open at the end closes at the window's end, on the same clock.
    #[test]
    fn an_open_wait_closes_at_the_end() {
        let r = run(0, &[out(40, 7, false, 1)], 1_000);
        let t = &r.threads[0];
        assert_eq!((t.cpu_ns, t.off_cpu_ns), (40, 960));
        assert!(t.intervals[0].open_at_end);
        assert_eq!(t.intervals[0].ns(), 960);
    }

    /// A thread whose first switch is a switch-in waited since before the window: counted
    /// apart, with no interval; a memory event first means it was running from the start.
    #[test]
    fn the_start_of_the_window() {
        let malloc = Event::new(30, 1, 9, EventKind::Malloc { addr: 8, size: 8 });
        let r = run(0, &[inn(25, 7), malloc, out(50, 9, false, 1)], 100);
        let (t7, t9) = (&r.threads[0], &r.threads[1]);
        assert_eq!((t7.before_first_switch_in_ns, t7.cpu_ns), (25, 75));
        assert!(t7.intervals.is_empty());
        assert_eq!((t9.cpu_ns, t9.off_cpu_ns), (50, 50));
    }

    /// A thread created and ended inside the window: its row covers its life, not the window
    /// (runnable, preempted, from its creation to its first switch-in), and its times add up
    /// to it; the time before its creation and after its exit is nobody's.
    #[test]
    fn a_thread_covers_its_own_life() {
        let ev = |ts, kind| Event::new(ts, 1, 7, kind);
        let r = run(
            100,
            &[
                // Stamped at its creation, sent just before its first switch-in.
                ev(150, EventKind::ThreadStart),
                inn(160, 7),
                out(200, 7, false, 3),
                inn(230, 7),
                ev(260, EventKind::ThreadExit),
                inn(300, 8),
            ],
            1_000,
        );
        assert_eq!(r.inconsistent, 0);
        let t = &r.threads[0];
        assert_eq!((t.start, t.end), (150, 260));
        assert_eq!(
            (t.cpu_ns, t.off_cpu_ns, t.before_first_switch_in_ns),
            (40 + 30, 10 + 30, 0)
        );
        assert!(t.intervals[0].preempted && t.intervals[0].stack.is_none());
        assert_eq!(t.intervals.len(), 2);
        // A thread without them: the window.
        let t8 = &r.threads[1];
        assert_eq!((t8.start, t8.end), (100, 1_000));
        assert_eq!(t8.before_first_switch_in_ns + t8.cpu_ns, 900);
    }

    /// `record`'s command existed before the window, waiting in memtrack's fork to be
    /// released: its row begins at its first exec, so that wait is not its "other" time. A
    /// second exec (the program running another) and a thread created in the window (a
    /// followed fork) keep their time before it.
    #[test]
    fn a_command_begins_at_its_first_exec() {
        let ev = |ts, tid, kind| Event::new(ts, 1, tid, kind);
        let r = run(
            0,
            &[
                // The root (7): off in memtrack's fork until released, then its program; a
                // followed fork (9), created in the window.
                out(10, 7, false, 1),
                ev(300, 9, EventKind::ThreadStart),
                inn(310, 9),
                ev(350, 9, EventKind::Exec),
                inn(400, 7),
                ev(410, 7, EventKind::Exec),
                out(500, 7, false, 2),
                inn(600, 7),
                ev(700, 7, EventKind::Exec),
            ],
            1_000,
        );
        assert_eq!(r.inconsistent, 0);
        let root = r.threads.iter().find(|t| t.tid == 7).unwrap();
        assert_eq!((root.start, root.end), (410, 1_000));
        assert_eq!((root.cpu_ns, root.off_cpu_ns), (90 + 400, 100));
        assert_eq!(root.intervals.len(), 1);
        let fork = r.threads.iter().find(|t| t.tid == 9).unwrap();
        assert_eq!((fork.start, fork.cpu_ns, fork.off_cpu_ns), (300, 690, 10));
    }

    /// An event of a thread after its exit contradicts it: counted.
    #[test]
    fn an_event_after_the_exit_is_counted() {
        let ev = |ts, kind| Event::new(ts, 1, 7, kind);
        let r = run(
            0,
            &[ev(10, EventKind::ThreadExit), out(20, 7, false, 1)],
            100,
        );
        assert_eq!(r.inconsistent, 1);
        assert_eq!((r.threads[0].cpu_ns, r.threads[0].end), (10, 10));
    }

    /// A known thread with no event slept through the window: idle, not an error.
    #[test]
    fn a_thread_without_events_is_idle() {
        let mut b = OffCpuBuilder::new(0);
        b.known_thread(1, 7);
        let r = b.finish(500);
        assert!(r.threads[0].idle);
        assert_eq!(r.threads[0].before_first_switch_in_ns, 500);
        assert_eq!(r.threads[0].cpu_ns, 0);
    }

    /// A switch-in the program recovered comes after the memory events the thread made since
    /// it got the CPU, stamped before them: the interval closes at its stamp, nothing counted.
    #[test]
    fn a_recovered_switch_in_after_held_memory_events_pairs() {
        let free = Event::new(30, 1, 7, EventKind::Free { addr: 8 });
        let malloc = Event::new(35, 1, 7, EventKind::Malloc { addr: 8, size: 8 });
        let r = run(
            0,
            &[
                out(10, 7, false, 1),
                free,
                malloc,
                inn(25, 7),
                out(50, 7, false, 2),
            ],
            100,
        );
        assert_eq!(r.inconsistent, 0);
        let t = &r.threads[0];
        assert_eq!(t.intervals[0].start, 10);
        assert_eq!(t.intervals[0].end, 25);
        assert_eq!((t.cpu_ns, t.off_cpu_ns), (10 + 25, 15 + 50));
    }

    /// A thread that ran while off the CPU with no switch-in stamped before it: counted,
    /// whether its next switch-out, a late switch-in or the window's end comes next.
    #[test]
    fn a_thread_running_while_off_without_a_switch_in_is_counted() {
        let free = |ts| Event::new(ts, 1, 7, EventKind::Free { addr: 8 });
        let r = run(
            0,
            &[out(10, 7, false, 1), free(30), out(50, 7, false, 2)],
            100,
        );
        assert_eq!(r.inconsistent, 2, "the switch-out, then the end");
        let r = run(0, &[out(10, 7, false, 1), free(30), inn(40, 7)], 100);
        assert_eq!(r.inconsistent, 1, "a switch-in after the event");
        let r = run(0, &[out(10, 7, false, 1), free(30)], 100);
        assert_eq!(r.inconsistent, 1, "the window's end");
    }

    /// Events that contradict the pairing are counted, and the pairing keeps its state.
    #[test]
    fn contradictions_are_counted() {
        let free = Event::new(30, 1, 7, EventKind::Free { addr: 8 });
        let r = run(
            0,
            &[
                out(10, 7, false, 1),
                out(20, 7, false, 2),
                free,
                inn(40, 7),
                inn(50, 7),
            ],
            100,
        );
        assert_eq!(r.inconsistent, 3);
        assert_eq!(r.threads[0].intervals.len(), 1);
        assert_eq!(r.threads[0].intervals[0].stack, StackId(1));
        assert_eq!(r.threads[0].off_cpu_ns, 30);
    }
}
