//! The turns of this process's sessions: one [`Phase`] behind one lock (plus the condvar its
//! waiters sleep on), changed only by the named transitions below (dhat-rs keeps its profiler's
//! lifecycle the same way).
//!
//! ```text
//!                begin(name)                          Turn::end(None), or no one waiting
//!   Idle ─────────────────────────▶ Recording(name) ──────────────────────────────────▶ Idle
//!     ▲                              │   ▲   │ begin(..) while running: refused, nested,
//!     │                              │   │   └─ or (wait) counted in `waiting` until it ends
//!     │      Turn::end(Some(hold))   │   │
//!     │      with someone waiting    ▼   │ begin(name): the next session takes the hold
//!     └──── (never: a waiter ─── HandingOff(hold)
//!            always takes it)
//! ```
//! A [`Turn`] is the running session's claim: dropping it without [`Turn::end`] (a panic
//! between start and finish) ends the turn too, so a panicking session still returns to idle.
//! The hold is whatever keeps a finished session's recorder warm for the next one (the eBPF
//! probes: attaching and detaching them costs tens of ms); it is dropped when no session
//! waits for it. Lock order: this lock, then the tracker's (never the reverse).

use std::sync::{Condvar, Mutex, MutexGuard};

/// Where the sessions of this process are.
#[derive(Debug)]
pub(crate) enum Phase<H> {
    /// No session runs; nothing is held.
    Idle,
    /// The session of this name runs.
    Recording(String),
    /// A session ended while others waited and left `H` for the next one to take.
    HandingOff(H),
}

/// The phase and how many `begin(.., wait)` calls sleep until it changes.
struct State<H> {
    phase: Phase<H>,
    waiting: usize,
}

/// The session lifecycle of a process (`H`: what a finished session hands to the next).
pub(crate) struct Lifecycle<H> {
    state: Mutex<State<H>>,
    changed: Condvar,
}

/// Why [`Lifecycle::begin`] refused a session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Another session runs (and the caller did not ask to wait).
    Active(String),
    /// The caller asked to wait, but the running session records the calling thread: it would
    /// wait for itself.
    Nested(String),
}

impl<H> Lifecycle<H> {
    pub(crate) const fn new() -> Self {
        Lifecycle {
            state: Mutex::new(State {
                phase: Phase::Idle,
                waiting: 0,
            }),
            changed: Condvar::new(),
        }
    }

    /// A panic while the lock was held left a consistent state (every transition is one
    /// assignment), so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, State<H>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Idle or HandingOff → Recording(`name`), returning the turn and what the previous session
    /// handed over (keep it until the new session has started). While another session runs:
    /// refused, or with `wait`, counted as waiting until it ends, unless `recorded_here` says
    /// the running session records the calling thread (a nested start).
    pub(crate) fn begin(
        &self,
        name: &str,
        wait: bool,
        recorded_here: impl Fn() -> bool,
    ) -> Result<(Turn<'_, H>, Option<H>), Refused> {
        let mut st = self.lock();
        if let Phase::Recording(active) = &st.phase {
            if !wait {
                return Err(Refused::Active(active.clone()));
            }
            if recorded_here() {
                return Err(Refused::Nested(active.clone()));
            }
            st.waiting += 1;
            while matches!(st.phase, Phase::Recording(_)) {
                st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.waiting -= 1;
        }
        let held = match std::mem::replace(&mut st.phase, Phase::Recording(name.to_owned())) {
            Phase::HandingOff(h) => Some(h),
            Phase::Idle | Phase::Recording(_) => None,
        };
        Ok((Turn { lifecycle: self }, held))
    }

    /// The name of the running session, if any.
    pub(crate) fn running(&self) -> Option<String> {
        match &self.lock().phase {
            Phase::Recording(name) => Some(name.clone()),
            Phase::Idle | Phase::HandingOff(_) => None,
        }
    }

    /// Whether a session runs (allocates nothing, unlike [`Lifecycle::running`]).
    pub(crate) fn is_running(&self) -> bool {
        matches!(self.lock().phase, Phase::Recording(_))
    }

    /// Recording → Idle, or → HandingOff(`hold`) if a session waits for its turn. A hold no one
    /// waits for is dropped before the lock is released, so that no session can begin (and
    /// attach the probes) before it is gone.
    fn end(&self, hold: Option<H>) {
        let mut st = self.lock();
        st.phase = match hold {
            Some(h) if st.waiting > 0 => Phase::HandingOff(h),
            unused => {
                drop(unused);
                Phase::Idle
            }
        };
        drop(st);
        self.changed.notify_all();
    }

    #[cfg(test)]
    fn phase(&self) -> String {
        match &self.lock().phase {
            Phase::Idle => "idle".into(),
            Phase::Recording(name) => format!("running({name})"),
            Phase::HandingOff(_) => "handing-off".into(),
        }
    }

    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting
    }
}

