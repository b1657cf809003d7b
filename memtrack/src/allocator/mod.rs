//! The in-process recorder of the Rust global allocator: [`Allocator`].
//!
//! ```text
//! #[global_allocator] Allocator<A>      every thread: one relaxed load when no session records;
//!   alloc/dealloc/realloc/alloc_zeroed  while recording, a TSC read and a 40-byte write into the
//!        │                              thread's own ring (single producer, no lock, no RMW)
//!        ▼
//!   per-thread rings ──▶ collector thread ("memtrack-collect"): drains every ring each
//!                        millisecond, merges by timestamp, converts TSC to CLOCK_MONOTONIC ns
//!                        ──▶ Encoder (the same artifact as the eBPF tracker, backend "alloc")
//! ```
//!
//! - **Re-entrancy**: memtrack's own allocations while recording (a ring, the collector's
//!   buffers) pass through unrecorded: a thread-local flag marks "inside memtrack", and
//!   memtrack's threads (collector, encoder) carry it for their whole life.
//! - **Fast path**: a thread's first recording call checks everything (the flag, the scope,
//!   counting) and leaves the thread a pass for that session word; its next calls compare
//!   one word and write their slot (no flag, no checks), until the session, the thread's scope
//!   or its exclusion changes. With call stacks on, an allocation takes it when its stack is
//!   one the thread walked and still holds (the last walk first, then the others); else the
//!   full call walks.
//! - **Order**: events are merged by TSC, which is invariant and synchronised across cores on
//!   the machines memtrack supports (checked at session start). An allocation is stamped after
//!   the inner allocator returns and a free before it is called, so a block handed to another
//!   thread is always freed after it was allocated, in the merged order too.
//! - **Thread exit**: a thread's ring outlives the thread (the registry holds it) until the
//!   collector has drained it. Allocations made after the thread's ring was torn down (other
//!   thread-local destructors) go to a shared, locked overflow ring.
//! - **Call stacks**: an allocation's stack is its wrapper's instruction pointer, then a
//!   bounded frame-pointer walk (`allocator/walk.rs`; the session's `stack_depth`, default 64
//!   frames, 0 for none), each distinct stack sent once per thread to the collector, which
//!   resolves it with the [`ModuleMap`](crate::modules::ModuleMap) of this process and defines it in
//!   the artifact as the eBPF tracker does. Frees carry none. Needs frame pointers in the
//!   program (`-C force-frame-pointers=yes`; Rust's std has them).
//! - **Before `main` and with no session**: the wrapper only forwards (one relaxed load of the
//!   switch per call; the ir-gate's `alloc_idle` over `alloc_system` gates it). The process's
//!   first allocation through it takes the recording call once,
//!   to learn that it is installed (`LEARN`).
//! - **Lifecycle**: idle → starting → recording → stopping → idle, one state behind one lock
//!   in `allocator/lifecycle.rs`; the switch and session word the hot path reads are its view,
//!   written only by its transitions.

mod collector;
mod error;
mod lifecycle;
mod merge;
mod walk;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use collector::{AllocRecording, start_recording};
#[cfg(feature = "criterion")]
pub(crate) use collector::{CountingGuard, counters, start_counting};
pub use error::AllocatorError;
pub(crate) use walk::{DEFAULT_STACK_DEPTH, STACK_MAX};

use crate::event::KindTag;
use lifecycle::{COUNT, Lifecycle, STREAM, View};

/// The view of [`RECORDER`]'s state that the hot path reads, written only by its transitions:
/// switch bits ([`STREAM`] records events, [`COUNT`] only keeps the global counters), and
/// [`LEARN`] until an allocation has gone through [`Allocator`].
static SWITCH: AtomicU32 = AtomicU32::new(LEARN);
/// Set in [`SWITCH`] while [`INSTALLED`] is not: the first allocation through [`Allocator`]
/// takes the recording call, which sets [`INSTALLED`] and clears the bit. So an idle wrapper
/// checks one word per call, not two: 4 fewer instructions per alloc+free pair than a
/// separate check of [`INSTALLED`] on every allocation (ir-gate `alloc_idle`).
const LEARN: u32 = 1 << 31;
const _: () = assert!(LEARN & (STREAM | COUNT) == 0);
/// The view's session word, so that a call reads a consistent pair: the recording's epoch
/// (high 32 bits; incremented by every recording, ring slots carry it, so that a late write of
/// an old session cannot leak into the next one) and its scope (low 32 bits: 0 for the whole
/// process, else the generation number that the threads in its scope carry in
/// [`THREAD_SCOPE`]). A call that read the switch during one session and the rest after the
/// next began is recorded with the epoch it read the scope with, so it is either in the new
/// session's scope or dropped.
static SESSION: AtomicU64 = AtomicU64::new(0);
/// The allocator recorder's lifecycle; see `allocator/lifecycle.rs`.
static RECORDER: Lifecycle<HotPath> = Lifecycle::new(HotPath);

/// The view [`RECORDER`]'s transitions write: [`SWITCH`] and [`SESSION`].
struct HotPath;

