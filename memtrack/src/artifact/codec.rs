//! The column encoding inside a frame (FORMAT.md, "Frame payload").
//!
//! Events are split into columns, each delta/zigzag/LEB128-encoded so that the common case
//! (a timestamp a few hundred ns after the previous one, an address near the previous one,
//! a small size) takes one or two bytes, then the columns are concatenated and compressed with
//! zstd. Column order and encodings are part of the format: change them only with a version bump.

use crate::event::{Event, EventKind, KindTag};

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
        // A table instead of `div_ceil(7)`: the division by 7 was ~10 instructions per value,
        // ~40 per event of the encoder (callgrind).
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
/// and the length written so far. Every store writes 9 bytes and advances by the varint's length.
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

    /// One prefix varint (see [`prefix_varint`]), written as a single 8-byte store: building
    /// the 9-byte array first and copying it cost ~25 instructions per event (callgrind).
    /// The caller must have reserved room for this value ([`OutCol::reserve`]): a value more
    /// than reserved panics.
    #[inline(always)]
    fn put(&mut self, v: u64) {
        if v < 1 << 56 && self.len + 8 <= self.buf.len() {
            let n = VARINT_LEN[(v | 1).leading_zeros() as usize] as usize;
            let w = (v << n) | (1 << (n - 1));
            // SAFETY: `len + 8 <= buf.len()` was checked just above (one compare, where the
            // slice copy it replaces checked the range twice and its length).
            unsafe {
                self.buf
                    .as_mut_ptr()
                    .add(self.len)
                    .cast::<[u8; 8]>()
                    .write_unaligned(w.to_le_bytes());
            }
            self.len += n;
        } else {
            self.put_wide(v);
        }
    }

    /// A value of 2^56 or more (9 bytes), or a store past the reserved room (which panics).
    #[cold]
    #[inline(never)]
    fn put_wide(&mut self, v: u64) {
        let (b, n) = prefix_varint(v);
        self.buf[self.len..self.len + 9].copy_from_slice(&b);
        self.len += n;
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Run-length state of a column that changes rarely (tid, pid): stored as (zigzag delta, run)
/// pairs. Threads run in bursts, so this is ~0.02 bytes per event before compression.
#[derive(Default)]
struct Runs {
    value: u32,
    run: u64,
}

impl Runs {
    #[inline(always)]
    fn push(&mut self, v: u32, out: &mut OutCol) {
        if v == self.value && self.run > 0 {
            self.run += 1;
        } else {
            self.flush(out);
            out.put(zigzag(v.wrapping_sub(self.value) as i32 as i64));
            self.value = v;
            self.run = 1;
        }
    }

    fn flush(&mut self, out: &mut OutCol) {
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
/// (FORMAT.md, "Frame payload"); [`ColumnReader`] mirrors it method for method.
struct ColumnWriter<'c> {
    kinds: &'c mut Vec<u8>,
    tid: &'c mut OutCol,
    pid: &'c mut OutCol,
    ts: &'c mut OutCol,
    addr: &'c mut OutCol,
    addr2: &'c mut OutCol,
    size: &'c mut OutCol,
    align: &'c mut OutCol,
    tid_runs: Runs,
    pid_runs: Runs,
    prev_ts: u64,
    prev_addr: u64,
}

impl<'c> ColumnWriter<'c> {
    /// Empties `cols` and makes room for `events` events.
    fn new(cols: &'c mut Columns, events: usize) -> Self {
        cols.kinds.clear();
        cols.kinds.reserve(events);
        for c in &mut cols.cols {
            c.len = 0;
            c.reserve(events);
        }
        let [tid, pid, ts, addr, addr2, size, align] = &mut cols.cols;
        ColumnWriter {
            kinds: &mut cols.kinds,
            tid,
            pid,
            ts,
            addr,
            addr2,
            size,
            align,
            tid_runs: Runs::default(),
            pid_runs: Runs::default(),
            prev_ts: 0,
            prev_addr: 0,
        }
    }

    /// One event: the kind, tid, pid, ts and addr columns always, the others as its kind has
    /// them.
    #[inline(always)]
    fn event(&mut self, ev: &Event) {
        self.kind(ev.kind.tag());
        self.tid(ev.tid);
        self.pid(ev.pid);
        self.ts(ev.ts);
        match ev.kind {
            EventKind::Malloc { addr, size }
            | EventKind::Calloc { addr, size }
            | EventKind::Mmap { addr, size }
            | EventKind::Munmap { addr, size } => {
                self.addr(addr);
                self.size(size);
            }
            EventKind::Realloc {
                old_addr,
                new_addr,
                size,
            }
            | EventKind::Mremap {
                old_addr,
                new_addr,
                size,
            } => {
                self.addr(old_addr);
                self.addr2(new_addr, old_addr);
                self.size(size);
            }
            EventKind::AlignedAlloc { addr, size, align } => {
                self.addr(addr);
                self.size(size);
                self.align(align);
            }
            EventKind::Free { addr } | EventKind::Brk { addr } => self.addr(addr),
            EventKind::Exec => self.addr(0),
        }
    }

    #[inline(always)]
    fn kind(&mut self, tag: KindTag) {
        self.kinds.push(tag as u8);
    }

    /// Runs of (zigzag delta, length).
    #[inline(always)]
    fn tid(&mut self, tid: u32) {
        self.tid_runs.push(tid, self.tid);
    }

    /// Runs of (zigzag delta, length).
    #[inline(always)]
    fn pid(&mut self, pid: u32) {
        self.pid_runs.push(pid, self.pid);
    }

    /// Zigzag delta from the previous event's.
    #[inline(always)]
    fn ts(&mut self, ts: u64) {
        self.ts.put(zigzag(ts.wrapping_sub(self.prev_ts) as i64));
        self.prev_ts = ts;
    }

    /// Zigzag delta from the previous event's (0 for an exec).
    #[inline(always)]
    fn addr(&mut self, addr: u64) {
        self.addr
            .put(zigzag(addr.wrapping_sub(self.prev_addr) as i64));
        self.prev_addr = addr;
    }

    /// A realloc's or mremap's new address: zigzag delta from its old one.
    #[inline(always)]
    fn addr2(&mut self, new_addr: u64, old_addr: u64) {
        let delta = new_addr.wrapping_sub(old_addr);
        self.addr2.put(zigzag(delta as i64));
    }

    #[inline(always)]
    fn size(&mut self, size: u64) {
        self.size.put(size);
    }

    #[inline(always)]
    fn align(&mut self, align: u64) {
        self.align.put(align);
    }

    /// Ends the open tid and pid runs.
    fn finish(mut self) {
        self.tid_runs.flush(self.tid);
        self.pid_runs.flush(self.pid);
    }
}

/// Serialises `events` into `raw` (cleared first): the uncompressed frame payload.
pub(crate) fn encode_events(events: &[Event], cols: &mut Columns, raw: &mut Vec<u8>) {
    let mut w = ColumnWriter::new(cols, events.len());
    for ev in events {
        w.event(ev);
    }
    w.finish();
    raw.clear();
    put_varint(raw, events.len() as u64);
    for c in &cols.cols {
        put_varint(raw, c.len as u64);
    }
    raw.extend_from_slice(&cols.kinds);
    for c in &cols.cols {
        raw.extend_from_slice(c.bytes());
    }
}

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
/// mirror of [`ColumnWriter`].
struct ColumnReader<'a> {
    kinds: &'a [u8],
    tid: Col<'a>,
    pid: Col<'a>,
    ts: Col<'a>,
    addr: Col<'a>,
    addr2: Col<'a>,
    size: Col<'a>,
    align: Col<'a>,
    tid_run: Run,
    pid_run: Run,
    prev_ts: u64,
    prev_addr: u64,
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

impl<'a> ColumnReader<'a> {
    /// Reads the column table (event count, then each column's length) and splits the payload
    /// into its columns. `expected` is the event count the frame header announces. Inlined:
    /// 1 instruction per event less in the decode loop (callgrind: 222.0 → 221.0).
    #[inline(always)]
    fn new(padded: &'a [u8], expected: u32) -> Result<Self, DecodeError> {
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
        let mut lens = [0usize; VAR_COLUMNS];
        for l in &mut lens {
            *l = usize::try_from(head.varint()?)
                .map_err(|_| "column length overflows".to_string())?;
        }
        let mut pos = head.pos;
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
        let [tid, pid, ts, addr, addr2, size, align] = NAMES;
        let reader = ColumnReader {
            kinds: &padded[kinds.pos..kinds.end],
            tid: take(lens[0], tid)?,
            pid: take(lens[1], pid)?,
            ts: take(lens[2], ts)?,
            addr: take(lens[3], addr)?,
            addr2: take(lens[4], addr2)?,
            size: take(lens[5], size)?,
            align: take(lens[6], align)?,
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

    /// The event of kind byte `k`, reading each column the writer wrote for it.
    #[inline(always)]
    fn event(&mut self, k: u8) -> Result<Event, DecodeError> {
        let tid = self.tid()?;
        let pid = self.pid()?;
        let ts = self.ts()?;
        let addr = self.addr()?;
        let kind = match Self::kind(k)? {
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
        };
        Ok(Event::new(ts, pid, tid, kind))
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
        ] {
            c.finish()?;
        }
        Ok(())
    }
}

/// Takes the column's name, not the column: `&self` passed to this outlined function cost the
/// decode loop 3 instructions per event (callgrind, hotpaths `decode`: 225.0 → 222.0).
#[cold]
fn overrun(column: &str) -> DecodeError {
    format!("{column} column ends inside a value")
}

#[cold]
fn empty_run(column: &str) -> DecodeError {
    format!("{column} column holds a run of length 0")
}

/// Decodes a payload written by [`encode_events`], appending to `out`. `expected` is the event
/// count the frame header announces; any disagreement, left-over byte or unknown kind is an error.
/// `padded` is the payload followed by at least [`PAD`] bytes (of any value).
///
/// Never inlined: called once per frame, so inlining gains nothing, and whether LLVM inlined it
/// into its caller (a thread-local's closure) depended on how unrelated code of the crate fell
/// into codegen units; inlined, its loop cost ~8.6 instructions more per event in the ir-gate's
/// decode (229.7 vs 221.0 Ir/op) after a change in the allocator recorder.
#[inline(never)]
pub(crate) fn decode_events(
    padded: &[u8],
    expected: u32,
    out: &mut Vec<Event>,
) -> Result<(), DecodeError> {
    let mut r = ColumnReader::new(padded, expected)?;
    // `kinds` holds `expected` bytes of this payload: a count bounded by real input, not a claim.
    out.reserve(r.kinds.len());
    for &k in r.kinds {
        out.push(r.event(k)?);
    }
    r.finish()
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

    fn decode(raw: &[u8], n: u32) -> Result<Vec<Event>, DecodeError> {
        let mut padded = raw.to_vec();
        padded.resize(raw.len() + PAD, 0);
        let mut out = Vec::new();
        decode_events(&padded, n, &mut out).map(|()| out)
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
        ];
        assert_eq!(kinds.len(), KindTag::ALL.len());
        let events: Vec<Event> = kinds
            .iter()
            .enumerate()
            .map(|(i, &k)| Event::new(1_000 + 10 * i as u64, 7, 7 + (i as u32 % 2), k))
            .collect();
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        encode_events(&events, &mut cols, &mut raw);
        assert_eq!(decode(&raw, events.len() as u32).unwrap(), events);
    }

    #[test]
    fn a_run_of_length_zero_names_its_column() {
        // One malloc: the count, 7 column lengths, 1 kind byte, then the tid column's
        // (delta, run) pair and the pid column's, every value one byte.
        let ev = Event::new(100, 7, 5, EventKind::Malloc { addr: 64, size: 8 });
        let (mut cols, mut raw) = (Columns::default(), Vec::new());
        encode_events(&[ev], &mut cols, &mut raw);
        assert_eq!(decode(&raw, 1).unwrap(), [ev]);
        for (offset, column) in [(10, "tid"), (12, "pid")] {
            let mut bad = raw.clone();
            assert_eq!(bad[offset], 1 << 1 | 1, "a run of 1 at {offset}");
            bad[offset] = 1; // a run of 0
            assert_eq!(
                decode(&bad, 1).unwrap_err(),
                format!("{column} column holds a run of length 0")
            );
        }
    }
}
