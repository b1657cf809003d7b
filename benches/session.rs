//! Cost of a session around an empty function: start (exclude memtrack's threads, switch on)
//! plus finish (switch off, drain the tail, write the artifact). The tracker is loaded and
//! attached once per process, before measuring ("warm"). Target: ≤ 50 ms.
//!
//! Run (needs root, or CAP_BPF + CAP_PERFMON): `cargo bench --bench session`

use criterion::{Criterion, criterion_group, criterion_main};

fn benches(c: &mut Criterion) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("session bench skipped: not root (the eBPF tracker needs CAP_BPF + CAP_PERFMON)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // Load and attach once: later sessions reuse the tracker.
    memtrack::SessionBuilder::new("warm-up")
        .output_dir(dir.path())
        .quiet(true)
        .start()
        .and_then(|s| s.finish())
        .expect("first session");
    let mut g = c.benchmark_group("session");
    g.sample_size(20);
    g.bench_function("start+finish, empty body", |b| {
        b.iter(|| {
            memtrack::SessionBuilder::new("empty")
                .output_dir(dir.path())
                .quiet(true)
                .start()
                .and_then(|s| s.finish())
                .expect("session")
        })
    });
    g.finish();
}

criterion_group!(session, benches);
criterion_main!(session);
