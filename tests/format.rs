//! Round trips, framing, recovery and corruption detection of the artifact format.

use std::collections::{BTreeMap, BTreeSet};

use memtrack::{
    artifact::Backend, artifact::Completeness, artifact::FormatError as Error, artifact::Metadata,
    artifact::Reader, artifact::VERSION_MINOR, encode::Encoder, encode::EncoderOptions,
    event::Event, event::EventKind, stack::Frame, stack::Module, stack::ModuleId, stack::Stack,
    stack::StackId, synth::Synth, synth::SynthOptions,
};
use proptest::prelude::*;

fn meta() -> Metadata {
    // Fixed metadata, so two encodings of the same events can be compared byte for byte.
    let mut m = Metadata::now(7, Backend::Other).with_name("test");
    m.start_unix_ns = 1;
    m.start_monotonic_ns = 2;
    m
}

fn encode_with(events: &[Event], opts: EncoderOptions) -> Vec<u8> {
    let mut enc = Encoder::new(Vec::new(), &meta(), opts).expect("encoder");
    enc.set_end_time(99);
    enc.extend(events.iter().copied()).expect("push");
    enc.finish_into(0).expect("finish").0
}

fn encode(events: &[Event], frame_events: usize) -> Vec<u8> {
    encode_with(
        events,
        EncoderOptions::new().workers(2).frame_events(frame_events),
    )
}

fn decode(bytes: Vec<u8>) -> Vec<Event> {
    let r = Reader::from_bytes(bytes).expect("open");
    assert_eq!(r.completeness(), &Completeness::Complete);
    r.events().collect::<Result<_, _>>().expect("decode")
}

fn synth(n: usize) -> Vec<Event> {
    Synth::new(SynthOptions {
        seed: 3,
        threads: 3,
    })
    .take(n)
    .collect()
}

#[test]
fn round_trip_is_exact_and_reencoding_is_byte_identical() {
    let events = synth(50_000);
    let bytes = encode(&events, 4096);
    let back = decode(bytes.clone());
    assert_eq!(back, events);
    assert_eq!(encode(&back, 4096), bytes);
}

#[test]
fn order_is_preserved_across_frames_and_windows() {
    // Tiny frames and a window of 2 frames: thousands of frames pass through the pool.
    let events: Vec<Event> = (0..20_011u64)
        .map(|i| Event::new(i, 1, (i % 5) as u32, EventKind::Free { addr: i * 16 }))
        .collect();
    for (workers, frame) in [(1, 7), (2, 7), (3, 64), (2, 1)] {
        let opts = EncoderOptions::new()
            .workers(workers)
            .frame_events(frame)
            .window(2);
        let r = Reader::from_bytes(encode_with(&events, opts)).expect("open");
        assert_eq!(r.frames().len(), 20_011usize.div_ceil(frame));
        let back: Vec<Event> = r.events().collect::<Result<_, _>>().expect("decode");
        assert_eq!(back, events, "workers {workers}, frame {frame}");
        // The parallel decoder hands frames over in order too.
        let mut par = Vec::new();
        r.for_each_frame(|i, evs| {
            assert_eq!(r.frames()[i].events as usize, evs.len());
            par.extend_from_slice(evs);
            Ok(())
        })
        .expect("parallel decode");
        assert_eq!(par, events);
    }
}

#[test]
fn empty_stream_and_single_event() {
    let r = Reader::from_bytes(encode(&[], 16)).expect("open");
    assert_eq!((r.frames().len(), r.event_count()), (0, 0));
    assert_eq!(r.events().count(), 0);
    let fin = r.final_metadata().expect("trailer");
    assert_eq!(fin.totals.events, 0);

    let one = [Event::new(5, 1, 2, EventKind::Brk { addr: 0x1000 })];
    assert_eq!(decode(encode(&one, 16)), one);
}

#[test]
fn frame_boundaries() {
    let events = synth(1000);
    for frame in [1, 2, 99, 100, 101, 999, 1000, 1001] {
        for n in [frame - 1, frame, frame + 1, 2 * frame, 2 * frame + 1] {
            let n = n.min(events.len());
            let bytes = encode(&events[..n], frame);
            let r = Reader::from_bytes(bytes.clone()).expect("open");
            assert_eq!(r.frames().len(), n.div_ceil(frame));
            assert_eq!(decode(bytes), &events[..n]);
        }
    }
}

