//! The allocator recorder's call stacks: a bounded frame-pointer walk in the recording call,
//! deduplicated per thread, each distinct stack handed once to the collector.
//!
//! ```text
//! record(alloc, rip and rbp of the allocator's wrapper): rip is the first frame
//!   the thread's last walk, then one of its last 4, started at this rip and rbp, and every
//!   frame it read still holds what it read (independent loads)? → its id, no walk
//!   walk: [rbp+8] return address, [rbp] the caller's rbp, while rbp is in the thread's stack,
//!         16-byte aligned and strictly growing, at most STACK_DEPTH frames (kept as a trace)
//!   per-thread map: addresses → id  ── new: NEW_STACKS (id, addresses) ──▶ collector
//!   Raw.stack = id                                                   ModuleMap → Frames → intern
//! ```
//!
//! The walk reads only words inside the thread's own stack (its bounds taken once per thread),
//! so a broken chain (code built without frame pointers, which uses `rbp` as a plain register)
//! stops it: it never faults. Ids are unique in the process (one counter for every thread), so
//! the collector needs no thread to tell two threads' stacks apart.

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use rustc_hash::FxHashMap;

/// Frames walked per allocation (0: no stacks). Set by the session before recording starts.
pub(crate) static STACK_DEPTH: AtomicU32 = AtomicU32::new(DEFAULT_STACK_DEPTH);

/// The default depth: 64 frames, as the eBPF tracker's.
pub(crate) const DEFAULT_STACK_DEPTH: u32 = 64;

/// The deepest walk allowed: the eBPF tracker's cap (the kernel's `perf_event_max_stack`), so
/// that one setting means the same for both recorders.
pub(crate) const STACK_MAX: u32 = memtrack_bpf::STACK_MAX;

/// The next stack id (ids ≥ 1; 0 is "no stack").
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// A distinct stack a thread saw for the first time: its id and return addresses, innermost
/// first.
pub(crate) struct NewStack {
    pub id: u32,
    pub truncated: bool,
    pub addrs: Box<[u64]>,
}

/// Stacks not taken by the collector yet. Pushed before the event naming them is published in
/// its ring, so a collector that drained the event finds the stack here.
pub(crate) static NEW_STACKS: Mutex<Vec<NewStack>> = Mutex::new(Vec::new());

/// Takes the stacks sent since the last call.
pub(crate) fn take_new_stacks() -> Vec<NewStack> {
    std::mem::take(&mut *NEW_STACKS.lock().unwrap_or_else(|e| e.into_inner()))
}

thread_local! {
    /// The thread's stack, `[low, high)`; (0, 0) until first needed.
    static BOUNDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// The stacks this thread sent, and the last one it recorded.
    static SEEN: RefCell<Seen> = RefCell::new(Seen::default());
    /// `SEEN` is set up (see [`ready`]).
    static READY: Cell<bool> = const { Cell::new(false) };
    /// The walk of `SEEN` that answered the thread's last look (null before the first, and
    /// once `SEEN` is gone): [`last`] checks it without borrowing `SEEN` or searching it.
    static LAST: Cell<*const Walked> = const { Cell::new(std::ptr::null()) };
}

/// The cap of a walk for the setting `depth`: at least 1 frame, at most [`STACK_MAX`].
#[inline]
pub(crate) fn cap(depth: u32) -> usize {
    depth.clamp(1, STACK_MAX) as usize
}

/// The calling thread's stack range `[low, high)` (glibc's `pthread_getattr_np`, which also
/// knows the main thread's); (0, 0) if it cannot be had (no walk then).
fn thread_bounds() -> (u64, u64) {
    BOUNDS.with(|b| {
        let got = b.get();
        if got.1 != 0 {
            return got;
        }
        let mut attr = MaybeUninit::<libc::pthread_attr_t>::uninit();
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        // SAFETY: `attr` is initialised by pthread_getattr_np before it is read, and destroyed
        // once; `addr` and `size` are plain out-parameters.
        let ok = unsafe {
            if libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) != 0 {
                false
            } else {
                let r = libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size);
                libc::pthread_attr_destroy(attr.as_mut_ptr());
                r == 0
            }
        };
        let bounds = if ok {
            (addr as u64, addr as u64 + size as u64)
        } else {
            (0, 0)
        };
        b.set(bounds);
        bounds
    })
}

