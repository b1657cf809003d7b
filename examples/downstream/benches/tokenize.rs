//! A criterion benchmark whose whole run is recorded by `#[memtrack]`: the summary line is
//! printed when it ends, the artifact is `target/memtrack/tokenize.memtrack`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use memtrack::memtrack;

#[memtrack(name = "tokenize")]
fn bench_tokenize(c: &mut Criterion) {
    let src = "fn main() { let x_1 = 42; println!(\"{}\", x_1 + 7); } ".repeat(50);
    c.bench_function("tokenize", |b| b.iter(|| downstream::tokenize(black_box(&src))));
}

criterion_group!(benches, bench_tokenize);
criterion_main!(benches);