impl View for HotPath {
    /// Writes the view in an order the hot path can read at any point: [`FAST`] closes first
    /// and opens last, once [`SWITCH`] and [`SESSION`] hold the new state.
    fn publish(&self, switch: u32, session: Option<u64>) {
        FAST.store(FAST_CLOSED, Ordering::SeqCst);
        if let Some(word) = session {
            SESSION.store(word, Ordering::SeqCst);
        }
        // A transition that raced with the first allocation may set LEARN again after that
        // allocation cleared it: the next allocation clears it again.
        let learn = if INSTALLED.load(Ordering::SeqCst) {
            0
        } else {
            LEARN
        };
        SWITCH.store(switch | learn, Ordering::SeqCst);
        let word = SESSION.load(Ordering::SeqCst);
        if switch == STREAM && word < NEVER {
            FAST.store(word, Ordering::SeqCst);
        }
    }
}

/// The session word while the switch is exactly [`STREAM`] (recording, nobody counting), else
/// [`FAST_CLOSED`]: the one word the fast path compares with its thread's [`FastPass`]. Written
/// only by [`HotPath::publish`]. A session whose word is [`NEVER`] or above has no fast path.
static FAST: AtomicU64 = AtomicU64::new(FAST_CLOSED);
const FAST_CLOSED: u64 = u64::MAX;
/// A [`FastPass`] word that [`FAST`] never holds.
const NEVER: u64 = u64::MAX - 1;
/// Events dropped because recording stopped while their thread waited for room (the
/// collector failed), or whose record the collector could not read (an unknown kind): reported
/// as lost.
pub(crate) static LOST: AtomicU64 = AtomicU64::new(0);
/// Calls of threads outside a thread-scoped session's scope, not recorded.
pub(crate) static OUT_OF_SCOPE: AtomicU64 = AtomicU64::new(0);
/// Set by the first allocation that goes through [`Allocator`] (see [`LEARN`]): the wrapper is
/// installed. A fact the hot path learns (it cannot take a lock), not a phase of the lifecycle.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Counters kept in [`COUNT`] mode (a criterion measurement reads them).
static COUNT_ALLOCS: AtomicU64 = AtomicU64::new(0);
static COUNT_BYTES: AtomicU64 = AtomicU64::new(0);
static COUNT_FREES: AtomicU64 = AtomicU64::new(0);

/// Whether [`Allocator`] is this program's global allocator (it has served an allocation).
pub fn allocator_installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// A `GlobalAlloc` that records every allocation of the program while a memtrack session with
/// the allocator recorder runs, and otherwise only forwards to `A` (one relaxed load).
///
/// ```
/// #[global_allocator]
/// static ALLOC: memtrack::Allocator = memtrack::Allocator::system();
/// # fn main() {}
/// ```
/// Needs no privileges. It sees the Rust global allocator only: allocations of C libraries
/// (through `malloc` directly) and `mmap`s are not recorded; the eBPF tracker sees those.
/// Call stacks need the program built with frame pointers (`RUSTFLAGS="-C
/// force-frame-pointers=yes"`); without them they stop early, and `memtrack show` says so.
pub struct Allocator<A = System> {
    inner: A,
}

impl Allocator<System> {
    /// Wraps the system allocator.
    pub const fn system() -> Self {
        Allocator { inner: System }
    }
}

impl<A> Allocator<A> {
    /// Wraps `inner` (any `GlobalAlloc`: jemalloc's, mimalloc's, ...).
    pub const fn new(inner: A) -> Self {
        Allocator { inner }
    }
}

/// One recorded call, as the producer writes it (converted to an [`Event`](crate::event::Event) by
/// the collector, which knows the thread).
/// `repr(C)`: the fast path writes the last word (stack id, alignment, kind, epoch) in one store
/// ([`Raw::write_meta`]).
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct Raw {
    pub tsc: u64,
    /// The block's address (a realloc's new block).
    pub addr: u64,
    /// A realloc's old block.
    pub addr2: u64,
    pub size: u64,
    /// The stack's id (see `walk.rs`; 0: none), unique in the process.
    pub stack: u32,
    /// log2 of an alignment + 1 (0: none given): keeps the slot at 40 bytes with the stack id.
    pub align_log: u8,
    pub kind: u8,
    pub epoch: u8,
}

/// Where [`Raw::write_meta`] writes, and the layout it writes (little-endian: x86-64 only).
const META: usize = std::mem::offset_of!(Raw, stack);
const _: () = assert!(
    META == 32
        && std::mem::offset_of!(Raw, align_log) == META + 4
        && std::mem::offset_of!(Raw, kind) == META + 5
        && std::mem::offset_of!(Raw, epoch) == META + 6
        && size_of::<Raw>() == META + 8
);

impl Raw {
    /// The slot's last word for `kind` with `align_log` and no stack: `stack`, `align_log`,
    /// `kind` and `epoch` (OR [`Raw::epoch_meta`]) in one value.
    #[inline(always)]
    pub(crate) const fn meta(kind: KindTag, align_log: u8) -> u64 {
        Raw::meta_of(kind as u8, align_log)
    }

    /// [`Raw::meta`] of a kind given by its tag's value.
    #[inline(always)]
    pub(crate) const fn meta_of(kind: u8, align_log: u8) -> u64 {
        (align_log as u64) << 32 | (kind as u64) << 40
    }

    /// `epoch`'s bits in [`Raw::meta`].
    pub(crate) const fn epoch_meta(epoch: u8) -> u64 {
        (epoch as u64) << 48
    }