#[test]
fn totals_in_the_trailer_match_an_independent_count() {
    let events = synth(30_000);
    let r = Reader::from_bytes(encode(&events, 1000)).expect("open");
    let t = &r.final_metadata().expect("trailer").totals;
    let allocs = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::Malloc { .. }
                    | EventKind::Calloc { .. }
                    | EventKind::Realloc { .. }
                    | EventKind::AlignedAlloc { .. }
            )
        })
        .count() as u64;
    let bytes: u64 = events
        .iter()
        .map(|e| match e.kind {
            EventKind::Malloc { size, .. }
            | EventKind::Calloc { size, .. }
            | EventKind::Realloc { size, .. }
            | EventKind::AlignedAlloc { size, .. } => size,
            _ => 0,
        })
        .sum();
    assert_eq!(
        (t.events, t.allocations, t.bytes_allocated),
        (30_000, allocs, bytes)
    );
    let per_thread: u64 = t.per_thread.values().map(|p| p.allocations).sum();
    assert_eq!(per_thread, allocs);
}

/// Where each frame starts and ends, from an intact file.
fn frame_spans(bytes: &[u8]) -> Vec<(u64, u64)> {
    let r = Reader::from_bytes(bytes.to_vec()).expect("open");
    r.frames()
        .iter()
        .map(|f| (f.offset, f.offset + 40 + f.payload_len as u64))
        .collect()
}

#[test]
fn truncation_at_every_frame_boundary_and_mid_frame_recovers_complete_frames() {
    let events = synth(5_000);
    let bytes = encode(&events, 500);
    let spans = frame_spans(&bytes);
    let header_end = spans[0].0 as usize;
    let mut cuts: Vec<usize> = Vec::new();
    for &(start, end) in &spans {
        let (s, e) = (start as usize, end as usize);
        cuts.extend([s, s + 1, s + 39, s + 40, (s + e) / 2, e - 1]);
    }
    cuts.extend(spans.last().unwrap().1 as usize..bytes.len());
    for cut in cuts {
        let r = Reader::from_bytes(bytes[..cut].to_vec())
            .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let Completeness::Recovered { reason } = r.completeness() else {
            panic!("cut at {cut} read as complete");
        };
        assert!(reason.contains("trailer is missing"), "{reason}");
        let whole = spans.iter().filter(|&&(_, e)| e as usize <= cut).count();
        assert_eq!(r.frames().len(), whole, "cut at {cut}");
        let back: Vec<Event> = r
            .events()
            .collect::<Result<_, _>>()
            .expect("recovered frames decode");
        assert_eq!(back, events[..whole * 500], "cut at {cut}");
        assert!(r.final_metadata().is_none());
    }
    // Inside the header: a clear error, never a result.
    for cut in [0, 4, 12, 19, header_end - 1] {
        assert!(
            Reader::from_bytes(bytes[..cut].to_vec()).is_err(),
            "cut at {cut}"
        );
    }
}

#[test]
fn every_flipped_byte_is_detected() {
    let events = synth(3_000);
    every_flipped_byte_is_detected_in(&events, &encode(&events, 1000));
}

/// The same with call stacks: the stack-id columns and the definitions blocks are covered too.
#[test]
fn every_flipped_byte_of_a_file_with_stacks_is_detected() {
    let (events, bytes) = synth_with_stacks(3_000, 1000);
    assert!(bytes.len() > 10_000);
    every_flipped_byte_is_detected_in(&events, &bytes);
}

