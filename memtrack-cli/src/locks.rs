//! `memtrack locks FILE [--json] [--top N]`: the lock waits of a recording made with
//! `record --locks`, per thread and by contended call site; and the folded stacks of the
//! contended call sites that `flamegraph --locks` draws and `export --format folded --locks`
//! writes.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use memtrack::render::{self, Align, Cell, Column, Table};
use memtrack::{artifact::Reader, human, locks::LockWaits, locks::WaitClass};

pub(crate) fn run(path: &Path, json: bool, top: usize) -> crate::error::Result<ExitCode> {
    let mut waits = read(path)?;
    waits.sites.truncate(top);
    crate::out(&if json { to_json(&waits) } else { text(&waits) })?;
    Ok(ExitCode::SUCCESS)
}

fn to_json(w: &LockWaits) -> String {
    let mut s = serde_json::to_string_pretty(w).expect("plain numbers and strings");
    s.push('\n');
    s
}

/// Milliseconds with one decimal, as the tables show nanoseconds.
fn ms(ns: u64) -> String {
    Cell::Nanos(ns).human()
}

fn text(w: &LockWaits) -> String {
    let mut threads = Table::new(vec![
        Column::new("tid", "tid", Align::Left),
        Column::new("mutex_wait_ns", "mutex", Align::Right),
        Column::new("rwlock_wait_ns", "rwlock", Align::Right),
        Column::new("condvar_wait_ns", "condvar", Align::Right),
        Column::new("barrier_wait_ns", "barrier", Align::Right),
        Column::new("glibc_lock_wait_ns", "glibc", Align::Right),
        Column::new("other_futex_wait_ns", "futex", Align::Right),
        Column::new("io_wait_ns", "io", Align::Right),
        Column::new("sleep_ns", "sleep", Align::Right),
        Column::new("other_off_cpu_ns", "other", Align::Right),
        Column::new("preempted_ns", "preempt", Align::Right),
        Column::new("cpu_ns", "cpu", Align::Right),
        Column::new("mutex_wait_per_cpu", "mutex/cpu", Align::Right),
    ]);
    for t in &w.threads {
        let x = &t.times;
        threads.push(vec![
            Cell::Text(if t.idle {
                format!("{} (idle)", t.tid)
            } else {
                t.tid.to_string()
            }),
            Cell::Nanos(x.mutex_wait_ns),
            Cell::Nanos(x.rwlock_wait_ns),
            Cell::Nanos(x.condvar_wait_ns),
            Cell::Nanos(x.barrier_wait_ns),
            Cell::Nanos(x.glibc_lock_wait_ns),
            Cell::Nanos(x.other_futex_wait_ns),
            Cell::Nanos(x.io_wait_ns),
            Cell::Nanos(x.sleep_ns),
            Cell::Nanos(x.other_off_cpu_ns),
            Cell::Nanos(x.preempted_ns),
            Cell::Nanos(x.cpu_ns),
            Cell::Ratio(t.mutex_wait_per_cpu),
        ]);
    }
    let mut out = format!(
        "time per thread, ms, over a window of {} ms:\n",
        ms(w.window_ns)
    );
    out += &render::text(&threads);
    if w.sites.is_empty() {
        out += "\nno thread waited for a lock\n";
        return out;
    }
    out += "\ncontended call sites, by time waited:\n";
    for (i, s) in w.sites.iter().enumerate() {
        out += &format!(
            "#{} {} {} ms in {}\n",
            i + 1,
            s.class.name(),
            ms(s.wait_ns),
            human::plural(s.waits, "wait", "waits")
        );
        for f in &s.frames {
            out += &format!("    {f}\n");
        }
    }
    out
}

/// `--class` of `flamegraph --locks` and `export --format folded --locks`: which lock waits
/// (the classes of [`memtrack::locks::WaitSite`]; names as in `locks --json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LockClass {
    /// Mutexes: std's, parking_lot's, pthreads'.
    Mutex,
    /// Read-write locks: std's, parking_lot's, pthreads'.
    Rwlock,
    /// Condition variables.
    Condvar,
    /// Barriers (pthreads').
    Barrier,
    /// glibc's internal locks (the malloc arena lock, stdio).
    #[value(name = "glibc_lock")]
    GlibcLock,
}

