//! Timing mode is criterion, reached through this crate: `criterion_group!` (both forms) and
//! `criterion_main!` come through the re-export and make this binary's `main`. Run by `cargo
//! test` without `--bench`, criterion's own test mode runs each benchmark once and prints
//! `Testing <id>` and `Success`.

// Criterion 0.5's `criterion_group!` does not document the function it defines.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use memtrack_criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

fn plain(c: &mut Criterion) {
    c.bench_function("vec", |b| b.iter(|| black_box(vec![1u8; 64])));
    let mut g = c.benchmark_group("sizes");
    for n in [1usize, 8] {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| black_box(vec![0u8; n]))
        });
    }
    g.finish();
}

criterion_group!(benches, plain);
criterion_group! {
    name = configured;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_millis(100));
    targets = plain
}
criterion_main!(benches, configured);