    /// Writes `meta` over the slot's `stack`, `align_log`, `kind` and `epoch` (and its padding
    /// byte).
    ///
    /// # Safety
    /// `slot` is valid for writes of a `Raw`.
    #[inline(always)]
    unsafe fn write_meta(slot: *mut Raw, meta: u64) {
        // SAFETY: bytes META..META + 8 are the slot's last (see the layout assertion), and
        // 8-aligned: `Raw` is (it holds u64s) and META is a multiple of 8.
        unsafe { slot.cast::<u8>().add(META).cast::<u64>().write(meta) }
    }

    /// `align_log` for `align` (a power of two, or 0 for none).
    #[inline(always)]
    pub(crate) fn align_log(align: u64) -> u8 {
        if align == 0 {
            0
        } else {
            align.trailing_zeros() as u8 + 1
        }
    }
}

/// Slots per thread ring: 16,384 × 40 bytes = 640 KiB per recording thread, ~16 ms of events
/// at a million allocations per second; the collector drains every millisecond, and is woken
/// early when a ring is a quarter full.
pub(crate) const RING: usize = 16_384;

/// Keeps a producer-side and a consumer-side counter on separate cache lines: sharing one
/// made every push miss in cache while the collector drained.
#[repr(align(128))]
struct Padded<T>(T);

/// A single-producer (its thread) single-consumer (the collector) ring of [`Raw`] slots.
pub(crate) struct Ring {
    /// A fixed-size array, so that indexing by `% RING` needs no bounds check.
    slots: Box<[UnsafeCell<Raw>; RING]>,
    /// Slots written (producer-owned; published with Release).
    head: Padded<AtomicUsize>,
    /// Producer-only: the head position at which the producer next looks at `tail` (to wait
    /// for room, or to wake the collector); always before the ring could be full.
    next_check: Padded<AtomicUsize>,
    /// Slots consumed (collector-owned; published with Release).
    tail: Padded<AtomicUsize>,
    pub(crate) tid: u32,
    /// Set when the thread's ring handle is destroyed (thread exit).
    pub(crate) closed: AtomicBool,
    /// Set by the producer when it sleeps for room; the collector wakes it after draining.
    pub(crate) waiting: AtomicBool,
    /// The producer thread, to wake it.
    pub(crate) thread: std::sync::OnceLock<std::thread::Thread>,
}

// SAFETY: slot `i` is written only by the producer while `i - tail < RING` and before `head`
// passes it (Release), and read only by the collector after it observed `head` past it
// (Acquire) and before it moves `tail` past it (Release): producer and consumer never touch the
// same slot at the same time.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(tid: u32) -> Self {
        Ring {
            slots: (0..RING)
                .map(|_| UnsafeCell::new(Raw::default()))
                .collect::<Box<[_]>>()
                .try_into()
                .unwrap_or_else(|_| unreachable!("RING slots collected")),
            head: Padded(AtomicUsize::new(0)),
            next_check: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            tid,
            closed: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            thread: std::sync::OnceLock::new(),
        }
    }

    /// Producer side: appends `raw`, waiting for the collector while the ring is full. Looks
    /// at the collector's `tail` only every so often (at most every RING/8 pushes), and wakes
    /// the collector at most that often, once the ring is a quarter full.
    /// `make` is called once there is room, and its slot is built in place (a `Raw` built
    /// first and copied costs the recording call a copy per event).
    #[inline(always)]
    fn push(&self, make: impl FnOnce() -> Raw) {
        let head = self.head.0.load(Ordering::Relaxed);
        if head >= self.next_check.0.load(Ordering::Relaxed) && !self.check(head) {
            LOST.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SAFETY: see `unsafe impl Sync`: this slot is free (`check` keeps head - tail < RING)
        // and only this thread writes slots.
        unsafe { self.slots[head % RING].get().write(make()) };
        self.head.0.store(head + 1, Ordering::Release);
    }

    /// Returns false if the ring is full and recording has stopped (the event is dropped).
    #[cold]
    fn check(&self, head: usize) -> bool {
        let mut tail = self.tail.0.load(Ordering::Acquire);
        if head - tail >= RING {
            match self.wait_for_room(head) {
                Some(t) => tail = t,
                None => return false,
            }
        }
        let used = head - tail;
        if used >= RING / 4 {
            RECORDER.wake_collector();
        }
        let next = head + (RING / 8).min(RING - used - 1).max(1);
        self.next_check.0.store(next, Ordering::Relaxed);
        true
    }

    /// Waits until the collector frees a slot; `None` if recording stopped meanwhile (the
    /// collector is gone: never wait for it).
    /// Sleeps (not spins: the collector and the encoder need the CPU) until the collector has
    /// drained this ring.
    #[cold]
    fn wait_for_room(&self, head: usize) -> Option<usize> {
        self.thread.get_or_init(std::thread::current);
        loop {
            let tail = self.tail.0.load(Ordering::Acquire);
            if head - tail < RING {
                return Some(tail);
            }
            if SWITCH.load(Ordering::Relaxed) & STREAM == 0 {
                return None;
            }
            self.waiting.store(true, Ordering::SeqCst);
            RECORDER.wake_collector();
            // Re-check after announcing the wait: the collector may have drained in between.
            if head - self.tail.0.load(Ordering::SeqCst) < RING {
                self.waiting.store(false, Ordering::Relaxed);
                continue;
            }
            std::thread::park_timeout(std::time::Duration::from_micros(500));
        }
    }

    /// Consumer side: calls `f` with the published slots, in order, as at most two runs (the
    /// second when they wrap past the ring's end), then frees them. Runs, not slots: the
    /// collector copies a run at once instead of checking its buffer's room per slot.
    pub(crate) fn drain(&self, mut f: impl FnMut(&[Raw])) {
        let tail = self.tail.0.load(Ordering::Relaxed);
        let head = self.head.0.load(Ordering::Acquire);
        let n = head - tail;
        let start = tail % RING;
        let first = n.min(RING - start);
        // `UnsafeCell<Raw>` has the layout of `Raw` (repr(transparent)).
        let base = self.slots.as_ptr().cast::<Raw>();
        // SAFETY: see `unsafe impl Sync`: slots tail..head are published and not yet freed,
        // so the producer does not write them while these borrows live; `start + first` and
        // `n - first` are at most RING.
        unsafe {
            f(std::slice::from_raw_parts(base.add(start), first));
            if n > first {
                f(std::slice::from_raw_parts(base, n - first));
            }
        }
        self.tail.0.store(head, Ordering::Release);
    }
}