impl LockClass {
    /// Every lock class: the default.
    pub const ALL: [LockClass; 5] = [
        LockClass::Mutex,
        LockClass::Rwlock,
        LockClass::Condvar,
        LockClass::Barrier,
        LockClass::GlibcLock,
    ];

    pub(crate) fn class(self) -> WaitClass {
        match self {
            LockClass::Mutex => WaitClass::Mutex,
            LockClass::Rwlock => WaitClass::RwLock,
            LockClass::Condvar => WaitClass::Condvar,
            LockClass::Barrier => WaitClass::Barrier,
            LockClass::GlibcLock => WaitClass::GlibcLock,
        }
    }
}

/// The lock waits of `file`, refused as `memtrack locks` refuses them (no context switches,
/// lost events, switches that do not pair).
pub(crate) fn read(file: &Path) -> crate::error::Result<LockWaits> {
    read_with_name(file).map(|(w, _)| w)
}

/// [`read`], with the recording's name (the file's path if it has none).
pub(crate) fn read_with_name(file: &Path) -> crate::error::Result<(LockWaits, String)> {
    let reader = Reader::open(file)?;
    let waits = memtrack::locks::lock_waits(&reader, &mut super::symbolizer(&[&reader]))?;
    let name = reader.metadata().name.clone();
    Ok((waits, name.unwrap_or_else(|| file.display().to_string())))
}

/// The folded stacks of the lock waits of `classes` (`root;…;caller of the lock;[class]
/// µs` per line, sorted): each contended call site's frames above the lock call, root first,
/// then a frame naming the lock's class, weighted by the time waited there in microseconds.
/// The microseconds are rounded once for the whole (largest remainders), so the lines add up
/// to the waits' total in nanoseconds / 1,000, rounded: what `locks --json` sums to. A `;` in
/// a name is written `,` (as the call sites' folded stacks do).
pub(crate) fn folded(w: &LockWaits, classes: &[LockClass]) -> Vec<String> {
    let wanted: Vec<WaitClass> = classes.iter().map(|c| c.class()).collect();
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for s in w.sites.iter().filter(|s| wanted.contains(&s.class)) {
        let path: Vec<String> = s
            .frames
            .iter()
            .rev()
            .map(|f| f.replace(';', ",").replace('\n', " "))
            .chain(std::iter::once(class_frame(s.class)))
            .collect();
        *merged.entry(path.join(";")).or_default() += s.wait_ns;
    }
    let total_ns: u64 = merged.values().sum();
    let total_us = (total_ns + 500) / 1_000;
    // Floors first, then one more µs to the largest remainders until the total is reached.
    let mut lines: Vec<(String, u64, u64)> = merged
        .into_iter()
        .map(|(path, ns)| (path, ns / 1_000, ns % 1_000))
        .collect();
    let floors: u64 = lines.iter().map(|l| l.1).sum();
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by(|&a, &b| lines[b].2.cmp(&lines[a].2).then(a.cmp(&b)));
    for &i in order.iter().take((total_us - floors) as usize) {
        lines[i].1 += 1;
    }
    lines
        .into_iter()
        .filter(|l| l.1 > 0)
        .map(|(path, us, _)| format!("{path} {us}"))
        .collect()
}

/// The leaf frame that names a lock wait's class: `[mutex]`, `[rwlock]`, ….
pub(crate) fn class_frame(c: WaitClass) -> String {
    format!("[{}]", c.name())
}

/// The total, in nanoseconds, of the waits of `classes` over every thread: what the folded
/// stacks add up to (in µs).
pub(crate) fn total_ns(w: &LockWaits, classes: &[LockClass]) -> u64 {
    let wanted: Vec<WaitClass> = classes.iter().map(|c| c.class()).collect();
    w.totals()
        .times
        .by_class()
        .iter()
        .filter(|(c, _)| wanted.contains(c))
        .map(|(_, ns)| ns)
        .sum()
}
