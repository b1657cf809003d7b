//! The column encoding inside a frame (FORMAT.md, "Frame payload").
//!
//! Events are split into columns, each delta/zigzag/prefix-varint-encoded so that the common
//! case (a timestamp a few hundred ns after the previous one, an address near the previous one,
//! a small size) takes one or two bytes; a free of a block allocated shortly before names that
//! allocation by distance (its ref) instead. The columns are concatenated and compressed with
//! zstd, but for the ts and addr columns, stored as they are after the zstd frame (addr since
//! 1.9, ts since 1.10). Column order and encodings are part of the format: change them only
//! with a version bump.

use crate::event::{Event, EventKind, KindTag};
use crate::stack::{Frame, Module, ModuleId, Stack, StackId};

/// Number of length-prefixed columns after the kind column.
const VAR_COLUMNS: usize = 7;

/// Bytes of the prefix varint of a value below 2^56 with `lz` leading zero bits:
/// ⌈(64 − lz) / 7⌉.
const VARINT_LEN: [u8; 65] = {
    let mut t = [0u8; 65];
    let mut lz = 0;
    while lz <= 64 {
        t[lz] = (64 - lz).div_ceil(7) as u8;
        lz += 1;
    }
    t
};

/// Encodes `v` as a prefix varint (FORMAT.md): below 2^56, `n` = 1..=8 bytes holding
/// `(v << n) | 1 << (n - 1)` little-endian, so the first byte's lowest set bit gives the length;
/// otherwise a zero byte and 8 bytes of `v`. Returns the bytes (9, of which the first `n` count).
#[inline(always)]
fn prefix_varint(v: u64) -> ([u8; 9], usize) {
    let mut b = [0u8; 9];
    if v < 1 << 56 {
        // A table, not `div_ceil(7)`: a division per value is the encoder's largest cost.
        let n = VARINT_LEN[(v | 1).leading_zeros() as usize] as usize;
        let w = (v << n) | (1 << (n - 1));
        b[..8].copy_from_slice(&w.to_le_bytes());
        (b, n)
    } else {
        b[1..].copy_from_slice(&v.to_le_bytes());
        (b, 9)
    }
}

/// A column being written: a buffer that only grows (so it is zeroed once, not per frame)
/// and the length written so far. Every store writes 8 or 9 bytes and advances by the varint's
/// length.
#[derive(Default)]
struct OutCol {
    buf: Vec<u8>,
    len: usize,
}

impl OutCol {
    /// Makes room for `values` more varints.
    fn reserve(&mut self, values: usize) {
        let need = self.len + values * 9 + 9;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
    }

    /// One prefix varint (see [`prefix_varint`]) at the end of the column.
    /// The caller must have reserved room for this value ([`OutCol::reserve`]): a value more
    /// than reserved panics.
    #[cfg(test)]
    fn put(&mut self, v: u64) {
        let mut c = Cursor::new(self);
        c.put(v);
        self.len = c.len(self);
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// `n − 1` for the prefix varint of a value below 2^56 whose highest set bit is bit `b`
/// (`(v | 1).ilog2()`): ⌈(b + 1) / 7⌉ − 1 (8 above: those take [`Cursor::put_wide`]).
const VARINT_SHIFT: [u8; 64] = {
    let mut t = [8u8; 64];
    let mut b = 0;
    while b < 56 {
        t[b] = ((b + 1).div_ceil(7) - 1) as u8;
        b += 1;
    }
    t
};

/// Where the column loop writes into an [`OutCol`]'s buffer: a pointer that stays in a
/// register (a length stored back per value cost a load and a store per value), with the last
/// position an 8-byte store fits at. Made from a reserved column by [`Cursor::new`]; the loop
/// must not touch the column otherwise until [`Cursor::len`] hands the length back.
#[derive(Clone, Copy)]
struct Cursor {
    at: *mut u8,
    last: *mut u8,
}

impl Cursor {
    /// A cursor at the end of `col`, whose buffer is at least 9 bytes long ([`OutCol::reserve`]).
    fn new(col: &mut OutCol) -> Cursor {
        assert!(col.buf.len() >= col.len + 9, "a column is reserved first");
        let base = col.buf.as_mut_ptr();
        // SAFETY: `len + 9 <= buf.len()` (asserted), so both are inside the buffer.
        unsafe {
            Cursor {
                at: base.add(col.len),
                last: base.add(col.buf.len() - 8),
            }
        }
    }

    /// The length of `col` once this cursor (made from it) has written.
    fn len(self, col: &OutCol) -> usize {
        self.at as usize - col.buf.as_ptr() as usize
    }

    /// One prefix varint (see [`prefix_varint`]): below 2^56 one 8-byte store of
    /// `(2v + 1) << (n − 1)`, the value's `n` bytes and garbage the next value overwrites.
    #[inline(always)]
    fn put(&mut self, v: u64) {
        if self.at <= self.last {
            // SAFETY: `at <= last`: the 8 bytes at `at` are inside the buffer, and `at + n`
            // (n ≤ 8) is at most its end; a 9-byte value takes `put_wide`, which checks.
            unsafe { self.put_unchecked(v) }
        } else {
            *self = self.put_wide(v);
        }
    }

    /// [`Cursor::put`] without the room check, for the column loop's per-event columns.
    ///
    /// # Safety
    /// The buffer has room for 9 bytes past the cursor (an 8-byte store, or a 9-byte value).
    #[inline(always)]
    unsafe fn put_unchecked(&mut self, v: u64) {
        if v < 1 << 56 {
            // A table, not `div_ceil(7)`: a division per value is the encoder's largest cost.
            let shift = VARINT_SHIFT[(v | 1).ilog2() as usize] as u32;
            let w = (2 * v + 1) << shift;
            // SAFETY: the caller's room.
            unsafe {
                self.at.cast::<[u8; 8]>().write_unaligned(w.to_le_bytes());
                self.at = self.at.add(shift as usize + 1);
            }
        } else {
            *self = self.put_wide(v);
        }
    }

    /// [`Cursor::put_unchecked`] of 0: its one byte.
    ///
    /// # Safety
    /// As [`Cursor::put_unchecked`]'s.
    #[inline(always)]
    unsafe fn put_zero(&mut self) {
        // SAFETY: the caller's room.
        unsafe {
            self.at.write(1);
            self.at = self.at.add(1);
        }
    }

    /// A value of 2^56 or more (9 bytes), or a store past the reserved room (which panics).
    #[cold]
    #[inline(never)]
    fn put_wide(self, v: u64) -> Cursor {
        let (b, n) = prefix_varint(v);
        assert!(
            self.at < self.last,
            "a column got more values than were reserved"
        );
        // SAFETY: `at < last = end − 8`, so the 9 bytes at `at` are inside the buffer.
        unsafe {
            self.at.copy_from_nonoverlapping(b.as_ptr(), 9);
            Cursor {
                at: self.at.add(n),
                last: self.last,
            }
        }
    }
}

/// Run-length state of a column that changes rarely (tid, pid): stored as (zigzag delta, run)
/// pairs. Threads run in bursts, so a run covers many events and the column costs a small
/// fraction of a byte per event before compression.
struct Runs {
    /// The open run's value: the base of the next run's delta (0 before the first run).
    value: u32,
    /// The open run's value widened, or `u64::MAX` while no run is open (no `u32` equals it):
    /// continuing a run is one compare, with no `run > 0` test per column and event.
    open: u64,
    run: u64,
}

impl Default for Runs {
    fn default() -> Self {
        Runs {
            value: 0,
            open: u64::MAX,
            run: 0,
        }
    }
}

impl Runs {
    /// `n` events of value `v` (what `n` pushes of one event each give).
    #[inline(always)]
    fn push(&mut self, v: u32, n: u64, out: &mut Cursor) {
        if v as u64 == self.open {
            self.run += n;
        } else {
            self.flush(out);
            out.put(zigzag(v.wrapping_sub(self.value) as i32 as i64));
            self.value = v;
            self.open = v as u64;
            self.run = n;
        }
    }

    #[inline(always)]
    fn flush(&mut self, out: &mut Cursor) {
        if self.run > 0 {
            out.put(self.run);
        }
    }
}

/// Reusable column buffers for [`encode_events`]; keep one per encoding thread.
#[derive(Default)]
pub(crate) struct Columns {
    kinds: Vec<u8>,
    cols: [OutCol; VAR_COLUMNS],
    /// The stack-id column of a frame whose events carry stacks (FORMAT.md, since 1.5).
    stack: OutCol,
    /// The ref column: one value per free (FORMAT.md, since 1.9).
    refs: OutCol,
    /// The frame's recent allocations, for the ref column.
    recent: Recent,
}

/// Slots of [`Recent`]: 2^12 (64 KiB), a power of two.
const RECENT_BITS: u32 = 12;

/// The frame's recent allocations by address, direct-mapped (the address's Fibonacci hash picks
/// the slot; a later allocation takes the slot over): where a free finds the event that
/// allocated its block, to name it by distance instead of by address. Only a hint for the
/// encoder: a free it does not find is written with its address, as before 1.9. A slot is
/// valid in the frame whose number its stamp holds, so nothing is cleared between frames.
struct Recent {
    slots: Box<[RecentSlot]>,
    /// The number of the frame being encoded (slots of other frames are stale); starts at 1.
    frame: u32,
}

#[derive(Clone, Copy, Default)]
struct RecentSlot {
    addr: u64,
    /// The allocation's frame number (high 32 bits) and index in its frame (low 32 bits).
    stamp: u64,
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            slots: vec![RecentSlot::default(); 1 << RECENT_BITS].into_boxed_slice(),
            frame: 0,
        }
    }
}

