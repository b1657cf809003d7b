//! Lock waits: each off-CPU interval of a recording of lock waits
//! ([`OffCpu`](crate::analysis::OffCpu)), classified by its symbolized stack, summed per thread, and the
//! contended call sites weighted by wait time.
//!
//! The classification is one table, [`RULES`]: read it top to bottom. A lock row (std's
//! `Mutex`, `RwLock`, `Condvar`, parking_lot's slow paths, pthreads, glibc's internal locks) matches
//! anywhere in the stack, innermost frame first, before any generic row (another futex, I/O,
//! sleep) does: a `Mutex` wait is also a futex wait, but the lock is the answer. A preempted
//! thread (still runnable) is [`WaitClass::Preempted`] whatever its stack: not a wait.

#[cfg(feature = "symbolize")]
use std::collections::HashMap;

#[cfg(feature = "symbolize")]
use crate::analysis::{OffCpuBuilder, ThreadTime};
#[cfg(feature = "symbolize")]
use crate::artifact::{Completeness, Reader, StackTable};
#[cfg(feature = "symbolize")]
use crate::event::EventKind;
#[cfg(feature = "symbolize")]
use crate::stack::StackId;
#[cfg(feature = "symbolize")]
use crate::symbolize::Symbolizer;

/// Why a thread was off the CPU. A class names a kind of lock, whichever library implements
/// it (the call site says whose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum WaitClass {
    /// A mutex: std's `Mutex::lock_contended`, parking_lot's `RawMutex::lock_slow`, a pthread
    /// mutex (`pthread_mutex_lock`, glibc's `__lll_lock_wait`; C++'s `std::mutex`).
    Mutex,
    /// A read-write lock: std's `RwLock::read_contended`/`write_contended`, parking_lot's
    /// `RawRwLock` slow paths, `pthread_rwlock_rdlock`/`wrlock`.
    RwLock,
    /// A condition variable's wait: std's and parking_lot's `Condvar`, `pthread_cond_wait`
    /// and its timed forms (C++'s `std::condition_variable`).
    Condvar,
    /// A barrier's wait: `pthread_barrier_wait`.
    Barrier,
    /// glibc's internal locks (`__lll_lock_wait_private`: the malloc arena lock, stdio).
    GlibcLock,
    /// Another futex wait (a futex of the program's own, pthread, `parking_lot_core::park`).
    OtherFutex,
    /// Waiting for I/O or polling: read/write/recv/send/accept/connect, poll/epoll/select.
    Io,
    /// Sleeping: `nanosleep`, `clock_nanosleep`, `std::thread::sleep`.
    Sleep,
    /// Off the CPU for a reason none of the rows names (a page fault, `waitpid`, no stack).
    OtherOffCpu,
    /// Preempted: still runnable, an involuntary switch (not a wait).
    Preempted,
}

impl WaitClass {
    /// The lower-case name used in tables and JSON (`"mutex"`, `"other_futex"`, …).
    pub const fn name(self) -> &'static str {
        match self {
            WaitClass::Mutex => "mutex",
            WaitClass::RwLock => "rwlock",
            WaitClass::Condvar => "condvar",
            WaitClass::Barrier => "barrier",
            WaitClass::GlibcLock => "glibc_lock",
            WaitClass::OtherFutex => "other_futex",
            WaitClass::Io => "io",
            WaitClass::Sleep => "sleep",
            WaitClass::OtherOffCpu => "other_off_cpu",
            WaitClass::Preempted => "preempted",
        }
    }
}

/// How a rule matches one frame's function name (demangled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// The name contains every one of these.
    Contains(&'static [&'static str]),
    /// The name is this libc function, once its aliases' decorations are taken off (leading
    /// underscores, `__GI_`, `__libc_`, a `_nocancel` or `64` suffix): `__libc_read` is `read`.
    Libc(&'static str),
}

impl Pattern {
    fn matches(self, function: &str) -> bool {
        match self {
            Pattern::Contains(all) => all.iter().all(|s| function.contains(s)),
            Pattern::Libc(name) => libc_base(function) == name,
        }
    }
}

/// A libc function's name without its aliases' decorations.
fn libc_base(f: &str) -> &str {
    let mut f = f.trim_start_matches('_');
    for prefix in ["GI_", "libc_"] {
        f = f.strip_prefix(prefix).unwrap_or(f).trim_start_matches('_');
    }
    let f = f.strip_suffix("_nocancel").unwrap_or(f);
    f.strip_suffix("64").unwrap_or(f)
}