/// The running session's turn; see the module docs.
#[must_use = "the turn ends when it is dropped"]
pub(crate) struct Turn<'l, H> {
    lifecycle: &'l Lifecycle<H>,
}

impl<H> Turn<'_, H> {
    /// Whether a session waits for this one to end: then it is worth keeping the recorder warm
    /// for it ([`Turn::end`] with a hold).
    pub(crate) fn awaited(&self) -> bool {
        self.lifecycle.lock().waiting > 0
    }

    /// Ends the turn: hands `hold` to a waiting session, or drops it.
    pub(crate) fn end(self, hold: Option<H>) {
        let lifecycle = self.lifecycle;
        std::mem::forget(self);
        lifecycle.end(hold);
    }
}

impl<H> Drop for Turn<'_, H> {
    fn drop(&mut self) {
        self.lifecycle.end(None);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::*;

    /// A hold that counts its drops (the real one detaches the eBPF probes when dropped).
    struct Hold(Arc<AtomicUsize>);

    impl Drop for Hold {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn no() -> bool {
        false
    }

    fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_session_runs_then_returns_to_idle_and_refuses_a_second_meanwhile() {
        let l = Lifecycle::<Hold>::new();
        assert_eq!(l.phase(), "idle");
        let (turn, held) = l.begin("a", false, no).unwrap();
        assert!(held.is_none());
        assert_eq!(l.phase(), "running(a)");
        assert_eq!(l.running().as_deref(), Some("a"));
        assert!(l.is_running());
        assert_eq!(
            l.begin("b", false, no).err(),
            Some(Refused::Active("a".into()))
        );
        assert!(!turn.awaited());
        turn.end(None);
        assert_eq!(l.phase(), "idle");
        assert_eq!(l.running(), None);
        let (turn, _) = l.begin("b", false, no).unwrap();
        assert_eq!(l.phase(), "running(b)");
        drop(turn);
        assert_eq!(l.phase(), "idle");
    }

    #[test]
    fn a_waiter_takes_the_hold() {
        let l = Arc::new(Lifecycle::<Hold>::new());
        let drops = Arc::new(AtomicUsize::new(0));
        let (turn, _) = l.begin("first", false, no).unwrap();
        let waiter = {
            let (l, drops) = (Arc::clone(&l), Arc::clone(&drops));
            std::thread::spawn(move || {
                let (turn, held) = l.begin("second", true, no).unwrap();
                // Handed over, not dropped: the probes stayed attached in between.
                assert_eq!(drops.load(Ordering::SeqCst), 0);
                assert!(held.is_some());
                drop(held);
                assert_eq!(drops.load(Ordering::SeqCst), 1);
                turn.end(None);
            })
        };
        until("the waiter to be counted", || l.waiting() == 1);
        assert!(turn.awaited());
        turn.end(Some(Hold(Arc::clone(&drops))));
        waiter.join().unwrap();
        assert_eq!(l.phase(), "idle");
        assert_eq!(l.waiting(), 0);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_finished_session_with_no_waiter_drops_its_hold() {
        let l = Lifecycle::<Hold>::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let (turn, _) = l.begin("alone", false, no).unwrap();
        turn.end(Some(Hold(Arc::clone(&drops))));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(l.phase(), "idle");
        let (_turn, held) = l.begin("next", false, no).unwrap();
        assert!(held.is_none());
    }

    #[test]
    fn a_panic_in_a_session_still_returns_to_idle() {
        let l = Lifecycle::<Hold>::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _turn = l.begin("panics", false, no).unwrap();
            panic!("the measured code panicked");
        }));
        assert!(r.is_err());
        assert_eq!(l.phase(), "idle");
        assert!(l.begin("after", false, no).is_ok());
    }

    #[test]
    fn a_nested_start_is_refused_instead_of_waiting_for_itself() {
        let l = Lifecycle::<Hold>::new();
        let (_turn, _) = l.begin("outer", false, no).unwrap();
        assert_eq!(
            l.begin("inner", true, || true).err(),
            Some(Refused::Nested("outer".into()))
        );
        assert_eq!(l.waiting(), 0);
        assert_eq!(l.phase(), "running(outer)");
        // Not running: the scope question is not asked, and there is nothing to nest in.
        drop(_turn);
        assert!(
            l.begin("inner", true, || panic!("asked while idle"))
                .is_ok()
        );
    }
}