impl Recent {
    #[inline(always)]
    fn slot(addr: u64) -> usize {
        (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT_BITS)) as usize
    }
}

#[inline(always)]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline(always)]
fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, v: u64) {
    let (b, n) = prefix_varint(v);
    out.extend_from_slice(&b[..n]);
}

/// The columns of one payload being written, one method per column in the format's order
/// (FORMAT.md, "Frame payload"); [`ColumnReader`] mirrors it method for method. All its state
/// is plain values (cursors, runs, the previous values), so that the column loop keeps it in
/// registers. `STACKS`: the frame has a stack-id column (a separate instantiation, so that a
/// frame without stacks is encoded by the same loop as before format 1.5).
struct ColumnWriter<const STACKS: bool> {
    tid: Cursor,
    pid: Cursor,
    ts: Cursor,
    addr: Cursor,
    addr2: Cursor,
    size: Cursor,
    align: Cursor,
    stack: Cursor,
    refs: Cursor,
    /// [`Columns::recent`]'s slots.
    recent: *mut RecentSlot,
    /// The next event's stamp: the frame's number (high 32 bits), its index (low 32 bits).
    stamp: u64,
    /// The OR of the stack ids of events whose kind carries none (must stay 0).
    stray_stacks: u32,
    tid_runs: Runs,
    pid_runs: Runs,
    prev_ts: u64,
    prev_addr: u64,
}

/// Why a column loop stopped before the frame's end.
#[derive(Debug, PartialEq)]
enum Stop {
    /// An event has a stack (the loop without a stack column stops: the frame needs one).
    Stack,
    /// An event whose kind carries no stack has one.
    Stray,
}

impl<const STACKS: bool> ColumnWriter<STACKS> {
    /// Empties `cols` and `stack` and makes room for `events` events; the writer's cursors
    /// point into them until [`ColumnWriter::finish`] (which the caller must call with them,
    /// untouched in between).
    fn new(
        cols: &mut [OutCol; VAR_COLUMNS],
        stack: &mut OutCol,
        refs: &mut OutCol,
        recent: &mut Recent,
        events: usize,
    ) -> Self {
        for c in cols.iter_mut() {
            c.len = 0;
            c.reserve(events);
        }
        // A tid or pid run of `n` events fits the 9 n bytes reserved for them: its two values
        // take at most 5 bytes (a u32's zigzag delta) and 1 + log2(n) / 7 (its length).
        stack.len = 0;
        stack.reserve(if STACKS { events } else { 0 });
        refs.len = 0;
        refs.reserve(events);
        // A new frame number makes every slot stale; after 2^32 frames the numbers start
        // again from cleared slots.
        recent.frame = recent.frame.wrapping_add(1);
        if recent.frame == 0 {
            recent.slots.fill(RecentSlot::default());
            recent.frame = 1;
        }
        let [tid, pid, ts, addr, addr2, size, align] = cols.each_mut().map(Cursor::new);
        ColumnWriter {
            tid,
            pid,
            ts,
            addr,
            addr2,
            size,
            align,
            stack: Cursor::new(stack),
            refs: Cursor::new(refs),
            recent: recent.slots.as_mut_ptr(),
            stamp: u64::from(recent.frame) << 32,
            stray_stacks: 0,
            tid_runs: Runs::default(),
            pid_runs: Runs::default(),
            prev_ts: 0,
            prev_addr: 0,
        }
    }

    /// A run of events of one thread at the start of `events` (up to an event with a stack,
    /// without `STACKS`), with their kind bytes in `kinds`: the tid and pid columns get the
    /// run's length at once, the other columns each event's values. Returns the run's length
    /// (0: the first event has a stack and the frame needs a stack column).
    ///
    /// # Safety
    /// Every column but the tid's and pid's has room for 9 bytes per event of `events` and 9
    /// more past its cursor (each event writes at most one value, of at most 9 bytes, to each).
    #[inline(always)]
    unsafe fn run(&mut self, events: &[Event], kinds: &mut [u8]) -> usize {
        let Some(first) = events.first() else {
            return 0;
        };
        let (tid, pid) = (first.tid, first.pid);
        // Thread and process in one compare (one load: the fields are adjacent).
        let who = |ev: &Event| u64::from(ev.tid) << 32 | u64::from(ev.pid);
        let first_who = who(first);
        let mut n = 0;
        for (ev, kind) in events.iter().zip(kinds) {
            if who(ev) != first_who || (!STACKS && !ev.stack.is_none()) {
                break;
            }
            *kind = ev.kind.tag() as u8;
            // SAFETY: the caller's room, for this event's values.
            unsafe { self.event(ev) };
            n += 1;
        }
        if n > 0 {
            self.tid_runs.push(tid, n as u64, &mut self.tid);
            self.pid_runs.push(pid, n as u64, &mut self.pid);
        }
        n
    }

    /// One event but its kind, tid and pid: the ts and addr columns always, the others as its
    /// kind has them.
    ///
    /// # Safety
    /// As [`ColumnWriter::run`]'s, for one event: every `put_unchecked` below, and in the
    /// helpers it calls, has the caller's room (one value per column).
    #[inline(always)]
    unsafe fn event(&mut self, ev: &Event) {
        // SAFETY: the caller's room, as above.
        unsafe {
            self.ts
                .put_unchecked(zigzag(ev.ts.wrapping_sub(self.prev_ts) as i64));
            self.prev_ts = ev.ts;
            match ev.kind {
                EventKind::Malloc { addr, size } | EventKind::Calloc { addr, size } => {
                    self.put_addr(addr);
                    self.size.put_unchecked(size);
                    self.allocated(addr);
                }
                EventKind::Mmap { addr, size } | EventKind::Munmap { addr, size } => {
                    self.put_addr(addr);
                    self.size.put_unchecked(size);
                }
                EventKind::Realloc {
                    old_addr,
                    new_addr,
                    size,
                } => {
                    self.put_moved(old_addr, new_addr, size);
                    self.allocated(new_addr);
                }
                EventKind::Mremap {
                    old_addr,
                    new_addr,
                    size,
                } => self.put_moved(old_addr, new_addr, size),
                EventKind::AlignedAlloc { addr, size, align } => {
                    self.put_addr(addr);
                    self.size.put_unchecked(size);
                    self.align.put_unchecked(align);
                    self.allocated(addr);
                }
                EventKind::Free { addr } => self.free(addr),
                EventKind::Brk { addr } => self.put_addr(addr),
                // A scheduling event (lock waits): a switch-out's `preempted` in `size`.
                EventKind::SwitchOut { preempted } => {
                    self.put_addr(0);
                    self.size.put_unchecked(preempted as u64);
                }
                EventKind::Exec
                | EventKind::SwitchIn
                | EventKind::ThreadStart
                | EventKind::ThreadExit
                | EventKind::IterationStart
                | EventKind::IterationEnd => self.put_addr(0),
            }
            self.stamp += 1;
            // The stack id of an event whose kind carries one ([`KindTag::carries_stack`]);
            // any other kind's must be [`StackId::NONE`] (checked by `finish`).
            if STACKS {
                if ev.kind.tag().carries_stack() {
                    self.stack.put_unchecked(ev.stack.0 as u64);
                } else {
                    self.stray_stacks |= ev.stack.0;
                }
            }
        }
    }

    /// The addr column's value for `a` (0 for the kinds without an address): the zigzag delta
    /// from the previous event's address.
    ///
    /// # Safety
    /// Room for one addr value.
    #[inline(always)]
    unsafe fn put_addr(&mut self, a: u64) {
        // SAFETY: the caller's room.
        unsafe {
            self.addr
                .put_unchecked(zigzag(a.wrapping_sub(self.prev_addr) as i64))
        };
        self.prev_addr = a;
    }

    /// A realloc's or mremap's values: its old address in addr, its new one as the zigzag
    /// delta from the old in addr2, its size.
    ///
    /// # Safety
    /// Room for one addr, addr2 and size value.
    #[inline(always)]
    unsafe fn put_moved(&mut self, old_addr: u64, new_addr: u64, size: u64) {
        // SAFETY: the caller's room.
        unsafe {
            self.put_addr(old_addr);
            let moved = new_addr.wrapping_sub(old_addr) as i64;
            self.addr2.put_unchecked(zigzag(moved));
            self.size.put_unchecked(size);
        }
    }

    /// An allocation of the block at `addr` takes its address's slot of the recent
    /// allocations, stamped with this event.
    ///
    /// # Safety
    /// `self.recent` points at [`Columns::recent`]'s slots (as [`ColumnWriter::new`] made it).
    #[inline(always)]
    unsafe fn allocated(&mut self, addr: u64) {
        let stamp = self.stamp;
        // SAFETY: `Recent::slot` is below the slots' count, 2^RECENT_BITS.
        unsafe { *self.recent.add(Recent::slot(addr)) = RecentSlot { addr, stamp } };
    }

