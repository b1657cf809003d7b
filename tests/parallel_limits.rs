//! The parallel suite (`parallel_suite/suite.rs`) on the eBPF recorder, under libtest's default
//! parallel runner. Needs root (or CAP_BPF + CAP_PERFMON); without, each test says it skipped.

use memtrack::BackendChoice;

const BACKEND: BackendChoice = BackendChoice::Ebpf;

fn skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    let skip = unsafe { libc::geteuid() } != 0;
    if skip {
        eprintln!("SKIPPED: not root (the eBPF tracker needs CAP_BPF + CAP_PERFMON)");
    }
    skip
}

include!("parallel_suite/suite.rs");

suite!("ebpf");
