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
    #[inline(always)]
    fn put(&mut self, v: u64) {
        if v < 1 << 56 {
            let n = VARINT_LEN[(v | 1).leading_zeros() as usize] as usize;
            let w = (v << n) | (1 << (n - 1));
            self.buf[self.len..self.len + 8].copy_from_slice(&w.to_le_bytes());
            self.len += n;
        } else {
            self.put_wide(v);
        }
    }

    #[cold]
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

/// Serialises `events` into `raw` (cleared first): the uncompressed frame payload.
pub(crate) fn encode_events(events: &[Event], cols: &mut Columns, raw: &mut Vec<u8>) {
    cols.kinds.clear();
    cols.kinds.reserve(events.len());
    for c in &mut cols.cols {
        c.len = 0;
        c.reserve(events.len());
    }
    let [tid_c, pid_c, ts_c, addr_c, addr2_c, size_c, align_c] = &mut cols.cols;
    let (mut tids, mut pids) = (Runs::default(), Runs::default());
    let (mut prev_ts, mut prev_addr) = (0u64, 0u64);
    for ev in events {
        cols.kinds.push(ev.kind.tag() as u8);
        tids.push(ev.tid, tid_c);
        pids.push(ev.pid, pid_c);
        ts_c.put(zigzag(ev.ts.wrapping_sub(prev_ts) as i64));
        prev_ts = ev.ts;
        let (addr, addr2, size, align) = match ev.kind {
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
            } => (old_addr, Some(new_addr), Some(size), None),
            EventKind::AlignedAlloc { addr, size, align } => (addr, None, Some(size), Some(align)),
            EventKind::Free { addr } | EventKind::Brk { addr } => (addr, None, None, None),
            EventKind::Exec => (0, None, None, None),
        };
        addr_c.put(zigzag(addr.wrapping_sub(prev_addr) as i64));
        prev_addr = addr;
        if let Some(a2) = addr2 {
            addr2_c.put(zigzag(a2.wrapping_sub(addr) as i64));
        }
        if let Some(s) = size {
            size_c.put(s);
        }
        if let Some(a) = align {
            align_c.put(a);
        }
    }
    tids.flush(tid_c);
    pids.flush(pid_c);
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
            return Err(self.overrun());
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
            return Err(self.overrun());
        }
        Ok(v)
    }

    #[cold]
    fn overrun(&self) -> DecodeError {
        format!("{} column ends inside a value", self.name)
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

/// Decodes a payload written by [`encode_events`], appending to `out`. `expected` is the event
/// count the frame header announces; any disagreement, left-over byte or unknown kind is an error.
/// `padded` is the payload followed by at least [`PAD`] bytes (of any value).
pub(crate) fn decode_events(
    padded: &[u8],
    expected: u32,
    out: &mut Vec<Event>,
) -> Result<(), DecodeError> {
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
    let n = n as usize;
    let mut lens = [0usize; VAR_COLUMNS];
    for l in &mut lens {
        *l = usize::try_from(head.varint()?).map_err(|_| "column length overflows".to_string())?;
    }
    let mut pos = head.pos;
    let take =
        |pos: &mut usize, len: usize, name: &'static str| -> Result<(usize, usize), DecodeError> {
            let end = pos
                .checked_add(len)
                .filter(|&e| e <= raw_len)
                .ok_or_else(|| format!("{name} column runs past the end of the payload"))?;
            let span = (*pos, end);
            *pos = end;
            Ok(span)
        };
    let (ks, ke) = take(&mut pos, n, "kind")?;
    let kinds = &padded[ks..ke];
    let mut cols: [Col; VAR_COLUMNS] = std::array::from_fn(|i| Col {
        data: padded,
        pos: 0,
        end: 0,
        name: NAMES[i],
    });
    for (i, c) in cols.iter_mut().enumerate() {
        (c.pos, c.end) = take(&mut pos, lens[i], NAMES[i])?;
    }
    if pos != raw_len {
        return Err(format!("{} bytes follow the last column", raw_len - pos));
    }
    // `kinds` holds `n` bytes of this payload: `n` is bounded by real input, not a claim.
    out.reserve(n);
    let (mut tid, mut pid, mut ts, mut addr) = (0u32, 0u32, 0u64, 0u64);
    let (mut tid_run, mut pid_run) = (0u64, 0u64);
    let [tid_c, pid_c, ts_c, addr_c, addr2_c, size_c, align_c] = &mut cols;
    for &k in kinds {
        if tid_run == 0 {
            tid = tid.wrapping_add(unzigzag(tid_c.varint()?) as u32);
            tid_run = tid_c.varint()?;
            if tid_run == 0 {
                return Err("tid column holds a run of length 0".into());
            }
        }
        tid_run -= 1;
        if pid_run == 0 {
            pid = pid.wrapping_add(unzigzag(pid_c.varint()?) as u32);
            pid_run = pid_c.varint()?;
            if pid_run == 0 {
                return Err("pid column holds a run of length 0".into());
            }
        }
        pid_run -= 1;
        ts = ts.wrapping_add(unzigzag(ts_c.varint()?) as u64);
        addr = addr.wrapping_add(unzigzag(addr_c.varint()?) as u64);
        let tag = KindTag::from_u8(k).ok_or_else(|| {
            format!(
                "unknown event kind {k} (written by a newer memtrack? this one knows kinds 1-{})",
                KindTag::ALL.len()
            )
        })?;
        let kind = match tag {
            KindTag::Malloc => EventKind::Malloc {
                addr,
                size: size_c.varint()?,
            },
            KindTag::Calloc => EventKind::Calloc {
                addr,
                size: size_c.varint()?,
            },
            KindTag::Mmap => EventKind::Mmap {
                addr,
                size: size_c.varint()?,
            },
            KindTag::Munmap => EventKind::Munmap {
                addr,
                size: size_c.varint()?,
            },
            KindTag::Realloc => EventKind::Realloc {
                old_addr: addr,
                new_addr: addr.wrapping_add(unzigzag(addr2_c.varint()?) as u64),
                size: size_c.varint()?,
            },
            KindTag::Mremap => EventKind::Mremap {
                old_addr: addr,
                new_addr: addr.wrapping_add(unzigzag(addr2_c.varint()?) as u64),
                size: size_c.varint()?,
            },
            KindTag::AlignedAlloc => EventKind::AlignedAlloc {
                addr,
                size: size_c.varint()?,
                align: align_c.varint()?,
            },
            KindTag::Free => EventKind::Free { addr },
            KindTag::Brk => EventKind::Brk { addr },
            KindTag::Exec => EventKind::Exec,
        };
        out.push(Event::new(ts, pid, tid, kind));
    }
    if tid_run != 0 || pid_run != 0 {
        return Err("a tid or pid run extends past the last event".into());
    }
    for c in &cols {
        c.finish()?;
    }
    Ok(())
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
}