    /// A free of a block allocated earlier in the frame names the allocation by its distance
    /// in events, in the ref column, and has no address value (its address is the base of the
    /// next delta all the same); any other has ref 0 and its address.
    ///
    /// # Safety
    /// As [`ColumnWriter::allocated`]'s, and room for one ref and addr value.
    #[inline(always)]
    unsafe fn free(&mut self, addr: u64) {
        let stamp = self.stamp;
        // SAFETY: as in `allocated`; the caller's room.
        unsafe {
            let slot = *self.recent.add(Recent::slot(addr));
            // A slot of this frame is at most this event's index back (an empty or older
            // frame's is further: its stamp is below the frame's first).
            let back = stamp.wrapping_sub(slot.stamp);
            if slot.addr == addr && back <= stamp & u64::from(u32::MAX) {
                self.refs.put_unchecked(back);
                self.prev_addr = addr;
            } else {
                self.refs.put_zero();
                self.put_addr(addr);
            }
        }
    }

    /// Ends the open tid and pid runs and hands the lengths back to the columns the writer
    /// was made of; [`Stop::Stray`] if an event whose kind carries no stack had one.
    fn finish(
        mut self,
        cols: &mut [OutCol; VAR_COLUMNS],
        stack: &mut OutCol,
        refs: &mut OutCol,
    ) -> Result<(), Stop> {
        self.tid_runs.flush(&mut self.tid);
        self.pid_runs.flush(&mut self.pid);
        let cursors = [
            self.tid, self.pid, self.ts, self.addr, self.addr2, self.size, self.align,
        ];
        for (c, cur) in cols.iter_mut().zip(cursors) {
            c.len = cur.len(c);
        }
        stack.len = self.stack.len(stack);
        refs.len = self.refs.len(refs);
        if self.stray_stacks == 0 {
            Ok(())
        } else {
            Err(Stop::Stray)
        }
    }
}

/// An event the format cannot store: a stack on an event whose kind carries none.
pub(crate) type EncodeProblem = String;

/// Serialises `events` into `raw` (cleared first): the part of the frame payload that is
/// compressed; [`Columns::append_plain`] gives the rest. Returns its frame flags:
/// [`FLAGS_WRITTEN`] always, and [`FLAG_STACKS`] when it has a stack-id column (some event
/// carries a stack).
pub(crate) fn encode_events(
    events: &[Event],
    cols: &mut Columns,
    raw: &mut Vec<u8>,
) -> Result<u32, EncodeProblem> {
    // Without a stack column until an event has a stack (none has, without stack recording):
    // then again from the start with one.
    let mut result = encode_columns::<false>(events, cols);
    let stacks = result == Err(Stop::Stack);
    if stacks {
        result = encode_columns::<true>(events, cols);
    }
    if result.is_err() {
        let ev = events
            .iter()
            .find(|e| !e.stack.is_none() && !e.kind.tag().carries_stack())
            .expect("a stray stack was seen");
        return Err(format!(
            "a {} event carries stack {}: only allocations and mappings carry a call stack \
             (a free is attributed to the stack that allocated its block)",
            ev.kind.name(),
            ev.stack.0
        ));
    }
    raw.clear();
    put_varint(raw, events.len() as u64);
    for c in &cols.cols {
        put_varint(raw, c.len as u64);
    }
    if stacks {
        put_varint(raw, cols.stack.len as u64);
    }
    put_varint(raw, cols.refs.len as u64);
    raw.extend_from_slice(&cols.kinds);
    for (i, c) in cols.cols.iter().enumerate() {
        // The ts and addr columns are stored after the compressed part, as they are.
        if i != TS && i != ADDR {
            raw.extend_from_slice(c.bytes());
        }
    }
    if stacks {
        raw.extend_from_slice(cols.stack.bytes());
    }
    raw.extend_from_slice(cols.refs.bytes());
    Ok(FLAGS_WRITTEN | if stacks { FLAG_STACKS } else { 0 })
}

/// The flags of every frame [`encode_events`] writes (and [`FLAG_STACKS`] where it has stacks).
const FLAGS_WRITTEN: u32 = FLAG_REFS | FLAG_PLAIN_TS | FLAG_PLAIN_ADDR;

/// The indices of the ts and addr columns among the length-prefixed columns.
const TS: usize = 2;
const ADDR: usize = 3;

impl Columns {
    /// The plain columns of the frame [`encode_events`] last encoded, ts's then addr's
    /// ([`FLAG_PLAIN_TS`], [`FLAG_PLAIN_ADDR`]): stored after the payload's zstd frame, in
    /// this order, uncompressed.
    pub(crate) fn plain(&self) -> [&[u8]; 2] {
        [self.cols[TS].bytes(), self.cols[ADDR].bytes()]
    }

    /// Appends [`Columns::plain`] to `out`, after the payload's zstd frame: the end of the
    /// frame payload.
    pub(crate) fn append_plain(&self, out: &mut Vec<u8>) {
        for col in self.plain() {
            out.extend_from_slice(col);
        }
    }
}

/// The column loop: the events run by run of one thread (the tid and pid columns get a run
/// at once), the kind bytes straight into their column, the other columns through a
/// [`ColumnWriter`]. Without `STACKS`, stops at the first event that has a stack.
fn encode_columns<const STACKS: bool>(events: &[Event], cols: &mut Columns) -> Result<(), Stop> {
    let Columns {
        kinds,
        cols,
        stack,
        refs,
        recent,
    } = cols;
    kinds.clear();
    kinds.resize(events.len(), 0);
    let mut w = ColumnWriter::<STACKS>::new(cols, stack, refs, recent, events.len());
    let mut done = 0;
    let mut stopped = Ok(());
    while done < events.len() {
        // SAFETY: `new` reserved 9 bytes per event of `events` and 9 more in each column, and
        // the runs take each event once.
        let n = unsafe { w.run(&events[done..], &mut kinds[done..]) };
        if n == 0 {
            stopped = Err(Stop::Stack);
            break;
        }
        done += n;
    }
    let finished = w.finish(cols, stack, refs);
    stopped.and(finished)
}

/// Frame flag (FORMAT.md, since 1.5): the payload's column table has an eighth length, and a
/// stack-id column follows the `align` column.
pub(crate) const FLAG_STACKS: u32 = 1;
/// Frame flag (FORMAT.md, since 1.5): the payload starts with a definitions block (modules and
/// stacks defined in this frame) before the columns' zstd frame.
pub(crate) const FLAG_DEFINITIONS: u32 = 2;
/// Frame flag (FORMAT.md, since 1.9): the payload's column table ends with one more length,
/// of the ref column, which follows the others; a free's address may be a ref.
pub(crate) const FLAG_REFS: u32 = 4;
/// Frame flag (FORMAT.md, since 1.9): the addr column is not in the compressed payload but
/// follows its zstd frame, uncompressed (its bytes are nearly random: entropy coding them cost
/// more than it saved).
pub(crate) const FLAG_PLAIN_ADDR: u32 = 8;
/// Frame flag (FORMAT.md, since 1.10): the ts column is not in the compressed payload but
/// follows its zstd frame, uncompressed, before the addr column if that is plain too (its time
/// deltas made zstd cost more instructions per byte than any other column did; FORMAT.md).
pub(crate) const FLAG_PLAIN_TS: u32 = 16;
/// Every frame flag this build reads.
pub(crate) const KNOWN_FLAGS: u32 =
    FLAG_STACKS | FLAG_DEFINITIONS | FLAG_REFS | FLAG_PLAIN_ADDR | FLAG_PLAIN_TS;

/// What is wrong with a frame payload; the reader adds the frame index and offset.
pub(crate) type DecodeError = String;

/// Zero bytes the decoder needs after the payload, so that every varint load can read 9 bytes.
pub(crate) const PAD: usize = 16;

/// A cursor over one column: `data` is the whole padded payload, the column is `pos..end`.
struct Col<'a> {
    data: &'a [u8],
    pos: usize,
    end: usize,
    name: &'static str,
}

impl Col<'_> {
    /// Reads one prefix varint: one load, one `tzcnt`, a mask and a shift. Reading up to 8
    /// bytes past the column is safe (the payload is padded) and caught by the end check.
    #[inline(always)]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let Some(w) = self.data.get(self.pos..self.pos + 9) else {
            return Err(overrun(self.name));
        };
        let b0 = w[0];
        let (v, n) = if b0 != 0 {
            let n = b0.trailing_zeros() as usize + 1;
            let x = u64::from_le_bytes(w[..8].try_into().expect("8 bytes"));
            ((x & (u64::MAX >> (64 - 8 * n))) >> n, n)
        } else {
            (u64::from_le_bytes(w[1..9].try_into().expect("8 bytes")), 9)
        };
        self.pos += n;
        if self.pos > self.end {
            return Err(overrun(self.name));
        }
        Ok(v)
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.end {
            Ok(())
        } else {
            Err(format!(
                "{} column has {} bytes left over after the last event",
                self.name,
                self.end - self.pos
            ))
        }
    }
}

