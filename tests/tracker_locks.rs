//! Lock waits captured by the eBPF tracker (`tp_btf/sched_switch`, [`Capture::lock_waits`]):
//! every context switch of the recorded threads, with the leaving thread's user stack, checked
//! against what the threads measure of themselves.
//!
//! Tests run one at a time on the main thread (`harness = false`): the tracker is
//! process-global, and a harness's other threads would switch concurrently. Needs CAP_BPF +
//! CAP_PERFMON; without them the tests are reported as ignored, with why.

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use memtrack::{
    Scope, artifact::Backend, artifact::Metadata, artifact::Reader, encode::EncoderOptions,
    event::Event, event::EventKind, symbolize::Symbolizer, tracker::Capture, tracker::Tracker,
    tracker::TrackerOptions,
};

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Records `work` (run on this thread) with `capture`; returns the file's reader.
fn record(dir: &std::path::Path, capture: Capture, work: impl FnOnce()) -> Reader {
    let tracker = Tracker::global(&TrackerOptions::new()).expect("load and attach");
    let path = dir.join("locks.memtrack");
    let file = std::fs::File::create(&path).unwrap();
    let meta = Metadata::now(std::process::id(), Backend::Ebpf).with_name("locks");
    let rec = tracker
        .start_with(file, &meta, EncoderOptions::new(), 2, capture)
        .unwrap();
    work();
    let recorded = rec.stop().unwrap();
    assert_eq!(recorded.lost_events, 0);
    Reader::open(&path).unwrap()
}

/// Per thread: the (switch-out, switch-in) pairs, each switch-out with its event.
fn off_cpu(events: &[Event]) -> HashMap<u32, Vec<(Event, u64)>> {
    let mut open: HashMap<u32, Event> = HashMap::new();
    let mut waits: HashMap<u32, Vec<(Event, u64)>> = HashMap::new();
    for e in events {
        match e.kind {
            EventKind::SwitchOut { .. } => {
                assert!(
                    open.insert(e.tid, *e).is_none(),
                    "two switch-outs in a row: {e:?}"
                );
            }
            EventKind::SwitchIn => {
                if let Some(out) = open.remove(&e.tid) {
                    waits.entry(e.tid).or_default().push((out, e.ts - out.ts));
                }
            }
            _ => {}
        }
    }
    waits
}

/// Runs `work` in a session that records lock waits (named `name`; its scope: this thread and
/// the threads it spawns), and returns what `work` returned with the recording's lock waits
/// and its threads' preempted intervals ([`preempted_of`]).
fn session_waits<T>(
    name: &str,
    work: impl FnOnce() -> T,
) -> (T, memtrack::locks::LockWaits, Preempted) {
    let dir = tempfile::tempdir().unwrap();
    let session = memtrack::SessionBuilder::new(name)
        .output_dir(dir.path())
        .quiet(true)
        .lock_waits(true)
        .start()
        .unwrap();
    let path = session.path().unwrap().to_path_buf();
    let out = work();
    session.finish().unwrap();
    let reader = Reader::open(&path).unwrap();
    let waits = memtrack::locks::lock_waits(&reader, &mut Symbolizer::new()).unwrap();
    (out, waits, preempted_of(&reader))
}

/// Per thread (by tid), the off-CPU intervals memtrack classes as preempted, each as (start,
/// end).
type Preempted = HashMap<u32, Vec<(u64, u64)>>;

