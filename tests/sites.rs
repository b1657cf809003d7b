//! Call sites (`memtrack::analysis::Sites`): each site's numbers against a count this test makes itself
//! from the events it generated, the naive way (a copy of every site's live numbers at each new
//! peak), on the `synth` model with stacks and on a hand-made trace of several processes with
//! an exec, replaced blocks and frees of unknown blocks.

use std::collections::{BTreeMap, HashMap};

use memtrack::{
    analysis::Site, analysis::SiteAnalyzer, analysis::SiteOrder, analysis::Sites,
    artifact::Backend, artifact::Metadata, artifact::Reader, encode::Encoder,
    encode::EncoderOptions, event::Event, event::EventKind, stack::StackId, synth::Synth,
    synth::SynthOptions,
};

/// Per site: blocks, bytes, and live blocks and bytes now.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
struct Count {
    blocks: u64,
    bytes: u64,
    live_blocks: u64,
    live_bytes: u64,
    /// The most live at once.
    max_blocks: u64,
    max_bytes: u64,
    /// The lifetimes of its blocks so far (ns), the live ones to the last event.
    lifetimes: u128,
}

/// The test's own count, from the accounting rules as the analysis documents them.
fn count(events: &[Event]) -> (BTreeMap<StackId, Count>, BTreeMap<StackId, Count>, u64) {
    let mut sites: BTreeMap<StackId, Count> = BTreeMap::new();
    let mut blocks: HashMap<(u32, u64), (u64, StackId, u64)> = HashMap::new();
    let (mut live, mut peak) = (0u64, 0u64);
    let mut at_peak = BTreeMap::new();
    for e in events {
        let free = |blocks: &mut HashMap<(u32, u64), (u64, StackId, u64)>,
                    sites: &mut BTreeMap<StackId, Count>,
                    live: &mut u64,
                    addr: u64| {
            if let Some((size, st, born)) = blocks.remove(&(e.pid, addr)) {
                let c = sites.get_mut(&st).unwrap();
                c.lifetimes += u128::from(e.ts - born);
                c.live_blocks -= 1;
                c.live_bytes -= size;
                *live -= size;
            }
        };
        let alloc = |blocks: &mut HashMap<(u32, u64), (u64, StackId, u64)>,
                     sites: &mut BTreeMap<StackId, Count>,
                     live: &mut u64,
                     addr: u64,
                     size: u64| {
            free(blocks, sites, live, addr); // a block already live there is replaced
            blocks.insert((e.pid, addr), (size, e.stack, e.ts));
            let c = sites.entry(e.stack).or_default();
            c.blocks += 1;
            c.bytes += size;
            c.live_blocks += 1;
            c.live_bytes += size;
            c.max_blocks = c.max_blocks.max(c.live_blocks);
            c.max_bytes = c.max_bytes.max(c.live_bytes);
            *live += size;
        };
        match e.kind {
            EventKind::Malloc { addr, size }
            | EventKind::Calloc { addr, size }
            | EventKind::AlignedAlloc { addr, size, .. } => {
                alloc(&mut blocks, &mut sites, &mut live, addr, size)
            }
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            } => {
                if old_addr != 0 {
                    free(&mut blocks, &mut sites, &mut live, old_addr);
                }
                if new_addr != 0 {
                    alloc(&mut blocks, &mut sites, &mut live, new_addr, size);
                }
            }
            EventKind::Free { addr } => free(&mut blocks, &mut sites, &mut live, addr),
            EventKind::Exec => {
                let gone: Vec<u64> = blocks
                    .keys()
                    .filter(|(pid, _)| *pid == e.pid)
                    .map(|&(_, a)| a)
                    .collect();
                for addr in gone {
                    free(&mut blocks, &mut sites, &mut live, addr);
                }
            }
            _ => {}
        }
        if live > peak {
            peak = live;
            at_peak = sites.clone();
        }
    }
    let end = events.last().map_or(0, |e| e.ts);
    for (_, st, born) in blocks.into_values() {
        sites.get_mut(&st).unwrap().lifetimes += u128::from(end - born);
    }
    (sites, at_peak, peak)
}

fn check(events: &[Event], sites: &Sites) {
    let (end, at_peak, peak) = count(events);
    assert_eq!(sites.peak_live_bytes, peak);
    let got: BTreeMap<StackId, Site> = sites.sites.iter().map(|s| (s.stack, *s)).collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        end.keys().collect::<Vec<_>>()
    );
    for (id, c) in &end {
        let s = got[id];
        let p = at_peak.get(id).copied().unwrap_or_default();
        assert_eq!(
            (s.blocks, s.bytes, s.blocks_at_end, s.bytes_at_end),
            (c.blocks, c.bytes, c.live_blocks, c.live_bytes),
            "site {id:?}"
        );
        assert_eq!(
            (s.blocks_at_peak, s.bytes_at_peak),
            (p.live_blocks, p.live_bytes),
            "site {id:?} at the peak"
        );
        assert_eq!(
            (s.max_blocks, s.max_bytes, s.lifetimes_ns),
            (c.max_blocks, c.max_bytes, c.lifetimes),
            "site {id:?}: most live at once, lifetimes"
        );
    }
    let at_peak_sum: u64 = sites.sites.iter().map(|s| s.bytes_at_peak).sum();
    assert_eq!(at_peak_sum, peak);
}