fn every_flipped_byte_is_detected_in(events: &[Event], bytes: &[u8]) {
    let spans = frame_spans(bytes);
    for pos in 0..bytes.len() {
        let mut bad = bytes.to_vec();
        bad[pos] ^= 0x10;
        let outcome = Reader::from_bytes(bad).and_then(|r| {
            let evs = r.events().collect::<Result<Vec<_>, _>>()?;
            r.stacks()?;
            Ok((r.completeness().clone(), evs))
        });
        match outcome {
            Err(Error::CorruptFrame { frame, offset, .. }) => {
                let i = spans
                    .iter()
                    .position(|&(s, e)| (s..e).contains(&(pos as u64)))
                    .unwrap_or_else(|| panic!("byte {pos}: frame error outside the frames"));
                assert_eq!((frame, offset), (i as u64, spans[i].0), "byte {pos}");
            }
            Err(Error::CorruptHeader { .. } | Error::NotAnArtifact { .. }) => {
                assert!(pos < spans[0].0 as usize, "byte {pos}");
            }
            Err(Error::UnsupportedVersion { .. }) => assert!((8..12).contains(&pos)),
            Err(Error::CorruptTrailer { .. }) => {
                assert!(pos >= spans.last().unwrap().1 as usize, "byte {pos}")
            }
            Err(e) => panic!("byte {pos}: unexpected error {e}"),
            // Only the end magic may be hit without an error: the file then reads as unfinished.
            Ok((Completeness::Recovered { .. }, evs)) => {
                assert!(pos >= bytes.len() - 8, "byte {pos}");
                assert_eq!(evs, events);
            }
            Ok((Completeness::Complete, _)) => panic!("flipped byte {pos} went unnoticed"),
        }
    }
}

/// `synth(n)` with call stacks, each stack defined just before the first event naming it (as a
/// recorder does), encoded in frames of `frame` events.
fn synth_with_stacks(n: usize, frame: usize) -> (Vec<Event>, Vec<u8>) {
    let model = Synth::with_stacks(SynthOptions {
        seed: 3,
        threads: 3,
    });
    let modules = model.modules().to_vec();
    let table: BTreeMap<StackId, Stack> = model.stacks().iter().cloned().collect();
    let events: Vec<Event> = model.take(n).collect();
    let mut enc = Encoder::new(
        Vec::new(),
        &meta(),
        EncoderOptions::new().workers(2).frame_events(frame),
    )
    .expect("encoder");
    enc.set_end_time(99);
    for (id, m) in modules {
        enc.define_module(id, m).expect("module");
    }
    let mut defined = BTreeSet::new();
    for ev in &events {
        if !ev.stack.is_none() && defined.insert(ev.stack) {
            enc.define_stack(ev.stack, table[&ev.stack].clone())
                .expect("stack");
        }
        enc.push(*ev).expect("push");
    }
    (events, enc.finish_into(0).expect("finish").0)
}

/// CRC-32/ISO-HDLC (FORMAT.md's) of the concatenated `parts`, bit by bit: the tests' own, not
/// the writer's.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// `bytes` with the header's minor version set to `minor` (and its CRC fixed).
fn with_minor(bytes: &[u8], minor: u16) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[10..12].copy_from_slice(&minor.to_le_bytes());
    let meta_len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    let crc = crc32(&[&b[..16], &b[20..20 + meta_len]]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Files of 1.0 to 1.4 (whose frames are laid out alike: the minor versions added metadata keys
/// and the `Exec` kind) read, with no stacks; so do the 1.3 files of the fuzz seeds, written by
/// a 1.3 writer.
#[test]
fn files_of_1_0_to_1_4_still_read() {
    let old = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/format-1.4-synth-3000.memtrack"
    ))
    .expect("the 1.4 fixture");
    let events: Vec<Event> = Synth::new(SynthOptions {
        seed: 5,
        threads: 2,
    })
    .take(3000)
    .collect();
    for minor in 0..=4 {
        let r = Reader::from_bytes(with_minor(&old, minor)).expect("open");
        assert_eq!(r.version(), (1, minor));
        let back: Vec<Event> = r.events().collect::<Result<_, _>>().expect("decode");
        assert_eq!(back, events, "1.{minor}");
        assert!(r.stacks().expect("no tables").is_empty());
    }
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/reader");
    let mut n = 0;
    for entry in std::fs::read_dir(seeds).expect("seeds") {
        let r = Reader::from_bytes(std::fs::read(entry.unwrap().path()).unwrap()).expect("open");
        if r.version().1 >= 5 {
            continue; // a seed with stacks
        }
        assert_eq!(r.version(), (1, 3));
        let evs: Vec<Event> = r.events().collect::<Result<_, _>>().expect("decode");
        assert!(evs.iter().all(|e| e.stack.is_none()));
        assert!(r.stacks().expect("no tables").is_empty());
        n += 1;
    }
    assert!(n >= 4);
}

