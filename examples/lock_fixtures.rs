//! Writes the recorded-stack fixtures of `tests/classify_fixtures.rs`: for each way of waiting
//! (std's Mutex, RwLock read and write, Condvar; parking_lot's Mutex, RwLock, Condvar; glibc's
//! internal stdio lock; a pthread mutex; a pipe read; poll; sleep) one thread waits ~50 ms that
//! way while recorded with lock waits (eBPF, needs root or CAP_BPF + CAP_PERFMON), and the
//! symbolized stack of its longest off-CPU interval is written to
//! `tests/fixtures/locks/<name>.txt`, one function per line, innermost first, after `#` lines
//! saying how it was made. A release build's stacks differ (inlined slow paths, whose frames
//! have only their DWARF names): they go to `tests/fixtures/locks/release/`.
//!
//! ```text
//! cargo run --example lock_fixtures [-- OUT_DIR]
//! cargo run --release --example lock_fixtures -- tests/fixtures/locks/release
//! ```

use std::io::Write;
use std::sync::{Arc, Barrier, Condvar, Mutex, RwLock};
use std::time::Duration;

use memtrack::{SessionBuilder, analysis::OffCpuBuilder, artifact::Reader, symbolize::Symbolizer};

const HOLD: Duration = Duration::from_millis(50);