/// Every ring of every thread that recorded, until the collector has drained a closed one.
pub(crate) static REGISTRY: Mutex<Vec<Arc<Ring>>> = Mutex::new(Vec::new());

/// Events written to the threads' rings that the collector has not drained yet. The hot-path
/// gate's driver waits for 0 between bursts, so that its measured thread never waits for room.
pub(crate) fn undrained() -> usize {
    let rings = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    rings
        .iter()
        .map(|r| {
            // Tail first: it never passes a head value read after it.
            let tail = r.tail.0.load(Ordering::Acquire);
            r.head.0.load(Ordering::Acquire) - tail
        })
        .sum()
}

/// Events of threads whose ring was already torn down (thread-local destructors at exit).
pub(crate) static OVERFLOW: Mutex<Vec<(u32, Raw)>> = Mutex::new(Vec::new());

/// The thread's handle on its ring; dropping it (thread exit) marks the ring closed.
struct RingHandle(Option<Arc<Ring>>);

impl Drop for RingHandle {
    fn drop(&mut self) {
        // From here on the thread's calls take the locked overflow path.
        revoke_pass();
        RING_PTR.with(|p| p.set(std::ptr::null()));
        if let Some(r) = &self.0 {
            r.closed.store(true, Ordering::Release);
        }
    }
}

thread_local! {
    /// Inside memtrack on this thread: allocations pass through unrecorded. No destructor, so
    /// it can be read at any point of the thread's life, thread-local teardown included.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    static RING_HANDLE: UnsafeCell<RingHandle> = const { UnsafeCell::new(RingHandle(None)) };
    /// The ring `RING_HANDLE` holds, or null: a plain pointer (no destructor, so no lazy
    /// registration check on every call) for the hot path. Cleared when the handle drops.
    static RING_PTR: Cell<*const Ring> = const { Cell::new(std::ptr::null()) };
    static TID: Cell<u32> = const { Cell::new(0) };
    /// The generation of the thread-scoped session this thread belongs to (0: none). Set only
    /// through [`set_scope`], which revokes the thread's [`PASS`].
    static THREAD_SCOPE: Cell<u32> = const { Cell::new(0) };
    /// The thread's pass for the recording call's fast path (see [`FastPass`]).
    static PASS: Cell<FastPass> = const { Cell::new(FastPass::NONE) };
}

/// What the full recording call checked of a thread, so that its next calls need not check it
/// again: the thread is not memtrack's own, has a ring, and is in the scope of the recording
/// whose session word is `word`. A call takes the fast path ([`fast_push`]) while [`FAST`]
/// holds `word` (for an allocation: `alloc_word`, which is `word` only if the recording takes
/// no call stacks); anything that changes what was checked revokes the pass ([`revoke_pass`]:
/// the thread's scope, its exclusion, its ring's end). One TLS read and one compare replace
/// the re-entrancy flag's two writes, the switch's, scope's and counting's checks of a call.
#[derive(Clone, Copy)]
struct FastPass {
    /// The thread's ring (valid while a word is not [`NEVER`]).
    ring: *const Ring,
    /// The session word the checks were made under ([`NEVER`]: no pass).
    word: u64,
    /// `word` if allocations take the fast path too, else [`NEVER`].
    alloc_word: u64,
    /// `word` if allocations take the fast path with their call stack (found again without a
    /// walk: [`walk::recent`]), else [`NEVER`].
    stack_word: u64,
    /// The epoch as [`Raw::meta`] bits.
    epoch: u64,
    /// The cap of the recording's walks ([`walk::cap`] of its stack depth).
    depth: usize,
    /// [`Raw::meta`] of a free and of a malloc, with the epoch: their calls store it as it is
    /// (two instructions fewer than making it).
    free_meta: u64,
    malloc_meta: u64,
}

impl FastPass {
    const NONE: FastPass = FastPass {
        ring: std::ptr::null(),
        word: NEVER,
        alloc_word: NEVER,
        stack_word: NEVER,
        epoch: 0,
        depth: 1,
        free_meta: 0,
        malloc_meta: 0,
    };
}

fn revoke_pass() {
    PASS.with(|p| p.set(FastPass::NONE));
}

/// Puts the calling thread in the thread scope `generation` (0: none).
fn set_scope(generation: u32) {
    revoke_pass();
    THREAD_SCOPE.with(|t| t.set(generation));
}

/// Puts the calling thread (the session's) in the thread scope of `generation` (0: the
/// session records the whole process; nothing to do).
fn join_scope(generation: u32) {
    if generation != 0 {
        set_scope(generation);
    }
}