/// A 1.9 file (the addr column plain, ts compressed) reads as written: the fuzz seed written
/// by a 1.9 writer from `memtrack synth --events 3000 --seed 3 --threads 2`.
#[test]
fn files_of_1_9_still_read() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/seeds/reader/synth-3000-events-refs-plain-addr"
    );
    let r = Reader::from_bytes(std::fs::read(path).expect("the 1.9 seed")).expect("open");
    assert_eq!(r.version(), (1, 9));
    let events: Vec<Event> = Synth::new(SynthOptions {
        seed: 3,
        threads: 2,
    })
    .take(3000)
    .collect();
    let back: Vec<Event> = r.events().collect::<Result<_, _>>().expect("decode");
    assert_eq!(back, events);
}

/// Stacks round trip: every event's stack id, and the table (modules and stacks) as defined.
#[test]
fn stacks_round_trip_with_their_tables() {
    let (events, bytes) = synth_with_stacks(50_000, 4096);
    let r = Reader::from_bytes(bytes.clone()).expect("open");
    let back: Vec<Event> = r.events().collect::<Result<_, _>>().expect("decode");
    assert_eq!(back, events);
    let model = Synth::with_stacks(SynthOptions {
        seed: 3,
        threads: 3,
    });
    let used: BTreeSet<StackId> = events.iter().map(|e| e.stack).collect();
    let table = r.stacks().expect("tables");
    let want: Vec<(StackId, &Stack)> = model
        .stacks()
        .iter()
        .filter(|(id, _)| used.contains(id))
        .map(|(id, s)| (*id, s))
        .collect();
    assert!(want.len() > 100, "{} stacks used", want.len());
    assert_eq!(table.stacks().collect::<Vec<_>>(), want);
    let modules: Vec<(ModuleId, &Module)> = model.modules().iter().map(|(i, m)| (*i, m)).collect();
    assert_eq!(table.modules().collect::<Vec<_>>(), modules);
    // Re-encoding what was read gives the same bytes.
    let mut enc = Encoder::new(
        Vec::new(),
        &meta(),
        EncoderOptions::new().workers(2).frame_events(4096),
    )
    .unwrap();
    enc.set_end_time(99);
    for (id, m) in table.modules() {
        enc.define_module(id, m.clone()).unwrap();
    }
    let mut defined = BTreeSet::new();
    for ev in &back {
        if !ev.stack.is_none() && defined.insert(ev.stack) {
            enc.define_stack(ev.stack, table.stack(ev.stack).unwrap().clone())
                .unwrap();
        }
        enc.push(*ev).unwrap();
    }
    assert_eq!(enc.finish_into(0).unwrap().0, bytes);
}

/// 1 M allocations (and their frees) from 3 call sites: 3 stack records in the file, not 1 M.
#[test]
fn a_million_allocations_from_three_sites_store_three_stacks() {
    let (bytes, with_stacks) = million_from_three_sites(true);
    let r = Reader::from_bytes(bytes).unwrap();
    let defs: Vec<_> = (0..r.frames().len())
        .map(|i| r.frame_definitions(i).unwrap())
        .collect();
    let records: usize = defs.iter().map(|d| d.stacks.len()).sum();
    assert_eq!(records, 3);
    assert_eq!(defs.iter().map(|d| d.modules.len()).sum::<usize>(), 1);
    assert_eq!(r.stacks().unwrap().stacks().count(), 3);
    // The stack column costs little: under 0.1 bytes per event over the same events without.
    let (_, without) = million_from_three_sites(false);
    assert!(
        with_stacks.bytes < without.bytes + 200_000,
        "{} bytes for 2 M events with stacks, {} without",
        with_stacks.bytes,
        without.bytes
    );
}

/// The file of 1 M allocations from 3 call sites (stacks of 12 frames; none with `!stacks`),
/// each freed after the next, and what the encoder says it wrote.
fn million_from_three_sites(stacks: bool) -> (Vec<u8>, memtrack::encode::Written) {
    let mut enc = Encoder::new(Vec::new(), &meta(), EncoderOptions::new().workers(2)).unwrap();
    enc.define_module(ModuleId(1), module("/bin/app")).unwrap();
    for s in 1..=3u32 {
        enc.define_stack(StackId(s), stack(s, 12)).unwrap();
    }
    for i in 0..1_000_000u64 {
        let addr = 0x1000 + (i % 64) * 32;
        let site = StackId(if stacks { 1 + (i % 3) as u32 } else { 0 });
        enc.push(Event::new(2 * i, 7, 7, EventKind::Malloc { addr, size: 24 }).with_stack(site))
            .unwrap();
        enc.push(Event::new(2 * i + 1, 7, 7, EventKind::Free { addr }))
            .unwrap();
    }
    enc.finish_into(0).unwrap()
}