// glibc's stdio locking (POSIX; not in the libc crate).
unsafe extern "C" {
    fn flockfile(f: *mut libc::FILE);
    fn funlockfile(f: *mut libc::FILE);
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Runs `hold` on one thread and `wait` on another once `hold` has its lock (both get the
/// barrier: `hold` waits on it after taking the lock, `wait` before waiting); returns the
/// waiting thread's tid.
fn pair(hold: impl FnOnce(&Barrier) + Send + 'static, wait: impl FnOnce() + Send + 'static) -> u32 {
    let ready = Arc::new(Barrier::new(2));
    let h = {
        let ready = Arc::clone(&ready);
        std::thread::spawn(move || hold(&ready))
    };
    let w = std::thread::spawn(move || {
        ready.wait();
        // Let the holder pass the barrier and sleep first.
        std::thread::sleep(Duration::from_millis(5));
        wait();
        gettid()
    });
    let tid = w.join().unwrap();
    h.join().unwrap();
    tid
}

/// A scenario: its name and what runs it (returning the waiting thread's tid).
type Scenario = (&'static str, Box<dyn FnOnce() -> u32>);

fn scenarios() -> Vec<Scenario> {
    let mut v: Vec<Scenario> = Vec::new();
    v.push((
        "std_mutex",
        Box::new(|| {
            let m = Arc::new(Mutex::new(0));
            let m2 = Arc::clone(&m);
            pair(
                move |b| {
                    let _g = m.lock().unwrap();
                    b.wait();
                    std::thread::sleep(HOLD);
                },
                move || *m2.lock().unwrap() += 1,
            )
        }),
    ));
    v.push((
        "std_rwlock_read",
        Box::new(|| {
            let l = Arc::new(RwLock::new(0));
            let l2 = Arc::clone(&l);
            pair(
                move |b| {
                    let _g = l.write().unwrap();
                    b.wait();
                    std::thread::sleep(HOLD);
                },
                move || {
                    std::hint::black_box(*l2.read().unwrap());
                },
            )
        }),
    ));
    v.push((
        "std_rwlock_write",
        Box::new(|| {
            let l = Arc::new(RwLock::new(0));
            let l2 = Arc::clone(&l);
            pair(
                move |b| {
                    let _g = l.read().unwrap();
                    b.wait();
                    std::thread::sleep(HOLD);
                },
                move || *l2.write().unwrap() += 1,
            )
        }),
    ));
    v.push((
        "std_condvar",
        Box::new(|| {
            let c = Arc::new((Mutex::new(false), Condvar::new()));
            let c2 = Arc::clone(&c);
            pair(
                move |b| {
                    b.wait();
                    std::thread::sleep(HOLD);
                    *c.0.lock().unwrap() = true;
                    c.1.notify_all();
                },
                move || {
                    let mut done = c2.0.lock().unwrap();
                    while !*done {
                        done = c2.1.wait(done).unwrap();
                    }
                },
            )
        }),
    ));
    v.push((
        "parking_lot_mutex",
        Box::new(|| {
            let m = Arc::new(parking_lot::Mutex::new(0));
            let m2 = Arc::clone(&m);
            pair(
                move |b| {
                    let _g = m.lock();
                    b.wait();
                    std::thread::sleep(HOLD);
                },
                move || *m2.lock() += 1,
            )
        }),
    ));
    v.push((
        "parking_lot_rwlock_read",
        Box::new(|| {
            let l = Arc::new(parking_lot::RwLock::new(0));
            let l2 = Arc::clone(&l);
            pair(
                move |b| {
                    let _g = l.write();
                    b.wait();
                    std::thread::sleep(HOLD);
                },
                move || {
                    std::hint::black_box(*l2.read());
                },
            )
        }),
    ));
    v.push((
        "parking_lot_condvar",
        Box::new(|| {
            let c = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
            let c2 = Arc::clone(&c);
            pair(
                move |b| {
                    b.wait();
                    std::thread::sleep(HOLD);
                    *c.0.lock() = true;
                    c.1.notify_all();
                },
                move || {
                    let mut done = c2.0.lock();
                    while !*done {
                        c2.1.wait(&mut done);
                    }
                },
            )
        }),
    ));
    v.push((
        "glibc_stdio_lock",
        Box::new(|| {
            // A FILE's lock is one of glibc's internal (private futex) locks.
            // SAFETY: a valid path and mode; the FILE is closed below, after both threads.
            let f = unsafe { libc::fopen(c"/dev/null".as_ptr(), c"w".as_ptr()) } as usize;
            assert!(f != 0);
            let tid = pair(
                move |b| {
                    // SAFETY: `f` is an open FILE.
                    unsafe { flockfile(f as *mut libc::FILE) };
                    b.wait();
                    std::thread::sleep(HOLD);
                    // SAFETY: locked above by this thread.
                    unsafe { funlockfile(f as *mut libc::FILE) };
                },
                move || {
                    // SAFETY: `f` is an open FILE.
                    unsafe { libc::fputc(b'x' as i32, f as *mut libc::FILE) };
                },
            );
            // SAFETY: both threads are done with it.
            unsafe { libc::fclose(f as *mut libc::FILE) };
            tid
        }),
    ));
    v.push((
        "pthread_mutex",
        Box::new(|| {
            static mut M: libc::pthread_mutex_t = libc::PTHREAD_MUTEX_INITIALIZER;
            pair(
                |b| {
                    // SAFETY: a static, initialised mutex; unlocked by the same thread.
                    unsafe { libc::pthread_mutex_lock(&raw mut M) };
                    b.wait();
                    std::thread::sleep(HOLD);
                    // SAFETY: as above.
                    unsafe { libc::pthread_mutex_unlock(&raw mut M) };
                },
                || {
                    // SAFETY: as above.
                    unsafe {
                        libc::pthread_mutex_lock(&raw mut M);
                        libc::pthread_mutex_unlock(&raw mut M);
                    }
                },
            )
        }),
    ));
    v.push((
        "pipe_read",
        Box::new(|| {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for two descriptors.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            let [r, w] = fds;
            let tid = pair(
                move |b| {
                    b.wait();
                    std::thread::sleep(HOLD);
                    // SAFETY: `w` is the pipe's open write end; one byte from a local.
                    unsafe { libc::write(w, [1u8].as_ptr().cast(), 1) };
                },
                move || {
                    let mut byte = 0u8;
                    // SAFETY: `r` is the pipe's open read end; one byte into a local.
                    unsafe { libc::read(r, (&raw mut byte).cast(), 1) };
                },
            );
            // SAFETY: both threads are done with them.
            unsafe {
                libc::close(r);
                libc::close(w);
            }
            tid
        }),
    ));
    v.push((
        "poll",
        Box::new(|| {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for two descriptors.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            let [r, w] = fds;
            let tid = pair(
                |b| {
                    b.wait();
                },
                move || {
                    let mut p = libc::pollfd {
                        fd: r,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd; nothing is ever written: it times out.
                    unsafe { libc::poll(&mut p, 1, HOLD.as_millis() as i32) };
                },
            );
            // SAFETY: both threads are done with them.
            unsafe {
                libc::close(r);
                libc::close(w);
            }
            tid
        }),
    ));
    v.push((
        "sleep",
        Box::new(|| {
            pair(
                |b| {
                    b.wait();
                },
                || std::thread::sleep(HOLD),
            )
        }),
    ));
    v
}

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tests/fixtures/locks".into());
    std::fs::create_dir_all(&out).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
    let glibc = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) }
        .to_string_lossy()
        .into_owned();
    for (name, run) in scenarios() {
        let session = SessionBuilder::new(name)
            .output_dir(dir.path())
            .quiet(true)
            .lock_waits(true)
            .start()
            .expect("a lock-wait session (root or CAP_BPF + CAP_PERFMON)");
        let path = session.path().unwrap().to_path_buf();
        let tid = run();
        session.finish().unwrap();
        let reader = Reader::open(&path).unwrap();
        let mut b = OffCpuBuilder::new(reader.metadata().start_monotonic_ns);
        for e in reader.events() {
            b.update(&e.unwrap());
        }
        let end = reader.final_metadata().unwrap().end_monotonic_ns;
        let off = b.finish(end);
        assert_eq!(off.inconsistent, 0, "{name}: switches do not pair");
        let t = off.threads.iter().find(|t| t.tid == tid).unwrap();
        let longest = t
            .intervals
            .iter()
            .filter(|i| !i.preempted && !i.stack.is_none())
            .max_by_key(|i| i.ns())
            .unwrap_or_else(|| panic!("{name}: no wait of thread {tid}"));
        let table = reader.stacks().unwrap();
        let stack = table.stack(longest.stack).unwrap();
        let mut sym = Symbolizer::new();
        let frames = sym.symbolize_stacks(&[stack], |m| table.module(m));
        let functions: Vec<String> = frames
            .into_iter()
            .flatten()
            .flatten()
            .map(|f| {
                f.function
                    .unwrap_or_else(|| format!("{}+{:#x}", f.module, f.offset))
            })
            .collect();
        let file = std::path::Path::new(&out).join(format!("{name}.txt"));
        let mut w = std::fs::File::create(&file).unwrap();
        writeln!(
            w,
            "# A {} ms off-CPU interval's stack (innermost first), recorded by\n\
             # `cargo run{} --example lock_fixtures` (examples/lock_fixtures.rs, scenario `{name}`)\n\
             # on Linux {} with glibc {glibc}, symbolized by memtrack's Symbolizer.",
            longest.ns() / 1_000_000,
            if cfg!(debug_assertions) { "" } else { " --release" },
            kernel.trim()
        )
        .unwrap();
        for f in &functions {
            writeln!(w, "{f}").unwrap();
        }
        println!("{name}: {} frames -> {}", functions.len(), file.display());
    }
}
