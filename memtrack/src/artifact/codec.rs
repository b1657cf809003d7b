//! The column encoding inside a frame (FORMAT.md, "Frame payload").
//!
//! Events are split into columns, each delta/zigzag/LEB128-encoded so that the common case
//! (a timestamp a few hundred ns after the previous one, an address near the previous one,
//! a small size) takes one or two bytes, then the columns are concatenated and compressed with
//! zstd. Column order and encodings are part of the format: change them only with a version bump.

use crate::event::{Event, EventKind, KindTag};

/// Number of length-prefixed columns after the kind column.
const VAR_COLUMNS: usize = 7;

/// Reusable column buffers for [`encode_events`]; keep one per encoding thread.
#[derive(Default)]
pub(crate) struct Columns {
    kinds: Vec<u8>,
    cols: [Vec<u8>; VAR_COLUMNS],
}

#[inline(always)]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline(always)]
fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[inline(always)]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Serialises `events` into `raw` (cleared first): the uncompressed frame payload.
pub(crate) fn encode_events(events: &[Event], cols: &mut Columns, raw: &mut Vec<u8>) {
    cols.kinds.clear();
    cols.kinds.reserve(events.len());
    for c in &mut cols.cols {
        c.clear();
    }
    let [tid_c, pid_c, ts_c, addr_c, addr2_c, size_c, align_c] = &mut cols.cols;
    let (mut prev_tid, mut prev_pid, mut prev_ts, mut prev_addr) = (0u32, 0u32, 0u64, 0u64);
    for ev in events {
        cols.kinds.push(ev.kind.tag() as u8);
        put_varint(tid_c, zigzag(ev.tid.wrapping_sub(prev_tid) as i32 as i64));
        prev_tid = ev.tid;
        put_varint(pid_c, zigzag(ev.pid.wrapping_sub(prev_pid) as i32 as i64));
        prev_pid = ev.pid;
        put_varint(ts_c, zigzag(ev.ts.wrapping_sub(prev_ts) as i64));
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
        };
        put_varint(addr_c, zigzag(addr.wrapping_sub(prev_addr) as i64));
        prev_addr = addr;
        if let Some(a2) = addr2 {
            put_varint(addr2_c, zigzag(a2.wrapping_sub(addr) as i64));
        }
        if let Some(s) = size {
            put_varint(size_c, s);
        }
        if let Some(a) = align {
            put_varint(align_c, a);
        }
    }
    raw.clear();
    put_varint(raw, events.len() as u64);
    for c in &cols.cols {
        put_varint(raw, c.len() as u64);
    }
    raw.extend_from_slice(&cols.kinds);
    for c in &cols.cols {
        raw.extend_from_slice(c);
    }
}

/// What is wrong with a frame payload; the reader adds the frame index and offset.
pub(crate) type DecodeError = String;

/// A cursor over one column.
struct Col<'a> {
    buf: &'a [u8],
    pos: usize,
    name: &'static str,
}

impl<'a> Col<'a> {
    #[inline(always)]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        // Fast path: one byte, the most common case (small deltas, sizes, tids).
        if let Some(&b) = self.buf.get(self.pos)
            && b < 0x80
        {
            self.pos += 1;
            return Ok(b as u64);
        }
        self.varint_slow()
    }

    #[cold]
    fn varint_slow(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!("{} column ends inside a value", self.name));
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(format!("{} column holds a value over 64 bits", self.name));
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(format!("{} column holds a value over 64 bits", self.name))
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(format!(
                "{} column has {} bytes left over after the last event",
                self.name,
                self.buf.len() - self.pos
            ))
        }
    }
}

const NAMES: [&str; VAR_COLUMNS] = ["tid", "pid", "ts", "addr", "addr2", "size", "align"];

/// Decodes a payload written by [`encode_events`], appending to `out`. `expected` is the event
/// count the frame header announces; any disagreement, left-over byte or unknown kind is an error.
pub(crate) fn decode_events(
    raw: &[u8],
    expected: u32,
    out: &mut Vec<Event>,
) -> Result<(), DecodeError> {
    let mut head = Col {
        buf: raw,
        pos: 0,
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
    let take = |pos: &mut usize, len: usize, name: &'static str| -> Result<&[u8], DecodeError> {
        let end = pos
            .checked_add(len)
            .filter(|&e| e <= raw.len())
            .ok_or_else(|| format!("{name} column runs past the end of the payload"))?;
        let s = &raw[*pos..end];
        *pos = end;
        Ok(s)
    };
    let kinds = take(&mut pos, n, "kind")?;
    let mut cols: [Col; VAR_COLUMNS] = std::array::from_fn(|i| Col {
        buf: &[],
        pos: 0,
        name: NAMES[i],
    });
    for (i, c) in cols.iter_mut().enumerate() {
        c.buf = take(&mut pos, lens[i], NAMES[i])?;
    }
    if pos != raw.len() {
        return Err(format!("{} bytes follow the last column", raw.len() - pos));
    }
    out.reserve(n);
    let (mut tid, mut pid, mut ts, mut addr) = (0u32, 0u32, 0u64, 0u64);
    let [tid_c, pid_c, ts_c, addr_c, addr2_c, size_c, align_c] = &mut cols;
    for &k in kinds {
        tid = tid.wrapping_add(unzigzag(tid_c.varint()?) as u32);
        pid = pid.wrapping_add(unzigzag(pid_c.varint()?) as u32);
        ts = ts.wrapping_add(unzigzag(ts_c.varint()?) as u64);
        addr = addr.wrapping_add(unzigzag(addr_c.varint()?) as u64);
        let tag = KindTag::from_u8(k).ok_or_else(|| {
            format!(
                "unknown event kind {k} (written by a newer memtrack? this one knows kinds 1-9)"
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
        };
        out.push(Event::new(ts, pid, tid, kind));
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

    #[test]
    fn varint_rejects_overlong_values() {
        let buf = [0xffu8; 11];
        let mut c = Col {
            buf: &buf,
            pos: 0,
            name: "ts",
        };
        assert!(c.varint().unwrap_err().contains("over 64 bits"));
        let mut out = Vec::new();
        put_varint(&mut out, u64::MAX);
        let mut c = Col {
            buf: &out,
            pos: 0,
            name: "ts",
        };
        assert_eq!(c.varint().unwrap(), u64::MAX);
    }
}