/// One row of the classification: a lock row is tried on every frame before any generic row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Whether it names a lock (tried first, on the whole stack).
    pub lock: bool,
    /// What a frame's function must look like.
    pub pattern: Pattern,
    /// The class it gives.
    pub class: WaitClass,
}

const fn lock(all: &'static [&'static str], class: WaitClass) -> Rule {
    lock_at(Pattern::Contains(all), class)
}

const fn lock_at(pattern: Pattern, class: WaitClass) -> Rule {
    Rule {
        lock: true,
        pattern,
        class,
    }
}

const fn generic(pattern: Pattern, class: WaitClass) -> Rule {
    Rule {
        lock: false,
        pattern,
        class,
    }
}

/// The classification, one row per way of waiting (see the module's docs for the order).
pub const RULES: &[Rule] = &[
    // std (library/std/src/sys/sync): cold, never inlined in release builds.
    lock(&["Mutex", "::lock_contended"], WaitClass::Mutex),
    lock(&["RwLock", "::read_contended"], WaitClass::RwLock),
    lock(&["RwLock", "::write_contended"], WaitClass::RwLock),
    lock(&["Condvar", "::wait"], WaitClass::Condvar),
    // parking_lot: `#[cold]` slow paths, separate functions in a debug build. In a release
    // build they are inlined, and an inlined frame has only its DWARF name, without its path
    // (`lock_slow`): the path is then in the generic arguments of the frames inlined into
    // them (`park<parking_lot::raw_mutex::{impl#3}::lock_slow::{closure_env#0}, …>`), and
    // the spin before parking yields under lock_api's `lock<parking_lot::raw_mutex::RawMutex,
    // T>` alone.
    lock(&["parking_lot::raw_mutex", "lock_slow"], WaitClass::Mutex),
    lock(&["<parking_lot::raw_mutex::RawMutex"], WaitClass::Mutex),
    lock(&["parking_lot::raw_rwlock", "_slow"], WaitClass::RwLock),
    lock(&["<parking_lot::raw_rwlock::RawRwLock"], WaitClass::RwLock),
    lock(&["parking_lot::condvar", "wait"], WaitClass::Condvar),
    // glibc's internal locks (malloc arenas, stdio).
    lock(&["__lll_lock_wait_private"], WaitClass::GlibcLock),
    // pthreads (glibc), matched on the innermost frames, which are inside libc: neither glibc
    // nor a C program built as distributions build keeps frame pointers, so what lies past
    // them may be no frame at all. With glibc's debug symbols the frames are its internal
    // functions (`__GI___lll_lock_wait`, `__pthread_rwlock_rdlock_full64`,
    // `__pthread_cond_wait_common`); without them, the exported entry points
    // (`pthread_mutex_lock`, `__pthread_rwlock_rdlock`, `pthread_cond_wait`). A mutex a
    // condvar's waiter takes again is a mutex wait (`__pthread_mutex_cond_lock`).
    lock_at(Pattern::Libc("lll_lock_wait"), WaitClass::Mutex),
    lock(&["pthread_mutex_lock"], WaitClass::Mutex),
    lock(&["pthread_mutex_cond_lock"], WaitClass::Mutex),
    lock(&["pthread_mutex_timedlock"], WaitClass::Mutex),
    lock(&["pthread_mutex_clocklock"], WaitClass::Mutex),
    lock(&["pthread_rwlock_"], WaitClass::RwLock),
    lock(&["pthread_cond_"], WaitClass::Condvar),
    lock(&["pthread_barrier_wait"], WaitClass::Barrier),
    generic(Pattern::Contains(&["futex"]), WaitClass::OtherFutex),
    generic(
        Pattern::Contains(&["parking_lot_core", "park"]),
        WaitClass::OtherFutex,
    ),
    generic(Pattern::Contains(&["sem_"]), WaitClass::OtherFutex),
    generic(Pattern::Contains(&["nanosleep"]), WaitClass::Sleep),
    generic(Pattern::Contains(&["std::thread::sleep"]), WaitClass::Sleep),
    generic(Pattern::Libc("usleep"), WaitClass::Sleep),
    generic(Pattern::Libc("read"), WaitClass::Io),
    generic(Pattern::Libc("readv"), WaitClass::Io),
    generic(Pattern::Libc("pread"), WaitClass::Io),
    generic(Pattern::Libc("write"), WaitClass::Io),
    generic(Pattern::Libc("writev"), WaitClass::Io),
    generic(Pattern::Libc("pwrite"), WaitClass::Io),
    generic(Pattern::Libc("recv"), WaitClass::Io),
    generic(Pattern::Libc("recvfrom"), WaitClass::Io),
    generic(Pattern::Libc("recvmsg"), WaitClass::Io),
    generic(Pattern::Libc("send"), WaitClass::Io),
    generic(Pattern::Libc("sendto"), WaitClass::Io),
    generic(Pattern::Libc("sendmsg"), WaitClass::Io),
    generic(Pattern::Libc("accept"), WaitClass::Io),
    generic(Pattern::Libc("accept4"), WaitClass::Io),
    generic(Pattern::Libc("connect"), WaitClass::Io),
    generic(Pattern::Libc("poll"), WaitClass::Io),
    generic(Pattern::Libc("ppoll"), WaitClass::Io),
    generic(Pattern::Libc("select"), WaitClass::Io),
    generic(Pattern::Libc("pselect"), WaitClass::Io),
    generic(Pattern::Contains(&["epoll_"]), WaitClass::Io),
];