const NAMES: [&str; VAR_COLUMNS] = ["tid", "pid", "ts", "addr", "addr2", "size", "align"];

/// The columns of one payload being read, one method per column in the format's order: the
/// mirror of [`ColumnWriter`]. `STACKS`: the payload has a stack-id column.
struct ColumnReader<'a, const STACKS: bool> {
    kinds: &'a [u8],
    tid: Col<'a>,
    pid: Col<'a>,
    ts: Col<'a>,
    addr: Col<'a>,
    addr2: Col<'a>,
    size: Col<'a>,
    align: Col<'a>,
    stack: Col<'a>,
    refs: Col<'a>,
    /// The frame has a ref column ([`FLAG_REFS`]): each free reads a ref first.
    with_refs: bool,
    tid_run: Run,
    pid_run: Run,
    prev_ts: u64,
    prev_addr: u64,
}

/// A payload's column table, read: its event count, where the columns start, the payload's
/// length without its padding, and each column's length (tid … align, stack, ref).
struct Table {
    events: u64,
    pos: usize,
    raw_len: usize,
    lens: [usize; VAR_COLUMNS + 2],
}

/// The run being read in a run-length column (tid, pid): its value and how many more events
/// it covers.
#[derive(Default)]
struct Run {
    value: u32,
    left: u64,
}

impl Run {
    /// The next value, reading a (zigzag delta, length) pair from `col` when the run has ended.
    #[inline(always)]
    fn next(&mut self, col: &mut Col<'_>) -> Result<u32, DecodeError> {
        if self.left == 0 {
            self.value = self.value.wrapping_add(unzigzag(col.varint()?) as u32);
            self.left = col.varint()?;
            if self.left == 0 {
                return Err(empty_run(col.name));
            }
        }
        self.left -= 1;
        Ok(self.value)
    }
}

impl<'a, const STACKS: bool> ColumnReader<'a, STACKS> {
    /// Reads the column table ([`ColumnReader::table`]) and splits the payload into its
    /// columns. `expected` is the event count the frame header announces. Inlined: it saves
    /// an instruction per event in the decode loop.
    #[inline(always)]
    fn new(
        padded: &'a [u8],
        expected: u32,
        with_refs: bool,
        plain: [bool; 2],
    ) -> Result<Self, DecodeError> {
        let Table {
            events: n,
            mut pos,
            mut raw_len,
            lens,
        } = Self::table(padded, expected, with_refs)?;
        let [ts_plain, addr_plain] = Self::plain_tail(padded, &mut raw_len, &lens, plain)?;
        let [tid, pid, ts, addr, addr2, size, align] = NAMES;
        let mut take = |len: usize, name: &'static str| -> Result<Col<'a>, DecodeError> {
            let end = pos
                .checked_add(len)
                .filter(|&e| e <= raw_len)
                .ok_or_else(|| format!("{name} column runs past the end of the payload"))?;
            let col = Col {
                data: padded,
                pos,
                end,
                name,
            };
            pos = end;
            Ok(col)
        };
        let kinds = take(n as usize, "kind")?;
        let (tid, pid) = (take(lens[0], tid)?, take(lens[1], pid)?);
        let ts = match ts_plain {
            Some(col) => col,
            None => take(lens[TS], ts)?,
        };
        let addr = match addr_plain {
            Some(col) => col,
            None => take(lens[ADDR], addr)?,
        };
        let reader = ColumnReader {
            kinds: &padded[kinds.pos..kinds.end],
            tid,
            pid,
            ts,
            addr,
            addr2: take(lens[4], addr2)?,
            size: take(lens[5], size)?,
            align: take(lens[6], align)?,
            stack: take(lens[7], "stack")?,
            refs: take(lens[8], "ref")?,
            with_refs,
            tid_run: Run::default(),
            pid_run: Run::default(),
            prev_ts: 0,
            prev_addr: 0,
        };
        if pos != raw_len {
            return Err(format!("{} bytes follow the last column", raw_len - pos));
        }
        Ok(reader)
    }

    /// The plain columns ([`FLAG_PLAIN_TS`], [`FLAG_PLAIN_ADDR`] as `plain` says), ts's and
    /// addr's: the payload's last bytes, after the others, in this order. Takes them off
    /// `raw_len`, which then ends the decompressed columns.
    #[inline(always)]
    fn plain_tail(
        padded: &'a [u8],
        raw_len: &mut usize,
        lens: &[usize; VAR_COLUMNS + 2],
        plain: [bool; 2],
    ) -> Result<[Option<Col<'a>>; 2], DecodeError> {
        let mut cols = [None, None];
        // addr's first from the end, then ts's before it.
        for (slot, column) in [(1, ADDR), (0, TS)] {
            if plain[slot] {
                let (len, name) = (lens[column], NAMES[column]);
                *raw_len = raw_len.checked_sub(len).ok_or_else(|| {
                    format!("{name} column of {len} bytes is longer than the payload")
                })?;
                cols[slot] = Some(Col {
                    data: padded,
                    pos: *raw_len,
                    end: *raw_len + len,
                    name,
                });
            }
        }
        Ok(cols)
    }

    /// The column table at the payload's start: the event count (which must be `expected`),
    /// then each column's length: tid … align, then the stack column's and the ref column's if
    /// the frame has them.
    #[inline(always)]
    fn table(padded: &[u8], expected: u32, with_refs: bool) -> Result<Table, DecodeError> {
        let raw_len = padded
            .len()
            .checked_sub(PAD)
            .ok_or("payload buffer is not padded")?;
        let mut head = Col {
            data: padded,
            pos: 0,
            end: raw_len,
            name: "column table",
        };
        let n = head.varint()?;
        if n != expected as u64 {
            return Err(format!(
                "payload holds {n} events but the frame header says {expected}"
            ));
        }
        let mut lens = [0usize; VAR_COLUMNS + 2];
        let mut length =
            || usize::try_from(head.varint()?).map_err(|_| "column length overflows".to_string());
        for l in &mut lens[..VAR_COLUMNS] {
            *l = length()?;
        }
        if STACKS {
            lens[VAR_COLUMNS] = length()?;
        }
        if with_refs {
            lens[VAR_COLUMNS + 1] = length()?;
        }
        Ok(Table {
            events: n,
            pos: head.pos,
            raw_len,
            lens,
        })
    }

    /// The event of kind byte `k`, reading each column the writer wrote for it; `done` holds
    /// the frame's events before it (a free's ref names one of them).
    #[inline(always)]
    fn event(&mut self, k: u8, done: &[Event]) -> Result<Event, DecodeError> {
        let tid = self.tid()?;
        let pid = self.pid()?;
        let ts = self.ts()?;
        let tag = Self::kind(k)?;
        let addr = if tag == KindTag::Free && self.with_refs {
            self.free_addr(done)?
        } else {
            self.addr()?
        };
        let kind = match tag {
            KindTag::Malloc => EventKind::Malloc {
                addr,
                size: self.size()?,
            },
            KindTag::Calloc => EventKind::Calloc {
                addr,
                size: self.size()?,
            },
            KindTag::Mmap => EventKind::Mmap {
                addr,
                size: self.size()?,
            },
            KindTag::Munmap => EventKind::Munmap {
                addr,
                size: self.size()?,
            },
            KindTag::Realloc => EventKind::Realloc {
                old_addr: addr,
                new_addr: self.addr2(addr)?,
                size: self.size()?,
            },
            KindTag::Mremap => EventKind::Mremap {
                old_addr: addr,
                new_addr: self.addr2(addr)?,
                size: self.size()?,
            },
            KindTag::AlignedAlloc => EventKind::AlignedAlloc {
                addr,
                size: self.size()?,
                align: self.align()?,
            },
            KindTag::Free => EventKind::Free { addr },
            KindTag::Brk => EventKind::Brk { addr },
            KindTag::Exec => EventKind::Exec,
            KindTag::SwitchIn => EventKind::SwitchIn,
            KindTag::ThreadStart => EventKind::ThreadStart,
            KindTag::ThreadExit => EventKind::ThreadExit,
            KindTag::IterationStart => EventKind::IterationStart,
            KindTag::IterationEnd => EventKind::IterationEnd,
            KindTag::SwitchOut => EventKind::SwitchOut {
                preempted: match self.size()? {
                    0 => false,
                    1 => true,
                    v => return Err(format!("a switch_out's preempted flag is {v}, not 0 or 1")),
                },
            },
        };
        let ev = Event::new(ts, pid, tid, kind);
        if STACKS && kind.tag().carries_stack() {
            return Ok(ev.with_stack(self.stack()?));
        }
        Ok(ev)
    }

    /// A stack id: an index into the recording's stack table, 0 for none.
    #[inline(always)]
    fn stack(&mut self) -> Result<StackId, DecodeError> {
        let id = self.stack.varint()?;
        u32::try_from(id)
            .map(StackId)
            .map_err(|_| format!("stack column holds id {id}, above 2^32 - 1"))
    }

    #[inline(always)]
    fn kind(k: u8) -> Result<KindTag, DecodeError> {
        KindTag::from_u8(k).ok_or_else(|| {
            format!(
                "unknown event kind {k} (written by a newer memtrack? this one knows kinds 1-{})",
                KindTag::ALL.len()
            )
        })
    }

