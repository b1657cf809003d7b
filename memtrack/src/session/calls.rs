//! Sessions that accumulate calls: the calls of one `#[memtrack]` function (or of one
//! [`SessionBuilder`] name, through [`SessionBuilder::call`]) in a process are one recording of
//! N calls, one artifact holding every call, each bounded by iteration marks.
//!
//! ```text
//!   call(name) ─▶ first call of `name`: finish the open recording of another name (its
//!                 summary line), start a session; later calls: resume the paused one
//!   Call::end() ─▶ pause (the recorder's Paused stage); with limits, check this call's figures
//!   finish_calls(), process exit ─▶ finish the open recording: one summary line per name
//! ```
//! One recording is open at a time, like one session: a call of another name, or a session
//! started by hand, finishes it first (then a later call of the first name starts its artifact
//! again). One call runs at a time; a call from another thread waits for the running one.
//! Between calls the recorder records nothing, the allocator wrapper costs what it costs idle,
//! and the eBPF probes are detached once idle for [`IDLE_GRACE`](crate::tracker::IDLE_GRACE).

use std::sync::{Condvar, Mutex, MutexGuard, Once};

use super::{Session, SessionBuilder};
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::report::Report;

/// The open recording of accumulated calls, and whether a call of it runs.
struct Calls {
    open: Option<Open>,
    /// A call runs (or a recording is being started or finished): other callers wait.
    busy: bool,
    /// Names whose recording a call of another name finished, with that name; and the names
    /// already warned about starting again.
    displaced: Vec<(String, String)>,
    warned: Vec<String>,
}

struct Open {
    name: String,
    session: Session,
    /// Calls begun so far.
    calls: u64,
}

static CALLS: Mutex<Calls> = Mutex::new(Calls {
    open: None,
    busy: false,
    displaced: Vec::new(),
    warned: Vec::new(),
});
static CHANGED: Condvar = Condvar::new();
static AT_EXIT: Once = Once::new();

fn lock() -> MutexGuard<'static, Calls> {
    CALLS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits until no call runs, then marks one as running.
fn claim() -> MutexGuard<'static, Calls> {
    claim_in(lock())
}

/// [`claim`] with the lock already held.
fn claim_in(mut g: MutexGuard<'static, Calls>) -> MutexGuard<'static, Calls> {
    while g.busy {
        g = CHANGED.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    g.busy = true;
    g
}

fn release(mut g: MutexGuard<'static, Calls>) {
    g.busy = false;
    drop(g);
    CHANGED.notify_all();
}

/// One call of an accumulating recording, running; [`Call::end`] ends it. Dropping it ends it
/// too, printing what `end` would have returned as an error.
#[must_use = "the call is recorded until it is ended or dropped"]
pub struct Call {
    /// Set once ended. The call holds no name: nothing it does allocates while it records.
    ended: bool,
    limits: Limits,
}

/// Resumes the open recording if it is `name`'s: the next call of the same function, begun
/// without building a session (nothing allocated). `None` if no recording of `name` is open.
pub(crate) fn resume_open(name: &str, limits: Limits) -> Option<Result<Call>> {
    let g = claim();
    if g.open.as_ref().is_some_and(|o| o.name == name) {
        return Some(resume(g, limits));
    }
    release(g);
    None
}

/// Resumes the open recording, claimed in `g`.
fn resume(mut g: MutexGuard<'static, Calls>, limits: Limits) -> Result<Call> {
    let Some(open) = g.open.as_mut() else {
        release(g);
        return Err(Error::SessionFinished);
    };
    match open.session.resume() {
        Ok(()) => {
            open.calls += 1;
            Ok(Call {
                ended: false,
                limits,
            })
        }
        Err(e) => {
            release(g);
            Err(e)
        }
    }
}

/// Begins a call of `builder`'s name: resumes the open recording of that name, or finishes
/// the open one of another name and starts this name's.
pub(super) fn call(mut builder: SessionBuilder) -> Result<Call> {
    // Checked per call, never against the recording's totals.
    let limits = std::mem::take(&mut builder.limits);
    let g = claim();
    if g.open.as_ref().is_some_and(|o| o.name == builder.name) {
        return resume(g, limits);
    }
    let mut g = g;
    let previous = g.open.take();
    if let Some(p) = &previous {
        g.displaced.push((p.name.clone(), builder.name.clone()));
    }
    warn_if_displaced(&mut g, &builder.name);
    // Neither finishing nor starting holds the lock: a session being started waits for its
    // turn, and callers wait on `busy` instead.
    drop(g);
    if let Some(previous) = previous {
        finish_open(previous);
    }
    AT_EXIT.call_once(|| {
        // SAFETY: registers a function with no arguments that never unwinds out of it.
        unsafe { libc::atexit(finish_at_exit) };
    });
    // Made before recording starts, so that it is not counted.
    let name = builder.name.clone();
    // The session starts recording; paused at once (nothing here allocates in between), it
    // then resumes as every later call does: the same marks, the same scope rules.
    let started = builder
        .start_accumulating()
        .and_then(|s| s.pause(false).map(|()| s));
    let mut g = lock();
    match started {
        Ok(session) => {
            g.open = Some(Open {
                name,
                session,
                calls: 0,
            });
            resume(g, limits)
        }
        Err(e) => {
            release(g);
            Err(e)
        }
    }
}

/// Warns, once per name, that `name`'s recording starts again in this process: its artifact
/// will hold only the calls from now on, since a call of another name finished the first.
fn warn_if_displaced(g: &mut Calls, name: &str) {
    let Some(by) = g
        .displaced
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, by)| by.clone())
    else {
        return;
    };
    if g.warned.iter().any(|n| n == name) {
        return;
    }
    g.warned.push(name.to_string());
    eprintln!(
        "memtrack: warning: {name}: a call of {by} finished its recording, and this call starts \
         a new one that replaces its artifact: one recording of calls is open at a time (call \
         each function's calls together, or in processes of their own)"
    );
}

