//! The poller's side of call stacks: stack records of the ring buffer turned into frames
//! (module + file offset) once, and the definitions each recording's encoder needs.
//!
//! ```text
//! stack record (BPF id, pid, ts, addresses) ──ModuleMap::frames──▶ Stack ──intern──▶ global id
//! event (BPF id) ──▶ global id ──first use in this recording──▶ define_module…, define_stack
//!                                └──────────────────────────────▶ Event.stack (recording's id)
//! ```
//!
//! The BPF program remembers the stacks it sent for its whole life (across recordings), so the
//! table here lives as long as the poller; each recording numbers its own stacks and modules
//! from 1, in the order its events first use them.

use std::sync::{Arc, Mutex};

use memtrack_bpf::{RawStack, STACK_TRUNCATED};

use crate::encode::EncodeError;
use crate::event::Event;
use crate::modules::{ModuleMap, StackInterner};
use crate::stack::{Frame, ModuleId, Stack, StackId};

use super::poll::Sink;
use super::unwind::ReturnSlots;

/// Every stack a recorder sent, by the id it sent it under (the BPF program's, or the
/// allocator recorder's): not the artifact's [`StackTable`](crate::artifact::StackTable), which a
/// reader gathers from a file.
pub(crate) struct SentStacks {
    modules: Arc<Mutex<ModuleMap>>,
    interner: StackInterner,
    /// BPF id → global id (`StackId::NONE`: not sent, or not understood).
    by_bpf: Vec<StackId>,
    /// Per global id (index id − 1): whether the stack stops early ([`stops_early`]).
    short: Vec<bool>,
    /// Per global id: whether its call site (innermost frame) is in the C library.
    in_libc: Vec<bool>,
    /// Whether an `Exec` event starts a new image in the module map (no tracer does it at its
    /// exec stop: an in-process or `--no-follow` recording).
    images_from_events: bool,
    /// Where the innermost function of a blocked thread's stack keeps its return address.
    slots: ReturnSlots,
}

/// Whether a stack stops early: no frame beyond the allocator's caller, or a frame outside
/// every executable mapping (a chain broken by code without frame pointers).
pub(crate) fn stops_early(frames: &[Frame]) -> bool {
    frames.len() <= 1 || frames.iter().any(|f| f.module == ModuleId::UNKNOWN)
}

/// Whether `path` is the C library or its dynamic loader (glibc, musl), which distributions
/// build without frame pointers: what they allocate for themselves (stdio buffers, thread
/// set-up) has a short stack that no rebuild of the program fixes.
fn is_c_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libc.so")
        || name.starts_with("libc-") && name.ends_with(".so")
        || name.starts_with("ld-linux")
        || name.starts_with("ld-musl")
}

impl SentStacks {
    pub(crate) fn new(modules: Arc<Mutex<ModuleMap>>, images_from_events: bool) -> Self {
        Self {
            modules,
            interner: StackInterner::new(),
            by_bpf: Vec::new(),
            short: Vec::new(),
            in_libc: Vec::new(),
            images_from_events,
            slots: ReturnSlots::default(),
        }
    }

    /// A stack record: its frames resolved against the mappings of its process when it was
    /// taken. Returns `false` for a record whose id is 0 (malformed).
    pub(crate) fn add(&mut self, h: &RawStack, addrs: impl Iterator<Item = u64>) -> bool {
        if h.id == 0 {
            return false;
        }
        let mut addrs: Vec<u64> = addrs.collect();
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if h.scanned != 0 {
            let scanned = h.scanned.count_ones() as usize;
            if addrs.len() >= 2 + scanned {
                // Of the word at sp and the code words above it, the one in the slot frame 0's
                // unwind info names is its caller; the rest are locals and stale words. Without
                // unwind info, the word at sp stays (a frameless function's return address).
                let ip = modules.frames(h.pid, h.ts, &addrs[..1], true)[0];
                let path = modules.module(ip.module).map(|m| m.path.clone());
                let slot = match path {
                    Some(p) => self.slots.slot(&p, ip.offset),
                    None => None,
                };
                let caller = match slot {
                    None | Some(0) => Some(addrs[1]),
                    Some(k) => (k < 16 && h.scanned & (1 << k) != 0).then(|| {
                        let below = (h.scanned & ((1 << k) - 1)).count_ones() as usize;
                        addrs[2 + below]
                    }),
                };
                let rest = addrs.split_off(2 + scanned);
                addrs.truncate(1);
                addrs.extend(caller.filter(|&a| a != 0));
                addrs.extend(rest);
            }
        }
        let frames = modules.frames(h.pid, h.ts, &addrs, true);
        let in_libc = frames
            .first()
            .and_then(|f| modules.module(f.module))
            .is_some_and(|m| is_c_library(&m.path));
        drop(modules);
        let short = stops_early(&frames);
        let (id, new) = self.interner.intern(Stack {
            frames,
            truncated: h.flags & STACK_TRUNCATED != 0,
        });
        if new {
            self.short.push(short);
            self.in_libc.push(in_libc);
        }
        let i = h.id as usize;
        if self.by_bpf.len() <= i {
            self.by_bpf.resize(i + 1, StackId::NONE);
        }
        self.by_bpf[i] = id;
        true
    }