/// Takes the calling thread out of any thread scope (a paused recording's caller, between its
/// calls).
fn leave_scope() {
    set_scope(0);
}

/// Whether the calling thread is in the scope of the allocator recorder's running session.
pub(crate) fn current_thread_in_scope() -> bool {
    if SWITCH.load(Ordering::Relaxed) & STREAM == 0 {
        return false;
    }
    let g = SESSION.load(Ordering::Relaxed) as u32;
    g == 0 || THREAD_SCOPE.with(|t| t.get()) == g
}

/// Makes `f` part of the calling thread's session when it runs on another thread: wrap the
/// closure of a thread you spawn inside a session, e.g.
/// `std::thread::spawn(memtrack::in_session(move || work()))`.
///
/// A session's default [`Scope::Threads`](crate::Scope::Threads) covers the thread that
/// started it and the threads spawned from it. The eBPF tracker sees every thread being created and needs no help; the
/// allocator recorder ([`Allocator`]) cannot see a spawn, so a thread it should record must be
/// started through this wrapper (elsewhere its allocations are counted in
/// the report's `out_of_scope`, not recorded). Outside a session, or
/// with [`Scope::Process`](crate::Scope::Process), it changes nothing.
///
/// # Examples
///
/// ```
/// # #[global_allocator]
/// # static ALLOC: memtrack::Allocator = memtrack::Allocator::system();
/// # fn main() -> Result<(), memtrack::Error> {
/// let session = memtrack::SessionBuilder::new("spawned")
///     .backend(memtrack::BackendChoice::Alloc)
///     .in_memory(true)
///     .quiet(true)
///     .start()?;
/// let worker = std::thread::spawn(memtrack::in_session(|| vec![0u8; 4096]));
/// let buffer = worker.join().unwrap();
/// assert!(session.finish()?.bytes_allocated() >= 4096); // the thread's buffer is counted
/// # drop(buffer);
/// # Ok(())
/// # }
/// ```
pub fn in_session<F, R>(f: F) -> impl FnOnce() -> R + Send + 'static
where
    F: FnOnce() -> R + Send + 'static,
{
    let generation = THREAD_SCOPE.with(|t| t.get());
    move || {
        set_scope(generation);
        f()
    }
}

/// Marks the current thread as memtrack's own for the rest of its life (collector, encoder).
pub(crate) fn exclude_current_thread() {
    INSIDE.with(|i| i.set(true));
    revoke_pass();
}

fn tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions.
            t.set(unsafe { libc::gettid() } as u32);
        }
        t.get()
    })
}

