//! `memtrack synth`: a seeded, realistic model of a multi-threaded program's allocations.
//!
//! It exists to exercise the format, the analysis and the tools without privileges, and to be
//! the "realistic trace" the benchmarks measure. The model follows what real traces show:
//! - sizes are heavy-tailed: most blocks are 8–64 bytes, a few are megabytes;
//! - most blocks die young (freed within a few allocations), a live set persists;
//! - each thread allocates from its own arena; freed blocks are reused LIFO per size class (as
//!   glibc's tcache does), so addresses repeat; blocks of 128 KiB and more are `mmap`ed (an `Mmap`
//!   before the `Malloc`, a `Munmap` after the `Free`) and the main arena grows with `Brk`;
//! - threads run in bursts of events; time advances a few hundred ns per event, with pauses;
//! - `Vec`-like growth by `Realloc`, a little `Calloc` and aligned allocation, rare explicit
//!   `Mmap`/`Mremap`/`Munmap` of files or buffers.
//!
//! Behind the non-default `synth` feature: it is the only user of `rand`/`rand_xoshiro`, which a
//! crate that only records should not compile. The `memtrack` command, the benches and the
//! format tests turn it on.
//!
//! Made with [`Synth::with_stacks`], allocations (`Malloc`, `Calloc`, `AlignedAlloc`,
//! `Realloc`) carry call stacks with the shape real programs show ([`Synth::stacks`] are their
//! definitions):
//! - [`SITES`] call sites, each one stack of 10–40 frames, innermost first, in three modules (the
//!   program, libc for the outermost frames, libstdc++ for the `operator new` frame of a fifth of
//!   the sites); sites share prefixes: a site's outer frames (`main`, a subsystem, a loop) are
//!   those of an earlier site for a random depth, as the callers of sibling functions are;
//! - allocation counts per site are Zipf-like (site of rank `r`, 1-based, weighs `1 / r`), and
//!   allocations come in loops: a thread's allocation is at its previous allocation's site with
//!   probability 1/2, else at a site drawn by weight. Stack ids are the ranks (a recorder numbers
//!   stacks as it first sees them, which puts the frequent ones first too).
//!
//! The stacks come from a random stream of their own: the events of a seed are the same with
//! and without stacks but for [`Event::stack`].
//!
//! The same seed gives the same events on every platform (xoshiro256++).

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use rustc_hash::FxHashMap;

use crate::event::{Event, EventKind};
use crate::stack::{Frame, Module, ModuleId, Stack, StackId};

const MMAP_THRESHOLD: u64 = 128 * 1024;
const BRK_STEP: u64 = 132 * 1024;

/// Settings of a synthetic trace.
#[derive(Debug, Clone, Copy)]
pub struct SynthOptions {
    /// Seed of the random stream.
    pub seed: u64,
    /// Number of threads (at least 1).
    pub threads: u32,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            seed: 1,
            threads: 4,
        }
    }
}

/// Call sites of the model's stacks.
pub const SITES: usize = 300;

/// The cumulative weights of `n` sites whose counts follow Zipf's law (exponent 1).
fn zipf_cumulative(n: usize) -> Vec<f64> {
    let mut total = 0.0;
    (1..=n)
        .map(|r| {
            total += 1.0 / r as f64;
            total
        })
        .collect()
}

/// The model's call sites: their stacks and modules, and how an allocation picks one.
struct Sites {
    rng: Xoshiro256PlusPlus,
    modules: Vec<(ModuleId, Module)>,
    stacks: Vec<(StackId, Stack)>,
    /// Cumulative weights of the sites (Zipf, exponent 1).
    cumulative: Vec<f64>,
    /// Each thread's previous site.
    last: Vec<StackId>,
}

impl Sites {
    const APP: ModuleId = ModuleId(1);
    const LIBC: ModuleId = ModuleId(2);
    const CXX: ModuleId = ModuleId(3);

    /// The program, libc and libstdc++, at paths no machine has: a symbolizer falls back to
    /// `module+0xOFFSET` everywhere alike (a real libc would be found, with another build id,
    /// and named so in the output).
    fn modules() -> Vec<(ModuleId, Module)> {
        let module = |path: &str, build_id: u8| Module {
            path: path.to_string(),
            build_id: Some(
                (0..20)
                    .map(|i| build_id.wrapping_mul(31).wrapping_add(i))
                    .collect(),
            ),
        };
        vec![
            (Sites::APP, module("/synth/bin/synth-app", 1)),
            (Sites::LIBC, module("/synth/lib/libc.so.6", 2)),
            (Sites::CXX, module("/synth/lib/libstdc++.so.6", 3)),
        ]
    }