/// The [`Preempted`] intervals of the recording `reader` reads: switched out still runnable,
/// except a `sched_yield`, which memtrack classes by its stack like a block (parking_lot's
/// lock slow paths yield before they park).
fn preempted_of(reader: &Reader) -> Preempted {
    let off = off_cpu_of(reader);
    let table = reader.stacks().unwrap();
    let mut sym = Symbolizer::new();
    let mut class = |stack| {
        let names: Vec<String> = match table.stack(stack) {
            Some(stack) => sym.symbolize_stacks(&[stack], |id| table.module(id))[0]
                .iter()
                .flatten()
                .filter_map(|f| f.function.clone())
                .collect(),
            None => Vec::new(),
        };
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        memtrack::locks::classify(true, &names).0
    };
    off.threads
        .iter()
        .map(|t| {
            let preempted = t
                .intervals
                .iter()
                .filter(|i| i.preempted && class(i.stack) == memtrack::locks::WaitClass::Preempted)
                .map(|i| (i.start, i.end))
                .collect();
            (t.tid, preempted)
        })
        .collect()
}

/// The off-CPU intervals of the recording `reader` reads, per thread.
fn off_cpu_of(reader: &Reader) -> memtrack::analysis::OffCpu {
    let mut b = memtrack::analysis::OffCpuBuilder::new(reader.metadata().start_monotonic_ns);
    for e in reader.events() {
        b.update(&e.unwrap());
    }
    b.finish(reader.final_metadata().unwrap().end_monotonic_ns)
}

/// A thread's own measure of its calls into a lock: when each began and returned (ns,
/// CLOCK_MONOTONIC, the events' clock).
#[derive(Debug, Default)]
struct Calls(Vec<(u64, u64)>);

impl Calls {
    /// Times `call`.
    fn time<R>(&mut self, call: impl FnOnce() -> R) -> R {
        let t0 = memtrack::artifact::monotonic_ns();
        let r = call();
        self.0.push((t0, memtrack::artifact::monotonic_ns()));
        r
    }

    /// Nanoseconds in the calls.
    fn ns(&self) -> u64 {
        self.0.iter().map(|(t0, t1)| t1 - t0).sum()
    }

    /// Whether `got`, what memtrack classed as waits in these calls for thread `tid`, agrees
    /// with the thread's own measure: within [`agrees`] of it less the time memtrack classed
    /// as preempted inside the calls (on a loaded machine a thread woken in a call may
    /// wait for a CPU there: its clock counts that as the call's, memtrack as preempted).
    fn agree(&self, got: u64, tid: u32, preempted: &Preempted) -> bool {
        let preempted = preempted_in(self.0.iter().copied(), &preempted[&tid]);
        agrees(got, self.ns() - preempted)
    }
}

/// Whether every lock site reached from `test`'s own code (its function path in a frame) is
/// of `class`, and one is: a thread may also wait on locks of std's own outside it (exiting
/// threads take turns on the lock of std's stack-overflow handlers).
fn sites_from_test_are(
    waits: &memtrack::locks::LockWaits,
    test: &str,
    class: memtrack::locks::WaitClass,
) -> bool {
    let mut ours = waits
        .sites
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.contains(test)))
        .peekable();
    ours.peek().is_some() && ours.all(|s| s.class == class)
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): what it ran, never what it waited.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux defines.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Whether a time memtrack recorded, `got`, agrees with the program's own measure, `want`:
/// within 5 % or 1 ms, whichever is larger.
fn agrees(got: u64, want: u64) -> bool {
    got.abs_diff(want) <= (want / 20).max(1_000_000)
}

