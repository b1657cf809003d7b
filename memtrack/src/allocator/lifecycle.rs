//! The allocator recorder's lifecycle: one [`State`] behind one lock, changed only by the named
//! transitions below (dhat-rs keeps its profiler's phase the same way; so does
//! `session/lifecycle.rs`).
//!
//! ```text
//!          claim(scope)               switch_on(collector)
//!   Idle ───────────────▶ Starting ───────────────────────▶ Recording { collector, epoch, scope }
//!     ▲                     │ {epoch, scope}      pause() ▲ │ ▼ resume()
//!     │                     │                          Paused { collector, epoch, scope }
//!     │       abandon()     │                                  │  stop() (the session), or
//!     ├─────────────────────┘                                  ▼  collector_failed() (its thread)
//!     └──────────────────────── finish(clock) ───────────── Stopping
//!
//!   counting users (criterion): count_begin() +1 / count_end() −1, in any phase
//! ```
//! Any other transition is refused with a [`Refused`] that names the phase it met (a second
//! recording while one starts, records or stops; a stop with nothing recording).
//!
//! The hot path takes no lock: it reads a *view* of the state, two atomics that only the
//! transitions write, under the lock, as a function of the state ([`State::switch`]): the
//! switch (`STREAM` while recording, `COUNT` while anyone counts; one relaxed load when both are
//! off) and the session word (the epoch in the high 32 bits, the scope's generation in the low
//! 32). Lock order: the session lifecycle's lock, then this one. A thread holding this lock
//! never waits for a producer (producers only `try_lock` it, to wake the collector).

use std::sync::{Mutex, MutexGuard};
use std::thread::Thread;

use super::collector::Clock;
use crate::lifecycle::{Stage, WrongStage};
use crate::scope::Scope;

/// Switch bits of the view: [`STREAM`] records events, [`COUNT`] only keeps the global counters.
pub(super) const STREAM: u32 = 1;
pub(super) const COUNT: u32 = 2;

/// Where the allocator recorder is.
#[derive(Debug)]
pub(super) enum Phase {
    /// No recording; the switch's `STREAM` bit is off.
    Idle,
    /// A recording was claimed and its threads are starting; the switch is still off, the
    /// session word already carries the new epoch and scope (so that what an earlier session
    /// left in the rings is recognised as old and dropped).
    Starting { epoch: u32, scope: u32 },
    /// Recording: the switch's `STREAM` bit is on; `collector` drains the rings.
    Recording {
        collector: Thread,
        epoch: u32,
        scope: u32,
    },
    /// Between two calls of a session that accumulates calls: the switch's `STREAM` bit is
    /// off (the wrapper costs what it costs idle), the collector and the artifact stay.
    Paused {
        collector: Thread,
        epoch: u32,
        scope: u32,
    },
    /// Switched off (by the session's stop, or because the collector failed: producers must
    /// not wait for room it will never make); the collector is being joined.
    Stopping,
}

impl Phase {
    /// The stage this phase is, in the names every lifecycle uses.
    fn stage(&self) -> Stage {
        match self {
            Phase::Idle => Stage::Idle,
            Phase::Starting { .. } => Stage::Starting,
            Phase::Recording { .. } => Stage::Recording,
            Phase::Paused { .. } => Stage::Paused,
            Phase::Stopping => Stage::Stopping,
        }
    }

    fn name(&self) -> &'static str {
        self.stage().name()
    }
}

/// The whole state of the allocator recorder.
struct State {
    phase: Phase,
    /// Live [`count_begin`](Lifecycle::count_begin)s (criterion measurements; they nest).
    counting: usize,
    /// TSC → CLOCK_MONOTONIC, calibrated once per process; the collector of a recording owns
    /// it (and refines it) until the recording finishes. `None` until the first recording, or
    /// if a collector panicked with it.
    clock: Option<Clock>,
    /// The last epoch handed out (every recording takes the next; ring slots carry its low 8
    /// bits).
    epoch: u32,
    /// The last thread-scope generation handed out (never 0: 0 means the whole process).
    generation: u32,
}

impl State {
    /// The switch bits this state shows the hot path.
    fn switch(&self) -> u32 {
        let stream = match self.phase {
            Phase::Recording { .. } => STREAM,
            Phase::Idle | Phase::Starting { .. } | Phase::Paused { .. } | Phase::Stopping => 0,
        };
        stream | if self.counting > 0 { COUNT } else { 0 }
    }