    fn new(seed: u64, threads: usize) -> Self {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5717_c4a5_0000_0001);
        let (app, libc, cxx) = (Sites::APP, Sites::LIBC, Sites::CXX);
        // Return addresses inside functions of the program (a 4 MiB text).
        let ret = |rng: &mut Xoshiro256PlusPlus| Frame {
            module: app,
            offset: 0x1_0000 + (rng.random_range(0..0x40_0000u64) & !0xf),
        };
        let start = Frame {
            module: libc,
            offset: 0x2_9d90,
        };
        let main = ret(&mut rng);
        let subsystems: Vec<Frame> = (0..8).map(|_| ret(&mut rng)).collect();
        let operator_new = Frame {
            module: cxx,
            offset: 0xa_e2bc,
        };
        let mut stacks: Vec<(StackId, Stack)> = Vec::with_capacity(SITES);
        for i in 0..SITES {
            let depth = rng.random_range(10..=40usize);
            // Outermost first while building; reversed at the end.
            let mut outer = if i > 0 && rng.random_bool(0.8) {
                let (_, parent) = &stacks[rng.random_range(0..i)];
                let mut shared: Vec<Frame> = parent.frames.iter().rev().copied().collect();
                // The parent's own call site (innermost) and operator new are not shared.
                shared.retain(|f| f.module != cxx);
                shared.truncate(rng.random_range(3..shared.len().max(4)).min(depth - 1));
                shared
            } else {
                vec![
                    start,
                    main,
                    subsystems[rng.random_range(0..subsystems.len())],
                ]
            };
            while outer.len() < depth {
                outer.push(ret(&mut rng));
            }
            if rng.random_bool(0.2) {
                *outer.last_mut().expect("10 frames or more") = operator_new;
            }
            outer.reverse();
            stacks.push((
                StackId(i as u32 + 1),
                Stack {
                    frames: outer,
                    truncated: depth == 40,
                },
            ));
        }
        Sites {
            rng,
            modules: Sites::modules(),
            stacks,
            cumulative: zipf_cumulative(SITES),
            last: vec![StackId::NONE; threads],
        }
    }

    /// The site of thread `t`'s next allocation.
    fn pick(&mut self, t: usize) -> StackId {
        if self.last[t].is_none() || !self.rng.random_bool(0.5) {
            let total = *self.cumulative.last().expect("sites");
            let u = self.rng.random::<f64>() * total;
            let rank = self.cumulative.partition_point(|&c| c < u).min(SITES - 1);
            self.last[t] = StackId(rank as u32 + 1);
        }
        self.last[t]
    }
}

/// Allocator size classes: 16-byte steps up to 1 KiB, then four classes per power of two (the
/// scheme of jemalloc and mimalloc), so freed blocks of similar sizes are reused.
fn size_class(size: u64) -> u64 {
    if size <= 1024 {
        return (size + 15).max(32) & !15;
    }
    let step = 1u64 << (63 - (size - 1).leading_zeros() - 2);
    size.div_ceil(step) * step
}

#[derive(Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    class: u64,
}

struct Thread {
    tid: u32,
    base: u64,
    bump: u64,
    target_live: usize,
    free_lists: FxHashMap<u64, Vec<u64>>,
    live: Vec<Block>,
}

/// An endless iterator of synthetic events; `take(n)` what you need.
pub struct Synth {
    rng: Xoshiro256PlusPlus,
    pid: u32,
    ts: u64,
    threads: Vec<Thread>,
    current: usize,
    burst_left: u32,
    mmap_cursor: u64,
    brk: u64,
    maps: Vec<(u64, u64)>,
    pending: VecDeque<EventKind>,
    sites: Option<Sites>,
}

impl Synth {
    /// A model with `opts`, whose allocations carry call stacks (see the module docs for
    /// their distribution); the events are those of [`Synth::new`] but for [`Event::stack`].
    pub fn with_stacks(opts: SynthOptions) -> Self {
        let mut model = Self::new(opts);
        model.sites = Some(Sites::new(opts.seed, opts.threads.max(1) as usize));
        model
    }

