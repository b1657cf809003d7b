//! Encode and decode throughput of the artifact format on a 1 M-event realistic trace
//! (`memtrack synth`'s model), sweeping the number of workers, and the size per event.
//!
//! Targets (2-core machine): encode ≥ 30 M events/s per worker, decode ≥ 100 M events/s,
//! decode + full aggregation ≥ 25 M events/s, ≤ 6 bytes/event.
//!
//! Run: `cargo bench --bench codec`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use memtrack::{
    analysis::Analyzer, artifact::Backend, artifact::Metadata, artifact::Reader, encode::Encoder,
    encode::EncoderOptions, event::Event, synth::Synth, synth::SynthOptions,
};

const EVENTS: usize = 1_000_000;

fn trace() -> Vec<Event> {
    Synth::new(SynthOptions {
        seed: 1,
        threads: 4,
    })
    .take(EVENTS)
    .collect()
}

fn encode(events: &[Event], workers: usize) -> Vec<u8> {
    let meta = Metadata::now(1, Backend::Synth);
    let opts = EncoderOptions::new().workers(workers);
    let mut enc = Encoder::new(Vec::with_capacity(8 << 20), &meta, opts).expect("encoder");
    enc.extend(events.iter().copied()).expect("push");
    enc.finish_into(0).expect("finish").0
}

fn max_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn benches(c: &mut Criterion) {
    let events = trace();
    let bytes = encode(&events, 1);
    println!(
        "artifact: {} events, {} bytes, {:.3} bytes/event",
        EVENTS,
        bytes.len(),
        bytes.len() as f64 / EVENTS as f64
    );

    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.sample_size(10);
    for w in 1..=max_workers() {
        g.bench_with_input(BenchmarkId::new("workers", w), &w, |b, &w| {
            b.iter(|| black_box(encode(&events, w)))
        });
    }
    g.finish();

    let reader = Reader::from_bytes(bytes).expect("reader");
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.sample_size(10);
    for w in 1..=max_workers() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(w)
            .build()
            .expect("pool");
        g.bench_with_input(BenchmarkId::new("parallel/workers", w), &w, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    let mut n = 0usize;
                    reader
                        .for_each_frame(|_, evs| {
                            n += black_box(evs).len();
                            Ok(())
                        })
                        .expect("decode");
                    assert_eq!(n, EVENTS);
                })
            })
        });
        g.bench_with_input(BenchmarkId::new("aggregate/workers", w), &w, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    let mut a = Analyzer::new();
                    reader
                        .for_each_frame(|_, evs| {
                            a.update_all(evs);
                            Ok(())
                        })
                        .expect("decode");
                    black_box(a.totals())
                })
            })
        });
    }
    g.bench_function("streaming", |b| {
        b.iter(|| {
            let mut n = 0;
            for e in reader.events() {
                black_box(e.expect("event"));
                n += 1;
            }
            assert_eq!(n, EVENTS);
        })
    });
    g.finish();
}

criterion_group!(codec, benches);
criterion_main!(codec);
