//! Cost of a session around an empty function: start (exclude memtrack's threads, attach the
//! probes, switch on) plus finish (switch off, drain the tail, write the artifact, detach the
//! probes in the background). The tracker is loaded once per process, before measuring
//! ("warm"). Target: ≤ 20 ms.
//!
//! Two figures: sessions that start at least 100 ms after the previous one ended (the usual
//! case: a benchmark or a test between them), and sessions back to back, where each start
//! waits for the previous session's probes to finish detaching (the kernel's RCU grace
//! period). Sessions that wait for their turn (`start_waiting`, parallel tests) are handed the
//! attached probes and pay neither.
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
    g.bench_function("start+finish, empty body, 100 ms apart", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            for _ in 0..iters {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let t = std::time::Instant::now();
                memtrack::SessionBuilder::new("empty")
                    .output_dir(dir.path())
                    .quiet(true)
                    .start()
                    .and_then(|s| s.finish())
                    .expect("session");
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(session, benches);
criterion_main!(session);