    /// A model with `opts`; `opts.threads` of 0 is taken as 1.
    pub fn new(opts: SynthOptions) -> Self {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(opts.seed);
        let pid = 4000 + (opts.seed % 1000) as u32;
        let threads = (0..opts.threads.max(1))
            .map(|i| {
                let base = if i == 0 {
                    0x5555_5556_0000
                } else {
                    0x7f30_0000_0000 - (i as u64) * 0x4000_0000
                };
                Thread {
                    tid: pid + i,
                    base,
                    bump: 0,
                    target_live: rng.random_range(500..5000),
                    free_lists: FxHashMap::default(),
                    live: Vec::new(),
                }
            })
            .collect();
        Synth {
            rng,
            pid,
            ts: 1_000_000_000_000 + opts.seed % 1_000_000,
            threads,
            current: 0,
            burst_left: 0,
            mmap_cursor: 0x7f80_0000_0000,
            brk: 0x5555_5556_0000,
            maps: Vec::new(),
            pending: VecDeque::new(),
            sites: None,
        }
    }

    /// The process id the model's events carry.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The modules of the stacks (empty but [`Synth::with_stacks`]): define them in the
    /// encoder ([`Encoder::define_module`](crate::encode::Encoder::define_module)) before the stacks.
    pub fn modules(&self) -> &[(ModuleId, Module)] {
        self.sites.as_ref().map_or(&[], |s| &s.modules)
    }

    /// Every stack the events may name, by id (empty but [`Synth::with_stacks`]): define
    /// them ([`Encoder::define_stack`](crate::encode::Encoder::define_stack)) before the events.
    pub fn stacks(&self) -> &[(StackId, Stack)] {
        self.sites.as_ref().map_or(&[], |s| &s.stacks)
    }

    fn size(&mut self) -> u64 {
        let r = &mut self.rng;
        let u: f64 = r.random();
        let log_uniform = |r: &mut Xoshiro256PlusPlus, lo: f64, hi: f64| -> u64 {
            (lo * (hi / lo).powf(r.random::<f64>())) as u64
        };
        if u < 0.55 {
            8 * r.random_range(1..=8)
        } else if u < 0.83 {
            r.random_range(65..=512)
        } else if u < 0.97 {
            log_uniform(r, 513.0, 8192.0)
        } else if u < 0.999 {
            log_uniform(r, 8193.0, 131_071.0)
        } else {
            log_uniform(r, 131_072.0, 8.0 * 1024.0 * 1024.0)
        }
    }

    /// Takes a block of `size` bytes for thread `t`, queueing the events that go with it
    /// (`Brk`, `Mmap`) before the caller's allocation event.
    fn place(&mut self, t: usize, size: u64) -> Block {
        if size >= MMAP_THRESHOLD {
            let len = (size + 16).div_ceil(4096) * 4096;
            self.mmap_cursor -= len;
            let map = self.mmap_cursor;
            self.pending.push_back(EventKind::Mmap {
                addr: map,
                size: len,
            });
            return Block {
                addr: map + 16,
                size,
                class: u64::MAX,
            };
        }
        let class = size_class(size);
        let th = &mut self.threads[t];
        if let Some(addr) = th.free_lists.get_mut(&class).and_then(Vec::pop) {
            return Block { addr, size, class };
        }
        let addr = th.base + th.bump + 16;
        th.bump += class;
        if t == 0 && th.base + th.bump > self.brk {
            self.brk = (th.base + th.bump).div_ceil(BRK_STEP) * BRK_STEP;
            self.pending.push_back(EventKind::Brk { addr: self.brk });
        }
        Block { addr, size, class }
    }

    fn release(&mut self, t: usize, b: Block) {
        if b.class == u64::MAX {
            let len = (b.size + 16).div_ceil(4096) * 4096;
            self.pending.push_back(EventKind::Munmap {
                addr: b.addr - 16,
                size: len,
            });
        } else {
            self.threads[t]
                .free_lists
                .entry(b.class)
                .or_default()
                .push(b.addr);
        }
    }

    fn pick_live(&mut self, t: usize) -> usize {
        let n = self.threads[t].live.len();
        if self.rng.random_bool(0.75) {
            n - 1 - self.rng.random_range(0..n.min(8))
        } else {
            self.rng.random_range(0..n)
        }
    }