fn module(path: &str) -> Module {
    Module {
        path: path.into(),
        build_id: Some(vec![0xab; 20]),
    }
}

/// A stack of `depth` frames in module 1, distinct per `seed`.
fn stack(seed: u32, depth: u64) -> Stack {
    Stack {
        frames: (0..depth)
            .map(|d| Frame {
                module: ModuleId(1),
                offset: 0x1000 * seed as u64 + 0x10 * d,
            })
            .collect(),
        truncated: false,
    }
}

/// A prefix of whole frames (a writer killed mid-run) has every stack its events name, and
/// each stack is defined in the frame of its first use or an earlier one.
#[test]
fn every_prefix_of_whole_frames_has_the_stacks_its_events_name() {
    let (events, bytes) = synth_with_stacks(20_000, 500);
    let spans = frame_spans(&bytes);
    let full = Reader::from_bytes(bytes.clone()).unwrap();
    let mut first_use = BTreeMap::new();
    for (i, ev) in events.iter().enumerate() {
        first_use.entry(ev.stack).or_insert(i / 500);
    }
    first_use.remove(&StackId::NONE);
    let mut defined_in = BTreeMap::new();
    for i in 0..full.frames().len() {
        for (id, _) in full.frame_definitions(i).unwrap().stacks {
            defined_in.insert(id, i);
        }
    }
    assert_eq!(
        defined_in.keys().collect::<Vec<_>>(),
        first_use.keys().collect::<Vec<_>>()
    );
    for (id, frame) in &defined_in {
        assert!(*frame <= first_use[id], "stack {id:?}");
    }
    // Definitions are spread over frames, not all in the first.
    assert!(defined_in.values().any(|&f| f > 0));
    for &(_, end) in &spans {
        let r = Reader::from_bytes(bytes[..end as usize].to_vec()).unwrap();
        assert!(matches!(r.completeness(), Completeness::Recovered { .. }));
        let table = r.stacks().expect("tables of the prefix");
        for ev in r.events() {
            let ev = ev.unwrap();
            if !ev.stack.is_none() {
                assert_eq!(
                    table.stack(ev.stack),
                    full.stacks().unwrap().stack(ev.stack),
                    "cut at {end}"
                );
            }
        }
    }
}

/// What the encoder refuses: a stack on a free, definitions with id 0, twice, or naming a
/// module not defined.
#[test]
fn bad_stacks_and_definitions_are_refused() {
    let mut enc = Encoder::new(Vec::new(), &meta(), EncoderOptions::new().workers(1)).unwrap();
    let err = enc.define_stack(StackId(1), stack(1, 3)).unwrap_err();
    assert!(
        err.to_string()
            .contains("stack 1 has a frame in module 1, which is not defined"),
        "{err}"
    );
    enc.define_module(ModuleId(1), module("/bin/app")).unwrap();
    let err = enc
        .define_module(ModuleId(1), module("/bin/other"))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("module 1 (/bin/other) is already defined")
    );
    let err = enc
        .define_module(ModuleId::UNKNOWN, module("/x"))
        .unwrap_err();
    assert!(err.to_string().contains("UNKNOWN"), "{err}");
    let err = enc.define_stack(StackId::NONE, stack(1, 3)).unwrap_err();
    assert!(err.to_string().contains("StackId::NONE"), "{err}");
    enc.define_stack(StackId(1), stack(1, 3)).unwrap();
    assert!(enc.define_stack(StackId(1), stack(2, 3)).is_err());
    enc.push(Event::new(1, 7, 7, EventKind::Malloc { addr: 16, size: 8 }).with_stack(StackId(1)))
        .unwrap();
    enc.push(Event::new(2, 7, 7, EventKind::Free { addr: 16 }).with_stack(StackId(1)))
        .unwrap();
    let err = enc.finish_into(0).unwrap_err().to_string();
    assert!(
        err.contains("a free event carries stack 1: only allocations and mappings carry"),
        "{err}"
    );
}

