//! The collector's merge buffer: the slots drained from the threads' rings and not written
//! yet, in timestamp order.
//!
//! A slot is kept as the thread wrote it (with its thread's id) until it is old enough, and
//! becomes an [`Event`] once, written straight into the encoder's frame a slice at a time with
//! its timestamp converted: one 48-byte event built per slot, never built and copied, and no
//! push per event. A deque, not a `Vec` compacted from its front, whose bulk copies would
//! move every kept slot at each drain.

use std::collections::VecDeque;
use std::io::Write;

use super::Raw;
use crate::encode::{EncodeError, Encoder};
use crate::event::{Event, EventKind, KindTag};
use crate::stack::StackId;
use crate::tracker::{Defined, SentStacks};

/// Slots emitted a chunk at a time: both passes of [`Pending::emit`] (stack ids, then events)
/// run over one chunk before the next, so that the second reads the slots from the L1 cache
/// that the first brought them into (the buffer holds `LAG_NS` of slots, megabytes, which
/// the cache has long evicted by the time they are emitted).
const CHUNK: usize = 256;

/// A drained slot and the thread that wrote it.
#[derive(Clone, Copy)]
struct Drained {
    raw: Raw,
    tid: u32,
}

/// Slots drained from the rings, in timestamp order once [`Pending::sort`] ran, of
/// process `pid`. Their stack ids are the recorder's process-wide ones until
/// [`Pending::emit`] gives the recording's.
pub(super) struct Pending {
    pid: u32,
    /// Whether the recording takes call stacks: without them no slot of its epoch has one,
    /// and [`Pending::emit`] skips the pass that gives stacks their ids.
    stacks: bool,
    /// A deque: the emitted front is popped without moving the rest (up to `LAG_NS` of slots).
    slots: VecDeque<Drained>,
    /// Whether every slot appended since the last [`Pending::sort`] came after the one
    /// before it in timestamp order (checked as they are appended, in the pass that checks
    /// their kind).
    ordered: bool,
}

impl Pending {
    /// An empty buffer for the slots of process `pid`, of a recording with call stacks or not.
    pub(super) fn new(pid: u32, stacks: bool) -> Self {
        Pending {
            pid,
            stacks,
            slots: VecDeque::new(),
            ordered: true,
        }
    }

    /// Slots not emitted yet.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Appends slot `r` of thread `tid`; `false` for a slot of a kind this build does not know
    /// (slot memory not written by `record`: a bug), which the caller counts as lost.
    #[inline(always)]
    pub(super) fn push(&mut self, tid: u32, r: &Raw) -> bool {
        if KindTag::from_u8(r.kind).is_none() {
            return false;
        }
        self.ordered &= self.slots.back().is_none_or(|d| d.raw.tsc <= r.tsc);
        self.slots.push_back(Drained { raw: *r, tid });
        true
    }

    /// Appends the slots of `run`, written in this order by thread `tid`, that belong to the
    /// recording `epoch` (a ring can still hold an earlier recording's); returns how many of
    /// them were of a kind this build does not know (see [`Pending::push`]).
    ///
    /// The common run (every slot this recording's, of a known kind) is checked in one pass
    /// and copied in one `extend`, which reserves room once instead of per slot.
    #[inline]
    pub(super) fn push_run(&mut self, tid: u32, epoch: u8, run: &[Raw]) -> u64 {
        // One pass without branches: whether every slot is this recording's, of a known kind,
        // and after the one before it.
        let last = self.slots.back().map_or(0, |d| d.raw.tsc);
        let (common, ordered, _) = run.iter().fold((true, true, last), |(ok, ord, last), r| {
            let known = KindTag::from_u8(r.kind).is_some();
            (
                ok & (r.epoch == epoch) & known,
                ord & (last <= r.tsc),
                r.tsc,
            )
        });
        if common {
            self.ordered &= ordered;
            self.slots
                .extend(run.iter().map(|&raw| Drained { raw, tid }));
            return 0;
        }
        let mut unknown = 0;
        for r in run.iter().filter(|r| r.epoch == epoch) {
            unknown += u64::from(!self.push(tid, r));
        }
        unknown
    }

    /// Puts the slots in timestamp order, given that those before the last call already were.
    /// With one thread allocating, the new slots follow the old ones (as their appending
    /// checked) and there is nothing to do; otherwise a stable sort merges the runs.
    pub(super) fn sort(&mut self) {
        if !self.ordered {
            self.slots.make_contiguous().sort_by_key(|d| d.raw.tsc);
        }
        self.ordered = true;
    }

    /// How many of the pending slots (from the oldest) have a TSC below `horizon`.
    pub(super) fn ready(&self, horizon: u64) -> usize {
        self.slots.partition_point(|d| d.raw.tsc < horizon)
    }