    /// One operation of thread `t`: queues one to three events.
    fn step(&mut self, t: usize) {
        let (live, target) = (self.threads[t].live.len(), self.threads[t].target_live);
        let u: f64 = self.rng.random();
        if u < 0.0002 {
            return self.file_mapping();
        }
        let alloc = live == 0 || self.rng.random_bool(target as f64 / (target + live) as f64);
        if !alloc {
            let i = self.pick_live(t);
            let b = self.threads[t].live.swap_remove(i);
            self.pending.push_back(EventKind::Free { addr: b.addr });
            return self.release(t, b);
        }
        if live > 0 && self.rng.random_bool(0.06) {
            // Vec-like growth (sometimes a shrink) of a live block.
            let i = self.pick_live(t);
            let old = self.threads[t].live[i];
            let size = if self.rng.random_bool(0.85) {
                (old.size * 2).max(16)
            } else {
                (old.size / 2).max(1)
            };
            let class = size_class(size);
            if old.class != u64::MAX && class == old.class {
                // Fits the block's size class: the allocator resizes in place.
                self.pending.push_back(EventKind::Realloc {
                    old_addr: old.addr,
                    new_addr: old.addr,
                    size,
                });
                self.threads[t].live[i] = Block { size, ..old };
                return;
            }
            // Moves: the allocator's own mmap/brk for the new block come before realloc returns.
            let b = self.place(t, size);
            self.pending.push_back(EventKind::Realloc {
                old_addr: old.addr,
                new_addr: b.addr,
                size,
            });
            self.release(t, old);
            self.threads[t].live[i] = b;
            return;
        }
        let size = self.size();
        let b = self.place(t, size);
        let v: f64 = self.rng.random();
        self.pending.push_back(if v < 0.88 {
            EventKind::Malloc { addr: b.addr, size }
        } else if v < 0.97 {
            EventKind::Calloc { addr: b.addr, size }
        } else {
            let align = if self.rng.random_bool(0.8) { 64 } else { 4096 };
            EventKind::AlignedAlloc {
                addr: b.addr,
                size,
                align,
            }
        });
        self.threads[t].live.push(b);
    }

    /// A file or buffer mapping: map, sometimes grow it, unmap an older one.
    fn file_mapping(&mut self) {
        let r: f64 = self.rng.random();
        if r < 0.5 || self.maps.is_empty() {
            let len = 4096 * self.rng.random_range(1..256);
            self.mmap_cursor -= len;
            self.maps.push((self.mmap_cursor, len));
            self.pending.push_back(EventKind::Mmap {
                addr: self.mmap_cursor,
                size: len,
            });
        } else if r < 0.7 {
            let i = self.rng.random_range(0..self.maps.len());
            let (old, len) = self.maps[i];
            let new_len = len * 2;
            self.mmap_cursor -= new_len;
            self.maps[i] = (self.mmap_cursor, new_len);
            self.pending.push_back(EventKind::Mremap {
                old_addr: old,
                new_addr: self.mmap_cursor,
                size: new_len,
            });
        } else {
            let i = self.rng.random_range(0..self.maps.len());
            let (addr, size) = self.maps.swap_remove(i);
            self.pending.push_back(EventKind::Munmap { addr, size });
        }
    }
}

impl Iterator for Synth {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        while self.pending.is_empty() {
            if self.burst_left == 0 {
                self.current = self.rng.random_range(0..self.threads.len());
                self.burst_left = 1 + (-200.0 * self.rng.random::<f64>().ln()) as u32;
            }
            self.burst_left -= 1;
            self.step(self.current);
        }
        let kind = self.pending.pop_front()?;
        let gap = if self.rng.random_bool(0.005) {
            self.rng.random_range(5_000..200_000)
        } else {
            40 + (-250.0 * self.rng.random::<f64>().ln()) as u64
        };
        self.ts += gap;
        let ev = Event::new(self.ts, self.pid, self.threads[self.current].tid, kind);
        let allocation = matches!(
            kind,
            EventKind::Malloc { .. }
                | EventKind::Calloc { .. }
                | EventKind::AlignedAlloc { .. }
                | EventKind::Realloc { .. }
        );
        match &mut self.sites {
            Some(sites) if allocation => Some(ev.with_stack(sites.pick(self.current))),
            _ => Some(ev),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_their_sizes() {
        assert_eq!(size_class(1), 32);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1280);
        assert_eq!(size_class(1280), 1280);
        assert_eq!(size_class(1281), 1536);
        assert_eq!(size_class(100_000), 114_688);
        for s in 1..200_000 {
            assert!(size_class(s) >= s);
        }
    }
}