/// What a walk read: each frame it read, in order, at most [`STACK_MAX`] + 1 of them (the
/// frames of a full stack and the one whose return address 0 ended it).
pub(crate) struct Trace {
    len: usize,
    reads: [Read; TRACE_MAX],
}

/// A frame the walk read: the two words it found there (`[next fp, return address]`), 16-byte
/// aligned as the frame itself is (the walk reads only aligned frames), and its address. One
/// array of these, not two, so that [`Trace::still_holds`] steps one pointer over both, and
/// compares a frame's words in one aligned SSE2 operation.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Read {
    words: [u64; 2],
    at: u64,
}

const TRACE_MAX: usize = STACK_MAX as usize + 1;

impl Trace {
    fn new() -> Box<Trace> {
        Box::new(Trace {
            len: 0,
            reads: [Read {
                words: [0; 2],
                at: 0,
            }; TRACE_MAX],
        })
    }

    /// The frames read, innermost first.
    #[cfg(test)]
    fn frames(&self) -> impl Iterator<Item = u64> + '_ {
        self.reads[..self.len].iter().map(|r| r.at)
    }

    /// Whether every frame this trace read still holds the words it read there. If so, a walk
    /// from the same frame pointer with the same cap returns what it returned then: each of
    /// its decisions depends only on the frame pointer it is at, the two words it reads there,
    /// the count so far, the cap and the thread's stack bounds. The addresses are known
    /// beforehand, so the loads are independent of each other, where the walk's each wait on
    /// the one before.
    ///
    /// # Safety
    /// Every frame of the trace must be readable: true of a trace of the calling thread's own
    /// walk (the walk read them; a thread's stack stays mapped while it lives).
    #[inline(always)]
    unsafe fn still_holds(&self) -> bool {
        let Some((first, rest)) = self.reads[..self.len.min(TRACE_MAX)].split_first() else {
            return true;
        };
        // SAFETY: every frame of the trace, which `diff` and `four` read, was read by this
        // thread's walk: readable, by the contract, and 16-byte aligned.
        unsafe {
            // The innermost frame alone first: two stacks that start at one frame pointer
            // mostly differ there (another call site in the same function), and a thread that
            // allocates at several places in turn checks each of its recent walks.
            if !sse::zero(sse::diff(first)) {
                return false;
            }
            // The rest as one difference, four frames a step: per frame an address load, two
            // aligned loads (one folded into the xor), an xor and an or, and no branch.
            let mut acc = sse::none();
            let mut fours = rest.chunks_exact(4);
            for r in &mut fours {
                acc = sse::or(acc, sse::four(r));
            }
            if !fours.remainder().is_empty() {
                if let Some(last) = rest.last_chunk::<4>() {
                    // The last four again, overlapping frames already compared (an OR of
                    // differences does not mind): fewer instructions than a loop over the rest.
                    acc = sse::or(acc, sse::four(last));
                } else {
                    for r in fours.remainder() {
                        acc = sse::or(acc, sse::diff(r));
                    }
                }
            }
            sse::zero(acc)
        }
    }
}

