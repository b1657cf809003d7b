//! Sessions that accumulate calls: the calls of one `#[memtrack]` function (or of one
//! [`SessionBuilder`] name, through [`SessionBuilder::call`]) in a process are one recording of
//! N calls, one artifact holding every call, each bounded by iteration marks.
//!
//! ```text
//!   call(name) ─▶ first call of `name`: set the open recording of another name aside (its
//!                 part so far, finished), start a session (a new part of `name`'s recording
//!                 if it was set aside); later calls: resume the paused one
//!   Call::end() ─▶ pause (the recorder's Paused stage); with limits, check this call's figures
//!   finish_calls(), process exit ─▶ finish every recording: its parts joined into its
//!                 artifact (`parts`), one summary line per name
//! ```
//! One recording records at a time, like one session: a call of another name, or a session
//! started by hand, sets the open one aside, and a later call of its name records its next
//! part; the artifact holds every call of the name, as if the recording had paused in
//! between. One call runs at a time; a call from another thread waits for the running one.
//! Between calls the recorder records nothing, the allocator wrapper costs what it costs idle,
//! and the eBPF probes are detached once idle for [`IDLE_GRACE`](crate::tracker::IDLE_GRACE).

use std::sync::{Condvar, Mutex, MutexGuard, Once};

use super::parts::{Part, join};
use super::{Session, SessionBuilder};
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::report::Report;
use crate::tracker::Tracker;

/// The open recording of accumulated calls, and whether a call of it runs.
struct Calls {
    open: Option<Open>,
    /// A call runs (or a recording is being started or finished): other callers wait.
    busy: bool,
    /// Recordings set aside by a call of another name or a session started by hand, in the
    /// order they were: their finished parts, joined when the recordings finish.
    aside: Vec<Aside>,
}

struct Open {
    name: String,
    session: Session,
    /// Calls begun so far in this part.
    calls: u64,
    /// The recording's parts before this one (set aside).
    earlier: Vec<Part>,
}

impl Open {
    /// Calls begun so far in the whole recording: the earlier parts' and this one's.
    fn calls_so_far(&self) -> u64 {
        let before: u64 = self
            .earlier
            .iter()
            .filter_map(|p| p.report.iterations)
            .sum();
        before + self.calls
    }
}

struct Aside {
    name: String,
    parts: Vec<Part>,
}