/// The class of an off-CPU interval: `preempted` (still runnable), else by the function names
/// of its stack, innermost first (each frame's inlined functions included). The index of the
/// frame that matched comes with it (`None`: no row matched, or preempted).
///
/// A thread that gave the CPU up itself with `sched_yield` is still runnable, but it chose to
/// wait: it is classified by its stack, like a blocked one (parking_lot's lock slow paths yield
/// a few times before they park; that time is the lock's).
pub fn classify(preempted: bool, functions: &[&str]) -> (WaitClass, Option<usize>) {
    let yielded = functions
        .first()
        .is_some_and(|f| libc_base(f) == "sched_yield");
    if preempted && !yielded {
        return (WaitClass::Preempted, None);
    }
    for tier in [true, false] {
        for (i, f) in functions.iter().enumerate() {
            if let Some(r) = RULES
                .iter()
                .find(|r| r.lock == tier && r.pattern.matches(f))
            {
                return (r.class, Some(i));
            }
        }
    }
    (WaitClass::OtherOffCpu, None)
}

/// Time by why it was off the CPU, and on it (nanoseconds): one thread's
/// ([`ThreadWaits::times`]) or every thread's summed ([`WaitTotals::times`]). Its fields are
/// the JSON keys of both (flattened into them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct WaitTimes {
    /// Waiting for a mutex (std, parking_lot).
    pub mutex_wait_ns: u64,
    /// Waiting for a read-write lock (std, parking_lot).
    pub rwlock_wait_ns: u64,
    /// Waiting on a condition variable.
    pub condvar_wait_ns: u64,
    /// Waiting at a barrier.
    pub barrier_wait_ns: u64,
    /// Waiting for one of glibc's internal locks.
    pub glibc_lock_wait_ns: u64,
    /// Waiting on another futex.
    pub other_futex_wait_ns: u64,
    /// Waiting for I/O or polling.
    pub io_wait_ns: u64,
    /// Sleeping.
    pub sleep_ns: u64,
    /// Off the CPU for another reason, or for a wait begun before the recording (no stack).
    pub other_off_cpu_ns: u64,
    /// Preempted (runnable, not waiting).
    pub preempted_ns: u64,
    /// On a CPU.
    pub cpu_ns: u64,
}

impl WaitTimes {
    /// The time of `class`.
    fn slot(&mut self, class: WaitClass) -> &mut u64 {
        match class {
            WaitClass::Mutex => &mut self.mutex_wait_ns,
            WaitClass::RwLock => &mut self.rwlock_wait_ns,
            WaitClass::Condvar => &mut self.condvar_wait_ns,
            WaitClass::Barrier => &mut self.barrier_wait_ns,
            WaitClass::GlibcLock => &mut self.glibc_lock_wait_ns,
            WaitClass::OtherFutex => &mut self.other_futex_wait_ns,
            WaitClass::Io => &mut self.io_wait_ns,
            WaitClass::Sleep => &mut self.sleep_ns,
            WaitClass::OtherOffCpu => &mut self.other_off_cpu_ns,
            WaitClass::Preempted => &mut self.preempted_ns,
        }
    }

