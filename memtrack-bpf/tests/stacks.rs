//! The call stacks memtrack's programs send: the first frames of an allocation's stack are its
//! call site and then each caller, in order (a frame-pointer chain of known depth and known
//! return addresses: `harness::chain`); a stack is sent once however often it allocates, each
//! distinct stack under its own id; the depth cap cuts a deeper stack and says so; depth 0
//! sends none.
//!
//! Needs root (CAP_BPF + CAP_PERFMON); skipped with a message otherwise.

use std::cell::RefCell;
use std::collections::HashMap;

use libbpf_rs::{Link, MapCore, Object, RingBufferBuilder};
use memtrack_bpf::{MAP_EVENTS, MAP_STATS, RawEvent, RawStack, RawStats, STACK_TRUNCATED, kind};
use memtrack_test_support::{TRACKER, requires, run};

#[path = "../examples/harness/mod.rs"]
mod harness;
use harness::chain::{mt_chain, mt_chain_ret, mt_chain_site};

/// What one recording sent: this thread's allocation events (stack id, size) and every stack
/// record (id → (flags, frames)).
struct Sent {
    allocs: Vec<(u32, u64)>,
    stacks: HashMap<u32, (u32, Vec<u64>)>,
    stats: RawStats,
}

fn attach(obj: &Object) -> Vec<Link> {
    harness::attach_sites(obj, &harness::libc_path())
}