#[inline(always)]
fn tsc() -> u64 {
    // SAFETY: rdtsc is available on every x86-64 CPU; invariance is checked at session start.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Stamps `slot` with the TSC, its two halves stored as `rdtsc` gives them (one instruction
/// fewer than joining them first).
///
/// # Safety
/// `slot` is valid for writes of a `Raw`.
#[inline(always)]
unsafe fn stamp(slot: *mut Raw) {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc is available on every x86-64 CPU; it touches no memory.
    unsafe {
        std::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    };
    // SAFETY: the slot's `tsc` is 8 bytes, little-endian (x86-64): low half first.
    unsafe {
        let at = (&raw mut (*slot).tsc).cast::<u32>();
        at.write(lo);
        at.add(1).write(hi);
    }
}

/// Records an allocation on the fast path ([`fast_push`]) and returns true, or returns false:
/// the caller then makes the full call, [`record`]. `meta` gives [`Raw::meta`] of the kind and
/// alignment, with the pass's epoch. `MOVE`: a realloc, whose old block is `old` (the other
/// kinds leave that field of the slot as it was: their events do not read it).
#[inline(always)]
fn fast_alloc<const MOVE: bool>(
    meta: impl FnOnce(&FastPass) -> u64,
    addr: u64,
    old: u64,
    size: u64,
) -> bool {
    // Allocations with call stacks take `fast_alloc_stack` or the full call (no `alloc_word`).
    fast_push(
        |pass| pass.alloc_word,
        |slot, pass| {
            // SAFETY: `fast_push` hands a free slot of this thread's ring.
            unsafe {
                (&raw mut (*slot).addr).write(addr);
                if MOVE {
                    (&raw mut (*slot).addr2).write(old);
                }
                (&raw mut (*slot).size).write(size);
                Raw::write_meta(slot, meta(pass));
                stamp(slot);
            }
            true
        },
    )
}

/// Writes an allocation's slot with stack `stack` on the fast path, `pass` found valid for it
/// ([`push_passed`]); false if the ring's room says the full call must record it. Arguments as
/// [`record`]'s; a kind that is not a realloc's ignores the `addr2` it writes.
#[inline(always)]
fn push_stack(
    pass: &FastPass,
    stack: u32,
    addr: u64,
    size: u64,
    kind_align: u32,
    addr2: u64,
) -> bool {
    push_passed(pass, |slot, pass| {
        let meta = Raw::meta_of(kind_align as u8, (kind_align >> 8) as u8) | pass.epoch;
        // SAFETY: `push_passed` hands a free slot of this thread's ring.
        unsafe {
            (&raw mut (*slot).addr).write(addr);
            (&raw mut (*slot).addr2).write(addr2);
            (&raw mut (*slot).size).write(size);
            Raw::write_meta(slot, meta | u64::from(stack));
            stamp(slot);
        }
        true
    })
}

/// [`record`] when the thread's last walk does not hold (a loop that allocates at several
/// places in turn): the stack of one of its other recent walks ([`walk::recent`]), else the
/// full call. Its own function, so that [`record`] calls nothing but in tail position and
/// keeps nothing across a call.
#[cold]
#[inline(never)]
fn record_recent(addr: u64, at: walk::Here, size: u64, kind_align: u32, addr2: u64) {
    // The pass `record` found valid: the search allocates nothing, so it is still this one.
    let pass = PASS.with(Cell::get);
    let stack = walk::recent(at, pass.depth as u32);
    if stack == 0 || !push_stack(&pass, stack, addr, size, kind_align, addr2) {
        record_full(addr, at, size, kind_align, addr2)
    }
}

/// [`fast_alloc`] of a free.
#[inline(always)]
fn fast_free(addr: u64) -> bool {
    fast_push(
        |pass| pass.word,
        |slot, pass| {
            // SAFETY: `fast_push` hands a free slot of this thread's ring. A free's event reads
            // its address only: the old block and size fields are left as they were.
            unsafe {
                (&raw mut (*slot).addr).write(addr);
                Raw::write_meta(slot, pass.free_meta);
                stamp(slot);
            }
            true
        },
    )
}

/// Records one allocation in full: when [`fast_alloc`] could not (no valid [`FastPass`], call
/// stacks, a check of the ring's room). `kind_align` is the kind's tag in the low byte and
/// [`Raw::align_log`] in the next; `at` is where the allocator wrapper runs, the call stack's
/// start; `addr2` a realloc's old block. The arguments come in the registers the wrapper's
/// recording calls hold them in (block, where, size), so that none moves on the fast path.
///
/// With call stacks, an allocation whose stack is the thread's last walk's, which still holds
/// ([`walk::last`]), is written here without the full call: the stack is found before the ring
/// is looked at, and every other case is a call in tail position ([`record_recent`],
/// [`record_full`]), so that nothing is kept in saved registers across the frames' check.
#[cold]
#[inline(never)]
fn record(addr: u64, at: walk::Here, size: u64, kind_align: u32, addr2: u64) {
    let pass = PASS.with(Cell::get);
    if at.ip == 0 || FAST.load(Ordering::Relaxed) != pass.stack_word {
        return record_full(addr, at, size, kind_align, addr2);
    }
    // SAFETY: with the thread's pass valid, no capture is under way on it: the pass is revoked
    // while one runs.
    let stack = unsafe { walk::last(at, pass.depth) };
    if stack == 0 {
        return record_recent(addr, at, size, kind_align, addr2);
    }
    if !push_stack(&pass, stack, addr, size, kind_align, addr2) {
        record_full(addr, at, size, kind_align, addr2)
    }
}

/// [`record`] without its fast path.
#[cold]
#[inline(never)]
fn record_full(addr: u64, at: walk::Here, size: u64, kind_align: u32, addr2: u64) {
    record_checked::<true>(kind_align, addr, addr2, size, at)
}

/// [`record`] of a free: its own entry, with one argument and no stack to consider.
#[cold]
#[inline(never)]
fn record_free(addr: u64) {
    record_checked::<false>(KindTag::Free as u32, addr, 0, 0, walk::Here::NONE)
}

/// The recording call's fast path: with a valid [`FastPass`] (the session word in force is the
/// pass's `word` of it) and room in the ring before its next check, has `fill` write the next
/// slot (given the pass, for the epoch's [`Raw::meta`] bits) and, if `fill` returns true,
/// publishes it and returns true; else returns false, the slot unpublished, and the caller
/// takes the full call ([`record_checked`]).
#[inline(always)]
fn fast_push(
    word: impl FnOnce(&FastPass) -> u64,
    fill: impl FnOnce(*mut Raw, &FastPass) -> bool,
) -> bool {
    let pass = PASS.with(Cell::get);
    if FAST.load(Ordering::Relaxed) != word(&pass) {
        return false;
    }
    push_passed(&pass, fill)
}

/// [`fast_push`] once the thread's `pass` is found valid: the ring's room, `fill`, publishing.
#[inline(always)]
fn push_passed(pass: &FastPass, fill: impl FnOnce(*mut Raw, &FastPass) -> bool) -> bool {
    // SAFETY: a pass's ring is this thread's, alive while the pass is (revoked before the
    // ring's handle drops).
    let ring = unsafe { &*pass.ring };
    let head = ring.head.0.load(Ordering::Relaxed);
    // At a check the full call waits for room or wakes the collector, which may allocate.
    if head >= ring.next_check.0.load(Ordering::Relaxed) {
        return false;
    }
    if !fill(ring.slots[head % RING].get(), pass) {
        return false;
    }
    ring.head.0.store(head + 1, Ordering::Release);
    true
}

/// `ALLOCATION`: the call is an allocation's, which learns [`INSTALLED`] (a free does not
/// check, so that its recording call is not longer for it).
#[inline(always)]
fn record_checked<const ALLOCATION: bool>(
    kind_align: u32,
    addr: u64,
    addr2: u64,
    size: u64,
    at: walk::Here,
) {
    let kind = kind_align as u8;
    let sw = SWITCH.load(Ordering::Relaxed);
    if ALLOCATION && sw & LEARN != 0 {
        learn_installed();
    }
    let inside = INSIDE.with(|i| i.replace(true));
    if inside {
        return;
    }
    // No fast path while inside: what this call allocates or frees is memtrack's own.
    revoke_pass();
    let session = SESSION.load(Ordering::Relaxed);
    let scope = session as u32;
    if scope != 0 && sw & STREAM != 0 && THREAD_SCOPE.with(|t| t.get()) != scope {
        OUT_OF_SCOPE.fetch_add(1, Ordering::Relaxed);
        INSIDE.with(|i| i.set(false));
        return;
    }
    if sw & COUNT != 0 {
        match kind {
            k if k == KindTag::Free as u8 => {
                COUNT_FREES.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                COUNT_ALLOCS.fetch_add(1, Ordering::Relaxed);
                COUNT_BYTES.fetch_add(size, Ordering::Relaxed);
            }
        }
    }
    if sw & STREAM != 0 {
        let depth = walk::STACK_DEPTH.load(Ordering::Relaxed);
        let epoch = (session >> 32) as u8;
        if depth != 0 && at.ip != 0 {
            push_with_stack(kind_align, addr, addr2, size, at, depth, epoch);
        } else {
            // Stamped once the slot is known to have room (still after the inner allocator
            // returned a block, and before a block is freed: see the module docs on order).
            push(|| Raw {
                tsc: tsc(),
                addr,
                addr2,
                size,
                stack: 0,
                align_log: (kind_align >> 8) as u8,
                kind,
                epoch,
            });
        }
    }
    grant_pass(sw, session);
    INSIDE.with(|i| i.set(false));
}

/// After a full recording call that found the thread in the scope of the recording with
/// session word `session` and switch `sw`: the thread's next calls may take the fast path
/// while both stay (only a pure [`STREAM`] switch has one: counting and learning need the
/// full call).
fn grant_pass(sw: u32, session: u64) {
    let ring = RING_PTR.with(|p| p.get());
    if sw == STREAM && !ring.is_null() && FAST.load(Ordering::SeqCst) == session {
        let depth = walk::STACK_DEPTH.load(Ordering::Relaxed);
        let stacks = depth != 0;
        let epoch = Raw::epoch_meta((session >> 32) as u8);
        PASS.with(|p| {
            p.set(FastPass {
                ring,
                word: session,
                alloc_word: if stacks { NEVER } else { session },
                // Once the thread has walked: its first `walk::recent` would set up what it
                // reads, and allocate.
                stack_word: if stacks && walk::ready() {
                    session
                } else {
                    NEVER
                },
                epoch,
                depth: walk::cap(depth),
                free_meta: Raw::meta(KindTag::Free, 0) | epoch,
                malloc_meta: Raw::meta(KindTag::Malloc, 0) | epoch,
            })
        });
    }
}

/// Events the recording has lost so far (none unless its collector failed).
pub(crate) fn lost_so_far() -> u64 {
    LOST.load(Ordering::Relaxed)
}

/// Writes an iteration mark (`IterationStart`, `IterationEnd`) into the calling thread's ring,
/// in the order of its other events. Called by the session while its recording runs.
pub(crate) fn mark(kind: KindTag) {
    if INSIDE.with(|i| i.replace(true)) {
        return;
    }
    let pass = PASS.with(|p| p.replace(FastPass::NONE));
    let epoch = (SESSION.load(Ordering::Relaxed) >> 32) as u8;
    push(|| Raw {
        tsc: tsc(),
        addr: 0,
        addr2: 0,
        size: 0,
        stack: 0,
        align_log: 0,
        kind: kind as u8,
        epoch,
    });
    PASS.with(|p| p.set(pass));
    INSIDE.with(|i| i.set(false));
}

/// The first allocation through [`Allocator`] (or one that raced with a transition: see
/// `HotPath::publish`).
#[cold]
#[inline(never)]
fn learn_installed() {
    INSTALLED.store(true, Ordering::SeqCst);
    SWITCH.fetch_and(!LEARN, Ordering::SeqCst);
}

/// [`record`]'s push of an allocation with its call stack. Kept out of `record`: a call to
/// the walk there makes `record` keep its arguments across it (spilled to the stack), which
/// the recording call without stacks would pay too.
#[inline(never)]
fn push_with_stack(
    kind_align: u32,
    addr: u64,
    addr2: u64,
    size: u64,
    at: walk::Here,
    depth: u32,
    epoch: u8,
) {
    let stack = walk::capture(at, depth);
    push(|| Raw {
        tsc: tsc(),
        addr,
        addr2,
        size,
        stack,
        align_log: (kind_align >> 8) as u8,
        kind: kind_align as u8,
        epoch,
    });
}

#[inline(always)]
fn push(make: impl FnOnce() -> Raw) {
    let ring = RING_PTR.with(|p| p.get());
    if ring.is_null() {
        push_slow(make());
    } else {
        // SAFETY: a non-null RING_PTR points into the Arc that this thread's RING_HANDLE holds
        // (set with it, cleared before it drops), so the ring is alive.
        unsafe { &*ring }.push(make);
    }
}

/// The thread's first event (creates its ring), or one after its ring was torn down.
#[cold]
#[inline(never)]
fn push_slow(raw: Raw) {
    let pushed = RING_HANDLE.try_with(|h| {
        // SAFETY: the handle is only touched by its own thread, and not re-entrantly
        // (`INSIDE` is set around every access).
        let h = unsafe { &mut *h.get() };
        let ring = h.0.get_or_insert_with(|| {
            let ring = Arc::new(Ring::new(tid()));
            REGISTRY
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::clone(&ring));
            ring
        });
        RING_PTR.with(|p| p.set(Arc::as_ptr(ring)));
        ring.push(|| raw);
    });
    if pushed.is_err() {
        // The ring handle is gone (thread-local teardown): the shared, locked path.
        OVERFLOW
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((tid(), raw));
    }
}