    /// Each class's time, in the order of [`WaitClass`] (the order of the fields).
    pub fn by_class(&self) -> [(WaitClass, u64); 10] {
        // `slot` is the one map of class to field; it needs a place it may write (a copy).
        let mut t = *self;
        [
            WaitClass::Mutex,
            WaitClass::RwLock,
            WaitClass::Condvar,
            WaitClass::Barrier,
            WaitClass::GlibcLock,
            WaitClass::OtherFutex,
            WaitClass::Io,
            WaitClass::Sleep,
            WaitClass::OtherOffCpu,
            WaitClass::Preempted,
        ]
        .map(|c| (c, *t.slot(c)))
    }
}

impl std::ops::AddAssign for WaitTimes {
    fn add_assign(&mut self, other: WaitTimes) {
        for (class, ns) in other.by_class() {
            *self.slot(class) += ns;
        }
        self.cpu_ns += other.cpu_ns;
    }
}

/// One thread's time, by why it was off the CPU.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct ThreadWaits {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// When its row begins, ns after the window's start: its creation (0: it existed when the
    /// recording began). Its times add up to `end_ns - start_ns`.
    pub start_ns: u64,
    /// When its row ends, ns after the window's start: its exit (`window_ns`: it was alive
    /// at the end).
    pub end_ns: u64,
    /// Its time by class, and on a CPU.
    #[serde(flatten)]
    pub times: WaitTimes,
    /// `mutex_wait_ns / cpu_ns` (0 when it had no CPU time).
    pub mutex_wait_per_cpu: f64,
    /// It had no event in the window: asleep throughout (all of it in `other_off_cpu_ns`).
    pub idle: bool,
}

/// A contended call site: the code that wanted a lock (the stack above the lock call), with
/// the time waited there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct WaitSite {
    /// The lock's class.
    pub class: WaitClass,
    /// The functions above the lock call, innermost first (the caller of `lock()` first).
    pub frames: Vec<String>,
    /// Nanoseconds waited from this site, all threads.
    pub wait_ns: u64,
    /// Intervals waited from this site.
    pub waits: u64,
}

impl serde::Serialize for WaitClass {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The lock waits of a recording: per thread, and the contended call sites by wait time.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LockWaits {
    /// The window's length, nanoseconds.
    pub window_ns: u64,
    /// Per thread, by (pid, tid).
    pub threads: Vec<ThreadWaits>,
    /// Lock call sites (mutex, rwlock, condvar, barrier, glibc lock), most waited first.
    pub sites: Vec<WaitSite>,
}

/// The lock waits of every thread of a recording, summed: what a session's `Report` and
/// summary line carry ([`LockWaits::totals`]). The same intervals as [`LockWaits::threads`],
/// so each time is the sum of that time over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct WaitTotals {
    /// Threads seen (idle ones included).
    pub threads: u64,
    /// Their times summed.
    #[serde(flatten)]
    pub times: WaitTimes,
}

impl LockWaits {
    /// Every thread's times summed.
    pub fn totals(&self) -> WaitTotals {
        let mut t = WaitTotals::default();
        for w in &self.threads {
            t.threads += 1;
            t.times += w.times;
        }
        t
    }
}

/// Why a recording's lock waits cannot be given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockWaitsError {
    /// The recording has no context switch: it was not recorded with lock waits.
    #[error(
        "the recording has no context switches: record it with lock waits \
         (`memtrack record --locks -- CMD`, `SessionBuilder::lock_waits(true)`)"
    )]
    NotRecorded,
    /// Events were lost (or the file was recovered): intervals would pair the wrong switches.
    #[error(
        "the recording is not whole ({0}): its off-CPU intervals would pair the wrong switches; \
         record it again (a larger ring buffer loses fewer events)"
    )]
    NotWhole(String),
    /// The artifact could not be read.
    #[error(transparent)]
    Format(#[from] crate::artifact::FormatError),
    /// A session recorded lock waits, but memtrack was built without its feature `symbolize`,
    /// which names the stacks the waits are classified by.
    #[error(
        "lock waits are classified by their call stacks' function names, which needs \
         memtrack's feature `symbolize` (features = [\"symbolize\"]); the artifact has them: \
         `memtrack locks FILE`"
    )]
    NoSymbolizer,
}

