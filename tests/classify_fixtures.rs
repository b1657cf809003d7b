//! `classify` on real stacks: each file of `tests/fixtures/locks/` is the symbolized stack of
//! one recorded wait (written by `cargo run --example lock_fixtures`, which says in the file
//! how), and must get its class, matched at the frame that names the way of waiting. The same
//! waits recorded from a release build, whose inlined slow paths symbolize otherwise, are in
//! `tests/fixtures/locks/release/`. The waits of a C program's pthread locks
//! (`tests/fixtures/pthread_locks.c`, no frame pointers) are in `tests/fixtures/locks/c/`, as
//! glibc's debug symbols name them, and in `tests/fixtures/locks/c-no-dbg/`, as its exported
//! symbols alone do.

use memtrack::{locks::WaitClass, locks::classify};

/// (fixture, class, a string of the frame the class must be matched at)
const CASES: &[(&str, WaitClass, &str)] = &[
    ("std_mutex", WaitClass::Mutex, "lock_contended"),
    ("std_rwlock_read", WaitClass::RwLock, "read_contended"),
    ("std_rwlock_write", WaitClass::RwLock, "write_contended"),
    ("std_condvar", WaitClass::Condvar, "Condvar"),
    ("parking_lot_mutex", WaitClass::Mutex, "lock_slow"),
    (
        "parking_lot_rwlock_read",
        WaitClass::RwLock,
        "lock_shared_slow",
    ),
    ("parking_lot_condvar", WaitClass::Condvar, "condvar::"),
    (
        "glibc_stdio_lock",
        WaitClass::GlibcLock,
        "__lll_lock_wait_private",
    ),
    ("pthread_mutex", WaitClass::Mutex, "lll_lock_wait"),
    ("pipe_read", WaitClass::Io, "read"),
    ("poll", WaitClass::Io, "poll"),
    ("sleep", WaitClass::Sleep, "nanosleep"),
];

/// The fixture directories: a debug build's stacks, a release build's.
const BUILDS: [&str; 2] = ["", "release/"];

/// The C program's waits, in both directories of them (the frame string: with glibc's debug
/// symbols, without).
const C_CASES: &[(&str, WaitClass, &str, &str)] = &[
    (
        "pthread_mutex",
        WaitClass::Mutex,
        "lll_lock_wait",
        "pthread_mutex_lock",
    ),
    (
        "pthread_rwlock_read",
        WaitClass::RwLock,
        "rwlock_rdlock_full",
        "pthread_rwlock_rdlock",
    ),
    (
        "pthread_rwlock_write",
        WaitClass::RwLock,
        "rwlock_wrlock_full",
        "pthread_rwlock_wrlock",
    ),
    (
        "pthread_cond",
        WaitClass::Condvar,
        "pthread_cond_wait_common",
        "pthread_cond_wait",
    ),
    (
        "pthread_barrier",
        WaitClass::Barrier,
        "pthread_barrier_wait",
        "pthread_barrier_wait",
    ),
];

/// The C program's directories: glibc's debug symbols installed, not.
const C_DIRS: [&str; 2] = ["c/", "c-no-dbg/"];

/// Every case of every build: (the fixture's name under `locks/`, class, frame string).
fn cases() -> impl Iterator<Item = (String, WaitClass, &'static str)> {
    let rust = BUILDS.iter().flat_map(|build| {
        CASES
            .iter()
            .map(move |&(name, want, at)| (format!("{build}{name}"), want, at))
    });
    let c = C_CASES.iter().flat_map(|&(name, want, dbg, exported)| {
        [(C_DIRS[0], dbg), (C_DIRS[1], exported)]
            .map(|(dir, at)| (format!("{dir}{name}"), want, at))
    });
    rust.chain(c)
}

fn functions(name: &str) -> Vec<String> {
    let path = format!(
        "{}/tests/fixtures/locks/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn recorded_stacks_get_their_class() {
    for (name, want, at) in cases() {
        let fns = functions(&name);
        let refs: Vec<&str> = fns.iter().map(String::as_str).collect();
        let (class, i) = classify(false, &refs);
        assert_eq!(class, want, "{name}: {refs:?}");
        let i = i.unwrap_or_else(|| panic!("{name}: no frame matched"));
        assert!(
            refs[i].contains(at),
            "{name}: matched at {:?}, not a frame with {at:?}",
            refs[i]
        );
    }
}

/// The same stacks left the CPU preempted: not a wait, whatever they hold.
#[test]
fn a_preempted_stack_is_preempted() {
    for (name, _, _) in cases() {
        let fns = functions(&name);
        let refs: Vec<&str> = fns.iter().map(String::as_str).collect();
        assert_eq!(
            classify(true, &refs),
            (WaitClass::Preempted, None),
            "{name}"
        );
    }
}

/// A thread that left with `sched_yield` (parking_lot's spin before it parks) is runnable
/// but waiting by choice: classified by its stack. Built from the recorded parking_lot stack,
/// its futex frames replaced by glibc's yield wrapper as symbolized.
#[test]
fn a_yield_in_a_lock_slow_path_is_the_lock() {
    for build in BUILDS {
        let fns = functions(&format!("{build}parking_lot_mutex"));
        // From the slow path out: in a release build the frame of `lock_slow` (inlined) is
        // named without its path.
        let from = fns.iter().rposition(|f| f.contains("lock_slow")).unwrap();
        let mut refs: Vec<&str> = vec!["__GI___sched_yield", "std::thread::yield_now"];
        refs.extend(fns[from..].iter().map(String::as_str));
        assert_eq!(
            classify(true, &refs).0,
            WaitClass::Mutex,
            "{build}: {refs:?}"
        );
        // Preempted anywhere else (not in sched_yield): preempted.
        assert_eq!(classify(true, &refs[1..]).0, WaitClass::Preempted);
    }
}

/// Every fixture is listed above (a new one is not left untested).
#[test]
fn every_fixture_is_a_case() {
    let rust = BUILDS.map(|b| (b, CASES.iter().map(|c| c.0).collect::<Vec<_>>()));
    let c = C_DIRS.map(|d| (d, C_CASES.iter().map(|c| c.0).collect::<Vec<_>>()));
    for (build, names) in rust.into_iter().chain(c) {
        let dir = format!(
            "{}/tests/fixtures/locks/{build}",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut cases: Vec<String> = names.iter().map(|n| format!("{n}.txt")).collect();
        cases.sort();
        assert_eq!(files, cases, "{dir}");
    }
}