static CALLS: Mutex<Calls> = Mutex::new(Calls {
    open: None,
    busy: false,
    aside: Vec::new(),
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

/// Begins a call of `builder`'s name: resumes the open recording of that name, or sets the
/// open one of another name aside and starts a part of this name's recording.
pub(super) fn call(mut builder: SessionBuilder) -> Result<Call> {
    // Checked per call, never against the recording's totals.
    let limits = std::mem::take(&mut builder.limits);
    let mut g = claim();
    if g.open.as_ref().is_some_and(|o| o.name == builder.name) {
        return resume(g, limits);
    }
    let previous = g.open.take();
    let earlier = g
        .aside
        .iter()
        .position(|a| a.name == builder.name)
        .map(|i| g.aside.remove(i));
    // Neither setting aside nor starting holds the lock: a session being started waits for
    // its turn, and callers wait on `busy` instead.
    drop(g);
    // The eBPF probes stay attached from the recording set aside to the one starting, as a
    // session hands them to the next, instead of detaching and attaching them again (an RCU
    // wait and a re-attach at every switch).
    let hold = previous
        .as_ref()
        .filter(|p| p.session.records_with_ebpf())
        .and_then(|_| Tracker::loaded())
        .and_then(|t| t.hold().ok());
    if let Some(previous) = previous {
        set_aside(previous);
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
    drop(hold);
    let mut g = lock();
    match started {
        Ok(session) => {
            g.open = Some(Open {
                name,
                session,
                calls: 0,
                earlier: earlier.map_or_else(Vec::new, |a| a.parts),
            });
            resume(g, limits)
        }
        Err(e) => {
            // The earlier parts stay a recording of their own calls.
            g.aside.extend(earlier);
            release(g);
            Err(e)
        }
    }
}

/// The line printed for an error of recording `name`: the name first, once (an error of
/// joining parts names its recording itself, since it is also returned to the caller).
fn error_line(name: &str, e: &Error) -> String {
    match e {
        Error::PartsNotJoined { .. } => format!("memtrack: {e}"),
        _ => format!("memtrack: {name}: {e}"),
    }
}

/// Sets `open` aside: its session finishes as a part, kept with the earlier ones until the
/// recording finishes. If it cannot finish, the error is printed (and the earlier parts are
/// finished now, by [`with_last_part`]).
fn set_aside(open: Open) {
    let Open {
        name,
        session,
        calls,
        earlier,
    } = open;
    match with_last_part(&name, session, calls, earlier) {
        Ok(parts) => lock().aside.push(Aside { name, parts }),
        Err(e) => eprintln!("{}", error_line(&name, &e)),
    }
}

/// `earlier` with `session` (of `calls` calls) finished as their last part. If it cannot
/// finish, the earlier parts are joined now, as the recording of the calls before (nothing
/// recorded is dropped), and the session's error is returned.
fn with_last_part(
    name: &str,
    mut session: Session,
    calls: u64,
    mut earlier: Vec<Part>,
) -> Result<Vec<Part>> {
    session.set_iterations(calls);
    match session.finish_part() {
        Ok(part) => {
            earlier.push(part);
            Ok(earlier)
        }
        Err(e) => {
            if !earlier.is_empty()
                && let Err(joined) = join(name, earlier)
            {
                eprintln!("{}", error_line(name, &joined));
            }
            Err(e)
        }
    }
}

impl Call {
    /// Ends the call: the recording pauses until the next call. With limits, checks them
    /// against this call's figures ([`Iteration`](crate::totals::Iteration)), waiting for the recorder to analyse the
    /// call (the allocator recorder's 2 ms merge window, or the eBPF poller's drain), and
    /// returns [`Error::CallLimitExceeded`] for a call that broke one.
    ///
    /// # Errors
    ///
    /// [`Error::CallLimitExceeded`] as above, or the recorder's error if it failed during the
    /// call.
    pub fn end(mut self) -> Result<()> {
        self.end_once()
    }

    fn end_once(&mut self) -> Result<()> {
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
                call: open.calls_so_far(),
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
        if let Err(e) = self.end_once() {
            eprintln!("memtrack: {e}");
        }
    }
}

/// Finishes every recording of calls of the process (waiting for a running call to end):
/// joins each one's parts into its artifact and prints its summary line, and returns the
/// report of the open one (the name called last). `None` if no recording of calls is open.
///
/// # Errors
///
/// As [`Session::finish`](crate::Session::finish), for the open recording: the recorder's or
/// the encoder's error, or the artifact's. Those of recordings set aside are printed.
pub fn finish_calls() -> Result<Option<Report>> {
    let mut g = claim();
    let (open, aside) = (g.open.take(), std::mem::take(&mut g.aside));
    drop(g);
    let report = finish_all(open, aside).transpose();
    release(lock());
    report
}

/// Makes way for a session started by hand: sets the open recording of calls aside (its
/// next call starts its next part), waiting for a running call to end (`wait`) or refusing
/// while one runs.
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
        set_aside(open);
    }
    release(lock());
    Ok(())
}

/// Finishes the recordings set aside (printing their errors), then the open one, returning
/// its result.
fn finish_all(open: Option<Open>, aside: Vec<Aside>) -> Option<Result<Report>> {
    for Aside { name, parts } in aside {
        if let Err(e) = join(&name, parts) {
            eprintln!("{}", error_line(&name, &e));
        }
    }
    open.map(finish_open)
}

/// Finishes the open recording: its session's artifact is the recording's, or its last part.
fn finish_open(open: Open) -> Result<Report> {
    let Open {
        name,
        mut session,
        calls,
        earlier,
    } = open;
    if earlier.is_empty() {
        session.set_iterations(calls);
        return session.finish();
    }
    join(&name, with_last_part(&name, session, calls, earlier)?)
}

/// At process exit: finishes every recording on a thread of its own (the exiting thread's
/// thread-locals may be gone), without waiting for a call that did not return.
extern "C" fn finish_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let mut g = lock();
        let (open, aside) = (g.open.take(), std::mem::take(&mut g.aside));
        drop(g);
        if open.is_none() && aside.is_empty() {
            return;
        }
        let finished = std::thread::Builder::new()
            .name("memtrack-exit".into())
            .spawn(move || {
                let name = open.as_ref().map(|o| o.name.clone());
                if let (Some(Err(e)), Some(name)) = (finish_all(open, aside), name) {
                    eprintln!("{}", error_line(&name, &e));
                }
            });
        if let Ok(t) = finished {
            let _ = t.join();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_line_names_its_recording_once() {
        let source = || Box::new(Error::InvalidOption("bad".into()));
        let not_joined = Error::PartsNotJoined {
            name: "calls".into(),
            kept: vec!["/d/calls.memtrack.1.partial".into()],
            source: source(),
        };
        assert_eq!(
            error_line("calls", &not_joined),
            "memtrack: calls: its 1 part could not be joined into one artifact (invalid option: \
             bad); it is kept as /d/calls.memtrack.1.partial, which `memtrack show` reads one by \
             one"
        );
        assert_eq!(
            error_line("calls", &source()),
            "memtrack: calls: invalid option: bad"
        );
    }
}