/// The lock waits of the recording `reader` reads, its stacks named by `sym`. Refused when
/// the recording lost events, was recovered, or its switches contradict each other.
#[cfg(feature = "symbolize")]
pub fn lock_waits(reader: &Reader, sym: &mut Symbolizer) -> Result<LockWaits, LockWaitsError> {
    lock_waits_of(reader, sym, false)
}

/// [`lock_waits`] of a recording known to have asked for them (a session's): one without any
/// context switch is not refused (its threads never left the CPU).
#[cfg(feature = "symbolize")]
pub(crate) fn lock_waits_of(
    reader: &Reader,
    sym: &mut Symbolizer,
    asked: bool,
) -> Result<LockWaits, LockWaitsError> {
    let end = whole_window_end(reader)?;
    let off = off_cpu(reader, end, asked)?;
    let names = stack_names(&off, reader.stacks()?, sym);
    let mut sites = SiteSums::new();
    let threads = off
        .threads
        .iter()
        .map(|t| thread_waits(t, off.start, &names, &mut sites))
        .collect();
    Ok(LockWaits {
        window_ns: off.end - off.start,
        threads,
        sites: ranked(sites),
    })
}

/// The end of the recording's window (ns, CLOCK_MONOTONIC); a recording that was recovered
/// or lost events is refused.
#[cfg(feature = "symbolize")]
fn whole_window_end(reader: &Reader) -> Result<u64, LockWaitsError> {
    if let Completeness::Recovered { reason } = reader.completeness() {
        return Err(LockWaitsError::NotWhole(format!("recovered: {reason}")));
    }
    match reader.final_metadata() {
        Some(f) if f.lost_events > 0 => Err(LockWaitsError::NotWhole(format!(
            "{} events lost",
            f.lost_events
        ))),
        Some(f) => Ok(f.end_monotonic_ns),
        None => Err(LockWaitsError::NotWhole("no final metadata".into())),
    }
}

/// The recording's off-CPU intervals up to `end`; refused if it has no context switch (unless
/// lock waits were `asked` for) or its switches do not pair.
#[cfg(feature = "symbolize")]
fn off_cpu(
    reader: &Reader,
    end: u64,
    asked: bool,
) -> Result<crate::analysis::OffCpu, LockWaitsError> {
    let mut b = OffCpuBuilder::new(reader.metadata().start_monotonic_ns);
    let mut switches = 0u64;
    for e in reader.events() {
        let e = e?;
        switches += matches!(e.kind, EventKind::SwitchOut { .. }) as u64;
        b.update(&e);
    }
    if switches == 0 && !asked {
        return Err(LockWaitsError::NotRecorded);
    }
    let off = b.finish(end);
    if off.inconsistent > 0 {
        return Err(LockWaitsError::NotWhole(format!(
            "{} context switches do not pair",
            off.inconsistent
        )));
    }
    Ok(off)
}

/// Every distinct stack of the intervals, symbolized once, to its function names.
#[cfg(feature = "symbolize")]
fn stack_names(
    off: &crate::analysis::OffCpu,
    table: &StackTable,
    sym: &mut Symbolizer,
) -> HashMap<StackId, Vec<String>> {
    let mut ids: Vec<StackId> = off
        .threads
        .iter()
        .flat_map(|t| t.intervals.iter().map(|i| i.stack))
        .filter(|s| !s.is_none())
        .collect();
    ids.sort_unstable_by_key(|s| s.0);
    ids.dedup();
    let stacks: Vec<_> = ids.iter().filter_map(|id| table.stack(*id)).collect();
    let named = sym.symbolize_stacks(&stacks, |m| table.module(m));
    ids.iter()
        .copied()
        .filter(|id| table.stack(*id).is_some())
        .zip(named)
        .map(|(id, frames)| {
            let fns = frames
                .into_iter()
                .flatten()
                // An unnamed frame as `show` prints it (`libc.so.6+0x…`, where the chain broke).
                .map(|f| f.function.clone().unwrap_or_else(|| f.to_string()))
                .collect();
            (id, fns)
        })
        .collect()
}