    /// Process `pid` executed a program at `ts` (an `Exec` event).
    pub(crate) fn exec(&mut self, pid: u32, ts: u64) {
        if self.images_from_events {
            self.modules
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .exec(pid, ts);
        }
    }

    fn global(&self, bpf_id: u32) -> StackId {
        self.by_bpf
            .get(bpf_id as usize)
            .copied()
            .unwrap_or(StackId::NONE)
    }
}

/// What one recording's encoder has been given, and its count of short stacks.
#[derive(Default)]
pub(crate) struct Defined {
    /// Global stack id − 1 → this recording's id (`NONE`: not defined yet).
    stacks: Vec<StackId>,
    /// Global module id − 1 → this recording's id.
    modules: Vec<ModuleId>,
    next_stack: u32,
    next_module: u32,
    /// The stack [`Defined::local`] gave last: consecutive events mostly name one stack.
    last: Last,
    /// Allocation events whose stack stops early.
    pub(crate) short_stacks: u64,
    /// Of those, the ones whose call site is in the C library.
    pub(crate) short_stacks_in_libc: u64,
    /// Events naming a stack id no record defined (a mismatched object): counted as malformed.
    pub(crate) unknown: u64,
}

/// A defined stack: its global id (`NONE`: none yet), this recording's, and whether it stops
/// early (in the C library).
#[derive(Default, Clone, Copy)]
struct Last {
    global: StackId,
    local: StackId,
    short: bool,
    in_libc: bool,
}

impl Defined {
    /// `ev` with its stack (BPF id `bpf_id`, 0 for none) in this recording's numbering, the
    /// definitions it needs given to `sink` first.
    pub(crate) fn attach(
        &mut self,
        table: &SentStacks,
        ev: Event,
        bpf_id: u32,
        sink: &mut dyn Sink,
    ) -> Result<Event, EncodeError> {
        let heap = ev.kind.tag().is_heap_allocation();
        Ok(match self.local(table, bpf_id, heap, sink)? {
            Some(id) => ev.with_stack(id),
            None => ev,
        })
    }

    /// This recording's id of the stack the recorder numbers `bpf_id`, defined in `sink`
    /// first if new; `heap`: the event that names it is a heap allocation (the malloc family),
    /// counted if its stack stops early. Mappings are not counted: one made inside the
    /// allocator (malloc calling mmap) has the allocator's broken chain above it whatever the
    /// program was built with. `None` for no stack: `bpf_id` 0, or an id no record defined
    /// (counted as unknown).
    #[inline(always)]
    pub(crate) fn local(
        &mut self,
        table: &SentStacks,
        bpf_id: u32,
        heap: bool,
        sink: &mut dyn Sink,
    ) -> Result<Option<StackId>, EncodeError> {
        let global = table.global(bpf_id);
        let last = self.last;
        if global.is_none() || global != last.global {
            return self.local_new(table, bpf_id, global, heap, sink);
        }
        self.count(last, heap);
        Ok(Some(last.local))
    }

    /// [`Defined::local`] of a stack other than the last one; `global` is its global id.
    #[inline(never)]
    fn local_new(
        &mut self,
        table: &SentStacks,
        bpf_id: u32,
        global: StackId,
        heap: bool,
        sink: &mut dyn Sink,
    ) -> Result<Option<StackId>, EncodeError> {
        if global.is_none() {
            // Id 0 is no stack; any other without a global id was never defined.
            if bpf_id != 0 {
                self.unknown += 1;
            }
            return Ok(None);
        }
        let g = global.0 as usize - 1;
        if self.stacks.len() <= g {
            self.stacks.resize(g + 1, StackId::NONE);
        }
        if self.stacks[g].is_none() {
            self.stacks[g] = self.define(table, global, sink)?;
        }
        let last = Last {
            global,
            local: self.stacks[g],
            short: table.short[g],
            in_libc: table.in_libc[g],
        };
        self.last = last;
        self.count(last, heap);
        Ok(Some(last.local))
    }

    /// Counts an event that names stack `last`, a heap allocation's if `heap`.
    #[inline(always)]
    fn count(&mut self, last: Last, heap: bool) {
        if heap && last.short {
            self.short_stacks += 1;
            self.short_stacks_in_libc += u64::from(last.in_libc);
        }
    }