/// A thread sleeping 20 × 10 ms is off the CPU, voluntarily, for at least 200 ms and at most
/// the time it measured around its sleeps; a thread blocked on a contended `std::sync::Mutex`
/// leaves with a stack through std's `lock_contended`, and its wait matches its own measure of
/// the time it spent in `lock()` off the CPU (the wall time less its CPU time there: spinning
/// before the wait and returning after it run on the CPU, slowly under an emulated CPU) within
/// 5 % or 1 ms.
fn sleeps_and_mutex_waits_are_exact_intervals_with_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sleeper, mut waiter) = (0u32, 0u32);
    let (mut slept, mut locked) = (Duration::ZERO, Duration::ZERO);
    // The sleeper's window around its sleeps, on the events' clock (CLOCK_MONOTONIC).
    let mut window = (0u64, 0u64);
    let capture = Capture::new(Scope::Process).lock_waits(true);
    let reader = record(dir.path(), capture, || {
        let s = std::thread::spawn(|| {
            let (t, from) = (Instant::now(), memtrack::artifact::monotonic_ns());
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(10));
            }
            (
                gettid(),
                t.elapsed(),
                (from, memtrack::artifact::monotonic_ns()),
            )
        });
        let m = Arc::new(Mutex::new(0u64));
        let ready = Arc::new(Barrier::new(2));
        let guard = m.lock().unwrap();
        let w = {
            let (m, ready) = (Arc::clone(&m), Arc::clone(&ready));
            std::thread::spawn(move || {
                ready.wait();
                let (t, cpu) = (Instant::now(), thread_cpu());
                *m.lock().unwrap() += 1;
                (gettid(), t.elapsed() - (thread_cpu() - cpu))
            })
        };
        ready.wait();
        std::thread::sleep(Duration::from_millis(50));
        drop(guard);
        (waiter, locked) = w.join().unwrap();
        (sleeper, slept, window) = s.join().unwrap();
    });
    let events: Vec<Event> = reader.events().collect::<Result<_, _>>().unwrap();
    let me = std::process::id();
    let switches: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::SwitchOut { .. } | EventKind::SwitchIn))
        .collect();
    assert!(
        switches.iter().all(|e| e.pid == me),
        "another process's switch"
    );
    let ours = [gettid(), sleeper, waiter];
    let strays: Vec<_> = switches.iter().filter(|e| !ours.contains(&e.tid)).collect();
    assert!(
        strays.is_empty(),
        "switches of memtrack's threads: {strays:?}"
    );
    assert!(
        switches
            .iter()
            .all(|e| matches!(e.kind, EventKind::SwitchIn) == e.stack.is_none()),
        "every switch-out and no switch-in carries a stack"
    );
    let waits = off_cpu(&events);

    // Within the window: the thread may also block as it starts or exits (glibc's and std's
    // thread set-up and teardown), which is not its sleeping (a release build measured 44 µs
    // of that beside 202.28 ms of sleeps).
    let voluntary: u64 = waits[&sleeper]
        .iter()
        .filter(|(out, ns)| {
            out.kind == EventKind::SwitchOut { preempted: false }
                && out.ts >= window.0
                && out.ts + ns <= window.1
        })
        .map(|(_, ns)| ns)
        .sum();
    assert!(
        voluntary >= 200_000_000 && voluntary <= slept.as_nanos() as u64,
        "sleeper off the CPU {voluntary} ns, it slept 20 × 10 ms in {slept:?}"
    );

    let table = reader.stacks().unwrap();
    let mut sym = Symbolizer::new();
    let mut in_lock = 0u64;
    for (out, ns) in &waits[&waiter] {
        let stack = table.stack(out.stack).expect("a defined stack");
        let frames = sym.symbolize_stacks(&[stack], |id| table.module(id));
        let names: Vec<&str> = frames[0]
            .iter()
            .flatten()
            .filter_map(|f| f.function.as_deref())
            .collect();
        if names.iter().any(|n| n.contains("lock_contended")) {
            // Blocked: glibc's frameless `syscall()` first, then its caller, whose return
            // address only the stack pointer holds (no frame-pointer walk finds it). Preempted
            // (a busy machine), the thread may be anywhere in lock(), spinning before it waits.
            assert!(
                out.kind == (EventKind::SwitchOut { preempted: true })
                    || (names[0] == "syscall" && names[1].ends_with("futex_wait")),
                "{names:?}"
            );
            in_lock += ns;
        }
    }
    // It waited: off the CPU for most of the 50 ms the main thread held the lock.
    let measured = locked.as_nanos() as u64;
    assert!(
        agrees(in_lock, measured) && measured >= 40_000_000,
        "waiter off the CPU in lock_contended {in_lock} ns, it measured {measured} ns off the CPU \
         in lock()"
    );

    // The classified result agrees: the waiter's mutex wait, the sleeper's sleep.
    let waits = memtrack::locks::lock_waits(&reader, &mut sym).unwrap();
    let of = |tid| waits.threads.iter().find(|t| t.tid == tid).unwrap();
    let w = of(waiter);
    assert!(
        agrees(w.times.mutex_wait_ns, measured),
        "mutex_wait_ns {} vs {measured} measured",
        w.times.mutex_wait_ns
    );
    let s = of(sleeper);
    assert!(
        s.times.sleep_ns >= 200_000_000 && s.times.sleep_ns <= slept.as_nanos() as u64,
        "sleep_ns {} vs 20 × 10 ms in {slept:?}",
        s.times.sleep_ns
    );
    // None of its 10 ms sleeps is a mutex wait (it may wait microseconds on a lock of std's
    // own as it starts or exits, beside the waiter: the lock of std's stack-overflow handlers).
    assert!(
        s.times.mutex_wait_ns < 10_000_000,
        "sleeper's mutex_wait_ns {}",
        s.times.mutex_wait_ns
    );
    // The one contended site, above std's lock wrappers (this test is built without frame
    // pointers, so its own frames may be missing from the chain: not asserted).
    let site = &waits.sites[0];
    assert_eq!(site.class, memtrack::locks::WaitClass::Mutex);
    assert!(agrees(site.wait_ns, measured), "{site:?}");
    assert!(
        site.frames.iter().all(|f| !f.contains("std::sync")),
        "the code that wanted the lock: {:?}",
        site.frames
    );
}

