//! Instructions mode's window: what callgrind counts of a benchmark is what runs between
//! [`Window::open`] (its counters of every thread set to zero) and [`Window::close`] (a dump of
//! them named by the benchmark's id and iterations, [`memtrack::instructions::Dump`]).
//! Outside valgrind the process stops at its first benchmark, saying how to run it.

use std::ffi::CString;

use memtrack::instructions::{Dump, client};

/// The measured iterations of one benchmark, under way.
pub(crate) struct Window {
    /// The dump's name, made before counting starts.
    text: CString,
    closed: bool,
}

impl Window {
    /// Sets callgrind's counters to zero: counting of `iterations` iterations of benchmark `id`
    /// starts when this returns.
    #[inline(always)]
    pub(crate) fn open(id: &str, iterations: u64) -> Window {
        ensure_valgrind();
        let text = Dump {
            id: id.to_string(),
            iterations,
        }
        .text();
        client::zero_stats();
        Window {
            text,
            closed: false,
        }
    }

    /// Dumps the counters since [`open`](Window::open): callgrind writes the benchmark's file
    /// before this returns.
    #[inline(always)]
    pub(crate) fn close(mut self) {
        client::dump_stats_at(&self.text);
        self.closed = true;
    }
}

impl Drop for Window {
    /// A window left open by a panic: its counts are no benchmark's, so they are discarded.
    fn drop(&mut self) {
        if !self.closed {
            client::zero_stats();
        }
    }
}

/// Ends the process (status 2) unless it runs under valgrind: outside it every count would
/// be zero.
fn ensure_valgrind() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        if !client::running_on_valgrind() {
            eprintln!(
                "memtrack: this benchmark was built in instructions mode, which counts under \
                 callgrind: run it with `memtrack bench --measure instructions`, or \
                 `valgrind --tool=callgrind` on this executable"
            );
            std::process::exit(2);
        }
    });
}