// SAFETY: every method forwards to `inner` with the caller's arguments unchanged and returns
// its result; recording only reads the arguments and the result.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Allocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        let p = unsafe { self.inner.alloc(layout) };
        if SWITCH.load(Ordering::Relaxed) != 0 && !p.is_null() {
            Self::note_alloc::<false>(p, walk::Here::now(), layout);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if SWITCH.load(Ordering::Relaxed) != 0 && !p.is_null() {
            Self::note_alloc::<true>(p, walk::Here::now(), layout);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if SWITCH.load(Ordering::Relaxed) != 0 {
            Self::note_free(ptr as u64);
        }
        // SAFETY: forwarded as is.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if SWITCH.load(Ordering::Relaxed) != 0 && !p.is_null() {
            let (new, old, size) = (p as u64, ptr as u64, new_size as u64);
            Self::note_realloc(new, walk::Here::now(), size, old);
        }
        p
    }
}

/// Alignments up to this are what `malloc` gives anyway: recorded as `Malloc`/`Calloc`.
const MIN_ALIGN: usize = 16;

// The recording calls of the wrapper, made only while the switch is on. Cold and out of line,
// so that the forwarding path stays as short as it is. Generic (through `A`), so that they
// are compiled in the program's own crate: there the fast path reads its thread-local
// `FastPass` with one `fs`-relative load, where a library's code reaches a thread-local
// through what is, to the compiler, a call to `__tls_get_addr`, which made every recording
// call save and restore the registers holding its arguments. `at` is where the wrapper runs,
// the start of an allocation's call stack.
impl<A> Allocator<A> {
    /// `ZEROED`: `alloc_zeroed`'s (a `Calloc`, whatever its alignment), else `alloc`'s.
    #[cold]
    #[inline(never)]
    fn note_alloc<const ZEROED: bool>(p: *mut u8, at: walk::Here, layout: Layout) {
        if !ZEROED && layout.align() > MIN_ALIGN {
            return Self::note_aligned(p, at, layout);
        }
        let kind = if ZEROED {
            KindTag::Calloc
        } else {
            KindTag::Malloc
        };
        let (addr, size) = (p as u64, layout.size() as u64);
        let meta = |pass: &FastPass| {
            if ZEROED {
                Raw::meta(kind, 0) | pass.epoch
            } else {
                pass.malloc_meta
            }
        };
        if !fast_alloc::<false>(meta, addr, 0, size) {
            record(addr, at, size, kind as u32, 0);
        }
    }