    /// Runs of (zigzag delta, length).
    #[inline(always)]
    fn tid(&mut self) -> Result<u32, DecodeError> {
        self.tid_run.next(&mut self.tid)
    }

    /// Runs of (zigzag delta, length).
    #[inline(always)]
    fn pid(&mut self) -> Result<u32, DecodeError> {
        self.pid_run.next(&mut self.pid)
    }

    /// Zigzag delta from the previous event's.
    #[inline(always)]
    fn ts(&mut self) -> Result<u64, DecodeError> {
        self.prev_ts = self
            .prev_ts
            .wrapping_add(unzigzag(self.ts.varint()?) as u64);
        Ok(self.prev_ts)
    }

    /// Zigzag delta from the previous event's (0 for an exec).
    #[inline(always)]
    fn addr(&mut self) -> Result<u64, DecodeError> {
        self.prev_addr = self
            .prev_addr
            .wrapping_add(unzigzag(self.addr.varint()?) as u64);
        Ok(self.prev_addr)
    }

    /// A free's address: its ref's (the block allocated by the event that many before it in
    /// the frame), or for ref 0 the address column's.
    #[inline(always)]
    fn free_addr(&mut self, done: &[Event]) -> Result<u64, DecodeError> {
        let distance = self.refs.varint()?;
        if distance == 0 {
            return self.addr();
        }
        let Some(at) = usize::try_from(distance)
            .ok()
            .and_then(|d| done.len().checked_sub(d))
        else {
            return Err(ref_before_frame(distance, done.len()));
        };
        let addr = match done[at].kind {
            EventKind::Malloc { addr, .. }
            | EventKind::Calloc { addr, .. }
            | EventKind::AlignedAlloc { addr, .. } => addr,
            EventKind::Realloc { new_addr, .. } => new_addr,
            other => return Err(ref_not_allocation(at, other)),
        };
        self.prev_addr = addr;
        Ok(addr)
    }

    /// A realloc's or mremap's new address: zigzag delta from its old one.
    #[inline(always)]
    fn addr2(&mut self, old_addr: u64) -> Result<u64, DecodeError> {
        Ok(old_addr.wrapping_add(unzigzag(self.addr2.varint()?) as u64))
    }

    #[inline(always)]
    fn size(&mut self) -> Result<u64, DecodeError> {
        self.size.varint()
    }

    #[inline(always)]
    fn align(&mut self) -> Result<u64, DecodeError> {
        self.align.varint()
    }

    /// Checks that every run ended with the last event and every column was read to its end.
    fn finish(&self) -> Result<(), DecodeError> {
        if self.tid_run.left != 0 || self.pid_run.left != 0 {
            return Err("a tid or pid run extends past the last event".into());
        }
        for c in [
            &self.tid,
            &self.pid,
            &self.ts,
            &self.addr,
            &self.addr2,
            &self.size,
            &self.align,
            &self.stack,
            &self.refs,
        ] {
            c.finish()?;
        }
        Ok(())
    }
}

/// Takes the column's name, not the column: passing `&self` to this outlined function keeps
/// the column in memory across the decode loop.
#[cold]
fn overrun(column: &str) -> DecodeError {
    format!("{column} column ends inside a value")
}

#[cold]
fn ref_before_frame(distance: u64, index: usize) -> DecodeError {
    format!(
        "the free at event {index} of its frame names the event {distance} before it, \
         before the frame's first"
    )
}

#[cold]
fn ref_not_allocation(at: usize, kind: EventKind) -> DecodeError {
    format!(
        "a free names event {at} of its frame, a {}, as its allocation",
        kind.name()
    )
}

#[cold]
fn empty_run(column: &str) -> DecodeError {
    format!("{column} column holds a run of length 0")
}

/// Decodes a payload written by [`encode_events`], appending to `out`. `expected` is the event
/// count the frame header announces; any disagreement, left-over byte or unknown kind is an error.
/// `padded` is the payload followed by at least [`PAD`] bytes (of any value).
/// `flags`: the frame header's ([`FLAG_STACKS`]: a stack-id column; [`FLAG_REFS`]: a ref column;
/// [`FLAG_PLAIN_TS`], [`FLAG_PLAIN_ADDR`]: those columns at the end of `padded`, as the reader
/// appends them after the decompressed part).
///
/// Never inlined: called once per frame, so inlining gains nothing, and left to LLVM, whether
/// it is inlined (and its loop compiled worse) depends on how unrelated code falls into codegen
/// units; the ir-gate's `decode` holds it.
#[inline(never)]
pub(crate) fn decode_events(
    padded: &[u8],
    expected: u32,
    flags: u32,
    out: &mut Vec<Event>,
) -> Result<(), DecodeError> {
    let refs = flags & FLAG_REFS != 0;
    let plain = [flags & FLAG_PLAIN_TS != 0, flags & FLAG_PLAIN_ADDR != 0];
    if flags & FLAG_STACKS != 0 {
        decode_columns::<true>(padded, expected, (refs, plain), out)
    } else {
        decode_columns::<false>(padded, expected, (refs, plain), out)
    }
}

fn decode_columns<const STACKS: bool>(
    padded: &[u8],
    expected: u32,
    (refs, plain): (bool, [bool; 2]),
    out: &mut Vec<Event>,
) -> Result<(), DecodeError> {
    let mut r = ColumnReader::<STACKS>::new(padded, expected, refs, plain)?;
    // `kinds` holds `expected` bytes of this payload: a count bounded by real input, not a claim.
    out.reserve(r.kinds.len());
    let start = out.len();
    for &k in r.kinds {
        let ev = r.event(k, &out[start..])?;
        out.push(ev);
    }
    r.finish()
}

/// The modules and stacks one frame defines (FORMAT.md, "Definitions", since 1.5): what the
/// encoder was given by `define_module` and `define_stack` while the frame's events were pushed,
/// in the order given ([`Reader::frame_definitions`](super::Reader::frame_definitions)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Definitions {
    /// Modules, by id.
    pub modules: Vec<(ModuleId, Module)>,
    /// Stacks, by id.
    pub stacks: Vec<(StackId, Stack)>,
}

impl Definitions {
    /// Whether it defines nothing.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty() && self.stacks.is_empty()
    }
}

/// Serialises `defs` into `raw` (cleared first): the uncompressed definitions block. Frames are
/// stored as absolute (module, offset) varints, not deltas, so that the frames stacks share
/// (their outer part: `main`, the thread's loop) are repeated byte strings zstd finds.
pub(crate) fn encode_definitions(defs: &Definitions, raw: &mut Vec<u8>) {
    raw.clear();
    put_varint(raw, defs.modules.len() as u64);
    for (id, m) in &defs.modules {
        put_varint(raw, id.0 as u64);
        put_varint(raw, m.path.len() as u64);
        raw.extend_from_slice(m.path.as_bytes());
        match &m.build_id {
            None => put_varint(raw, 0),
            Some(b) => {
                put_varint(raw, b.len() as u64 + 1);
                raw.extend_from_slice(b);
            }
        }
    }
    put_varint(raw, defs.stacks.len() as u64);
    for (id, st) in &defs.stacks {
        put_varint(raw, id.0 as u64);
        put_varint(raw, (st.frames.len() as u64) << 1 | st.truncated as u64);
        for f in &st.frames {
            put_varint(raw, f.module.0 as u64);
            put_varint(raw, f.offset);
        }
    }
}

/// Decodes a definitions block written by [`encode_definitions`]: `padded` is the block followed
/// by at least [`PAD`] bytes. Counts and lengths are checked against the bytes left before
/// anything is allocated for them; ids must be ≥ 1 and fit in 32 bits.
pub(crate) fn decode_definitions(padded: &[u8]) -> Result<Definitions, DecodeError> {
    let len = padded
        .len()
        .checked_sub(PAD)
        .ok_or("definitions buffer is not padded")?;
    let mut r = DefinitionReader(Col {
        data: padded,
        pos: 0,
        end: len,
        name: "definitions",
    });
    let mut defs = Definitions::default();
    let n = r.0.varint()?;
    let n = r.count(n, 3, "modules")?;
    defs.modules.reserve(n);
    for _ in 0..n {
        defs.modules.push(r.module()?);
    }
    let n = r.0.varint()?;
    let n = r.count(n, 2, "stacks")?;
    defs.stacks.reserve(n);
    for _ in 0..n {
        defs.stacks.push(r.stack()?);
    }
    r.0.finish()?;
    Ok(defs)
}

/// Reads the parts of a definitions block, each checked before anything is allocated for it.
struct DefinitionReader<'a>(Col<'a>);