/// [`Trace::still_holds`]'s steps, in SSE2 (part of x86-64: these intrinsics only lack its
/// `target_feature` attribute, so every one is safe to call here).
mod sse {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_load_si128, _mm_movemask_epi8, _mm_or_si128,
        _mm_setzero_si128, _mm_xor_si128,
    };

    use super::Read;

    /// No difference.
    #[inline(always)]
    pub(super) fn none() -> __m128i {
        // SAFETY: SSE2 (see the module docs).
        unsafe { _mm_setzero_si128() }
    }

    #[inline(always)]
    pub(super) fn or(a: __m128i, b: __m128i) -> __m128i {
        // SAFETY: SSE2 (see the module docs).
        unsafe { _mm_or_si128(a, b) }
    }

    /// Whether `d` is no difference.
    #[inline(always)]
    pub(super) fn zero(d: __m128i) -> bool {
        // SAFETY: SSE2 (see the module docs).
        unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) == 0xFFFF }
    }

    /// The frame's 16 bytes now xor what the walk read there: zero where it still holds.
    ///
    /// # Safety
    /// The frame at `r.at` is readable and 16-byte aligned (as the walk reads them).
    #[inline(always)]
    pub(super) unsafe fn diff(r: &Read) -> __m128i {
        // SAFETY: `r.at` by the contract; `r.words` is 16-byte aligned (`Read` is).
        unsafe {
            let got = _mm_load_si128(r.at as *const __m128i);
            _mm_xor_si128(got, _mm_load_si128(r.words.as_ptr().cast::<__m128i>()))
        }
    }

    /// [`diff`] of the four frames of `r` (four long) at once.
    ///
    /// # Safety
    /// As [`diff`]'s, for each of the four.
    #[inline(always)]
    pub(super) unsafe fn four(r: &[Read]) -> __m128i {
        // SAFETY: by the contract.
        unsafe { or(or(diff(&r[0]), diff(&r[1])), or(diff(&r[2]), diff(&r[3]))) }
    }
}