    /// Sends the events of the `n` oldest pending slots to `enc`, each TSC converted by
    /// `to_ns`, and each stack (if any) given this recording's id with `stacks`, which
    /// defines it in `enc` before the first event naming it.
    pub(super) fn emit<W: Write + Send + 'static>(
        &mut self,
        n: usize,
        to_ns: impl Fn(u64) -> u64,
        enc: &mut Encoder<W>,
        stacks: &mut (SentStacks, Defined),
    ) -> Result<(), EncodeError> {
        if self.stacks {
            self.emit_with::<true, W>(n, to_ns, enc, stacks)
        } else {
            self.emit_with::<false, W>(n, to_ns, enc, stacks)
        }
    }

    /// [`Pending::emit`]; without `STACKS` every event has [`StackId::NONE`] and the stack
    /// pass is skipped (6 of the collector's instructions per event, callgrind).
    #[inline(always)]
    fn emit_with<const STACKS: bool, W: Write + Send + 'static>(
        &mut self,
        n: usize,
        to_ns: impl Fn(u64) -> u64,
        enc: &mut Encoder<W>,
        stacks: &mut (SentStacks, Defined),
    ) -> Result<(), EncodeError> {
        let (front, back) = self.slots.as_mut_slices();
        let (front, back) = if n <= front.len() {
            (&mut front[..n], &mut back[..0])
        } else {
            let k = n - front.len();
            (front, &mut back[..k])
        };
        let (table, defined) = &mut *stacks;
        let pid = self.pid;
        for part in [front, back].into_iter().flat_map(|p| p.chunks_mut(CHUNK)) {
            // The recording's stack ids first (a stack is defined in `enc` at its first use,
            // before any event naming it is pushed), then the events a slice at a time.
            if STACKS {
                for d in part.iter_mut() {
                    if d.raw.stack != 0 {
                        // The slot's kind is known (checked when it was drained).
                        let heap =
                            KindTag::from_u8(d.raw.kind).is_some_and(|k| k.is_heap_allocation());
                        let local = defined.local(table, d.raw.stack, heap, enc)?;
                        d.raw.stack = local.unwrap_or(StackId::NONE).0;
                    }
                }
            }
            enc.extend_mapped(part, |d| {
                Event::new(to_ns(d.raw.tsc), pid, d.tid, event_kind(&d.raw))
                    .with_stack(StackId(if STACKS { d.raw.stack } else { 0 }))
            })?;
        }
        self.slots.drain(..n);
        Ok(())
    }
}