/// A frame flag this build does not know is refused with the message a 1.4 reader gives a
/// 1.5 frame with stacks.
#[test]
fn an_unknown_frame_flag_is_refused() {
    let (_, mut bytes) = synth_with_stacks(100, 50);
    let at = frame_spans(&bytes)[0].0 as usize;
    assert_eq!(
        bytes[at + 4],
        31,
        "the first frame has stacks, definitions, refs and plain ts and addr columns"
    );
    bytes[at + 4] |= 32;
    reseal_frame(&mut bytes, at);
    let r = Reader::from_bytes(bytes).unwrap();
    let err = r
        .events()
        .find_map(Result::err)
        .expect("refused")
        .to_string();
    assert!(
        err.contains(&format!(
            "corrupt frame 0 at byte offset {at}: unknown frame flags 0x3f (written by a newer memtrack?)"
        )),
        "{err}"
    );
}

/// Rewrites the CRC of the frame at byte `at` for its header and payload as they now are, so
/// that a reader gets past the CRC to the damage a test made.
fn reseal_frame(bytes: &mut [u8], at: usize) {
    let payload_len = u32::from_le_bytes(bytes[at + 16..at + 20].try_into().unwrap()) as usize;
    let crc = crc32(&[&bytes[at..at + 20], &bytes[at + 24..at + 40 + payload_len]]);
    bytes[at + 20..at + 24].copy_from_slice(&crc.to_le_bytes());
}

/// A frame whose payload does not start with a zstd frame (its CRC right) is named: the
/// reader cannot find where the plain columns after it begin.
#[test]
fn a_payload_that_is_not_a_zstd_frame_is_named() {
    let mut bytes = encode(&synth(100), 100);
    let at = frame_spans(&bytes)[0].0 as usize;
    // No definitions: the payload is the events' zstd frame, then the plain columns.
    assert_eq!(bytes[at + 4] & 2, 0, "a frame without definitions");
    assert_eq!(
        bytes[at + 40..at + 44],
        [0x28, 0xb5, 0x2f, 0xfd],
        "zstd's magic"
    );
    bytes[at + 40] ^= 0xff;
    reseal_frame(&mut bytes, at);
    let err = Reader::from_bytes(bytes)
        .unwrap()
        .events()
        .find_map(Result::err)
        .expect("refused")
        .to_string();
    assert!(
        err.contains(&format!(
            "corrupt frame 0 at byte offset {at}: payload is not a zstd frame"
        )),
        "{err}"
    );
}

#[test]
fn unknown_major_version_is_refused_with_a_clear_message() {
    let mut bytes = encode(&synth(10), 16);
    bytes[8..10].copy_from_slice(&2u16.to_le_bytes());
    let err = Reader::from_bytes(bytes).err().expect("refused");
    let msg = err.to_string();
    assert!(
        matches!(err, Error::UnsupportedVersion { major: 2, .. }),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("version 2.{VERSION_MINOR} is not supported"))
            && msg.contains("reads format 1.x"),
        "{msg}"
    );
}

#[test]
fn invalid_options_are_errors() {
    for (opts, needle) in [
        (
            EncoderOptions::new().workers(0),
            "workers must be at least 1",
        ),
        (EncoderOptions::new().frame_events(0), "frame_events"),
        (EncoderOptions::new().level(0), "level"),
    ] {
        let err = Encoder::new(Vec::new(), &meta(), opts)
            .err()
            .expect("rejected");
        assert!(err.to_string().contains(needle), "{err}");
    }
}

fn arb_kind() -> impl Strategy<Value = EventKind> {
    let a = any::<u64>();
    prop_oneof![
        (a, a).prop_map(|(addr, size)| EventKind::Malloc { addr, size }),
        (a, a).prop_map(|(addr, size)| EventKind::Calloc { addr, size }),
        (a, a, a).prop_map(|(old_addr, new_addr, size)| {
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            }
        }),
        (a, a, a).prop_map(|(addr, size, align)| EventKind::AlignedAlloc { addr, size, align }),
        a.prop_map(|addr| EventKind::Free { addr }),
        (a, a).prop_map(|(addr, size)| EventKind::Mmap { addr, size }),
        (a, a).prop_map(|(addr, size)| EventKind::Munmap { addr, size }),
        (a, a, a).prop_map(|(old_addr, new_addr, size)| {
            EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            }
        }),
        a.prop_map(|addr| EventKind::Brk { addr }),
        Just(EventKind::Exec),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    (any::<u64>(), any::<u32>(), any::<u32>(), arb_kind())
        .prop_map(|(ts, pid, tid, kind)| Event::new(ts, pid, tid, kind))
}