impl DefinitionReader<'_> {
    /// One module: id, path, build id (its length + 1, 0 for none).
    fn module(&mut self) -> Result<(ModuleId, Module), DecodeError> {
        let id = ModuleId(self.id("module")?);
        let path_len = self.0.varint()?;
        let path = String::from_utf8(self.bytes(path_len, "a module path")?)
            .map_err(|_| format!("the path of module {} is not UTF-8", id.0))?;
        let build_id = match self.0.varint()? {
            0 => None,
            n => Some(self.bytes(n - 1, "a build id")?),
        };
        Ok((id, Module { path, build_id }))
    }

    /// One stack: id, depth and the truncated bit, then (module, offset) per frame.
    fn stack(&mut self) -> Result<(StackId, Stack), DecodeError> {
        let id = StackId(self.id("stack")?);
        let head = self.0.varint()?;
        let depth = self.count(head >> 1, 2, "frames")?;
        let mut frames = Vec::with_capacity(depth);
        for _ in 0..depth {
            let module =
                ModuleId(u32::try_from(self.0.varint()?).map_err(|_| {
                    format!("a frame of stack {} names a module above 2^32 - 1", id.0)
                })?);
            frames.push(Frame {
                module,
                offset: self.0.varint()?,
            });
        }
        Ok((
            id,
            Stack {
                frames,
                truncated: head & 1 == 1,
            },
        ))
    }

    /// A module or stack id: 0 is reserved, and ids fit in 32 bits.
    fn id(&mut self, what: &str) -> Result<u32, DecodeError> {
        let v = self.0.varint()?;
        match u32::try_from(v) {
            Ok(0) => Err(format!("{what} id 0 is reserved (no {what})")),
            Ok(v) => Ok(v),
            Err(_) => Err(format!("{what} id {v} is above 2^32 - 1")),
        }
    }

    /// `n` items of at least `min` bytes each: every module takes at least 3 bytes and every
    /// stack or frame at least 2, so a count above what is left is damage, not a reason to
    /// reserve memory.
    fn count(&self, n: u64, min: usize, what: &str) -> Result<usize, DecodeError> {
        let c = &self.0;
        let left = (c.end - c.pos) / min;
        if n > left as u64 {
            return Err(format!(
                "{n} {what} announced, but only {} bytes are left",
                c.end - c.pos
            ));
        }
        Ok(n as usize)
    }

    /// The next `n` bytes.
    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, DecodeError> {
        let c = &mut self.0;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if n > c.end - c.pos {
            return Err(format!("{what} runs past the end of the definitions"));
        }
        let b = c.data[c.pos..c.pos + n].to_vec();
        c.pos += n;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    fn col(data: &[u8], end: usize) -> Col<'_> {
        Col {
            data,
            pos: 0,
            end,
            name: "ts",
        }
    }

    /// `OutCol::put` writes 8 bytes below 2^56 and takes a cold path above: the bytes it keeps
    /// must be `prefix_varint`'s (the format) at every length boundary, in a column of many.
    #[test]
    fn put_writes_the_prefix_varint_at_every_length() {
        let mut values = vec![0u64, 1, u64::MAX];
        for bits in (7..=63).step_by(7).chain([56, 63, 64]) {
            let edge = 1u128 << bits;
            values.extend([(edge - 1) as u64, edge.min(u64::MAX as u128) as u64]);
        }
        let mut col = OutCol::default();
        col.reserve(values.len());
        let mut expected = Vec::new();
        for &v in &values {
            col.put(v);
            let (b, n) = prefix_varint(v);
            expected.extend_from_slice(&b[..n]);
        }
        assert_eq!(col.bytes(), &expected[..]);
    }

    #[test]
    fn varint_rejects_values_past_the_column() {
        let mut buf = vec![0u8; 2 + PAD];
        buf[0] = 0b100; // a 3-byte value in a 2-byte column
        assert!(
            col(&buf, 2)
                .varint()
                .unwrap_err()
                .contains("ends inside a value")
        );
        buf[0] = 0; // a 9-byte value
        assert!(
            col(&buf, 2)
                .varint()
                .unwrap_err()
                .contains("ends inside a value")
        );
        assert!(col(&buf[..5], 2).varint().is_err());
    }

    #[test]
    fn varints_round_trip_at_every_length() {
        let mut values: Vec<u64> = (0..64)
            .flat_map(|b| [1u64 << b, (1u64 << b) - 1, (1u64 << b) + 1])
            .collect();
        values.extend([0, u64::MAX, u64::MAX - 1, 0x5555_5555_0000]);
        let mut out = OutCol::default();
        out.reserve(values.len());
        let mut reference = Vec::new();
        for &v in &values {
            out.put(v);
            put_varint(&mut reference, v);
        }
        assert_eq!(out.bytes(), &reference[..]);
        let mut padded = reference.clone();
        padded.resize(reference.len() + PAD, 0xff);
        let mut c = col(&padded, reference.len());
        for &v in &values {
            assert_eq!(c.varint().unwrap(), v);
        }
        c.finish().unwrap();
        // Lengths: 7 bits per byte up to 56 bits, then 9 bytes.
        for (v, n) in [
            (0u64, 1),
            (127, 1),
            (128, 2),
            ((1 << 56) - 1, 8),
            (1 << 56, 9),
        ] {
            assert_eq!(prefix_varint(v).1, n, "{v}");
        }
    }

    /// [`encode_events`], with the plain ts and addr columns appended to `raw`: the layout the
    /// reader decodes (the decompressed part, then the plain columns).
    fn encode_whole(
        events: &[Event],
        cols: &mut Columns,
        raw: &mut Vec<u8>,
    ) -> Result<u32, EncodeProblem> {
        let flags = encode_events(events, cols, raw)?;
        cols.append_plain(raw);
        Ok(flags)
    }

    fn decode(raw: &[u8], n: u32) -> Result<Vec<Event>, DecodeError> {
        let mut padded = raw.to_vec();
        padded.resize(raw.len() + PAD, 0);
        let mut out = Vec::new();
        decode_events(&padded, n, FLAGS_WRITTEN, &mut out).map(|()| out)
    }

    #[test]
    fn the_reader_reads_every_kind_the_writer_writes() {
        let kinds = [
            EventKind::Malloc {
                addr: 0x1000,
                size: 24,
            },
            EventKind::Calloc {
                addr: 0x2000,
                size: 48,
            },
            EventKind::Realloc {
                old_addr: 0x2000,
                new_addr: 0x1800,
                size: 96,
            },
            EventKind::AlignedAlloc {
                addr: 0x4000,
                size: 64,
                align: 4096,
            },
            EventKind::Free { addr: 0x1000 },
            EventKind::Mmap {
                addr: 0x7f00_0000_0000,
                size: 1 << 20,
            },
            EventKind::Mremap {
                old_addr: 0x7f00_0000_0000,
                new_addr: 0x7e00_0000_0000,
                size: 2 << 20,
            },
            EventKind::Munmap {
                addr: 0x7e00_0000_0000,
                size: 2 << 20,
            },
            EventKind::Brk { addr: 0x55_0000 },
            EventKind::Exec,
            EventKind::SwitchOut { preempted: false },
            EventKind::SwitchIn,
            EventKind::ThreadStart,
            EventKind::ThreadExit,
            EventKind::IterationStart,
            EventKind::IterationEnd,
        ];
        assert_eq!(kinds.len(), KindTag::ALL.len());
        let events: Vec<Event> = kinds
            .iter()
            .enumerate()
            .map(|(i, &k)| Event::new(1_000 + 10 * i as u64, 7, 7 + (i as u32 % 2), k))
            .collect();
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        encode_whole(&events, &mut cols, &mut raw).unwrap();
        assert_eq!(decode(&raw, events.len() as u32).unwrap(), events);
        // With stacks on the kinds that carry one.
        let with: Vec<Event> = events
            .iter()
            .enumerate()
            .map(|(i, e)| match e.kind.tag().carries_stack() {
                true => e.with_stack(StackId(i as u32 * 1000)),
                false => *e,
            })
            .collect();
        assert_eq!(
            encode_whole(&with, &mut cols, &mut raw),
            Ok(FLAGS_WRITTEN | FLAG_STACKS)
        );
        assert_eq!(decode_stacks(&raw, with.len() as u32).unwrap(), with);
    }

    #[test]
    fn a_run_of_length_zero_names_its_column() {
        // One malloc: the count, 7 column lengths and the ref column's, 1 kind byte, then the
        // tid column's (delta, run) pair and the pid column's, every value one byte.
        let ev = Event::new(100, 7, 5, EventKind::Malloc { addr: 64, size: 8 });
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        encode_whole(&[ev], &mut cols, &mut raw).unwrap();
        assert_eq!(decode(&raw, 1).unwrap(), [ev]);
        for (offset, column) in [(11, "tid"), (13, "pid")] {
            let mut bad = raw.clone();
            assert_eq!(bad[offset], 1 << 1 | 1, "a run of 1 at {offset}");
            bad[offset] = 1; // a run of 0
            assert_eq!(
                decode(&bad, 1).unwrap_err(),
                format!("{column} column holds a run of length 0")
            );
        }
    }

    fn defs_decode(raw: &[u8]) -> Result<Definitions, DecodeError> {
        let mut padded = raw.to_vec();
        padded.resize(raw.len() + PAD, 0);
        decode_definitions(&padded)
    }

    #[test]
    fn definitions_round_trip_and_damage_is_named() {
        let defs = Definitions {
            modules: vec![
                (
                    ModuleId(1),
                    Module {
                        path: "/usr/bin/app".into(),
                        build_id: Some(vec![1, 2, 3]),
                    },
                ),
                (
                    ModuleId(7),
                    Module {
                        path: String::new(),
                        build_id: None,
                    },
                ),
            ],
            stacks: vec![
                (
                    StackId(3),
                    Stack {
                        frames: vec![
                            Frame {
                                module: ModuleId(1),
                                offset: 0x1234,
                            },
                            Frame {
                                module: ModuleId::UNKNOWN,
                                offset: u64::MAX,
                            },
                        ],
                        truncated: true,
                    },
                ),
                (StackId(u32::MAX), Stack::default()),
            ],
        };
        let mut raw = Vec::new();
        encode_definitions(&defs, &mut raw);
        assert_eq!(defs_decode(&raw).unwrap(), defs);
        // Cut anywhere: an error, never a panic or a partial table.
        for cut in 0..raw.len() {
            assert!(defs_decode(&raw[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = raw.clone();
        extra.push(0);
        assert!(defs_decode(&extra).unwrap_err().contains("left over"));
        // A count far above what the bytes can hold is refused before allocating.
        let mut huge = Vec::new();
        put_varint(&mut huge, 1 << 40);
        assert!(
            defs_decode(&huge)
                .unwrap_err()
                .contains("modules announced, but only")
        );
        // Id 0 is reserved.
        let mut zero = Vec::new();
        put_varint(&mut zero, 0);
        put_varint(&mut zero, 1);
        put_varint(&mut zero, 0);
        put_varint(&mut zero, 0);
        assert!(
            defs_decode(&zero)
                .unwrap_err()
                .contains("stack id 0 is reserved")
        );
    }

    /// A stack on an event whose kind carries none is refused, not dropped.
    #[test]
    fn a_stack_on_a_free_is_refused() {
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        let alloc = Event::new(1, 2, 3, EventKind::Malloc { addr: 8, size: 8 });
        assert_eq!(
            encode_whole(&[alloc], &mut cols, &mut raw),
            Ok(FLAGS_WRITTEN)
        );
        assert_eq!(
            encode_whole(&[alloc.with_stack(StackId(4))], &mut cols, &mut raw),
            Ok(FLAGS_WRITTEN | FLAG_STACKS)
        );
        assert_eq!(
            decode_stacks(&raw, 1).unwrap(),
            [alloc.with_stack(StackId(4))]
        );
        let free = Event::new(1, 2, 3, EventKind::Free { addr: 8 }).with_stack(StackId(4));
        assert!(
            encode_whole(&[alloc, free], &mut cols, &mut raw)
                .unwrap_err()
                .contains("a free event carries stack 4")
        );
    }

    /// The frame payload of `events` as FORMAT.md states it, one plain step per value (no
    /// cursors, no runs kept open across events): what the encoder's fast loop must write.
    fn reference_payload(events: &[Event]) -> Vec<u8> {
        reference_laid_out(events, &[TS, ADDR])
    }

    /// [`reference_payload`] with the columns `plain` (in column order) stored after the
    /// others, as the frame flags of plain columns say: `[TS, ADDR]` since 1.10, `[ADDR]` in
    /// 1.9.
    fn reference_laid_out(events: &[Event], plain: &[usize]) -> Vec<u8> {
        let stacks = events.iter().any(|e| !e.stack.is_none());
        let mut cols: [Vec<u8>; VAR_COLUMNS + 2] = Default::default();
        let (mut kinds, mut prev_ts, mut prev_addr) = (Vec::new(), 0u64, 0u64);
        // The encoder's recent allocations: slot -> (address, index of the event).
        let mut recent: std::collections::HashMap<usize, (u64, usize)> = Default::default();
        // Runs of tid and pid: (zigzag delta from the previous run's value, length).
        let mut runs: [Vec<(u32, u64)>; 2] = Default::default();
        for (i, e) in events.iter().enumerate() {
            for (r, v) in runs.iter_mut().zip([e.tid, e.pid]) {
                match r.last_mut() {
                    Some((last, n)) if *last == v => *n += 1,
                    _ => r.push((v, 1)),
                }
            }
            kinds.push(e.kind.tag() as u8);
            put_varint(&mut cols[2], zigzag(e.ts.wrapping_sub(prev_ts) as i64));
            prev_ts = e.ts;
            let (addr, addr2, size, align) = reference_values(e.kind);
            let named = match e.kind {
                EventKind::Free { addr } => {
                    let hit = recent.get(&Recent::slot(addr)).filter(|r| r.0 == addr);
                    put_varint(&mut cols[8], hit.map_or(0, |r| (i - r.1) as u64));
                    hit.is_some()
                }
                _ => false,
            };
            if !named {
                put_varint(&mut cols[3], zigzag(addr.wrapping_sub(prev_addr) as i64));
            }
            prev_addr = addr;
            match e.kind {
                EventKind::Malloc { addr, .. }
                | EventKind::Calloc { addr, .. }
                | EventKind::AlignedAlloc { addr, .. }
                | EventKind::Realloc { new_addr: addr, .. } => {
                    recent.insert(Recent::slot(addr), (addr, i));
                }
                _ => {}
            }
            if let Some(d) = addr2 {
                put_varint(&mut cols[4], zigzag(d as i64));
            }
            if let Some(v) = size {
                put_varint(&mut cols[5], v);
            }
            if let Some(v) = align {
                put_varint(&mut cols[6], v);
            }
            if stacks && e.kind.tag().carries_stack() {
                put_varint(&mut cols[7], e.stack.0 as u64);
            }
        }
        for (col, r) in cols.iter_mut().zip(&runs) {
            let mut base = 0u32;
            for &(v, n) in r {
                put_varint(col, zigzag(v.wrapping_sub(base) as i32 as i64));
                put_varint(col, n);
                base = v;
            }
        }
        reference_assemble(events.len(), &kinds, &cols, stacks, plain)
    }

    /// An event's (addr, addr2 delta, size, align) values as FORMAT.md's column table has them
    /// for its kind (addr 0 for the kinds without an address).
    fn reference_values(kind: EventKind) -> (u64, Option<u64>, Option<u64>, Option<u64>) {
        match kind {
            EventKind::Malloc { addr, size }
            | EventKind::Calloc { addr, size }
            | EventKind::Mmap { addr, size }
            | EventKind::Munmap { addr, size } => (addr, None, Some(size), None),
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            }
            | EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            } => (
                old_addr,
                Some(new_addr.wrapping_sub(old_addr)),
                Some(size),
                None,
            ),
            EventKind::AlignedAlloc { addr, size, align } => (addr, None, Some(size), Some(align)),
            EventKind::Free { addr } | EventKind::Brk { addr } => (addr, None, None, None),
            EventKind::SwitchOut { preempted } => (0, None, Some(preempted as u64), None),
            _ => (0, None, None, None),
        }
    }

    /// A payload from its columns' bytes (tid … align, stack, ref): the column table, the
    /// kinds, the columns in order but those of `plain`, then those, as they are stored after
    /// the zstd frame.
    fn reference_assemble(
        events: usize,
        kinds: &[u8],
        cols: &[Vec<u8>; VAR_COLUMNS + 2],
        stacks: bool,
        plain: &[usize],
    ) -> Vec<u8> {
        let used: Vec<&Vec<u8>> = cols[..VAR_COLUMNS]
            .iter()
            .chain(stacks.then_some(&cols[VAR_COLUMNS]))
            .chain([&cols[VAR_COLUMNS + 1]])
            .collect();
        let mut raw = Vec::new();
        put_varint(&mut raw, events as u64);
        for c in &used {
            put_varint(&mut raw, c.len() as u64);
        }
        raw.extend_from_slice(kinds);
        // The plain columns last: they are stored after the zstd frame.
        for (i, c) in used.iter().enumerate() {
            if !plain.contains(&i) {
                raw.extend_from_slice(c);
            }
        }
        for &i in plain {
            raw.extend_from_slice(used[i]);
        }
        raw
    }

    /// Events of every kind, mostly one thread's with bursts of others (a tid shared by two
    /// processes, a pid change alone), timestamps and addresses stepping both ways and by
    /// 2^56 and more (9-byte values), frees mostly of one of the last 64 blocks allocated
    /// (named by ref when the encoder still has them), stacks on some allocations when `stacks`.
    fn mixed(n: usize, stacks: bool) -> Vec<Event> {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let (mut ts, mut addr) = (1u64 << 40, 0x5555_0000_0000u64);
        // The last 64 blocks allocated: most frees free one of them (the ref column's case).
        let mut blocks = [0u64; 64];
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let r = x;
                ts = match r % 97 {
                    0 => ts.wrapping_sub(r >> 40),
                    1 => r,
                    _ => ts + (r >> 50),
                };
                addr = match (r >> 8) % 89 {
                    0 => r,
                    1 => 0,
                    _ => addr.wrapping_add((r >> 20) % 4096).wrapping_sub(2048),
                };
                let size = if r % 53 == 0 {
                    u64::MAX - (r >> 60)
                } else {
                    (r >> 30) % 5000
                };
                let kind = mixed_kind(r, addr, size);
                let kind = match kind {
                    EventKind::Free { .. } if r % 4 != 0 => EventKind::Free {
                        addr: blocks[(r >> 33) as usize % 64],
                    },
                    EventKind::Malloc { addr, .. }
                    | EventKind::Calloc { addr, .. }
                    | EventKind::AlignedAlloc { addr, .. }
                    | EventKind::Realloc { new_addr: addr, .. } => {
                        blocks[i % 64] = addr;
                        kind
                    }
                    _ => kind,
                };
                let (pid, tid) = match (r >> 24) % 50 {
                    0 => (7, 9),
                    1 => (8, 9),
                    2 => (8, 3),
                    3 => (u32::MAX, 0),
                    _ => (7, 3),
                };
                let e = Event::new(ts, pid, tid, kind);
                let stack = (i as u32 % 5) * 1000 + (r >> 58) as u32;
                match stacks && kind.tag().carries_stack() {
                    true => e.with_stack(StackId(stack)),
                    false => e,
                }
            })
            .collect()
    }

    /// [`mixed`]'s event kind for the random `r`: each kind alike, and mallocs and frees
    /// more often.
    fn mixed_kind(r: u64, addr: u64, size: u64) -> EventKind {
        let kinds = KindTag::ALL.len() as u64;
        match (r >> 16) % (kinds + 8) {
            k if k >= kinds => {
                [EventKind::Malloc { addr, size }, EventKind::Free { addr }][k as usize % 2]
            }
            0 => EventKind::Malloc { addr, size },
            1 => EventKind::Calloc { addr, size },
            2 => EventKind::Realloc {
                old_addr: addr,
                new_addr: addr ^ r,
                size,
            },
            3 => EventKind::AlignedAlloc {
                addr,
                size,
                align: 1 << (r % 64),
            },
            4 => EventKind::Free { addr },
            5 => EventKind::Mmap { addr, size },
            6 => EventKind::Munmap { addr, size },
            7 => EventKind::Mremap {
                old_addr: addr,
                new_addr: r,
                size,
            },
            8 => EventKind::Brk { addr },
            9 => EventKind::Exec,
            10 => EventKind::SwitchOut {
                preempted: r & 1 == 0,
            },
            11 => EventKind::SwitchIn,
            12 => EventKind::ThreadStart,
            13 => EventKind::ThreadExit,
            14 => EventKind::IterationStart,
            _ => EventKind::IterationEnd,
        }
    }

    /// The column loop writes what the plain reference writes, with and without stacks, for
    /// frames of any length (a run or a wide value at a frame's start and end), and the reader
    /// reads it back.
    #[test]
    fn the_encoder_writes_the_formats_bytes() {
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        for stacks in [false, true] {
            let events = mixed(20_000, stacks);
            for len in [1, 2, 3, 7, 64, 1000, 20_000] {
                for frame in events.chunks(len) {
                    assert_eq!(
                        encode_whole(frame, &mut cols, &mut raw),
                        Ok(FLAGS_WRITTEN
                            | if frame.iter().any(|e| !e.stack.is_none()) {
                                FLAG_STACKS
                            } else {
                                0
                            })
                    );
                    assert_eq!(raw, reference_payload(frame), "frames of {len}");
                }
            }
            encode_whole(&events, &mut cols, &mut raw).unwrap();
            let back = if stacks {
                decode_stacks(&raw, 20_000)
            } else {
                decode(&raw, 20_000)
            };
            assert_eq!(back.unwrap(), events);
        }
    }

    /// Frees are named by ref when their block was allocated earlier in the frame (by any
    /// allocating kind, a realloc by its new address) and its slot was not taken since; any other
    /// free, of a block from an earlier frame or whose slot a later allocation took, has its
    /// address.
    #[test]
    fn frees_are_named_by_the_event_that_allocated_their_block() {
        let ev = |i: u64, kind| Event::new(1000 + i, 7, 3, kind);
        let a = 0x7f00_0000_1000u64;
        // An address whose slot is `a`'s: found by search, as a crafted workload could.
        let b = (1..)
            .map(|k| a + 16 * k)
            .find(|&b| Recent::slot(b) == Recent::slot(a))
            .expect("a colliding address");
        let events = [
            ev(0, EventKind::Malloc { addr: a, size: 8 }),
            ev(
                1,
                EventKind::Calloc {
                    addr: a + 64,
                    size: 8,
                },
            ),
            ev(2, EventKind::Free { addr: a }),
            ev(
                3,
                EventKind::Realloc {
                    old_addr: a + 64,
                    new_addr: a + 4096,
                    size: 64,
                },
            ),
            ev(4, EventKind::Free { addr: a + 4096 }),
            ev(5, EventKind::Free { addr: 0x1234 }),
            ev(
                6,
                EventKind::AlignedAlloc {
                    addr: a,
                    size: 32,
                    align: 64,
                },
            ),
            ev(7, EventKind::Malloc { addr: b, size: 8 }),
            ev(8, EventKind::Free { addr: a }),
            ev(9, EventKind::Free { addr: b }),
        ];
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        encode_whole(&events, &mut cols, &mut raw).unwrap();
        assert_eq!(raw, reference_payload(&events));
        // One ref per free: 2 back, 1 back, none (unknown address), none (its slot was
        // taken by `b`'s malloc), 2 back.
        assert_eq!(
            cols.refs.bytes(),
            [2 << 1 | 1, 1 << 1 | 1, 1, 1, 2 << 1 | 1]
        );
        assert_eq!(decode(&raw, events.len() as u32).unwrap(), events);
        // The plain columns are the payload's last bytes: a payload one byte short moves ts's
        // start a byte into the ref column before it.
        assert_eq!(
            decode(&raw[..raw.len() - 1], events.len() as u32).unwrap_err(),
            "ref column runs past the end of the payload"
        );
        // A later frame does not name a block of an earlier one.
        encode_whole(&events[8..], &mut cols, &mut raw).unwrap();
        assert_eq!(cols.refs.bytes(), [1, 1]);
        assert_eq!(decode(&raw, 2).unwrap(), events[8..]);
    }

    /// Frames of the earlier layouts read as they did: 1.9's (only addr plain), and ts plain
    /// alone or no plain column (each flag stands on its own), with and without stacks.
    #[test]
    fn every_layout_of_plain_columns_decodes() {
        for stacks in [false, true] {
            let events = mixed(5000, stacks);
            let stack_flag = if stacks { FLAG_STACKS } else { 0 };
            for (plain, flags) in [
                (&[ADDR][..], FLAG_REFS | FLAG_PLAIN_ADDR),
                (&[TS][..], FLAG_REFS | FLAG_PLAIN_TS),
                (&[][..], FLAG_REFS),
                (&[TS, ADDR][..], FLAGS_WRITTEN),
            ] {
                let mut padded = reference_laid_out(&events, plain);
                padded.resize(padded.len() + PAD, 0);
                let mut out = Vec::new();
                decode_events(&padded, 5000, flags | stack_flag, &mut out).unwrap();
                assert_eq!(out, events, "plain columns {plain:?}");
            }
        }
    }

    /// A column table whose plain ts or addr column is longer than the payload is named.
    #[test]
    fn a_plain_column_longer_than_the_payload_is_named() {
        for (column, name) in [(TS, "ts"), (ADDR, "addr")] {
            // One event; every column empty but `column`, said to hold 100 bytes.
            let mut raw = Vec::new();
            put_varint(&mut raw, 1);
            for i in 0..VAR_COLUMNS {
                put_varint(&mut raw, if i == column { 100 } else { 0 });
            }
            put_varint(&mut raw, 0);
            assert_eq!(
                decode(&raw, 1).unwrap_err(),
                format!("{name} column of 100 bytes is longer than the payload")
            );
        }
    }

    /// A damaged ref is named: one reaching before the frame's first event, or naming an
    /// event that allocated nothing.
    #[test]
    fn damaged_refs_are_named() {
        let ev = |i: u64, kind| Event::new(1000 + i, 7, 3, kind);
        let a = 0x7f00_0000_1000u64;
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        // Damage: the free at event 2 names the event 3 before it (there is none), or the
        // event 1 before it, which is a free (frames of `Malloc, Free, Free`).
        let frame = [
            ev(0, EventKind::Malloc { addr: a, size: 8 }),
            ev(1, EventKind::Free { addr: a }),
            ev(2, EventKind::Free { addr: a }),
        ];
        encode_whole(&frame, &mut cols, &mut raw).unwrap();
        assert_eq!(cols.refs.bytes(), [1 << 1 | 1, 2 << 1 | 1]);
        // The second free's ref: the ref column's last byte, before the plain columns.
        let at = raw.len() - cols.plain().iter().map(|c| c.len()).sum::<usize>() - 1;
        for (distance, problem) in [
            (
                3,
                "the free at event 2 of its frame names the event 3 before it, before the \
                 frame's first",
            ),
            (
                1,
                "a free names event 1 of its frame, a free, as its allocation",
            ),
        ] {
            let mut bad = raw.clone();
            bad[at] = distance << 1 | 1;
            assert_eq!(decode(&bad, 3).unwrap_err(), problem);
        }
    }

    fn decode_stacks(raw: &[u8], n: u32) -> Result<Vec<Event>, DecodeError> {
        let mut padded = raw.to_vec();
        padded.resize(raw.len() + PAD, 0);
        let mut out = Vec::new();
        decode_events(&padded, n, FLAGS_WRITTEN | FLAG_STACKS, &mut out).map(|()| out)
    }
}