/// Lock call sites being summed: (class, frames above the lock call) to (ns waited, waits).
#[cfg(feature = "symbolize")]
type SiteSums = HashMap<(WaitClass, Vec<String>), (u64, u64)>;

/// Thread `t`'s times by class, its intervals classified by their stacks' `names`; each lock
/// wait is also added to its call site in `sites`.
#[cfg(feature = "symbolize")]
fn thread_waits(
    t: &ThreadTime,
    window_start: u64,
    names: &HashMap<StackId, Vec<String>>,
    sites: &mut SiteSums,
) -> ThreadWaits {
    let mut w = ThreadWaits {
        pid: t.pid,
        tid: t.tid,
        start_ns: t.start - window_start,
        end_ns: t.end - window_start,
        times: WaitTimes {
            cpu_ns: t.cpu_ns,
            other_off_cpu_ns: t.before_first_switch_in_ns,
            ..WaitTimes::default()
        },
        idle: t.idle,
        ..ThreadWaits::default()
    };
    for i in &t.intervals {
        let fns: Vec<&str> = names
            .get(&i.stack)
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let (class, at) = classify(i.preempted, &fns);
        *w.times.slot(class) += i.ns();
        let is_lock = matches!(
            class,
            WaitClass::Mutex
                | WaitClass::RwLock
                | WaitClass::Condvar
                | WaitClass::Barrier
                | WaitClass::GlibcLock
        );
        if let (true, Some(at)) = (is_lock, at) {
            let above = lock_caller(&fns, at);
            let s = sites.entry((class, above)).or_default();
            s.0 += i.ns();
            s.1 += 1;
        }
    }
    if w.times.cpu_ns > 0 {
        w.mutex_wait_per_cpu = w.times.mutex_wait_ns as f64 / w.times.cpu_ns as f64;
    }
    w
}

/// The call sites, most waited first (equal waits in the order of their frames).
#[cfg(feature = "symbolize")]
fn ranked(sites: SiteSums) -> Vec<WaitSite> {
    let mut sites: Vec<WaitSite> = sites
        .into_iter()
        .map(|((class, frames), (wait_ns, waits))| WaitSite {
            class,
            frames,
            wait_ns,
            waits,
        })
        .collect();
    sites.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.frames.cmp(&b.frames)));
    sites
}