/// A recording that does not ask for lock waits records no switch at all (the program is
/// detached after the recording that asked for them).
fn no_switches_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Capture::new(Scope::Process).lock_waits(true);
    let with = record(dir.path(), locks, || {
        std::thread::sleep(Duration::from_millis(5))
    });
    let count = |r: &Reader| {
        r.events()
            .map(|e| e.unwrap())
            .filter(|e| matches!(e.kind, EventKind::SwitchOut { .. } | EventKind::SwitchIn))
            .count()
    };
    assert!(
        count(&with) >= 2,
        "the sleep is a switch-out and a switch-in"
    );
    drop(with);
    let without = record(dir.path(), Capture::new(Scope::Process), || {
        std::thread::sleep(Duration::from_millis(5))
    });
    assert_eq!(count(&without), 0);
}

/// Which mutex the threads take turns on.
#[derive(Clone, Copy, Debug)]
enum MutexKind {
    Std,
    ParkingLot,
}

/// Threads taking turns on one mutex (`std::sync::Mutex` or `parking_lot::Mutex`), each
/// holding it for 2 ms at a time and measuring its own time in `lock()`: a session's
/// `mutex_wait_ns` per thread agrees with it ([`Calls::agree`]).
fn mutex_waits_match_what_the_threads_measure(threads: usize, kind: MutexKind) {
    let (measured, waits, preempted) = session_waits(&format!("mutex-{kind:?}-{threads}"), || {
        let m = Arc::new(Mutex::new(0u64));
        let pl = Arc::new(parking_lot::Mutex::new(0u64));
        let start = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (m, pl, start) = (Arc::clone(&m), Arc::clone(&pl), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    let mut calls = Calls::default();
                    for _ in 0..20 {
                        match kind {
                            MutexKind::Std => {
                                let mut g = calls.time(|| m.lock().unwrap());
                                *g += 1;
                                std::thread::sleep(Duration::from_millis(2));
                            }
                            MutexKind::ParkingLot => {
                                let mut g = calls.time(|| pl.lock());
                                *g += 1;
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        }
                    }
                    (gettid(), calls)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<(u32, Calls)>>()
    });
    let mut total = 0;
    for (tid, calls) in measured {
        let t = waits.threads.iter().find(|t| t.tid == tid).unwrap();
        assert!(
            calls.agree(t.times.mutex_wait_ns, tid, &preempted),
            "thread {tid}: mutex_wait_ns {} ns, it measured {} ns in lock() ({threads} \
             threads, {kind:?}; {t:?})",
            t.times.mutex_wait_ns,
            calls.ns()
        );
        total += calls.ns();
    }
    // Contended for real: while one thread holds the lock the others wait, but a thread that
    // the scheduler starts late (a loaded machine) does not wait for the holds before its
    // first lock(), so only a quarter of one thread's 20 holds of 2 ms is certain.
    assert!(total >= 5 * 2_000_000, "{total} ns of waits: no contention");
}

/// Threads sleeping 10 ms × 100: `sleep_ns` ≈ 1 s each (at least 1 s, at most what they
/// measured around their sleeps), and no lock wait in their code.
fn sleeps_are_sleep() {
    let (measured, waits, _) = session_waits("sleeps", || {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(|| {
                    let t = Instant::now();
                    for _ in 0..100 {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    (gettid(), t.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<(u32, Duration)>>()
    });
    for (tid, d) in measured {
        let t = waits.threads.iter().find(|t| t.tid == tid).unwrap();
        assert!(
            t.times.sleep_ns >= 1_000_000_000 && t.times.sleep_ns <= d.as_nanos() as u64,
            "thread {tid}: sleep_ns {} ns, it slept 100 × 10 ms in {d:?}",
            t.times.sleep_ns
        );
    }
    let ours: Vec<_> = waits
        .sites
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.contains("sleeps_are_sleep")))
        .collect();
    assert!(ours.is_empty(), "lock waits in the sleeps: {ours:?}");
}

/// One writer and readers on one `std::sync::RwLock`: the writer holds it 2 ms at a time, each
/// reader holds it 1 ms at a time, and every thread measures its own time in `write()` /
/// `read()`: `rwlock_wait_ns` per thread agrees with it ([`Calls::agree`]), and the waits
/// of the reads and writes are rwlock waits.
fn rwlock_waits_match_what_the_threads_measure() {
    let (measured, waits, preempted) = session_waits("rwlock", || {
        let rw = Arc::new(std::sync::RwLock::new(0u64));
        // No start barrier: it is a Mutex + Condvar, whose waits would be mutex waits. Twenty
        // rounds of each take 20 ms or more, far longer than spawning the others.
        let readers = 3;
        let writer = {
            let rw = Arc::clone(&rw);
            std::thread::spawn(move || {
                let mut calls = Calls::default();
                for _ in 0..20 {
                    let mut g = calls.time(|| rw.write().unwrap());
                    *g += 1;
                    std::thread::sleep(Duration::from_millis(2));
                    drop(g);
                    std::thread::sleep(Duration::from_millis(1));
                }
                (gettid(), calls)
            })
        };
        let handles: Vec<_> = (0..readers)
            .map(|_| {
                let rw = Arc::clone(&rw);
                std::thread::spawn(move || {
                    let mut calls = Calls::default();
                    for _ in 0..20 {
                        let g = calls.time(|| rw.read().unwrap());
                        std::hint::black_box(*g);
                        std::thread::sleep(Duration::from_millis(1));
                        drop(g);
                    }
                    (gettid(), calls)
                })
            })
            .collect();
        let mut measured: Vec<(u32, Calls)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        measured.push(writer.join().unwrap());
        measured
    });
    let mut total = 0;
    for (tid, calls) in measured {
        let t = waits.threads.iter().find(|t| t.tid == tid).unwrap();
        assert!(
            calls.agree(t.times.rwlock_wait_ns, tid, &preempted),
            "thread {tid}: rwlock_wait_ns {} ns, it measured {} ns in read()/write() ({t:?})",
            t.times.rwlock_wait_ns,
            calls.ns()
        );
        total += calls.ns();
    }
    assert!(
        sites_from_test_are(
            &waits,
            "rwlock_waits_match_what_the_threads_measure",
            memtrack::locks::WaitClass::RwLock
        ),
        "the reads' and writes' waits are rwlock waits: {:?}",
        waits.sites
    );
    assert!(
        total >= 20 * 1_000_000,
        "{total} ns of waits: no contention"
    );
}

/// One thread locking and unlocking an uncontended `std::sync::Mutex` in a loop: it never
/// waits for it (`mutex_wait_ns` under 1 % of its CPU time).
fn an_uncontended_mutex_is_no_wait() {
    let (tid, waits, _) = session_waits("uncontended", || {
        std::thread::spawn(|| {
            let m = Mutex::new(0u64);
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(200) {
                for _ in 0..1000 {
                    *m.lock().unwrap() += 1;
                }
            }
            std::hint::black_box(m);
            gettid()
        })
        .join()
        .unwrap()
    });
    let t = waits.threads.iter().find(|t| t.tid == tid).unwrap();
    // 200 ms of wall time; on a loaded machine much of it preempted.
    assert!(t.times.cpu_ns >= 20_000_000, "it ran: {t:?}");
    assert!(
        t.times.mutex_wait_ns * 100 < t.times.cpu_ns,
        "mutex_wait_ns {} of {} ns on the CPU",
        t.times.mutex_wait_ns,
        t.times.cpu_ns
    );
}

/// A ring buffer too small for the switches (4 KiB: 64 events, drained every 10 ms) loses
/// events: the recording counts them, and its lock waits are refused, never paired.
fn lost_switches_refuse_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.memtrack");
    memtrack_test_support::record_lost_switches(&path);
    let reader = Reader::open(&path).unwrap();
    let err = memtrack::locks::lock_waits(&reader, &mut Symbolizer::new()).expect_err("refused");
    assert!(
        matches!(err, memtrack::locks::LockWaitsError::NotWhole(_))
            && err.to_string().contains("lost"),
        "{err}"
    );
}

/// Lock waits with the allocator recorder: a clear error before anything starts.
fn lock_waits_need_the_ebpf_backend() {
    let err = memtrack::SessionBuilder::new("alloc-locks")
        .backend(memtrack::BackendChoice::Alloc)
        .in_memory(true)
        .lock_waits(true)
        .start()
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(
        matches!(err, memtrack::Error::InvalidOption(_)) && msg.contains("eBPF tracker"),
        "{msg}"
    );
}

/// What a worker of `pthread_locks.c` measured of itself (ns, CLOCK_MONOTONIC).
#[derive(Debug)]
struct CWorker {
    tid: u32,
    mutex_ns: u64,
    rwlock_ns: u64,
    condvar_ns: u64,
    barrier_ns: u64,
    begin_ns: u64,
    end_ns: u64,
    /// Each timed call: its class (`mutex`, …), when it began and returned.
    calls: Vec<(String, u64, u64)>,
}

fn c_workers(out: &str) -> Vec<CWorker> {
    let mut workers: Vec<CWorker> = out
        .lines()
        .filter(|l| l.starts_with("tid "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let v = |key: &str| -> u64 {
                let i = f.iter().position(|w| *w == key).expect(key);
                f[i + 1].parse().unwrap()
            };
            CWorker {
                tid: v("tid") as u32,
                mutex_ns: v("mutex_ns"),
                rwlock_ns: v("rwlock_ns"),
                condvar_ns: v("condvar_ns"),
                barrier_ns: v("barrier_ns"),
                begin_ns: v("begin_ns"),
                end_ns: v("end_ns"),
                calls: Vec::new(),
            }
        })
        .collect();
    for l in out.lines().filter(|l| l.starts_with("call ")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let tid: u32 = f[1].parse().unwrap();
        let w = workers.iter_mut().find(|w| w.tid == tid).unwrap();
        w.calls.push((
            f[2].to_string(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        ));
    }
    workers
}

/// Nanoseconds of the calls (each when it began and returned) during which the thread was
/// preempted (its [`Preempted`] intervals), which its clock counts as the call's.
fn preempted_in(calls: impl Iterator<Item = (u64, u64)>, preempted: &[(u64, u64)]) -> u64 {
    calls
        .map(|(t0, t1)| {
            preempted
                .iter()
                .map(|&(start, end)| end.min(t1).saturating_sub(start.max(t0)))
                .sum::<u64>()
        })
        .sum()
}

/// A C program built as distributions build it (`-O2 -fomit-frame-pointer`; glibc keeps no
/// frame pointers either), recorded as a command: 4 threads take turns on one
/// `pthread_mutex_t`, then on one `pthread_rwlock_t` (writes and reads), then wait on a
/// `pthread_cond_t` and at a `pthread_barrier_t`, holding each lock 5 ms, 30 rounds, each
/// measuring its own time in the calls (long holds: a thread preempted inside a call, say by
/// the threads it wakes, counts that time as the call's, memtrack as preempted). Per thread, `mutex_wait_ns`, `rwlock_wait_ns`,
/// `condvar_wait_ns` and `barrier_wait_ns` agree within 5 % (or 1 ms) with what it measured,
/// less the time it was preempted inside those calls (on a loaded machine a thread woken in a
/// call, or waking others, may wait for a CPU there: memtrack counts that as preempted, the
/// thread's clock as the call's; the figure is never above what the thread measured);
/// its row covers its own life (created before it began, ended after it returned: the
/// recording's start and end are not its), its times add up to that, and a worker, which
/// blocks nowhere but in its locks, has under 5 % of it "other" off-CPU time.
fn pthread_lock_waits_match_what_the_c_threads_measure() {
    let dir = tempfile::tempdir().unwrap();
    let exe = memtrack_test_support::fixtures::pthread_locks(dir.path(), "pthread_locks");
    let (measured, file) = (
        dir.path().join("measured.txt"),
        dir.path().join("c.memtrack"),
    );
    let command: Vec<std::ffi::OsString> = vec![
        exe.into(),
        measured.clone().into(),
        "4".into(),
        "30".into(),
        "5000".into(),
    ];
    let outcome = memtrack::tracker::record_command_with(
        &command,
        std::fs::File::create(&file).unwrap(),
        &TrackerOptions::new(),
        &memtrack::tracker::CommandOptions::new().lock_waits(true),
    )
    .unwrap();
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(outcome.recorded.lost_events, 0);
    let workers = c_workers(&std::fs::read_to_string(&measured).unwrap());
    assert_eq!(workers.len(), 4);
    let reader = Reader::open(&file).unwrap();
    let waits = memtrack::locks::lock_waits(&reader, &mut Symbolizer::new()).unwrap();
    // Each thread's life on the events' clock.
    let off = off_cpu_of(&reader);
    let classed_preempted = preempted_of(&reader);
    let mut contended = 0;
    for w in &workers {
        let t = waits.threads.iter().find(|t| t.tid == w.tid).unwrap();
        let life = off.threads.iter().find(|l| l.tid == w.tid).unwrap();
        for (class, got, measured) in [
            ("mutex", t.times.mutex_wait_ns, w.mutex_ns),
            ("rwlock", t.times.rwlock_wait_ns, w.rwlock_ns),
            ("condvar", t.times.condvar_wait_ns, w.condvar_ns),
            ("barrier", t.times.barrier_wait_ns, w.barrier_ns),
        ] {
            let calls = w.calls.iter().filter(|c| c.0 == class);
            let preempted = preempted_in(
                calls.map(|&(_, t0, t1)| (t0, t1)),
                &classed_preempted[&w.tid],
            );
            let want = measured - preempted;
            assert!(
                agrees(got, want) && got <= measured,
                "thread {}: {class} {got} ns, it measured {measured} ns, {preempted} of them \
                 preempted ({t:?})",
                w.tid
            );
        }
        contended += w.mutex_ns + w.rwlock_ns;
        assert!(
            life.start <= w.begin_ns && w.end_ns <= life.end && life.end < off.end,
            "thread {}: its row {}..{} ns, it ran {}..{}, the window ends at {}",
            w.tid,
            life.start,
            life.end,
            w.begin_ns,
            w.end_ns,
            off.end
        );
        let row = t.end_ns - t.start_ns;
        assert_eq!(row, life.end - life.start);
        let all: u64 = t.times.by_class().iter().map(|(_, ns)| ns).sum::<u64>() + t.times.cpu_ns;
        assert_eq!(all, row, "{t:?}");
        assert!(
            t.times.other_off_cpu_ns * 20 < row,
            "thread {}: other_off_cpu_ns {} of its {row} ns ({t:?})",
            w.tid,
            t.times.other_off_cpu_ns
        );
    }
    // Contended for real: 3 of 4 threads wait for each 5 ms hold, 30 rounds, two locks.
    assert!(contended >= 2 * 30 * 5_000_000, "{contended} ns of waits");
}

fn main() {
    use memtrack_test_support::{Need, TRACKER, requires, run_sequential};
    run_sequential(vec![
        requires(
            "sleeps_and_mutex_waits_are_exact_intervals_with_stacks",
            &[TRACKER],
            sleeps_and_mutex_waits_are_exact_intervals_with_stacks,
        ),
        requires(
            "no_switches_unless_asked_for",
            &[TRACKER],
            no_switches_unless_asked_for,
        ),
        requires("mutex_waits_2_threads", &[TRACKER], || {
            mutex_waits_match_what_the_threads_measure(2, MutexKind::Std)
        }),
        requires("mutex_waits_4_threads", &[TRACKER], || {
            mutex_waits_match_what_the_threads_measure(4, MutexKind::Std)
        }),
        requires("mutex_waits_8_threads", &[TRACKER], || {
            mutex_waits_match_what_the_threads_measure(8, MutexKind::Std)
        }),
        requires("parking_lot_mutex_waits_2_threads", &[TRACKER], || {
            mutex_waits_match_what_the_threads_measure(2, MutexKind::ParkingLot)
        }),
        requires("parking_lot_mutex_waits_4_threads", &[TRACKER], || {
            mutex_waits_match_what_the_threads_measure(4, MutexKind::ParkingLot)
        }),
        requires("parking_lot_mutex_waits_8_threads", &[TRACKER], || {
            mutex_waits_match_what_the_threads_measure(8, MutexKind::ParkingLot)
        }),
        requires(
            "rwlock_waits_match_what_the_threads_measure",
            &[TRACKER],
            rwlock_waits_match_what_the_threads_measure,
        ),
        requires(
            "an_uncontended_mutex_is_no_wait",
            &[TRACKER],
            an_uncontended_mutex_is_no_wait,
        ),
        requires("sleeps_are_sleep", &[TRACKER], sleeps_are_sleep),
        requires(
            "pthread_lock_waits_match_what_the_c_threads_measure",
            // Without bpf_find_vma glibc's rwlock and condvar waits are not told apart.
            &[
                TRACKER,
                Need::Tool("cc"),
                Need::Kernel(memtrack::tracker::Feature::FindVma),
            ],
            pthread_lock_waits_match_what_the_c_threads_measure,
        ),
        requires(
            "lost_switches_refuse_the_result",
            &[TRACKER],
            lost_switches_refuse_the_result,
        ),
        memtrack_test_support::test(
            "lock_waits_need_the_ebpf_backend",
            lock_waits_need_the_ebpf_backend,
        ),
    ]);
}
