//! The collector's merge buffer: the events drained from the threads' rings and not written
//! yet, in timestamp order.
//!
//! A slot becomes an [`Event`] once, when it is drained (its `ts` still the TSC value), and
//! goes to the encoder when it is old enough, its timestamp converted on the way: a copy less
//! than keeping slot copies and converting them on the way out (the collector's thread: 107 →
//! 96 instructions per event, callgrind, hotpaths `alloc_session`). A `Vec` compacted from its
//! front, with events sent to the encoder as slices, measured 113: its bulk copies run as
//! `rep movsb`, which callgrind counts per byte (48 per event).

use std::collections::VecDeque;
use std::io::Write;

use super::Raw;
use crate::encode::{EncodeError, Encoder};
use crate::event::{Event, EventKind};
use crate::stack::StackId;
use crate::tracker::{Defined, StackTable};

/// Events drained from the rings, in timestamp order once [`Pending::sort_from`] ran. Their
/// `ts` holds the TSC value until [`Pending::emit`] converts it: nothing outside this buffer
/// sees an event before that.
#[derive(Default)]
pub(super) struct Pending {
    /// A deque: the emitted front is popped without moving the rest (up to `LAG_NS` of events).
    events: VecDeque<Event>,
}

impl Pending {
    /// Events not emitted yet.
    pub(super) fn len(&self) -> usize {
        self.events.len()
    }

    /// Appends the event `r` stands for, of thread `tid` of process `pid`; `false` for a slot
    /// of a kind this build does not know (slot memory not written by `record`: a bug), which
    /// the caller counts as lost.
    #[inline(always)]
    pub(super) fn push(&mut self, pid: u32, tid: u32, r: &Raw) -> bool {
        match EventKind::from_raw(r.kind as u32, r) {
            Some(kind) => {
                // The recorder's process-wide stack id, until `emit` gives the recording's.
                self.events
                    .push_back(Event::new(r.tsc, pid, tid, kind).with_stack(StackId(r.stack)));
                true
            }
            None => false,
        }
    }

    /// Puts the events in timestamp order, given that the first `before` already were and
    /// that each ring's events arrive in order. With one thread allocating, the new events
    /// follow the old ones and checking them is all the work; otherwise a stable sort merges
    /// the runs.
    pub(super) fn sort_from(&mut self, before: usize) {
        let sorted = self
            .events
            .range(before.saturating_sub(1)..)
            .is_sorted_by_key(|e| e.ts);
        if !sorted {
            self.events.make_contiguous().sort_by_key(|e| e.ts);
        }
    }

    /// How many of the pending events (from the oldest) have a TSC below `horizon`.
    pub(super) fn ready(&self, horizon: u64) -> usize {
        self.events.partition_point(|e| e.ts < horizon)
    }

    /// Sends the `n` oldest pending events to `enc`, each TSC converted by `to_ns` first, and
    /// its stack (if any) given this recording's id with `stacks`, which defines it in `enc` at
    /// its first use.
    pub(super) fn emit<W: Write + Send + 'static>(
        &mut self,
        n: usize,
        to_ns: impl Fn(u64) -> u64,
        enc: &mut Encoder<W>,
        stacks: &mut (StackTable, Defined),
    ) -> Result<(), EncodeError> {
        let (front, back) = self.events.as_slices();
        let (front, back) = if n <= front.len() {
            (&front[..n], &back[..0])
        } else {
            (front, &back[..n - front.len()])
        };
        // Two plain loops: a chained iterator cost 5 instructions per event more (callgrind).
        for part in [front, back] {
            for e in part {
                let mut e = *e;
                e.ts = to_ns(e.ts);
                if !e.stack.is_none() {
                    let (table, defined) = &mut *stacks;
                    e = defined.attach(table, e.with_stack(StackId::NONE), e.stack.0, enc)?;
                }
                enc.push(e)?;
            }
        }
        self.events.drain(..n);
        Ok(())
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
        let mut p = Pending::default();
        for kind in [0, KindTag::ALL.len() as u8 + 1, u8::MAX] {
            assert!(!p.push(1, 2, &Raw { kind, ..r }), "kind {kind}");
        }
        assert_eq!(p.len(), 0);
        assert!(p.push(
            1,
            2,
            &Raw {
                kind: KindTag::Realloc as u8,
                ..r
            }
        ));
        assert!(p.push(
            1,
            2,
            &Raw {
                kind: KindTag::Free as u8,
                ..r
            }
        ));
        assert_eq!(
            p.events,
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

    /// Two threads' runs merge in timestamp order (ties keep drain order), the horizon holds
    /// back the young events, timestamps are converted on the way out, frames cut where
    /// single pushes would, and an unknown kind is refused.
    #[test]
    fn merges_converts_and_emits_in_order() {
        let mut p = Pending::default();
        assert!(!p.push(
            1,
            5,
            &Raw {
                kind: 0,
                ..raw(1, KindTag::Malloc, 1)
            }
        ));
        for (tid, tsc) in [(5, 10), (5, 30), (5, 50)] {
            assert!(p.push(1, tid, &raw(tsc, KindTag::Malloc, tsc)));
        }
        p.sort_from(0);
        let before = p.len();
        for (tid, tsc) in [(6, 20), (6, 30), (6, 60)] {
            assert!(p.push(1, tid, &raw(tsc, KindTag::Free, tsc)));
        }
        p.sort_from(before);
        assert_eq!(p.ready(31), 4);
        let meta = Metadata::now(1, Backend::Alloc);
        let opts = EncoderOptions::new().workers(1).frame_events(3);
        let mut enc = Encoder::new(Vec::new(), &meta, opts).unwrap();
        let mut stacks = (
            StackTable::new(Default::default(), false),
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