/// The kind of a slot [`Pending::push`] accepted.
#[inline(always)]
fn event_kind(r: &Raw) -> EventKind {
    match EventKind::from_raw(r.kind as u32, r) {
        Some(kind) => kind,
        None => unreachable!("a pending slot's kind is checked when it is drained"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::{Backend, Metadata, Reader};
    use crate::encode::EncoderOptions;
    use crate::event::KindTag;

    fn raw(tsc: u64, kind: KindTag, addr: u64) -> Raw {
        Raw {
            tsc,
            addr,
            addr2: 0,
            size: 8,
            stack: 0,
            align_log: 0,
            kind: kind as u8,
            epoch: 0,
        }
    }

    /// A slot of an unknown kind is no event (the collector counts it lost); it used to become
    /// a `Malloc`. A known kind reads the fields it has (a realloc's old block is `addr2`).
    #[test]
    fn unknown_kinds_are_not_events() {
        let r = Raw {
            tsc: 5,
            addr: 0x2000,
            addr2: 0x1000,
            size: 96,
            stack: 0,
            align_log: Raw::align_log(64),
            kind: 0,
            epoch: 0,
        };
        let mut p = Pending::new(1, false);
        for kind in [0, KindTag::ALL.len() as u8 + 1, u8::MAX] {
            assert!(!p.push(2, &Raw { kind, ..r }), "kind {kind}");
        }
        assert_eq!(p.len(), 0);
        assert!(p.push(
            2,
            &Raw {
                kind: KindTag::Realloc as u8,
                ..r
            }
        ));
        assert!(p.push(
            2,
            &Raw {
                kind: KindTag::Free as u8,
                ..r
            }
        ));
        let got: Vec<Event> = p
            .slots
            .iter()
            .map(|d| Event::new(d.raw.tsc, p.pid, d.tid, event_kind(&d.raw)))
            .collect();
        assert_eq!(
            got,
            [
                Event::new(
                    5,
                    1,
                    2,
                    EventKind::Realloc {
                        old_addr: 0x1000,
                        new_addr: 0x2000,
                        size: 96
                    }
                ),
                Event::new(5, 1, 2, EventKind::Free { addr: 0x2000 }),
            ]
        );
    }

    /// Runs of two threads that interleave in time, one of them out of order in itself (a
    /// thread whose TSC went back), are put in order by `sort`, whichever path appended them;
    /// runs that follow each other need no sort and keep their order.
    #[test]
    fn sort_orders_what_was_appended_out_of_order() {
        let tscs = |p: &Pending| p.slots.iter().map(|d| d.raw.tsc).collect::<Vec<_>>();
        let run = |tscs: &[u64]| -> Vec<Raw> {
            tscs.iter().map(|&t| raw(t, KindTag::Malloc, t)).collect()
        };
        let mut p = Pending::new(1, false);
        p.push_run(5, 0, &run(&[10, 40]));
        p.push_run(6, 0, &run(&[20, 30]));
        assert!(p.push(7, &raw(25, KindTag::Free, 25)));
        p.push_run(5, 0, &run(&[50, 45]));
        p.sort();
        assert_eq!(tscs(&p), [10, 20, 25, 30, 40, 45, 50]);
        assert!(p.ordered);
        // In order from here: after the last slot, then by `push`.
        p.push_run(5, 0, &run(&[50, 60, 70]));
        assert!(p.push(5, &raw(80, KindTag::Free, 80)));
        assert!(p.ordered);
        assert!(p.push(5, &raw(75, KindTag::Free, 75)));
        assert!(!p.ordered);
        p.sort();
        assert_eq!(tscs(&p), [10, 20, 25, 30, 40, 45, 50, 50, 60, 70, 75, 80]);
    }

    /// A run keeps its recording's slots in order and counts those of unknown kinds, whether
    /// it is copied whole (every slot this recording's, of a known kind) or slot by slot.
    #[test]
    fn a_run_keeps_its_recordings_slots_in_order() {
        let slot = |tsc: u64, kind: u8, epoch: u8| Raw {
            kind,
            epoch,
            ..raw(tsc, KindTag::Malloc, 0x1000 + tsc)
        };
        let (malloc, free) = (KindTag::Malloc as u8, KindTag::Free as u8);
        let clean = [slot(1, malloc, 3), slot(2, free, 3), slot(3, malloc, 3)];
        let mixed = [
            slot(4, malloc, 2),
            slot(5, free, 3),
            slot(6, 0, 3),
            slot(7, u8::MAX, 2),
            slot(8, malloc, 3),
        ];
        // Known kinds, one of them an earlier recording's.
        let stale = [slot(9, malloc, 2), slot(10, free, 3)];
        let mut p = Pending::new(1, false);
        assert_eq!(p.push_run(9, 3, &clean), 0);
        // One unknown kind of this recording; the other is an earlier recording's: skipped.
        assert_eq!(p.push_run(9, 3, &mixed), 1);
        assert_eq!(p.push_run(9, 3, &stale), 0);
        let got: Vec<(u64, u8, u32)> = p
            .slots
            .iter()
            .map(|d| (d.raw.tsc, d.raw.kind, d.tid))
            .collect();
        assert_eq!(
            got,
            [
                (1, malloc, 9),
                (2, free, 9),
                (3, malloc, 9),
                (5, free, 9),
                (8, malloc, 9),
                (10, free, 9)
            ]
        );
    }

    /// Slots of more than one chunk, across the deque's wrap (its front and back halves), keep
    /// their order and each its own stack: the two passes of `emit` run a chunk at a time, and
    /// an event must carry the stack of its own slot, defined before the event.
    #[test]
    fn emits_many_chunks_with_their_stacks() {
        // Process-wide ids 1..=3: stacks of code addresses of this binary (an address outside
        // every mapping would end its stack), one function each.
        let code = [
            raw as *const () as u64,
            Pending::new as *const () as u64,
            event_kind as *const () as u64,
        ];
        let mut stacks = (three_stacks(code), Defined::default());
        let meta = Metadata::now(1, Backend::Alloc);
        let opts = EncoderOptions::new().workers(1).frame_events(1000);
        let mut enc = Encoder::new(Vec::new(), &meta, opts).unwrap();
        let mut p = Pending::new(1, true);
        let slot = |i: u64| Raw {
            // Every fourth slot has no stack; first used in the order 3, 2, 1, so that the
            // recording's ids (1, 2, 3 by first use) are not the process-wide ones.
            stack: if i % 4 == 3 { 0 } else { 3 - (i % 3) as u32 },
            ..raw(i, KindTag::Malloc, 0x10_0000 + i * 16)
        };
        let mut next = 0u64;
        // Fill, emit most, fill again: the deque wraps, and the next emit spans both halves.
        for _ in 0..3 * CHUNK + 7 {
            assert!(p.push(7, &slot(next)));
            next += 1;
        }
        p.sort();
        p.emit(2 * CHUNK + 5, |t| t, &mut enc, &mut stacks).unwrap();
        for _ in 0..4 * CHUNK + 3 {
            assert!(p.push(7, &slot(next)));
            next += 1;
        }
        p.sort();
        assert!(!p.slots.as_slices().1.is_empty(), "the deque wrapped");
        p.emit(p.len(), |t| t, &mut enc, &mut stacks).unwrap();
        let (bytes, written) = enc.finish_into(0).unwrap();
        assert_eq!(written.events, next);
        let r = Reader::from_bytes(bytes).unwrap();
        // The first frame's offset of each event's stack, by the process-wide id of its slot.
        let mut offsets: [Vec<u64>; 3] = Default::default();
        for (i, e) in r.events().enumerate() {
            let e = e.unwrap();
            let i = i as u64;
            assert_eq!((e.ts, e.tid), (i, 7));
            assert_eq!(
                e.kind,
                EventKind::Malloc {
                    addr: 0x10_0000 + i * 16,
                    size: 8
                }
            );
            let want = slot(i).stack;
            if want == 0 {
                assert!(e.stack.is_none(), "event {i}");
            } else {
                offsets[want as usize - 1].push(r.stack(e.stack).unwrap().frames[0].offset);
            }
        }
        assert_stacks_name(&offsets, code);
        assert_eq!(r.stacks().unwrap().stacks().len(), 3);
    }

    /// A table of the process-wide stacks 1..=3, each the one frame `code[id - 1]`.
    fn three_stacks(code: [u64; 3]) -> SentStacks {
        let mut table = SentStacks::new(Default::default(), false);
        for (id, at) in (1..=3u32).zip(code) {
            let h = memtrack_bpf::RawStack {
                ts: 0,
                pid: std::process::id(),
                id,
                record: memtrack_bpf::RECORD_STACK,
                nframes: 1,
                flags: 0,
                scanned: 0,
            };
            assert!(table.add(&h, [at].into_iter()));
        }
        table
    }

    /// Every slot's event has its own stack: one offset per process-wide id (`offsets`), and
    /// the three as far apart as the functions they name (`code`, one mapping of this binary).
    fn assert_stacks_name(offsets: &[Vec<u64>; 3], code: [u64; 3]) {
        let one: Vec<u64> = offsets
            .iter()
            .map(|o| {
                assert!(!o.is_empty() && o.iter().all(|x| *x == o[0]), "{o:?}");
                o[0]
            })
            .collect();
        for k in 1..3 {
            assert_eq!(
                one[k].wrapping_sub(one[0]),
                code[k].wrapping_sub(code[0]),
                "stack {}",
                k + 1
            );
        }
    }

    /// Two threads' runs merge in timestamp order (ties keep drain order), the horizon holds
    /// back the young events, timestamps are converted on the way out, frames cut where
    /// single pushes would, and an unknown kind is refused.
    #[test]
    fn merges_converts_and_emits_in_order() {
        let mut p = Pending::new(1, false);
        assert!(!p.push(
            5,
            &Raw {
                kind: 0,
                ..raw(1, KindTag::Malloc, 1)
            }
        ));
        for (tid, tsc) in [(5, 10), (5, 30), (5, 50)] {
            assert!(p.push(tid, &raw(tsc, KindTag::Malloc, tsc)));
        }
        p.sort();
        for (tid, tsc) in [(6, 20), (6, 30), (6, 60)] {
            assert!(p.push(tid, &raw(tsc, KindTag::Free, tsc)));
        }
        p.sort();
        assert_eq!(p.ready(31), 4);
        let meta = Metadata::now(1, Backend::Alloc);
        let opts = EncoderOptions::new().workers(1).frame_events(3);
        let mut enc = Encoder::new(Vec::new(), &meta, opts).unwrap();
        let mut stacks = (
            SentStacks::new(Default::default(), false),
            Defined::default(),
        );
        p.emit(4, |t| t * 100, &mut enc, &mut stacks).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p.ready(u64::MAX), 2);
        p.emit(2, |t| t * 100, &mut enc, &mut stacks).unwrap();
        assert_eq!(p.len(), 0);
        let (bytes, written) = enc.finish_into(0).unwrap();
        assert_eq!((written.frames, written.events), (2, 6));
        let r = Reader::from_bytes(bytes).unwrap();
        let got: Vec<(u64, u32)> = r
            .events()
            .map(|e| e.map(|e| (e.ts, e.tid)).unwrap())
            .collect();
        assert_eq!(
            got,
            [
                (1000, 5),
                (2000, 6),
                (3000, 5),
                (3000, 6),
                (5000, 5),
                (6000, 6)
            ]
        );
    }
}