/// Walks the frame-pointer chain from `fp` into `out` (return addresses, innermost first);
/// returns how many it wrote (`out[..n]`, now initialised) and whether it stopped at
/// `out.len()` with the chain going on. Every frame it reads goes into `trace`, for
/// [`Trace::still_holds`].
/// Reads only the words `[fp, fp + 16)` of frames inside `[low, high)`, 16-byte aligned, each
/// above the last: any other frame pointer (a broken chain, the outermost frame's 0) ends it.
///
/// # Safety
/// `[low, high)` must be readable memory (the calling thread's stack).
pub(crate) unsafe fn walk(
    mut fp: u64,
    low: u64,
    high: u64,
    out: &mut [MaybeUninit<u64>],
    trace: &mut Trace,
) -> (usize, bool) {
    let valid =
        |fp: u64| fp >= low && fp.checked_add(16).is_some_and(|e| e <= high) && fp % 16 == 0;
    // `out` is at most STACK_MAX long: the reads (one more at most) fit in the trace.
    let cap = out.len().min(STACK_MAX as usize);
    let out = &mut out[..cap];
    let mut n = 0;
    trace.len = 0;
    while valid(fp) {
        if n == out.len() {
            return (n, true);
        }
        // SAFETY: `valid(fp)`: both words lie inside `[low, high)`, readable by the contract.
        let (next, ret) = unsafe { (*(fp as *const u64), *((fp + 8) as *const u64)) };
        trace.reads[n] = Read {
            words: [next, ret],
            at: fp,
        };
        trace.len = n + 1;
        if ret == 0 {
            break;
        }
        out[n].write(ret);
        n += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    (n, false)
}

/// The id of the calling thread's stack at `at` (the allocator wrapper's), at most `depth`
/// frames (≥ 1): `at.ip`, then the return addresses walked from `at.fp`; a stack new to this
/// thread is sent to the collector first. 0 (no stack) during the thread's teardown (its map is
/// gone).
///
/// An allocation in a loop has the stack of an allocation a few before it: if it starts where
/// one of the thread's last [`RECENT`] walks started (instruction and frame pointer, same cap)
/// and every frame that walk read still holds what it held ([`Trace::still_holds`]), it is
/// that walk's stack, found without walking or hashing it.
#[inline(never)]
pub(crate) fn capture(at: Here, depth: u32) -> u32 {
    let depth = cap(depth);
    SEEN.try_with(|seen| {
        let mut seen = seen.borrow_mut();
        let seen = &mut *seen;
        let id = seen.recent_id(at, depth);
        if id != 0 {
            return id;
        }
        let (low, high) = thread_bounds();
        // Not zeroed: 1 KiB of stores on every allocation (the walk writes what is read).
        let mut buf = [MaybeUninit::<u64>::uninit(); STACK_MAX as usize + 1];
        buf[0].write(at.ip);
        // The oldest walk's place.
        let i = seen.replace;
        seen.replace = (i + 1) % RECENT;
        let w = &mut seen.recent[i];
        // Its trace is about to be another walk's: no id until it has this one's (a panic in
        // between must not leave the new trace answering with the old id).
        w.id = 0;
        // SAFETY: `[low, high)` is this thread's own stack (or empty).
        let (n, truncated) = unsafe { walk(at.fp, low, high, &mut buf[1..depth], &mut w.trace) };
        let n = n + 1;
        buf[n].write(truncated as u64);
        // SAFETY: `buf[0]`, the `n - 1` words the walk wrote after it and `buf[n]` are written.
        let key: &[u64] = unsafe { &*(&buf[..=n] as *const [MaybeUninit<u64>] as *const [u64]) };
        let id = intern(&mut seen.ids, key);
        let w = &mut seen.recent[i];
        (w.ip, w.fp, w.depth, w.id) = (at.ip, at.fp, depth, id);
        seen.answer(i);
        READY.with(|r| r.set(true));
        id
    })
    .unwrap_or(0)
}

/// [`capture`]'s answer without a walk: the id of the stack at `at` if one of the thread's
/// recent walks still holds, else 0 (also during the thread's teardown, and before its first
/// [`capture`]). Never walks, never allocates: the recording call's fast path calls it.
#[inline(always)]
pub(crate) fn recent(at: Here, depth: u32) -> u32 {
    let depth = cap(depth);
    SEEN.try_with(|seen| {
        seen.try_borrow_mut()
            .map_or(0, |mut s| s.recent_id(at, depth))
    })
    .unwrap_or(0)
}

/// [`recent`]'s first look, without borrowing the thread's walks: the id of the stack at `at`
/// (cap `depth`, as [`cap`] gives it) if the walk that answered the thread's last look started
/// there and still holds, else 0 (then [`recent`] looks at the others).
///
/// # Safety
/// No [`capture`] or [`recent`] of the calling thread is under way (the recording call's fast
/// path: the thread's pass is revoked while they run, and they run to the end).
#[inline(always)]
pub(crate) unsafe fn last(at: Here, depth: usize) -> u32 {
    let w = LAST.with(Cell::get);
    if w.is_null() {
        return 0;
    }
    // SAFETY: a non-null LAST points at a walk in this thread's SEEN, alive until SEEN drops
    // (which clears LAST first) and, by the contract, not borrowed for a change now.
    unsafe { &*w }.id_at(at, depth)
}

/// Whether the calling thread has made a [`capture`] (its [`recent`] then needs no set-up,
/// which would allocate).
#[inline]
pub(crate) fn ready() -> bool {
    READY.with(Cell::get)
}

/// The walks a thread keeps to find a stack again without walking it (see [`capture`]): a loop
/// that allocates at up to this many places in turn walks each once.
const RECENT: usize = 4;

/// A thread's stacks: return addresses, then 1 if the walk was cut at the depth cap, else 0
/// (never a return address) → id; and its last walks.
struct Seen {
    ids: FxHashMap<Box<[u64]>, u32>,
    recent: [Walked; RECENT],
    /// The walk that answered the last capture (checked first).
    answered: usize,
    /// The walk the next one replaces (the oldest).
    replace: usize,
}

/// A walk: where it started, with which cap, what it read, the id of its stack (0: none).
struct Walked {
    ip: u64,
    fp: u64,
    depth: usize,
    id: u32,
    trace: Box<Trace>,
}

impl Seen {
    /// The id of the recent walk that starts at `at` with cap `depth` and still holds; 0 if none.
    #[inline(always)]
    fn recent_id(&mut self, at: Here, depth: usize) -> u32 {
        // The walk that answered last first: a loop with one stack checks one.
        for k in 0..RECENT {
            let i = (self.answered + k) % RECENT;
            let id = self.recent[i].id_at(at, depth);
            if id != 0 {
                self.answer(i);
                return id;
            }
        }
        0
    }

    /// Walk `i` answered the last look: checked first by the next ([`last`]).
    #[inline(always)]
    fn answer(&mut self, i: usize) {
        self.answered = i;
        LAST.with(|l| l.set(&self.recent[i]));
    }
}

impl Walked {
    /// This walk's stack id if it started at `at` with cap `depth` and every frame it read
    /// still holds (its stack is then the one at `at`); else 0.
    #[inline(always)]
    fn id_at(&self, at: Here, depth: usize) -> u32 {
        let starts_here = self.id != 0 && (self.ip, self.fp, self.depth) == (at.ip, at.fp, depth);
        // SAFETY: the trace is of this thread's own walk (a thread's walks are its own).
        if starts_here && unsafe { self.trace.still_holds() } {
            self.id
        } else {
            0
        }
    }
}

impl Drop for Seen {
    fn drop(&mut self) {
        LAST.with(|l| l.set(std::ptr::null()));
    }
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            ids: FxHashMap::default(),
            recent: std::array::from_fn(|_| Walked {
                ip: 0,
                fp: 0,
                depth: 0,
                id: 0,
                trace: Trace::new(),
            }),
            answered: 0,
            replace: 0,
        }
    }
}

