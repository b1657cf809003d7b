//! The poller thread: drains the ring buffer into the encoder.

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use libbpf_rs::{MapHandle, RingBuffer, RingBufferBuilder};
use memtrack_bpf::{RawEvent, RawStack};

use super::TrackerError;
use super::bpf::{ThreadStates, exclude_tid, gettid};
use super::stacks::{Defined, SentStacks};
use crate::encode::{EncodeError, Encoder, Snapshot};
use crate::event::{Event, EventKind, RawRecord};
use crate::stack::{Module, ModuleId, Stack, StackId};

/// How often the poller drains when no wakeup comes: the BPF program submits events without
/// wakeups (see `wakeup_flag` in memtrack.bpf.c), so `poll()` alone would wait for the 64 KiB
/// watermark.
const DRAIN_PERIOD: Duration = Duration::from_millis(10);

/// The [`Event`] a ring-buffer record stands for; `None` for a kind this build does not know.
#[inline]
pub(crate) fn to_event(r: &RawEvent) -> Option<Event> {
    EventKind::from_raw(r.kind, &Ring(r)).map(|k| Event::new(r.ts, r.pid, r.tid, k))
}

/// A ring-buffer record as the kind table reads it.
struct Ring<'a>(&'a RawEvent);

impl RawRecord for Ring<'_> {
    #[inline(always)]
    fn addr(&self) -> u64 {
        self.0.addr
    }
    #[inline(always)]
    fn old_addr(&self) -> u64 {
        self.0.old_addr
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        self.0.size
    }
    #[inline(always)]
    fn align(&self) -> u64 {
        self.0.align
    }
}

/// What the poller does with one ring-buffer record: its [`Event`], or `None` for a record of
/// the wrong size or an unknown kind (counted as malformed). The hot-path gate measures this.
#[inline]
pub(crate) fn record_to_event(data: &[u8]) -> Option<Event> {
    RawEvent::from_bytes(data).as_ref().and_then(to_event)
}

/// Where a recording's events go: the session's encoder, whatever it writes to.
pub(crate) trait Sink: Send {
    fn push(&mut self, ev: Event) -> Result<(), EncodeError>;
    fn define_module(&mut self, id: ModuleId, module: Module) -> Result<(), EncodeError>;
    fn define_stack(&mut self, id: StackId, stack: Stack) -> Result<(), EncodeError>;
    fn snapshot(&mut self, s: &Arc<Snapshot>) -> Result<(), EncodeError>;
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<W: Write + Send + 'static> Sink for Encoder<W> {
    fn push(&mut self, ev: Event) -> Result<(), EncodeError> {
        Encoder::push(self, ev)
    }

    fn define_module(&mut self, id: ModuleId, module: Module) -> Result<(), EncodeError> {
        Encoder::define_module(self, id, module)
    }

    fn define_stack(&mut self, id: StackId, stack: Stack) -> Result<(), EncodeError> {
        Encoder::define_stack(self, id, stack)
    }

    fn snapshot(&mut self, s: &Arc<Snapshot>) -> Result<(), EncodeError> {
        Encoder::snapshot(self, s)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// The iteration marks of a recording (a session accumulating calls stamps them on
/// `CLOCK_MONOTONIC`, the clock of the program's events): the poller puts each before the first
/// ring-buffer event stamped after it, or after a drain that began after it, so a call's marks
/// bound exactly the calling thread's events (which the thread submits before it stamps the
/// end, and after it stamps the start).
#[derive(Default)]
pub(crate) struct Marks {
    /// Marks queued: the poller looks at the queue only when it is not 0.
    pending: AtomicUsize,
    queue: Mutex<VecDeque<Event>>,
}

impl Marks {
    /// Queues `mark` (stamped later than every mark queued before it).
    pub(crate) fn push(&self, mark: Event) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(mark);
        self.pending.fetch_add(1, Ordering::Release);
    }

    /// Calls `f` with every queued mark stamped before `until` (all of them for `None`), in
    /// order, and removes them.
    fn take_before(&self, until: Option<u64>, mut f: impl FnMut(Event)) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(m) = q.front().copied() {
            if until.is_some_and(|t| m.ts >= t) {
                break;
            }
            q.pop_front();
            self.pending.fetch_sub(1, Ordering::Release);
            f(m);
        }
    }
}

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock of the program's events.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the poller hands back when a recording stops.
pub(crate) struct Drained {
    pub(crate) sink: Box<dyn Sink>,
    /// The first error of `Encoder::push`, if any (later events were dropped).
    pub(crate) push_error: Option<EncodeError>,
    /// Records of an unknown kind or size, and events naming a stack no record defined (a
    /// mismatched object).
    pub(crate) malformed: u64,
    /// Heap allocation events whose call stack stops early.
    pub(crate) short_stacks: u64,
    /// Of those, the ones whose call site is in the C library.
    pub(crate) short_stacks_in_libc: u64,
}