    fn define(
        &mut self,
        table: &SentStacks,
        global: StackId,
        sink: &mut dyn Sink,
    ) -> Result<StackId, EncodeError> {
        let stack = table.interner.stack(global).expect("an interned id");
        let mut frames = Vec::with_capacity(stack.frames.len());
        for f in &stack.frames {
            let module = if f.module == ModuleId::UNKNOWN {
                ModuleId::UNKNOWN
            } else {
                let m = f.module.0 as usize - 1;
                if self.modules.len() <= m {
                    self.modules.resize(m + 1, ModuleId::UNKNOWN);
                }
                if self.modules[m] == ModuleId::UNKNOWN {
                    self.next_module += 1;
                    let local = ModuleId(self.next_module);
                    let module = table
                        .modules
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .module(f.module)
                        .cloned()
                        .expect("a module of the map");
                    sink.define_module(local, module)?;
                    self.modules[m] = local;
                }
                self.modules[m]
            };
            frames.push(Frame {
                module,
                offset: f.offset,
            });
        }
        self.next_stack += 1;
        let local = StackId(self.next_stack);
        sink.define_stack(
            local,
            Stack {
                frames,
                truncated: stack.truncated,
            },
        )?;
        Ok(local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one() {}
    fn two() {}

    /// A table of recorder ids 1 (two frames of this binary: whole), 2 (one frame: short) and
    /// 3 (one frame in the C library: short, in libc).
    fn three_stacks() -> SentStacks {
        let mut table = SentStacks::new(Default::default(), false);
        let code = |f: fn()| f as *const () as u64;
        let stacks: [(u32, Vec<u64>); 3] = [
            (1, vec![code(one), code(two)]),
            (2, vec![code(one)]),
            (3, vec![libc::malloc as *const () as u64]),
        ];
        for (id, addrs) in &stacks {
            let h = RawStack {
                ts: 0,
                pid: std::process::id(),
                id: *id,
                record: memtrack_bpf::RECORD_STACK,
                nframes: addrs.len() as u32,
                flags: 0,
                scanned: 0,
            };
            assert!(table.add(&h, addrs.iter().copied()));
        }
        table
    }

    /// A recording's ids are given by first use, each stack defined once, whether the stack
    /// is the last one's (kept) or another; a heap allocation whose stack stops early is
    /// counted at every event, in the C library or not; an id no record defined is counted
    /// unknown, and id 0 is no stack.
    #[test]
    fn ids_and_counts_are_the_same_for_the_last_stack_and_another() {
        let table = three_stacks();
        // (short, in libc) of each, as the table has them: what the counts follow.
        let props = |id: u32| {
            let g = table.global(id).0 as usize - 1;
            (table.short[g], table.in_libc[g])
        };
        assert_eq!(
            [props(1), props(2), props(3)],
            [(false, false), (true, false), (true, true)]
        );
        let meta = crate::artifact::Metadata::now(1, crate::artifact::Backend::Alloc);
        let mut enc = crate::encode::Encoder::new(Vec::new(), &meta, Default::default()).unwrap();
        let mut defined = Defined::default();
        // (recorder id, a heap allocation's): 7 is an id no record defined, 0 no stack.
        let events = [
            (1, true),
            (1, true),
            (2, true),
            (2, true),
            (2, false),
            (3, true),
            (3, true),
            (1, true),
            (0, true),
            (7, true),
            (7, true),
            (2, true),
            (3, false),
            (3, true),
        ];
        let (mut first_use, mut short, mut in_libc) = (Vec::new(), 0, 0);
        for (id, heap) in events {
            let got = defined.local(&table, id, heap, &mut enc).unwrap();
            if id == 0 || id == 7 {
                assert_eq!(got, None, "recorder id {id}");
                continue;
            }
            if !first_use.contains(&id) {
                first_use.push(id);
            }
            let want = first_use.iter().position(|&i| i == id).unwrap() as u32 + 1;
            assert_eq!(got, Some(StackId(want)), "recorder id {id}");
            let (s, l) = props(id);
            short += u64::from(heap && s);
            in_libc += u64::from(heap && s && l);
        }
        assert_eq!((short, in_libc), (6, 3));
        assert_eq!(
            (
                defined.short_stacks,
                defined.short_stacks_in_libc,
                defined.unknown
            ),
            (short, in_libc, 2)
        );
        // Each stack was defined once (a second definition is an error of the encoder's).
        enc.push(Event::new(1, 1, 1, crate::event::EventKind::Exec))
            .unwrap();
        let (bytes, _) = enc.finish_into(0).unwrap();
        let r = crate::artifact::Reader::from_bytes(bytes).unwrap();
        assert_eq!(r.stacks().unwrap().stacks().len(), 3);
    }

    #[test]
    fn a_stack_stops_early_without_callers_or_outside_the_mapped_text() {
        let f = |m: u32| Frame {
            module: ModuleId(m),
            offset: 0x10,
        };
        assert!(stops_early(&[]));
        assert!(stops_early(&[f(1)]));
        assert!(!stops_early(&[f(1), f(2)]));
        assert!(stops_early(&[f(1), f(0), f(2)]));
    }
}
