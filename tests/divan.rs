//! divan: a `#[memtrack]` function under `#[divan::bench]` gets per-call figures, however many
//! times divan calls it (its samples and their sizes are divan's choice): every call is one
//! iteration of one recording. The allocator recorder, so no privileges are needed.
//!
//! `harness = false`: divan's `run_benches` drives the benchmark from this binary's `main`.

use std::hint::black_box;

use memtrack::memtrack;

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

/// Two allocations, 100 + 5 bytes, both freed before the call returns.
#[divan::bench]
#[memtrack(name = "divan_bench", backend = "alloc")]
fn two_blocks() {
    black_box(vec![0u8; 100]);
    black_box(String::from("hello"));
}

fn per_call_figures_under_divan() {
    divan::Divan::default()
        .sample_count(5)
        .sample_size(4)
        .run_benches();
    let report = memtrack::finish_calls()
        .expect("the recording finishes")
        .expect("divan called the function");
    let calls = report.iterations.expect("calls counted");
    assert!(calls >= 20, "{}", report.summary_line());
    let s = report.totals().iteration_spread.expect("marked calls");
    assert_eq!(s.iterations, calls);
    assert_eq!((s.allocations.min, s.allocations.max), (2, 2));
    assert_eq!((s.bytes_allocated.min, s.bytes_allocated.max), (105, 105));
    assert_eq!(report.allocations(), 2 * calls, "nothing but the calls");
}

fn main() {
    memtrack_test_support::run_sequential(vec![memtrack_test_support::test(
        "per_call_figures_under_divan",
        per_call_figures_under_divan,
    )]);
}