impl Drained {
    /// The encoder the recording was started with.
    pub(crate) fn encoder<W: Write + Send + 'static>(self) -> Option<Encoder<W>> {
        self.sink
            .into_any()
            .downcast::<Encoder<W>>()
            .ok()
            .map(|e| *e)
    }
}

enum Cmd {
    Record {
        sink: Box<dyn Sink>,
        stop: Arc<AtomicBool>,
        snapshot: Arc<Snapshot>,
        marks: Arc<Marks>,
        done: SyncSender<Result<Drained, TrackerError>>,
    },
    Quit,
}

/// An eventfd the poller waits on beside the ring buffer, so that a stopping recording wakes
/// it at once instead of after the rest of a drain period.
struct Waker(OwnedFd);

impl Waker {
    fn new() -> Result<Self, TrackerError> {
        // SAFETY: eventfd takes an initial count and flags; returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(TrackerError::Io {
                what: "creating the poller's eventfd".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a new descriptor this value now owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 to the eventfd; a full counter (EAGAIN) means it
        // is readable already.
        unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a u64 from the non-blocking eventfd (EAGAIN: not woken).
        unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

/// An epoll set of the ring buffer's own epoll fd (readable when a forced wakeup came) and the
/// [`Waker`].
struct Wait(OwnedFd);

impl Wait {
    fn new(ring: i32, waker: &Waker) -> std::io::Result<Self> {
        // SAFETY: epoll_create1 takes flags; returns a new fd or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor this value now owns.
        let wait = Self(unsafe { OwnedFd::from_raw_fd(fd) });
        for watched in [ring, waker.0.as_raw_fd()] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 0,
            };
            // SAFETY: adds an open fd to the epoll set with a valid event.
            if unsafe { libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, watched, &mut ev) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(wait)
    }

    /// Returns when either is readable, or after `timeout`.
    fn wait(&self, timeout: Duration) -> std::io::Result<()> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: epoll_wait fills at most 2 events into `evs`.
        let n = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                evs.as_mut_ptr(),
                2,
                timeout.as_millis() as i32,
            )
        };
        match n {
            0.. => Ok(()),
            _ => match std::io::Error::last_os_error() {
                e if e.kind() == std::io::ErrorKind::Interrupted => Ok(()),
                e => Err(e),
            },
        }
    }
}