    /// The session word this state shows the hot path: the epoch and scope of the recording
    /// that starts or runs. `None` when idle or stopping: the word keeps the last recording's
    /// (a call that reads the switch off does not read it).
    fn session(&self) -> Option<u64> {
        match self.phase {
            Phase::Starting { epoch, scope }
            | Phase::Recording { epoch, scope, .. }
            | Phase::Paused { epoch, scope, .. } => Some(u64::from(epoch) << 32 | u64::from(scope)),
            Phase::Idle | Phase::Stopping => None,
        }
    }
}

/// Why a transition was refused: it does not start from the phase the recorder is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// A recording was asked for while one starts, records or stops (named).
    Busy(&'static str),
    /// A transition needs another phase than the one the recorder is in.
    Invalid(WrongStage),
    /// `count_end` without a matching `count_begin`.
    #[cfg(any(test, feature = "criterion"))]
    NotCounting,
}

impl From<Refused> for super::AllocatorError {
    fn from(r: Refused) -> Self {
        match r {
            // Sessions take turns before they start a recorder: a second claim is a bug.
            Refused::Busy(_) => {
                super::AllocatorError::Internal("a recording started while another one ran")
            }
            Refused::Invalid(w) => super::AllocatorError::Internal(w.transition),
            #[cfg(any(test, feature = "criterion"))]
            Refused::NotCounting => super::AllocatorError::Internal("count_end while not counting"),
        }
    }
}

/// What [`Lifecycle::claim`] hands the starting recording.
#[derive(Debug)]
pub(super) struct Claim {
    /// The recording's epoch (ring slots carry its low 8 bits).
    pub epoch: u32,
    /// Its scope's generation: 0 for the whole process, else the value the threads in its
    /// scope carry.
    pub generation: u32,
    /// The clock as the last recording left it (`None`: calibrate one).
    pub clock: Option<Clock>,
}

/// Where the view of the state is written: the hot path's statics, or (in tests) atomics of
/// their own.
pub(super) trait View {
    /// Stores the session word (if `Some`), then the switch bits.
    fn publish(&self, switch: u32, session: Option<u64>);
}

/// The allocator recorder's lifecycle and the view of it that the hot path reads.
pub(super) struct Lifecycle<V> {
    state: Mutex<State>,
    view: V,
}

impl<V: View> Lifecycle<V> {
    pub(super) const fn new(view: V) -> Self {
        Lifecycle {
            state: Mutex::new(State {
                phase: Phase::Idle,
                counting: 0,
                clock: None,
                epoch: 0,
                generation: 0,
            }),
            view,
        }
    }

    /// A panic while the lock was held left a consistent state (the view is written after
    /// the state, from it), so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the view of `st`; every transition ends with it. The session word first: a
    /// call that sees the switch on reads the word of the recording that turned it on.
    fn publish(&self, st: &State) {
        self.view.publish(st.switch(), st.session());
    }

    /// Idle → Starting: a new epoch and scope (published in the session word, switch still
    /// off) and the clock for the new recording's collector. Refused unless idle.
    pub(super) fn claim(&self, scope: Scope) -> Result<Claim, Refused> {
        let mut st = self.lock();
        if !matches!(st.phase, Phase::Idle) {
            return Err(Refused::Busy(st.phase.name()));
        }
        st.epoch = st.epoch.wrapping_add(1);
        let generation = match scope {
            Scope::Process => 0,
            Scope::Threads => {
                st.generation = st.generation.wrapping_add(1).max(1);
                st.generation
            }
        };
        st.phase = Phase::Starting {
            epoch: st.epoch,
            scope: generation,
        };
        self.publish(&st);
        Ok(Claim {
            epoch: st.epoch,
            generation,
            clock: st.clock.take(),
        })
    }

    /// Starting → Idle: the recording could not start; `clock` (if it was calibrated) is kept
    /// for the next one.
    pub(super) fn abandon(&self, clock: Option<Clock>) -> Result<(), Refused> {
        let mut st = self.lock();
        self.expect(&st, "abandon", |p| matches!(p, Phase::Starting { .. }))?;
        st.phase = Phase::Idle;
        st.clock = st.clock.take().or(clock);
        self.publish(&st);
        Ok(())
    }