fn arb_frame() -> impl Strategy<Value = Frame> {
    (0u32..4, any::<u64>()).prop_map(|(m, offset)| Frame {
        module: ModuleId(m),
        offset,
    })
}

fn arb_stack() -> impl Strategy<Value = Stack> {
    (prop::collection::vec(arb_frame(), 0..70), any::<bool>())
        .prop_map(|(frames, truncated)| Stack { frames, truncated })
}

fn arb_module() -> impl Strategy<Value = Module> {
    (
        "[a-z/._é-]{0,40}",
        prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
    )
        .prop_map(|(path, build_id)| Module { path, build_id })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn arbitrary_events_round_trip(events in prop::collection::vec(arb_event(), 0..300), frame in 1usize..64) {
        prop_assert_eq!(decode(encode(&events, frame)), events);
    }

    /// Events with stacks (on the kinds that carry one), definitions given at arbitrary points
    /// before their first use, arbitrary ids, modules (ids 1–3, and UNKNOWN frames) and stacks.
    #[test]
    fn arbitrary_stacks_round_trip(
        events in prop::collection::vec((arb_event(), any::<prop::sample::Index>(), any::<bool>()), 1..300),
        stacks in prop::collection::btree_map(1u32.., arb_stack(), 1..20),
        modules in prop::collection::vec(arb_module(), 3),
        early in prop::collection::vec(any::<bool>(), 20),
        frame in 1usize..64,
    ) {
        let ids: Vec<u32> = stacks.keys().copied().collect();
        let events: Vec<Event> = events
            .into_iter()
            .map(|(e, i, with)| {
                if with && e.kind.tag().carries_stack() {
                    e.with_stack(StackId(ids[i.index(ids.len())]))
                } else {
                    e
                }
            })
            .collect();
        let mut enc = Encoder::new(
            Vec::new(),
            &meta(),
            EncoderOptions::new().workers(2).frame_events(frame),
        )
        .unwrap();
        for (i, m) in modules.iter().enumerate() {
            enc.define_module(ModuleId(i as u32 + 1), m.clone()).unwrap();
        }
        // Some stacks are defined up front, the others just before their first use.
        let mut defined = BTreeSet::new();
        for (k, (id, st)) in stacks.iter().enumerate() {
            if early[k] {
                enc.define_stack(StackId(*id), st.clone()).unwrap();
                defined.insert(*id);
            }
        }
        for ev in &events {
            if !ev.stack.is_none() && defined.insert(ev.stack.0) {
                enc.define_stack(ev.stack, stacks[&ev.stack.0].clone()).unwrap();
            }
            enc.push(*ev).unwrap();
        }
        let r = Reader::from_bytes(enc.finish_into(0).unwrap().0).unwrap();
        let back: Vec<Event> = r.events().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&back, &events);
        let table = r.stacks().unwrap();
        for (id, st) in table.stacks() {
            prop_assert_eq!(Some(st), stacks.get(&id.0));
            prop_assert!(defined.contains(&id.0));
        }
        // Every definition was written (none given after the last event here).
        prop_assert_eq!(table.stacks().count(), defined.len());
        prop_assert_eq!(table.modules().count(), 3);
        for (id, m) in table.modules() {
            prop_assert_eq!(m, &modules[id.0 as usize - 1]);
        }
    }
}

/// Inputs the fuzzer found crashing the reader once (`fuzz/`): each must now give a clean
/// error or a result.
#[test]
fn fuzz_regressions_read_without_panicking() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("regressions folder") {
        let bytes = std::fs::read(entry.expect("entry").path()).expect("read");
        if let Ok(r) = Reader::from_bytes(bytes) {
            for ev in r.events() {
                if ev.is_err() {
                    break;
                }
            }
        }
        n += 1;
    }
    assert!(n > 0);
}