/// The poller thread of a tracker: started once, it keeps the ring buffer mapped for the
/// tracker's lifetime (mapping a large ring costs tens of ms, not to be paid per session) and
/// drains it into the current recording's encoder.
pub(crate) struct Poller {
    cmds: Mutex<SyncSender<Cmd>>,
    waker: Arc<Waker>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// One recording in the poller; [`PollerRecording::finish`] drains the tail and hands the
/// encoder back.
pub(crate) struct PollerRecording {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    done: Receiver<Result<Drained, TrackerError>>,
}

impl Poller {
    /// Starts the thread. With `exclude` it first adds its own tid to the excluded set
    /// (in-process recording); returns once the ring buffer is mapped. Stack records are
    /// resolved with `stacks`' module map.
    pub(crate) fn spawn(
        events: Arc<MapHandle>,
        exclude: Option<Arc<ThreadStates>>,
        stacks: SentStacks,
    ) -> Result<Self, TrackerError> {
        let (ready_tx, ready_rx) = sync_channel(1);
        let (cmd_tx, cmd_rx) = sync_channel(1);
        let waker = Arc::new(Waker::new()?);
        let theirs = Arc::clone(&waker);
        let thread = std::thread::Builder::new()
            .name("memtrack-poll".into())
            .spawn(move || {
                if let Some(ex) = &exclude
                    && let Err(e) = exclude_tid(ex, gettid())
                {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                run(&events, stacks, &cmd_rx, &ready_tx, &theirs);
            })
            .map_err(|source| TrackerError::Io {
                what: "spawning the poller".into(),
                source,
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                cmds: Mutex::new(cmd_tx),
                waker,
                thread: Mutex::new(Some(thread)),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(TrackerError::PollerDied)
            }
        }
    }

    /// Starts draining into `sink`, with `marks` among its events; answers `snapshot`'s
    /// requests.
    pub(crate) fn record(
        &self,
        sink: Box<dyn Sink>,
        snapshot: Arc<Snapshot>,
        marks: Arc<Marks>,
    ) -> Result<PollerRecording, TrackerError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (done, done_rx) = sync_channel(1);
        let cmd = Cmd::Record {
            sink,
            stop: Arc::clone(&stop),
            snapshot,
            marks,
            done,
        };
        self.cmds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(cmd)
            .map_err(|_| TrackerError::PollerDied)?;
        Ok(PollerRecording {
            stop,
            waker: Arc::clone(&self.waker),
            done: done_rx,
        })
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        let _ = self
            .cmds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Cmd::Quit);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl PollerRecording {
    /// Wakes the poller to drain now (a snapshot asked for is answered sooner).
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// Asks the poller to drain the tail (call after disabling recording) and waits for it.
    pub(crate) fn finish(self) -> Result<Drained, TrackerError> {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
        self.done
            .recv()
            .unwrap_or_else(|_| Err(TrackerError::PollerDied))
    }
}

/// The recording being drained, if any.
struct Active {
    sink: Box<dyn Sink>,
    push_error: Option<EncodeError>,
    malformed: u64,
    defined: Defined,
    marks: Arc<Marks>,
}

impl Active {
    /// Pushes the marks stamped before `until` (every one for `None`).
    fn push_marks(&mut self, until: Option<u64>) {
        let (sink, error) = (&mut self.sink, &mut self.push_error);
        self.marks.take_before(until, |m| {
            if error.is_none()
                && let Err(e) = sink.push(m)
            {
                *error = Some(e);
            }
        });
    }
}

/// One ring-buffer record: a stack goes into the table (also between recordings: the program
/// remembers every stack it sent, and a late one must not be missing from the next recording);
/// an event goes to the recording, if one runs, with its stack in the recording's numbering.
fn on_record(data: &[u8], table: &mut SentStacks, active: Option<&mut Active>) {
    if RawStack::is_stack(data) {
        let ok = RawStack::from_bytes(data).is_some_and(|(h, frames)| table.add(&h, frames));
        if let (false, Some(a)) = (ok, active) {
            a.malformed += 1;
        }
        return;
    }
    let raw = RawEvent::from_bytes(data);
    if let Some(r) = &raw
        && r.kind == memtrack_bpf::kind::EXEC
    {
        table.exec(r.pid, r.ts);
    }
    // Between recordings the switch is off: no event arrives, and none is kept.
    let Some(a) = active else { return };
    match raw.as_ref().and_then(to_event) {
        Some(ev) if a.push_error.is_none() => {
            a.push_marks(Some(ev.ts));
            let stack = raw.map_or(0, |r| r.stack);
            let pushed = a
                .defined
                .attach(table, ev, stack, a.sink.as_mut())
                .and_then(|ev| a.sink.push(ev));
            if let Err(e) = pushed {
                a.push_error = Some(e);
            }
        }
        Some(_) => {}
        None => a.malformed += 1,
    }
}

fn run(
    events: &MapHandle,
    table: SentStacks,
    cmds: &Receiver<Cmd>,
    ready: &SyncSender<Result<(), TrackerError>>,
    waker: &Waker,
) {
    let state: RefCell<Option<Active>> = RefCell::new(None);
    let table = RefCell::new(table);
    let mut builder = RingBufferBuilder::new();
    let added = builder.add(events, |data: &[u8]| {
        on_record(data, &mut table.borrow_mut(), state.borrow_mut().as_mut());
        0
    });
    if let Err(e) = added {
        let _ = ready.send(Err(TrackerError::bpf("adding the ring buffer", e)));
        return;
    }
    let rb = match builder.build() {
        Ok(rb) => rb,
        Err(e) => {
            let _ = ready.send(Err(TrackerError::bpf("mapping the ring buffer", e)));
            return;
        }
    };
    let wait = match Wait::new(rb.epoll_fd(), waker) {
        Ok(w) => w,
        Err(source) => {
            let _ = ready.send(Err(TrackerError::Io {
                what: "waiting on the ring buffer".into(),
                source,
            }));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    while let Ok(Cmd::Record {
        sink,
        stop,
        snapshot,
        marks,
        done,
    }) = cmds.recv()
    {
        *state.borrow_mut() = Some(Active {
            sink,
            push_error: None,
            malformed: 0,
            defined: Defined::default(),
            marks,
        });
        let drained = drain_recording(&rb, &wait, waker, &stop, &snapshot, &state);
        let a = state.borrow_mut().take().expect("set above");
        let _ = done.send(drained.map(|()| Drained {
            sink: a.sink,
            push_error: a.push_error,
            malformed: a.malformed + a.defined.unknown,
            short_stacks: a.defined.short_stacks,
            short_stacks_in_libc: a.defined.short_stacks_in_libc,
        }));
    }
}

/// Drains `rb` into the recording in `state` every [`DRAIN_PERIOD`] (sooner when woken) and
/// answers its snapshots, until `stop`; then drains the tail.
fn drain_recording(
    rb: &RingBuffer,
    wait: &Wait,
    waker: &Waker,
    stop: &AtomicBool,
    snapshot: &Arc<Snapshot>,
    state: &RefCell<Option<Active>>,
) -> Result<(), TrackerError> {
    let drain = || {
        rb.consume()
            .map_err(|e| TrackerError::bpf("draining the ring buffer", e))
    };
    // The marks stamped before a drain began go after what it drained.
    let drain_marks = |until: Option<u64>| {
        if let Some(a) = state.borrow_mut().as_mut() {
            a.push_marks(until);
        }
    };
    while !stop.load(Ordering::Acquire) {
        // Returns early on a forced wakeup (watermark passed) or a stop, else after
        // the period.
        wait.wait(DRAIN_PERIOD).map_err(|source| TrackerError::Io {
            what: "waiting on the ring buffer".into(),
            source,
        })?;
        waker.clear();
        let began = monotonic_ns();
        drain()?;
        drain_marks(Some(began + 1));
        if snapshot.take_request() {
            // Everything submitted before the request is in the ring buffer now.
            let began = monotonic_ns();
            drain()?;
            drain_marks(Some(began + 1));
            let mut st = state.borrow_mut();
            let a = st.as_mut().expect("a recording is active");
            if a.push_error.is_none()
                && let Err(e) = a.sink.snapshot(snapshot)
            {
                a.push_error = Some(e);
            }
        }
    }
    // The tail: recording is off, but a program that passed the switch just before
    // may still be filling its record; drain until two passes 1 ms apart find nothing.
    loop {
        drain()?;
        std::thread::sleep(Duration::from_millis(1));
        if rb.consume_raw() <= 0 {
            drain_marks(None);
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use memtrack_bpf::kind;

    use super::*;

    #[test]
    fn raw_events_convert_field_by_field() {
        let raw = RawEvent {
            ts: 5,
            pid: 7,
            tid: 8,
            kind: kind::REALLOC,
            stack: 0,
            addr: 0x2000,
            old_addr: 0x1000,
            size: 96,
            align: 0,
        };
        let ev = to_event(&raw).unwrap();
        assert_eq!(
            ev,
            Event::new(
                5,
                7,
                8,
                EventKind::Realloc {
                    old_addr: 0x1000,
                    new_addr: 0x2000,
                    size: 96
                }
            )
        );
        let aligned = RawEvent {
            kind: kind::ALIGNED_ALLOC,
            align: 64,
            ..raw
        };
        assert_eq!(
            to_event(&aligned).unwrap().kind,
            EventKind::AlignedAlloc {
                addr: 0x2000,
                size: 96,
                align: 64
            }
        );
        assert!(to_event(&RawEvent { kind: 0, ..raw }).is_none());
        let kinds = kind::ALL.len() as u32;
        assert!(
            to_event(&RawEvent {
                kind: kinds + 1,
                ..raw
            })
            .is_none()
        );
        for k in 1..=kinds {
            let ev = to_event(&RawEvent { kind: k, ..raw }).unwrap();
            assert_eq!(
                ev.kind.tag() as u32,
                k,
                "tag numbers of memtrack.h and KindTag differ"
            );
        }
    }
}