fn encode(events: &[Event]) -> Reader {
    let meta = Metadata::now(7, Backend::Other);
    let mut enc = Encoder::new(
        Vec::new(),
        &meta,
        EncoderOptions::new().workers(2).frame_events(4096),
    )
    .unwrap();
    // Tables are not needed for the numbers, but a file naming undefined stacks is not one a
    // recorder writes: define them.
    enc.define_module(
        memtrack::stack::ModuleId(1),
        memtrack::stack::Module {
            path: "/bin/t".into(),
            build_id: None,
        },
    )
    .unwrap();
    let mut ids: Vec<StackId> = events.iter().map(|e| e.stack).collect();
    ids.sort();
    ids.dedup();
    for id in ids.into_iter().filter(|i| !i.is_none()) {
        let frames = vec![memtrack::stack::Frame {
            module: memtrack::stack::ModuleId(1),
            offset: id.0 as u64,
        }];
        enc.define_stack(
            id,
            memtrack::stack::Stack {
                frames,
                truncated: false,
            },
        )
        .unwrap();
    }
    enc.extend(events.iter().copied()).unwrap();
    Reader::from_bytes(enc.finish_into(0).unwrap().0).unwrap()
}

#[test]
fn synth_sites_match_an_independent_count() {
    let events: Vec<Event> = Synth::with_stacks(SynthOptions {
        seed: 11,
        threads: 3,
    })
    .take(200_000)
    .collect();
    let r = encode(&events);
    let sites = Sites::read(&r).unwrap();
    check(&events, &sites);
    // Read from the artifact (frames decoded in parallel) as fed one event at a time: the same
    // sites (lifetimes and per-site maxima too), the same totals, and every frame handed to
    // the caller once, in order.
    let mut seq = SiteAnalyzer::new();
    seq.update_all(&events);
    let mut seen = Vec::new();
    let par = SiteAnalyzer::read(&r, |evs| seen.extend_from_slice(evs)).unwrap();
    assert!(r.frames().len() > 10, "{} frames", r.frames().len());
    assert_eq!(par.sites(), seq.sites());
    assert_eq!(par.sites(), sites);
    assert_eq!(par.analyzer().totals(), seq.analyzer().totals());
    assert_eq!(seen, events);
    assert!(sites.sites.len() > 200, "{} sites", sites.sites.len());
    // synth's mappings carry no stack and are in no site; every allocation has a stack.
    assert!(sites.no_stack().is_none() && sites.has_stacks());
    let totals = r.final_metadata().unwrap().totals.clone();
    assert_eq!(sites.peak_live_bytes, totals.peak_live_bytes);
    assert_eq!(sites.peak_ts, totals.peak_ts);
    let blocks: u64 = sites.sites.iter().map(|s| s.blocks).sum();
    assert_eq!(blocks, totals.allocations);
    let live: u64 = sites.sites.iter().map(|s| s.bytes_at_end).sum();
    assert_eq!(live, totals.live_bytes_at_end);
    // Ranking: largest first, each order by its own field.
    for order in [
        SiteOrder::Bytes,
        SiteOrder::Allocations,
        SiteOrder::Peak,
        SiteOrder::Leaked,
    ] {
        let top = sites.top(order, 10);
        assert_eq!(top.len(), 10);
        let max = sites.sites.iter().map(|s| order.key(s)).max().unwrap();
        assert_eq!(order.key(top[0]), max);
        assert!(top.windows(2).all(|w| order.key(w[0]) >= order.key(w[1])));
    }
}

/// Two processes (the same addresses in each), an exec that discards one's blocks, a block
/// replaced without its free, frees of unknown blocks, reallocs across sites, and events
/// without a stack, with the peak in the middle.
#[test]
fn hand_made_sites_match_an_independent_count() {
    let mut v = Vec::new();
    let mut ts = 0;
    let mut ev = |pid: u32, kind: EventKind, stack: u32| {
        ts += 10;
        v.push(Event::new(ts, pid, pid, kind).with_stack(StackId(stack)));
    };
    let m = |addr, size| EventKind::Malloc { addr, size };
    for pid in [100, 200] {
        for i in 0..50u64 {
            ev(pid, m(0x1000 + i * 64, 10 + i), 1 + (i % 3) as u32);
        }
    }
    ev(
        100,
        EventKind::Realloc {
            old_addr: 0x1000,
            new_addr: 0x9000,
            size: 4000,
        },
        4,
    );
    ev(100, m(0x1040, 7), 0); // replaces a live block of site 2, without a stack
    ev(200, EventKind::Free { addr: 0xdead }, 0);
    ev(200, EventKind::Exec, 0);
    for i in 0..20u64 {
        ev(
            100,
            EventKind::Free {
                addr: 0x1000 + i * 64,
            },
            0,
        );
    }
    ev(200, m(0x1000, 100), 5);
    ev(
        200,
        EventKind::Realloc {
            old_addr: 0,
            new_addr: 0x2000,
            size: 30,
        },
        0,
    );
    let events = v;
    let sites = Sites::read(&encode(&events)).unwrap();
    check(&events, &sites);
    let none = sites.no_stack().expect("a no-stack site");
    assert_eq!((none.blocks, none.bytes), (2, 37));
}
