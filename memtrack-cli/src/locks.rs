//! `memtrack locks FILE [--json] [--top N]`: the lock waits of a recording made with
//! `record --locks`, per thread and by contended call site.

use std::path::Path;
use std::process::ExitCode;

use memtrack::{LockWaits, Reader, Symbolizer, human};

pub(crate) fn run(path: &Path, json: bool, top: usize) -> memtrack::Result<ExitCode> {
    let reader = Reader::open(path)?;
    let mut waits = memtrack::lock_waits(&reader, &mut Symbolizer::new())?;
    waits.sites.truncate(top);
    crate::out(&if json { to_json(&waits) } else { text(&waits) })?;
    Ok(ExitCode::SUCCESS)
}

fn to_json(w: &LockWaits) -> String {
    let mut s = serde_json::to_string_pretty(w).expect("plain numbers and strings");
    s.push('\n');
    s
}

/// Milliseconds with one decimal.
fn ms(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e6)
}

fn text(w: &LockWaits) -> String {
    let mut rows = vec![
        [
            "tid",
            "mutex",
            "rwlock",
            "condvar",
            "glibc",
            "futex",
            "io",
            "sleep",
            "other",
            "preempt",
            "cpu",
            "mutex/cpu",
        ]
        .map(String::from),
    ];
    for t in &w.threads {
        rows.push([
            if t.idle {
                format!("{} (idle)", t.tid)
            } else {
                t.tid.to_string()
            },
            ms(t.mutex_wait_ns),
            ms(t.rwlock_wait_ns),
            ms(t.condvar_wait_ns),
            ms(t.glibc_lock_wait_ns),
            ms(t.other_futex_wait_ns),
            ms(t.io_wait_ns),
            ms(t.sleep_ns),
            ms(t.other_off_cpu_ns),
            ms(t.preempted_ns),
            ms(t.cpu_ns),
            format!("{:.3}", t.mutex_wait_per_cpu),
        ]);
    }
    let mut out = format!(
        "time per thread, ms, over a window of {} ms:\n",
        ms(w.window_ns)
    );
    out += &human::table(
        &rows,
        &[
            false, true, true, true, true, true, true, true, true, true, true, true,
        ],
    );
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