/// The frames above the lock call: past the matched frame and the lock's own wrappers (std's
/// `Mutex<T>::lock`, `RwLock<T>::read`, parking_lot's `lock_api` layer, glibc's pthread
/// functions and their inlined helpers).
#[cfg(feature = "symbolize")]
fn lock_caller(fns: &[&str], at: usize) -> Vec<String> {
    fns.iter()
        .skip(at + 1)
        .skip_while(|f| {
            f.starts_with("std::sync::")
                || f.starts_with("<std::sync::")
                || f.starts_with("std::sys::")
                || f.starts_with("<std::sys::")
                || f.contains("lock_api::")
                || f.contains("parking_lot::")
                || f.contains("pthread_")
                || f.starts_with("lll_")
                || f.starts_with("futex_")
        })
        .map(|f| f.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(functions: &[&str]) -> WaitClass {
        classify(false, functions).0
    }

    /// Recorded with `tests/tracker_locks.rs` (a thread blocked in `Mutex::lock`).
    const STD_MUTEX: &[&str] = &[
        "syscall",
        "std::sys::pal::unix::futex::futex_wait",
        "<std::sys::sync::mutex::futex::Mutex>::lock_contended",
        "std::sys::sync::mutex::futex::Mutex::lock",
        "std::sync::poison::mutex::Mutex<T>::lock",
        "start_thread",
    ];

    #[test]
    fn std_mutex() {
        assert_eq!(classify(false, STD_MUTEX), (WaitClass::Mutex, Some(2)));
    }

    #[test]
    fn std_rwlock_read_and_write() {
        let f = "std::sys::pal::unix::futex::futex_wait";
        for contended in ["read_contended", "write_contended"] {
            let lock = format!("<std::sys::sync::rwlock::futex::RwLock>::{contended}");
            assert_eq!(class(&["syscall", f, &lock]), WaitClass::RwLock);
        }
    }

    #[test]
    fn std_condvar_wait() {
        let stack = [
            "syscall",
            "std::sys::pal::unix::futex::futex_wait",
            "<std::sys::sync::condvar::futex::Condvar>::wait_optional_timeout",
            "std::sync::poison::condvar::Condvar::wait",
        ];
        assert_eq!(class(&stack), WaitClass::Condvar);
    }

    /// A condvar's waiter that wakes and finds the mutex taken waits for the mutex: the
    /// innermost lock frame decides.
    #[test]
    fn the_innermost_lock_decides() {
        let stack = [
            "syscall",
            "std::sys::pal::unix::futex::futex_wait",
            "<std::sys::sync::mutex::futex::Mutex>::lock_contended",
            "<std::sys::sync::condvar::futex::Condvar>::wait_optional_timeout",
        ];
        assert_eq!(class(&stack), WaitClass::Mutex);
    }

    #[test]
    fn parking_lot_slow_paths() {
        let park = "parking_lot_core::parking_lot::park";
        let rows = [
            (
                "parking_lot::raw_mutex::RawMutex::lock_slow",
                WaitClass::Mutex,
            ),
            (
                "parking_lot::raw_rwlock::RawRwLock::lock_shared_slow",
                WaitClass::RwLock,
            ),
            (
                "parking_lot::raw_rwlock::RawRwLock::lock_exclusive_slow",
                WaitClass::RwLock,
            ),
            (
                "parking_lot::condvar::Condvar::wait_until_internal",
                WaitClass::Condvar,
            ),
        ];
        for (f, want) in rows {
            assert_eq!(class(&["syscall", park, f]), want, "{f}");
        }
        // parking_lot_core's park alone (a primitive of its own): another futex.
        assert_eq!(class(&["syscall", park]), WaitClass::OtherFutex);
    }

    /// A release build: the slow paths inlined, their frames named without their paths,
    /// which only the generic arguments of the frames inlined into them carry.
    #[test]
    fn parking_lot_slow_paths_inlined() {
        // `futex_wait` and `park` inlined: their frames' names as DWARF gives them.
        let (futex, short_park) = ("futex_wait", "park");
        let rows = [
            (
                vec![
                    "park<parking_lot::raw_mutex::{impl#3}::lock_slow::{closure_env#0}>",
                    "lock_slow",
                    "lock",
                    "lock<parking_lot::raw_mutex::RawMutex, i32>",
                ],
                WaitClass::Mutex,
            ),
            (
                vec![
                    "park<parking_lot::raw_rwlock::{impl#10}::lock_common::{closure_env#0}\
                     <parking_lot::raw_rwlock::{impl#10}::lock_shared_slow::{closure_env#0}>>",
                    "lock_common<parking_lot::raw_rwlock::{impl#10}::lock_shared_slow>",
                    "lock_shared_slow",
                ],
                WaitClass::RwLock,
            ),
            (
                vec![
                    "park<parking_lot::condvar::{impl#1}::wait_until_internal::{closure_env#0}>",
                    "wait_until_internal",
                    "wait<bool>",
                ],
                WaitClass::Condvar,
            ),
        ];
        for (frames, want) in rows {
            let stack: Vec<&str> = ["syscall", futex, short_park]
                .into_iter()
                .chain(frames)
                .collect();
            assert_eq!(class(&stack), want, "{stack:?}");
        }
        // The short names alone say nothing of whose they are.
        assert_eq!(
            class(&["syscall", futex, "lock_slow", "lock"]),
            WaitClass::OtherFutex
        );
    }

    /// The spin before parking yields under lock_api's generic `lock`/`read`/`write`.
    #[test]
    fn parking_lot_spin_yields() {
        for (f, want) in [
            (
                "lock<parking_lot::raw_mutex::RawMutex, u64>",
                WaitClass::Mutex,
            ),
            (
                "read<parking_lot::raw_rwlock::RawRwLock, u64>",
                WaitClass::RwLock,
            ),
            (
                "write<parking_lot::raw_rwlock::RawRwLock, u64>",
                WaitClass::RwLock,
            ),
        ] {
            assert_eq!(class(&["__GI___sched_yield", "lock", f]), want, "{f}");
        }
    }

    #[test]
    fn glibc_internal_locks() {
        let stack = ["__lll_lock_wait_private", "_int_free", "free", "main"];
        assert_eq!(class(&stack), WaitClass::GlibcLock);
    }

    /// pthreads, from the innermost frames in libc: as glibc's debug symbols name them (the
    /// internal functions, inlined ones first), and as its exported symbols alone do (the
    /// innermost function unnamed). Past them, no frame may be right: not needed.
    #[test]
    fn pthreads_by_their_innermost_frames() {
        let unnamed = "libc.so.6+0x85e96";
        let rows: [(&[&str], WaitClass); 10] = [
            (
                &[
                    "futex_wait",
                    "__GI___lll_lock_wait",
                    "lll_mutex_lock_optimized",
                ],
                WaitClass::Mutex,
            ),
            (&[unnamed, "pthread_mutex_lock"], WaitClass::Mutex),
            (
                &[
                    "futex_wait",
                    "__GI___lll_lock_wait",
                    "__pthread_mutex_cond_lock",
                ],
                WaitClass::Mutex,
            ),
            (
                &[
                    "__futex_abstimed_wait_common64",
                    "__futex_abstimed_wait_common",
                    "__pthread_rwlock_rdlock_full64",
                    "___pthread_rwlock_rdlock",
                ],
                WaitClass::RwLock,
            ),
            (&[unnamed, "__pthread_rwlock_wrlock"], WaitClass::RwLock),
            (
                &[
                    "__futex_abstimed_wait_common",
                    "__pthread_cond_wait_common",
                    "___pthread_cond_wait",
                ],
                WaitClass::Condvar,
            ),
            (&[unnamed, "pthread_cond_timedwait"], WaitClass::Condvar),
            (&[unnamed, "pthread_cond_clockwait"], WaitClass::Condvar),
            (
                &["futex_wait", "futex_wait_simple", "___pthread_barrier_wait"],
                WaitClass::Barrier,
            ),
            (&["pthread_barrier_wait"], WaitClass::Barrier),
        ];
        for (stack, want) in rows {
            assert_eq!(class(stack), want, "{stack:?}");
        }
    }

    /// The call site of a contended pthread lock is the code above the pthread call.
    #[cfg(feature = "symbolize")]
    #[test]
    fn the_call_site_is_above_the_pthread_call() {
        let stack = [
            "futex_wait",
            "__GI___lll_lock_wait",
            "lll_mutex_lock_optimized",
            "___pthread_mutex_lock",
            "work",
            "start_thread",
        ];
        assert_eq!(lock_caller(&stack, 1), ["work", "start_thread"]);
    }

    #[test]
    fn other_futex() {
        assert_eq!(
            class(&["syscall", "my_crate::Event::wait_futex"]),
            WaitClass::OtherFutex
        );
        assert_eq!(
            class(&["__futex_abstimed_wait_common", "__new_sem_wait_slow64"]),
            WaitClass::OtherFutex
        );
    }

    #[test]
    fn io_and_polling() {
        for f in [
            "__libc_read",
            "read",
            "__GI___libc_write",
            "__libc_recv",
            "recvfrom",
            "accept4",
            "__poll",
            "epoll_wait",
            "__select",
            "__libc_pread64",
        ] {
            assert_eq!(class(&[f, "main"]), WaitClass::Io, "{f}");
        }
        // Not I/O because of a substring: a thread's start is not `read`.
        assert_eq!(class(&["start_thread"]), WaitClass::OtherOffCpu);
    }

    #[test]
    fn sleep() {
        for f in [
            "__GI___clock_nanosleep",
            "__nanosleep",
            "std::thread::sleep",
            "usleep",
        ] {
            assert_eq!(class(&[f]), WaitClass::Sleep, "{f}");
        }
    }

    #[test]
    fn preemption_is_not_a_wait() {
        assert_eq!(classify(true, STD_MUTEX), (WaitClass::Preempted, None));
    }

    #[test]
    fn no_row_matches() {
        assert_eq!(class(&["__wait4", "main"]), (WaitClass::OtherOffCpu));
        assert_eq!(class(&[]), WaitClass::OtherOffCpu);
    }

    /// The call site of a contended lock is the code above the lock's own wrappers.
    #[cfg(feature = "symbolize")]
    #[test]
    fn the_call_site_is_above_the_lock() {
        let mut stack = STD_MUTEX.to_vec();
        stack.insert(5, "app::worker");
        assert_eq!(lock_caller(&stack, 2), ["app::worker", "start_thread"]);
    }
}