    /// Starting → Recording: every recorder thread runs; the switch's `STREAM` bit goes on.
    /// The last thing done under the lock, so that nothing here is recorded.
    pub(super) fn switch_on(&self, collector: Thread) -> Result<(), Refused> {
        let mut st = self.lock();
        let Phase::Starting { epoch, scope } = st.phase else {
            return Err(self.invalid(&st, "switch_on"));
        };
        st.phase = Phase::Recording {
            collector,
            epoch,
            scope,
        };
        self.publish(&st);
        Ok(())
    }

    /// Recording → Paused, between two calls: the switch's `STREAM` bit is off when it
    /// returns; the collector keeps draining what was recorded.
    pub(super) fn pause(&self) -> Result<(), Refused> {
        self.between_calls("pause", true).map(drop)
    }

    /// Paused → Recording, for the next call, in the recording's scope, whose generation it
    /// returns for the calling thread to join (threads that earlier calls started keep it:
    /// a pool a call started does the next calls' work too). The switch's `STREAM` bit goes
    /// on, the last thing done.
    pub(super) fn resume(&self) -> Result<u32, Refused> {
        self.between_calls("resume", false)
    }

    /// Recording → Paused (`pause`) or Paused → Recording, keeping the collector, epoch and
    /// scope; returns the scope's generation.
    fn between_calls(&self, transition: &'static str, pause: bool) -> Result<u32, Refused> {
        let mut st = self.lock();
        let (collector, epoch, scope) = match std::mem::replace(&mut st.phase, Phase::Idle) {
            Phase::Recording {
                collector,
                epoch,
                scope,
            } if pause => (collector, epoch, scope),
            Phase::Paused {
                collector,
                epoch,
                scope,
            } if !pause => (collector, epoch, scope),
            other => {
                st.phase = other;
                return Err(self.invalid(&st, transition));
            }
        };
        st.phase = if pause {
            Phase::Paused {
                collector,
                epoch,
                scope,
            }
        } else {
            Phase::Recording {
                collector,
                epoch,
                scope,
            }
        };
        self.publish(&st);
        Ok(scope)
    }

    /// Recording or Paused → Stopping (the session stops the recording), or Stopping →
    /// Stopping (the collector failed first): the switch's `STREAM` bit is off when it returns.
    pub(super) fn stop(&self) -> Result<(), Refused> {
        let mut st = self.lock();
        self.expect(&st, "stop", |p| {
            matches!(
                p,
                Phase::Recording { .. } | Phase::Paused { .. } | Phase::Stopping
            )
        })?;
        st.phase = Phase::Stopping;
        self.publish(&st);
        Ok(())
    }

    /// Recording → Stopping, from the collector thread when it fails: producers waiting for
    /// room see the switch off and drop their events (counted lost) instead of waiting for a
    /// collector that is gone. The session still calls [`Lifecycle::stop`] and `finish`.
    pub(super) fn collector_failed(&self) -> Result<(), Refused> {
        let mut st = self.lock();
        self.expect(&st, "collector_failed", |p| {
            matches!(p, Phase::Recording { .. } | Phase::Paused { .. })
        })?;
        st.phase = Phase::Stopping;
        self.publish(&st);
        Ok(())
    }

    /// Stopping → Idle: the collector was joined; `clock` is what it refined (`None` if it
    /// panicked: the next recording calibrates a new one).
    pub(super) fn finish(&self, clock: Option<Clock>) -> Result<(), Refused> {
        let mut st = self.lock();
        self.expect(&st, "finish", |p| matches!(p, Phase::Stopping))?;
        st.phase = Phase::Idle;
        st.clock = clock;
        self.publish(&st);
        Ok(())
    }

    #[cfg(any(test, feature = "criterion"))]
    /// One more counting user (any phase): the switch's `COUNT` bit is on until the last one
    /// ends.
    pub(super) fn count_begin(&self) {
        let mut st = self.lock();
        st.counting += 1;
        self.publish(&st);
    }

    #[cfg(any(test, feature = "criterion"))]
    /// One counting user fewer; refused if there is none.
    pub(super) fn count_end(&self) -> Result<(), Refused> {
        let mut st = self.lock();
        st.counting = st.counting.checked_sub(1).ok_or(Refused::NotCounting)?;
        self.publish(&st);
        Ok(())
    }

    /// Wakes the recording's collector (a ring fills up). Never blocks: a producer may call
    /// it while the lock's holder waits for memory, or while holding the lock itself (an
    /// allocation inside a transition).
    pub(super) fn wake_collector(&self) {
        if let Ok(st) = self.state.try_lock()
            && let Phase::Recording { collector, .. } | Phase::Paused { collector, .. } = &st.phase
        {
            collector.unpark();
        }
    }

