//! Criterion measuring memory: allocations per iteration instead of time, with criterion's
//! own statistics, reports and baseline comparisons, kept apart from its timings
//! (`target/criterion-memtrack-allocations`); plus `#[memtrack]` on the benchmark function,
//! which writes one artifact for the whole benchmark run. For per-benchmark artifacts with call
//! stacks, a suite uses memtrack-criterion instead (`memtrack bench`).
//!
//! Run (needs root, or CAP_BPF + CAP_PERFMON): `cargo run --release --example criterion -- --bench`
//! Bytes per iteration instead: `MEMTRACK_MEASURE=bytes cargo run --release --example criterion -- --bench`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion};
use memtrack::criterion::{Allocations, BytesAllocated};
use memtrack::memtrack;

/// Splits `text` into owned words: one allocation for the Vec's growth steps plus one per word.
fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

fn bench_words<M: criterion::measurement::Measurement>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group("words");
    for n in [10usize, 100] {
        let text = "lorem ipsum dolor sit amet ".repeat(n / 5);
        g.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, t| {
            b.iter(|| words(black_box(t)))
        });
    }
    g.finish();
}

/// The whole benchmark run, recorded into `target/memtrack/criterion_example.memtrack`.
#[memtrack(name = "criterion_example")]
fn run() {
    if std::env::var("MEMTRACK_MEASURE").as_deref() == Ok("bytes") {
        let c = BytesAllocated::criterion().expect("tracker");
        bench_words(&mut c.configure_from_args());
    } else {
        let c = Allocations::criterion().expect("tracker");
        bench_words(&mut c.configure_from_args());
    }
}

fn main() {
    run();
}
