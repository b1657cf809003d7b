//! Feeds arbitrary bytes to the artifact reader: it must return an error or events, never
//! panic, hang or allocate without bound. Seeds: fuzz/seeds/reader (`memtrack synth` outputs, one
//! cut short) and tests/fuzz-regressions; CI runs it for 60 s with `.ci/fuzz`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = memtrack::Reader::from_bytes(data.to_vec()) else {
        return;
    };
    let mut analyzer = memtrack::Analyzer::new();
    for ev in reader.events() {
        match ev {
            Ok(ev) => analyzer.update(&ev),
            Err(_) => break,
        }
    }
    let _ = analyzer.totals();
    let _ = reader.for_each_frame(|_, evs| {
        std::hint::black_box(evs);
        Ok(())
    });
});
