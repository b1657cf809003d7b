//! The suite: `cargo bench` times it (criterion), `memtrack bench` records what each iteration
//! allocates (see Cargo.toml).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

/// The input: 50 lines of 8 tokens each.
fn source() -> String {
    "fn main() { let x_1 = 42; println!(\"{}\", x_1 + 7); } ".repeat(50)
}

fn bench_tokenize(c: &mut Criterion) {
    let src = source();
    c.bench_function("tokenize", |b| b.iter(|| downstream::tokenize(black_box(&src))));
}

fn bench_render(c: &mut Criterion) {
    let tokens = downstream::tokenize(&source());
    c.bench_function("render", |b| b.iter(|| downstream::render(black_box(&tokens))));
}

criterion_group!(benches, bench_tokenize, bench_render);
criterion_main!(benches);