    fn expect(
        &self,
        st: &State,
        transition: &'static str,
        from: impl Fn(&Phase) -> bool,
    ) -> Result<(), Refused> {
        if from(&st.phase) {
            Ok(())
        } else {
            Err(self.invalid(st, transition))
        }
    }

    fn invalid(&self, st: &State, transition: &'static str) -> Refused {
        Refused::Invalid(WrongStage {
            transition,
            stage: st.phase.stage(),
        })
    }

    #[cfg(test)]
    fn phase(&self) -> String {
        match &self.lock().phase {
            Phase::Recording { epoch, scope, .. } => format!("recording({epoch}, {scope})"),
            Phase::Starting { epoch, scope } => format!("starting({epoch}, {scope})"),
            p => p.name().into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use super::*;

    /// A view of its own (not the hot path's: these tests must not switch the process's
    /// recorder).
    #[derive(Default)]
    struct Own(AtomicU32, AtomicU64);

    impl View for Own {
        fn publish(&self, switch: u32, session: Option<u64>) {
            if let Some(word) = session {
                self.1.store(word, Ordering::SeqCst);
            }
            self.0.store(switch, Ordering::SeqCst);
        }
    }

    fn lifecycle() -> Lifecycle<Own> {
        Lifecycle::new(Own::default())
    }

    fn switch(l: &Lifecycle<Own>) -> u32 {
        l.view.0.load(Ordering::SeqCst)
    }

    fn session(l: &Lifecycle<Own>) -> u64 {
        l.view.1.load(Ordering::SeqCst)
    }

    fn clock(tsc0: u64) -> Clock {
        Clock::for_test(tsc0)
    }

    #[test]
    fn a_recording_goes_idle_starting_recording_stopping_idle() {
        let l = lifecycle();
        assert_eq!(l.phase(), "idle");
        let claim = l.claim(Scope::Process).unwrap();
        assert_eq!((claim.epoch, claim.generation), (1, 0));
        assert!(claim.clock.is_none(), "no clock before the first recording");
        assert_eq!(l.phase(), "starting(1, 0)");
        assert_eq!(
            switch(&l),
            0,
            "the switch stays off while the threads start"
        );
        assert_eq!(session(&l), 1 << 32);

        l.switch_on(std::thread::current()).unwrap();
        assert_eq!(l.phase(), "recording(1, 0)");
        assert_eq!(switch(&l), STREAM);

        l.stop().unwrap();
        assert_eq!(l.phase(), "stopping");
        assert_eq!(switch(&l), 0);

        l.finish(Some(clock(7))).unwrap();
        assert_eq!(l.phase(), "idle");
        assert_eq!(switch(&l), 0);

        // The next recording takes the next epoch, a thread scope, and the refined clock.
        let claim = l.claim(Scope::Threads).unwrap();
        assert_eq!((claim.epoch, claim.generation), (2, 1));
        assert_eq!(claim.clock.map(|c| c.tsc0()), Some(7));
        assert_eq!(session(&l), 2 << 32 | 1);
        let claim = {
            l.abandon(None).unwrap();
            l.claim(Scope::Threads).unwrap()
        };
        assert_eq!((claim.epoch, claim.generation), (3, 2));
    }

    #[test]
    fn a_second_recording_is_refused_in_every_busy_phase() {
        let l = lifecycle();
        l.claim(Scope::Process).unwrap();
        assert_eq!(
            l.claim(Scope::Process).err().map(|r| (r, l.phase())),
            Some((Refused::Busy("starting"), "starting(1, 0)".into()))
        );
        l.switch_on(std::thread::current()).unwrap();
        assert_eq!(
            l.claim(Scope::Threads).err(),
            Some(Refused::Busy("recording"))
        );
        l.stop().unwrap();
        assert_eq!(
            l.claim(Scope::Threads).err(),
            Some(Refused::Busy("stopping"))
        );
        // Refusals change nothing: still stopping, epoch not consumed.
        assert_eq!(l.phase(), "stopping");
        l.finish(None).unwrap();
        assert_eq!(l.claim(Scope::Process).unwrap().epoch, 2);
        assert_eq!(
            super::super::AllocatorError::from(Refused::Busy("recording")).to_string(),
            super::super::AllocatorError::Internal("a recording started while another one ran")
                .to_string()
        );
    }

    #[test]
    fn transitions_from_the_wrong_phase_are_refused_and_change_nothing() {
        let l = lifecycle();
        let invalid = |transition, stage| Refused::Invalid(WrongStage { transition, stage });
        assert_eq!(l.stop(), Err(invalid("stop", Stage::Idle)));
        assert_eq!(l.finish(None), Err(invalid("finish", Stage::Idle)));
        assert_eq!(l.abandon(None), Err(invalid("abandon", Stage::Idle)));
        assert_eq!(
            l.switch_on(std::thread::current()),
            Err(invalid("switch_on", Stage::Idle))
        );
        assert_eq!(
            l.collector_failed(),
            Err(invalid("collector_failed", Stage::Idle))
        );
        assert_eq!(l.phase(), "idle");

        l.claim(Scope::Process).unwrap();
        assert_eq!(l.stop(), Err(invalid("stop", Stage::Starting)));
        assert_eq!(l.finish(None), Err(invalid("finish", Stage::Starting)));
        l.switch_on(std::thread::current()).unwrap();
        assert_eq!(
            l.switch_on(std::thread::current()),
            Err(invalid("switch_on", Stage::Recording))
        );
        assert_eq!(l.finish(None), Err(invalid("finish", Stage::Recording)));
        assert_eq!(l.abandon(None), Err(invalid("abandon", Stage::Recording)));
        assert_eq!(l.phase(), "recording(1, 0)");
        assert_eq!(switch(&l), STREAM);
        let e = super::super::AllocatorError::from(invalid("finish", Stage::Recording));
        assert!(e.to_string().contains("unexpected state (finish)"), "{e}");
    }

    #[test]
    fn a_failed_collector_switches_off_and_the_session_still_stops() {
        let l = lifecycle();
        l.claim(Scope::Process).unwrap();
        l.switch_on(std::thread::current()).unwrap();
        l.collector_failed().unwrap();
        assert_eq!(l.phase(), "stopping");
        assert_eq!(
            switch(&l),
            0,
            "producers must not wait for a collector that is gone"
        );
        assert_eq!(
            l.collector_failed(),
            Err(Refused::Invalid(WrongStage {
                transition: "collector_failed",
                stage: Stage::Stopping
            }))
        );
        l.stop().unwrap();
        l.finish(None).unwrap();
        assert_eq!(l.phase(), "idle");
    }

    #[test]
    fn a_start_that_fails_returns_to_idle_keeping_the_clock() {
        let l = lifecycle();
        let claim = l.claim(Scope::Threads).unwrap();
        assert!(claim.clock.is_none());
        l.abandon(Some(clock(42))).unwrap();
        assert_eq!(l.phase(), "idle");
        assert_eq!(switch(&l), 0);
        assert_eq!(
            l.claim(Scope::Process).unwrap().clock.map(|c| c.tsc0()),
            Some(42)
        );
    }

    #[test]
    fn counting_users_nest_and_combine_with_recording() {
        let l = lifecycle();
        assert_eq!(l.count_end(), Err(Refused::NotCounting));
        l.count_begin();
        l.count_begin();
        assert_eq!(switch(&l), COUNT);
        l.claim(Scope::Process).unwrap();
        assert_eq!(switch(&l), COUNT);
        l.switch_on(std::thread::current()).unwrap();
        assert_eq!(switch(&l), STREAM | COUNT);
        l.count_end().unwrap();
        assert_eq!(switch(&l), STREAM | COUNT, "one user still counts");
        l.stop().unwrap();
        assert_eq!(switch(&l), COUNT);
        l.count_end().unwrap();
        assert_eq!(switch(&l), 0);
        assert_eq!(l.count_end(), Err(Refused::NotCounting));
        assert_eq!(switch(&l), 0);
    }

    #[test]
    fn waking_unparks_the_collector_only_while_recording() {
        let l = lifecycle();
        l.wake_collector(); // idle: nothing to wake, and no panic
        l.claim(Scope::Process).unwrap();
        let collector = std::thread::spawn(|| {
            let t = std::time::Instant::now();
            std::thread::park_timeout(std::time::Duration::from_secs(30));
            t.elapsed()
        });
        l.switch_on(collector.thread().clone()).unwrap();
        l.wake_collector();
        let parked = collector.join().unwrap();
        assert!(
            parked.as_secs() < 30,
            "the collector was not woken: {parked:?}"
        );
        // Never blocks, even when the lock is held (a producer allocating inside a transition).
        let held = l.lock();
        l.wake_collector();
        drop(held);
    }
}