    /// [`Self::note_alloc`] of a block aligned past what `malloc` gives: an `AlignedAlloc`.
    #[cold]
    #[inline(never)]
    fn note_aligned(p: *mut u8, at: walk::Here, layout: Layout) {
        let (kind, align_log) = (KindTag::AlignedAlloc, Raw::align_log(layout.align() as u64));
        let (addr, size) = (p as u64, layout.size() as u64);
        let meta = |pass: &FastPass| Raw::meta(kind, align_log) | pass.epoch;
        if !fast_alloc::<false>(meta, addr, 0, size) {
            record(addr, at, size, kind as u32 | u32::from(align_log) << 8, 0);
        }
    }

    #[cold]
    #[inline(never)]
    fn note_realloc(new: u64, at: walk::Here, size: u64, old: u64) {
        let meta = |pass: &FastPass| Raw::meta(KindTag::Realloc, 0) | pass.epoch;
        if !fast_alloc::<true>(meta, new, old, size) {
            record(new, at, size, KindTag::Realloc as u32, old);
        }
    }

    #[cold]
    #[inline(never)]
    fn note_free(addr: u64) {
        if !fast_free(addr) {
            record_free(addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The collector drains a ring in runs: every published slot once, in the order the thread
    /// wrote it, also when the slots wrap past the ring's end (two runs).
    #[test]
    fn a_drain_gives_every_slot_once_in_order_across_the_wrap() {
        let ring = Ring::new(7);
        let mut next = 0u64;
        let push = |n: usize, next: &mut u64| {
            for _ in 0..n {
                let tsc = *next;
                ring.push(|| Raw {
                    tsc,
                    ..Raw::default()
                });
                *next += 1;
            }
        };
        let drained = |ring: &Ring| {
            let mut runs: Vec<Vec<u64>> = Vec::new();
            ring.drain(|run| runs.push(run.iter().map(|r| r.tsc).collect()));
            runs
        };
        push(RING - 3, &mut next);
        let first = drained(&ring);
        assert_eq!(first.len(), 1);
        assert!(first[0].iter().copied().eq(0..RING as u64 - 3));
        // 3 slots to the end of the ring, then 7 from its start.
        push(10, &mut next);
        let second = drained(&ring);
        assert_eq!(second.iter().map(Vec::len).collect::<Vec<_>>(), [3, 7]);
        assert!(
            second
                .concat()
                .into_iter()
                .eq(RING as u64 - 3..RING as u64 + 7)
        );
        // Nothing twice.
        assert_eq!(drained(&ring), [Vec::<u64>::new()]);
    }
}