impl Call {
    /// Ends the call: the recording pauses until the next call. With limits, checks them
    /// against this call's figures ([`Iteration`](crate::analysis::Iteration)), waiting for the recorder to analyse the
    /// call (the allocator recorder's 2 ms merge window, or the eBPF poller's drain), and
    /// returns [`Error::CallLimitExceeded`] for a call that broke one.
    ///
    /// # Errors
    ///
    /// [`Error::CallLimitExceeded`] as above, or the recorder's error if it failed during the
    /// call.
    pub fn end(mut self) -> Result<()> {
        self.end_inner()
    }

    fn end_inner(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        let mut g = lock();
        let Some(open) = g.open.as_mut() else {
            release(g);
            return Err(Error::SessionFinished);
        };
        let paused = open.session.pause(true);
        let checked = paused.and_then(|()| {
            if self.limits.is_empty() {
                return Ok(());
            }
            let stats = open.session.stats()?;
            let iteration = stats.last_iteration.unwrap_or_default();
            let lost = open.session.lost_events_so_far()?;
            let violations = self.limits.check(&iteration.as_totals(), lost);
            if violations.is_empty() {
                return Ok(());
            }
            Err(Error::CallLimitExceeded {
                name: open.name.clone(),
                call: open.calls,
                path: open.session.path().map(ToOwned::to_owned),
                iteration: Box::new(iteration),
                violations,
            })
        });
        release(g);
        checked
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Err(e) = self.end_inner() {
            eprintln!("memtrack: {e}");
        }
    }
}

/// Finishes the open recording of accumulated calls (waiting for a running call to end):
/// writes its artifact, prints its summary line, and returns its report. `None` if no
/// recording of calls is open.
///
/// # Errors
///
/// As [`Session::finish`](crate::Session::finish): the recorder's or the encoder's error, or
/// the artifact's.
pub fn finish_calls() -> Result<Option<Report>> {
    let mut g = claim();
    let open = g.open.take();
    drop(g);
    let report = open.map(finish_session).transpose();
    release(lock());
    report
}

/// Makes way for a session started by hand: finishes the open recording of calls, waiting
/// for a running call to end (`wait`) or refusing while one runs.
pub(super) fn make_way(wait: bool, requested: &str) -> Result<()> {
    let g = lock();
    if g.open.is_none() {
        return Ok(());
    }
    if g.busy && !wait {
        let active = g.open.as_ref().map(|o| o.name.clone()).unwrap_or_default();
        return Err(Error::SessionActive {
            requested: requested.to_string(),
            active,
        });
    }
    let open = claim_in(g).open.take();
    if let Some(open) = open {
        finish_open(open);
    }
    release(lock());
    Ok(())
}

fn finish_session(open: Open) -> Result<Report> {
    let Open {
        mut session, calls, ..
    } = open;
    session.set_iterations(calls);
    session.finish()
}

/// Finishes a recording that another name's call or a hand-started session replaces: its
/// summary line is printed by the session; an error is printed here, as a dropped session's.
fn finish_open(open: Open) {
    let name = open.name.clone();
    if let Err(e) = finish_session(open) {
        eprintln!("memtrack: {name}: {e}");
    }
}

/// At process exit: finishes the open recording on a thread of its own (the exiting thread's
/// thread-locals may be gone), without waiting for a call that did not return.
extern "C" fn finish_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let open = lock().open.take();
        if let Some(open) = open {
            let finished = std::thread::Builder::new()
                .name("memtrack-exit".into())
                .spawn(move || finish_open(open));
            if let Ok(t) = finished {
                let _ = t.join();
            }
        }
    });
}