fn stats(obj: &Object) -> RawStats {
    let map = obj.maps().find(|m| m.name() == MAP_STATS).unwrap();
    map.lookup_percpu(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
        .unwrap()
        .unwrap()
        .iter()
        .map(|b| RawStats::from_bytes(b).unwrap())
        .fold(RawStats::default(), |a, b| a + b)
}

/// Loads the programs with stacks of `depth` frames, runs `calls` recording this process, and
/// returns what was sent (the ring buffer is drained after `calls`: it is large enough).
fn record(depth: u32, calls: impl FnOnce()) -> Sent {
    let obj = harness::load_with(Some(1 << 22), depth);
    let links = attach(&obj);
    harness::switch(&obj, true, 1);
    calls();
    harness::switch(&obj, false, 1);
    drop(links);
    let events = obj.maps().find(|m| m.name() == MAP_EVENTS).unwrap();
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let sent = RefCell::new((Vec::new(), HashMap::new()));
    let mut b = RingBufferBuilder::new();
    b.add(&events, |bytes| {
        let mut s = sent.borrow_mut();
        if let Some((h, frames)) = RawStack::from_bytes(bytes) {
            assert_eq!(h.pid, std::process::id());
            let old = s.1.insert(h.id, (h.flags, frames.collect::<Vec<_>>()));
            assert!(old.is_none(), "stack id {} sent twice", h.id);
            return 0;
        }
        let e = RawEvent::from_bytes(bytes).expect("a RawEvent or a RawStack");
        if e.tid == me && e.kind == kind::MALLOC {
            s.0.push((e.stack, e.size));
        }
        if e.kind == kind::FREE {
            assert_eq!(e.stack, 0, "a free carries no stack");
        }
        0
    })
    .unwrap();
    b.build().unwrap().consume().unwrap();
    let (allocs, stacks) = sent.into_inner();
    Sent {
        allocs,
        stacks,
        stats: stats(&obj),
    }
}

/// The address of a label of `harness::chain`.
fn addr(label: unsafe extern "C" fn()) -> u64 {
    label as *const () as u64
}

fn chain(n: usize, size: usize) {
    // SAFETY: malloc through an assembly chain; the block is freed at once.
    unsafe { libc::free(std::hint::black_box(mt_chain(n, size))) }
}

/// The stack of the one allocation of `size`: its id and frames.
fn stack_of(s: &Sent, size: u64) -> (u32, &(u32, Vec<u64>)) {
    let ids: Vec<u32> = s
        .allocs
        .iter()
        .filter(|a| a.1 == size)
        .map(|a| a.0)
        .collect();
    assert!(!ids.is_empty(), "no malloc({size}) recorded");
    let id = ids[0];
    assert!(id != 0, "malloc({size}) carries no stack");
    (id, s.stacks.get(&id).expect("its stack record was sent"))
}

fn first_frames_are_the_call_site_and_each_caller() {
    let s = record(64, || chain(5, 0x5a5a1));
    let (_, (flags, frames)) = stack_of(&s, 0x5a5a1);
    assert_eq!(*flags, 0);
    let mut want = vec![addr(mt_chain_site)];
    want.extend([addr(mt_chain_ret); 5]);
    assert!(frames.len() > 6, "{frames:x?}");
    assert_eq!(frames[..6], want[..], "frames {frames:x?}");
}

fn each_stack_is_sent_once_and_distinct_stacks_get_distinct_ids() {
    let s = record(64, || {
        for _ in 0..1000 {
            chain(3, 0x5a5a2);
            chain(4, 0x5a5a3);
        }
    });
    let ids = |size: u64| -> Vec<u32> {
        s.allocs
            .iter()
            .filter(|a| a.1 == size)
            .map(|a| a.0)
            .collect()
    };
    let (a, b) = (ids(0x5a5a2), ids(0x5a5a3));
    assert_eq!((a.len(), b.len()), (1000, 1000));
    assert!(a.iter().all(|&i| i == a[0]) && b.iter().all(|&i| i == b[0]));
    assert_ne!(a[0], b[0]);
    assert_eq!(s.stacks[&a[0]].1[1..4], [addr(mt_chain_ret); 3]);
    assert_eq!(s.stacks[&b[0]].1[1..5], [addr(mt_chain_ret); 4]);
    // 2,000 allocations from two call sites: a handful of stack records (the harness's and
    // libbpf's own allocations on this thread add a few), not thousands.
    assert!(s.stacks.len() < 50, "{} stack records", s.stacks.len());
    assert_eq!(s.stats.stack_collisions, 0);
}

fn a_stack_deeper_than_the_cap_is_cut_and_marked() {
    let s = record(8, || chain(20, 0x5a5a4));
    let (_, (flags, frames)) = stack_of(&s, 0x5a5a4);
    assert_eq!(frames.len(), 8);
    assert_eq!(*flags & STACK_TRUNCATED, STACK_TRUNCATED);
    assert_eq!(frames[0], addr(mt_chain_site));
    assert!(s.stats.stacks_truncated >= 1);
    // Exactly at the cap is not cut: mt_chain(6) gives 7 frames of its own, then its callers.
    let s = record(40, || chain(6, 0x5a5a5));
    let (_, (flags, _)) = stack_of(&s, 0x5a5a5);
    assert_eq!(*flags, 0);
}

fn depth_zero_sends_no_stacks() {
    let s = record(0, || chain(5, 0x5a5a6));
    assert_eq!(
        s.allocs.iter().find(|a| a.1 == 0x5a5a6).map(|a| a.0),
        Some(0)
    );
    assert!(s.stacks.is_empty());
    assert_eq!(s.stats.stacks, 0);
}

fn main() {
    run(vec![
        requires(
            "first_frames_are_the_call_site_and_each_caller",
            &[TRACKER],
            first_frames_are_the_call_site_and_each_caller,
        ),
        requires(
            "each_stack_is_sent_once_and_distinct_stacks_get_distinct_ids",
            &[TRACKER],
            each_stack_is_sent_once_and_distinct_stacks_get_distinct_ids,
        ),
        requires(
            "a_stack_deeper_than_the_cap_is_cut_and_marked",
            &[TRACKER],
            a_stack_deeper_than_the_cap_is_cut_and_marked,
        ),
        requires(
            "depth_zero_sends_no_stacks",
            &[TRACKER],
            depth_zero_sends_no_stacks,
        ),
    ])
}