/// The id of `key` (addresses, then the truncation flag) in `ids`, sending it if new.
fn intern(ids: &mut FxHashMap<Box<[u64]>, u32>, key: &[u64]) -> u32 {
    if let Some(&id) = ids.get(key) {
        return id;
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let (addrs, flag) = key.split_at(key.len() - 1);
    NEW_STACKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(NewStack {
            id,
            truncated: flag[0] != 0,
            addrs: addrs.into(),
        });
    ids.insert(key.into(), id);
    id
}

/// Where the allocator wrapper runs: its instruction pointer and frame pointer (`rbp`). Taken
/// in the wrapper, which is compiled into the program's own code (with the program's
/// frame-pointer setting), often inlined into the allocating function: the instruction pointer
/// is the allocation's call site (as the eBPF tracker's first frame, the return address into
/// the code that called `malloc`), and the walk from `rbp` gives its callers.
#[derive(Clone, Copy)]
pub(crate) struct Here {
    pub ip: u64,
    pub fp: u64,
}

impl Here {
    /// None: a free, which has no stack.
    pub(crate) const NONE: Here = Here { ip: 0, fp: 0 };

    /// Here, in the calling code (always inlined).
    #[inline(always)]
    pub(crate) fn now() -> Here {
        let (ip, fp): (u64, u64);
        // SAFETY: reads the instruction pointer and a register; touches no memory.
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {fp}, rbp",
                ip = out(reg) ip,
                fp = out(reg) fp,
                options(nomem, nostack, preserves_flags)
            )
        };
        Here { ip, fp }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crafted stack: frames at word indexes, each `[next fp, return address]`.
    #[repr(align(16))]
    struct Buf([u64; 64]);

    fn addr(b: &Buf, i: usize) -> u64 {
        &b.0[i] as *const u64 as u64
    }

    /// [`walk`] over bounds that lie inside a test's own buffer or this thread's stack.
    fn walk_in(fp: u64, low: u64, high: u64, out: &mut [u64]) -> (usize, bool) {
        // SAFETY: a `u64` slice seen as `MaybeUninit<u64>`s, into which `walk` writes only
        // initialised values; every caller's `[low, high)` is inside its live `Buf` or its
        // thread's stack.
        unsafe {
            let out = &mut *(out as *mut [u64] as *mut [MaybeUninit<u64>]);
            walk(fp, low, high, out, &mut Trace::new())
        }
    }

    fn bounds(b: &Buf) -> (u64, u64) {
        (addr(b, 0), addr(b, 0) + 64 * 8)
    }

    fn chain(b: &mut Buf, at: &[usize]) {
        for (k, &i) in at.iter().enumerate() {
            let next = at.get(k + 1).map_or(0, |&j| addr(b, j));
            b.0[i] = next;
            b.0[i + 1] = 0x1000 + k as u64;
        }
    }

    #[test]
    fn a_whole_chain_is_walked_to_its_end_or_the_cap() {
        let mut b = Buf([0; 64]);
        chain(&mut b, &[2, 8, 20, 40]);
        let (lo, hi) = bounds(&b);
        let mut out = [0u64; 8];
        let got = walk_in(addr(&b, 2), lo, hi, &mut out);
        assert_eq!(got, (4, false));
        assert_eq!(out[..4], [0x1000, 0x1001, 0x1002, 0x1003]);
        let got = walk_in(addr(&b, 2), lo, hi, &mut out[..2]);
        assert_eq!(got, (2, true), "cut at the cap, the chain going on");
        let got = walk_in(addr(&b, 2), lo, hi, &mut out[..4]);
        assert_eq!(got, (4, false), "the 4th frame ends the chain: not cut");
    }

    /// A walk's trace holds while every word it read is unchanged: a changed return address,
    /// frame pointer, or the word that ended the chain each make it fail.
    #[test]
    fn a_trace_holds_until_a_word_it_read_changes() {
        let mut b = Buf([0; 64]);
        chain(&mut b, &[2, 8, 20, 40]);
        let (lo, hi) = bounds(&b);
        let mut out = [MaybeUninit::<u64>::uninit(); 8];
        let mut trace = Trace::new();
        // Takes `b` to borrow it: the trace reads it through addresses, which the compiler
        // does not see (it would call the writes to `b` below dead).
        let holds = |_: &Buf, t: &Trace| {
            // SAFETY: the trace's frames are in `b`, alive throughout.
            unsafe { t.still_holds() }
        };
        assert_eq!(
            // SAFETY: the bounds are `b`'s own.
            unsafe { walk(addr(&b, 2), lo, hi, &mut out, &mut trace) },
            (4, false)
        );
        assert_eq!(trace.len, 4);
        assert!(trace.frames().eq([2, 8, 20, 40].map(|i| addr(&b, i))));
        assert!(holds(&b, &trace));
        for (word, what) in [
            (21, "a return address"),
            (8, "a frame pointer"),
            (40, "the 0 that ended the chain"),
        ] {
            let was = b.0[word];
            b.0[word] = addr(&b, 50);
            assert!(!holds(&b, &trace), "{what} changed");
            b.0[word] = was;
            assert!(holds(&b, &trace), "{what} restored");
        }
        // A word outside the frames read (past the end of the chain) does not matter.
        b.0[50] = 7;
        assert!(holds(&b, &trace));
        // The frame whose return address 0 ended the walk was read: it is in the trace.
        b.0[41] = 0;
        assert_eq!(
            // SAFETY: the bounds are `b`'s own.
            unsafe { walk(addr(&b, 2), lo, hi, &mut out, &mut trace) },
            (3, false)
        );
        assert_eq!(trace.len, 4, "frame 40 read, return address 0: not a frame");
        b.0[41] = 0x1003;
        assert!(
            !holds(&b, &trace),
            "the return address that ended the walk changed"
        );
        b.0[41] = 0;
        // Cut at the cap: the frames past it were not read.
        assert_eq!(
            // SAFETY: the bounds are `b`'s own.
            unsafe { walk(addr(&b, 2), lo, hi, &mut out[..2], &mut trace) },
            (2, true)
        );
        assert_eq!(trace.len, 2);
        b.0[21] = 0x5000;
        assert!(holds(&b, &trace));
    }

    /// Every word of every frame is compared, whatever the trace's length: the first frame on
    /// its own, the rest four at a time, and the last one to three again in an overlapping
    /// four or, in a trace of fewer than five, one by one.
    #[test]
    fn every_word_of_every_frame_is_compared_at_every_length() {
        let holds = |_: &Buf, t: &Trace| {
            // SAFETY: the trace's frames are in the buffer, alive throughout.
            unsafe { t.still_holds() }
        };
        for frames in 1..=13usize {
            let mut b = Buf([0; 64]);
            let at: Vec<usize> = (0..frames).map(|k| 2 + 4 * k).collect();
            chain(&mut b, &at);
            let (lo, hi) = bounds(&b);
            let mut out = [MaybeUninit::<u64>::uninit(); 16];
            let mut trace = Trace::new();
            assert_eq!(
                // SAFETY: the bounds are `b`'s own.
                unsafe { walk(addr(&b, at[0]), lo, hi, &mut out, &mut trace) },
                (frames, false)
            );
            assert_eq!(trace.len, frames);
            assert!(holds(&b, &trace), "{frames} frames, unchanged");
            for word in at.iter().flat_map(|&i| [i, i + 1]) {
                let was = b.0[word];
                b.0[word] = was ^ 0x40;
                assert!(!holds(&b, &trace), "{frames} frames: word {word} changed");
                b.0[word] = was;
                assert!(holds(&b, &trace), "{frames} frames: word {word} restored");
            }
        }
    }

    /// Two allocation sites in one function (the allocator's wrapper inlined into it, as
    /// with LTO) share its frame pointer and every frame above it: only the instruction
    /// pointer tells them apart, in the last walk's check as in the search of the others; a
    /// walk of another cap is another stack too.
    #[test]
    fn sites_that_share_a_frame_are_told_apart() {
        let here = Here::now();
        let other = Here {
            ip: here.ip + 1,
            ..here
        };
        let last = |at: Here, depth: u32| {
            // SAFETY: no capture or search is under way on this thread (the test makes them
            // in turn).
            unsafe { last(at, cap(depth)) }
        };
        let a = capture(here, 6);
        assert_ne!(a, 0);
        assert_eq!(last(here, 6), a);
        assert_eq!(last(other, 6), 0, "another instruction");
        assert_eq!(last(here, 5), 0, "another cap");
        assert_eq!(recent(other, 6), 0);
        let b = capture(other, 6);
        assert!(b != 0 && b != a);
        assert_eq!(last(other, 6), b);
        assert_eq!(last(here, 6), 0, "the last walk is `other`'s");
        // The search finds `here`'s walk among the recent ones, and makes it the last.
        assert_eq!(recent(here, 6), a);
        assert_eq!(last(here, 6), a);
    }

    /// An allocation site reached by two callers: the same first frame, the same depth.
    #[inline(never)]
    fn site() -> u32 {
        capture(Here::now(), 6)
    }

    #[inline(never)]
    fn via_a() -> u32 {
        std::hint::black_box(site()) + std::hint::black_box(0)
    }

    #[inline(never)]
    fn via_b() -> u32 {
        std::hint::black_box(site()) * std::hint::black_box(1)
    }

    /// `site` through `via_a` or `via_b`, from one call site (so that only those frames
    /// differ).
    #[inline(never)]
    fn through(a: bool) -> u32 {
        if std::hint::black_box(a) {
            via_a()
        } else {
            via_b()
        }
    }

    /// Two stacks of one length and one first frame that differ in a caller get two ids; the
    /// same stack again gets its id back, whether or not it was the last one recorded.
    #[test]
    fn stacks_that_differ_in_one_caller_are_two_stacks() {
        let ids: Vec<u32> = [true, true, false, true]
            .into_iter()
            .map(|a| std::hint::black_box(through(a)))
            .collect();
        assert_ne!(ids[0], 0, "no stack taken (frame pointers?)");
        assert_eq!(ids[0], ids[1], "the same stack twice");
        assert_ne!(ids[0], ids[2], "via_a and via_b have one stack id");
        assert_eq!(ids[0], ids[3], "the first stack again after another");
    }

    #[test]
    fn a_corrupted_chain_stops_the_walk_without_faulting() {
        let mut out = [0u64; 16];
        // Out of bounds: a wild pointer (unmapped, would fault if read), below and above.
        for wild in [0x10u64, 0xdead_0000_0000, u64::MAX - 15] {
            let mut b = Buf([0; 64]);
            chain(&mut b, &[2, 8]);
            b.0[8] = wild;
            let (lo, hi) = bounds(&b);
            assert_eq!(
                walk_in(addr(&b, 2), lo, hi, &mut out),
                (2, false),
                "{wild:#x}"
            );
        }
        // Misaligned: the next frame pointer is 8 bytes off.
        let mut b = Buf([0; 64]);
        chain(&mut b, &[2, 8]);
        b.0[8] = addr(&b, 13);
        let (lo, hi) = bounds(&b);
        assert_eq!(walk_in(addr(&b, 2), lo, hi, &mut out), (2, false));
        // Not growing: a loop back to an earlier frame, and to itself.
        let mut b = Buf([0; 64]);
        chain(&mut b, &[2, 8, 20]);
        b.0[20] = addr(&b, 8);
        let (lo, hi) = bounds(&b);
        assert_eq!(walk_in(addr(&b, 2), lo, hi, &mut out), (3, false));
        b.0[20] = addr(&b, 20);
        assert_eq!(walk_in(addr(&b, 2), lo, hi, &mut out), (3, false));
        // The last frame's two words must fit in the bounds.
        let mut b = Buf([0; 64]);
        chain(&mut b, &[2, 62]);
        let (lo, _) = bounds(&b);
        let hi = addr(&b, 63);
        assert_eq!(walk_in(addr(&b, 2), lo, hi, &mut out), (1, false));
        // A start outside the stack walks nothing.
        assert_eq!(walk_in(0, lo, hi, &mut out), (0, false));
    }

    /// 1 M allocations from 3 sites in turn: 3 stack records, each sent once; then one site
    /// repeated keeps its id.
    #[test]
    fn each_distinct_stack_is_sent_once() {
        let mut seen = Seen::default();
        let sites: [&[u64]; 3] = [
            &[0x401000, 0x402000, 0],
            &[0x401100, 0x402000, 0],
            &[0x401000, 0x402000, 1],
        ];
        let before = NEXT_ID.load(Ordering::Relaxed);
        let mut ids = [0u32; 3];
        for i in 0..1_000_000 {
            let id = intern(&mut seen.ids, sites[i % 3]);
            if i < 3 {
                ids[i] = id;
            } else {
                assert_eq!(id, ids[i % 3]);
            }
        }
        assert_eq!(seen.ids.len(), 3);
        for _ in 0..3 {
            assert_eq!(intern(&mut seen.ids, sites[1]), ids[1]);
        }
        assert_eq!(seen.ids.len(), 3);
        let sent: Vec<_> = take_new_stacks()
            .into_iter()
            .filter(|s| ids.contains(&s.id))
            .map(|s| (s.addrs.to_vec(), s.truncated))
            .collect();
        assert_eq!(
            sent,
            [
                (vec![0x401000, 0x402000], false),
                (vec![0x401100, 0x402000], false),
                (vec![0x401000, 0x402000], true)
            ]
        );
        assert!(ids.iter().all(|&id| id >= before));
    }

    /// The calling thread's own chain, walked from here: bounded by its stack, and (with frame
    /// pointers or not) never faulting.
    #[test]
    fn the_threads_own_stack_is_walked_within_its_bounds() {
        let (lo, hi) = thread_bounds();
        let here = &lo as *const u64 as u64;
        assert!(lo < here && here < hi, "{lo:#x} {here:#x} {hi:#x}");
        let mut out = [0u64; 64];
        let _ = walk_in(Here::now().fp, lo, hi, &mut out);
    }
}
