//! Writing the container: header, frame records, trailer. The parallel pipeline that feeds it
//! lives in `encode.rs`.

use std::io::Write;

use super::FormatError as Error;
use super::codec::{Columns, Definitions, FLAG_DEFINITIONS, encode_definitions, encode_events};
use super::{
    END_MAGIC, FRAME_HEADER, FRAME_MAGIC, Final, INDEX_ENTRY, MAGIC, Metadata, TRAILER_MAGIC,
    VERSION_MAJOR, VERSION_MINOR,
};
use crate::event::Event;

type Result<T, E = Error> = std::result::Result<T, E>;

/// Per-thread scratch for [`encode_frame`]: column buffers, the raw payload and a zstd context.
pub(crate) struct FrameScratch {
    cols: Columns,
    raw: Vec<u8>,
    defs_raw: Vec<u8>,
    zstd: zstd::bulk::Compressor<'static>,
}

impl FrameScratch {
    pub(crate) fn new(level: i32) -> Result<Self> {
        let mut zstd = zstd::bulk::Compressor::new(level)
            .map_err(|e| Error::io("creating a zstd compressor", e))?;
        // The frame CRC covers the payload; zstd's own checksum would hash it a second time.
        zstd.include_checksum(false)
            .and_then(|()| zstd.include_contentsize(true))
            .map_err(|e| Error::io("configuring the zstd compressor", e))?;
        Ok(FrameScratch {
            cols: Columns::default(),
            raw: Vec::new(),
            defs_raw: Vec::new(),
            zstd,
        })
    }
}

/// Encodes `events` into one complete frame record (header + compressed payload) in `out`, with
/// the definitions `defs` (modules and stacks first referenced in this frame or later) when
/// there are any. A frame without definitions nor stacks is written as in format 1.4.
pub(crate) fn encode_frame(
    events: &[Event],
    defs: Option<&Definitions>,
    scratch: &mut FrameScratch,
    out: &mut Vec<u8>,
) -> Result<()> {
    let mut flags = encode_events(events, &mut scratch.cols, &mut scratch.raw)
        .map_err(|problem| Error::Unwritable { problem })?;
    // The payload is compressed straight into `out` after room for the header, which is
    // written last (its CRC covers the payload): no copy of the compressed bytes.
    out.clear();
    out.resize(FRAME_HEADER, 0);
    if let Some(defs) = defs.filter(|d| !d.is_empty()) {
        // u32 length of the definitions' zstd frame, that frame, then the events' one.
        flags |= FLAG_DEFINITIONS;
        encode_definitions(defs, &mut scratch.defs_raw);
        out.extend_from_slice(&[0; 4]);
        let len = compress_after(&mut scratch.zstd, &scratch.defs_raw, out)
            .map_err(|e| Error::io("compressing a frame's definitions", e))?;
        out[FRAME_HEADER..FRAME_HEADER + 4].copy_from_slice(&(len as u32).to_le_bytes());
    }
    compress_after(&mut scratch.zstd, &scratch.raw, out)
        .map_err(|e| Error::io("compressing a frame", e))?;
    scratch.cols.append_plain(out);
    let payload = &out[FRAME_HEADER..];
    let first_ts = events.first().map_or(0, |e| e.ts);
    let last_ts = events.last().map_or(0, |e| e.ts);
    let mut hdr = [0u8; FRAME_HEADER];
    hdr[0..4].copy_from_slice(&FRAME_MAGIC);
    hdr[4..8].copy_from_slice(&flags.to_le_bytes());
    hdr[8..12].copy_from_slice(&(events.len() as u32).to_le_bytes());
    hdr[12..16].copy_from_slice(&(scratch.raw.len() as u32).to_le_bytes());
    hdr[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    hdr[24..32].copy_from_slice(&first_ts.to_le_bytes());
    hdr[32..40].copy_from_slice(&last_ts.to_le_bytes());
    let crc = frame_crc(&hdr, payload);
    hdr[20..24].copy_from_slice(&crc.to_le_bytes());
    out[..FRAME_HEADER].copy_from_slice(&hdr);
    Ok(())
}

/// Compresses `src` into one zstd frame appended to `out`; returns its length.
fn compress_after(
    zstd: &mut zstd::bulk::Compressor<'static>,
    src: &[u8],
    out: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let start = out.len();
    out.reserve(zstd::zstd_safe::compress_bound(src.len()));
    let mut at = std::io::Cursor::new(&mut *out);
    at.set_position(start as u64);
    zstd.compress_to_buffer(src, &mut at)?;
    Ok(out.len() - start)
}

/// CRC-32 of a frame: its header (without the CRC field) and its payload.
pub(crate) fn frame_crc(hdr: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&hdr[0..20]);
    h.update(&hdr[24..FRAME_HEADER]);
    h.update(payload);
    h.finalize()
}

/// One entry of the trailer's frame index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub offset: u64,
    pub events: u32,
    pub payload_len: u32,
    pub first_ts: u64,
    pub last_ts: u64,
}

impl IndexEntry {
    pub(crate) fn to_bytes(self) -> [u8; INDEX_ENTRY] {
        let mut b = [0u8; INDEX_ENTRY];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.events.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_ts.to_le_bytes());
        b[24..32].copy_from_slice(&self.last_ts.to_le_bytes());
        b
    }
}

/// Writes a container sequentially: the header at creation, whole frame records as they come,
/// and the trailer at [`FrameWriter::finish`]. Every frame is written with one `write_all`, so a
/// writer killed mid-run leaves a file whose complete frames are all readable.
pub(crate) struct FrameWriter<W: Write> {
    out: W,
    offset: u64,
    index: Vec<IndexEntry>,
    events: u64,
}

impl<W: Write> FrameWriter<W> {
    /// Writes the header for `meta`.
    pub(crate) fn new(mut out: W, meta: &Metadata) -> Result<Self> {
        let json = serde_json::to_vec(meta).expect("metadata serialises");
        let mut hdr = Vec::with_capacity(super::HEADER_FIXED + json.len());
        hdr.extend_from_slice(&MAGIC);
        hdr.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
        hdr.extend_from_slice(&VERSION_MINOR.to_le_bytes());
        hdr.extend_from_slice(&(json.len() as u32).to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(&hdr);
        h.update(&json);
        hdr.extend_from_slice(&h.finalize().to_le_bytes());
        hdr.extend_from_slice(&json);
        out.write_all(&hdr)
            .map_err(|e| Error::io("writing the artifact header", e))?;
        Ok(FrameWriter {
            out,
            offset: hdr.len() as u64,
            index: Vec::new(),
            events: 0,
        })
    }

    /// Appends one frame record made by [`encode_frame`].
    pub(crate) fn write_frame(&mut self, record: &[u8]) -> Result<()> {
        let le32 = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().unwrap());
        let le64 = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap());
        let entry = IndexEntry {
            offset: self.offset,
            events: le32(8),
            payload_len: le32(16),
            first_ts: le64(24),
            last_ts: le64(32),
        };
        self.out
            .write_all(record)
            .map_err(|e| Error::io(format!("writing frame {}", self.index.len()), e))?;
        self.offset += record.len() as u64;
        self.events += entry.events as u64;
        self.index.push(entry);
        Ok(())
    }

    /// Frames written so far.
    pub(crate) fn frames(&self) -> u64 {
        self.index.len() as u64
    }

    /// Events written so far.
    pub(crate) fn events(&self) -> u64 {
        self.events
    }

    /// Writes the trailer and tail, flushes, and returns the writer and the file's length.
    pub(crate) fn finish(mut self, fin: &Final) -> Result<(W, u64)> {
        let json = serde_json::to_vec(fin).expect("final metadata serialises");
        let mut t = Vec::with_capacity(32 + self.index.len() * INDEX_ENTRY + json.len() + 16);
        t.extend_from_slice(&TRAILER_MAGIC);
        t.extend_from_slice(&0u32.to_le_bytes());
        t.extend_from_slice(&(self.index.len() as u64).to_le_bytes());
        t.extend_from_slice(&self.events.to_le_bytes());
        t.extend_from_slice(&(json.len() as u32).to_le_bytes());
        t.extend_from_slice(&[0u8; 4]); // CRC, filled below
        for e in &self.index {
            t.extend_from_slice(&e.to_bytes());
        }
        t.extend_from_slice(&json);
        let crc = trailer_crc(&t);
        t[28..32].copy_from_slice(&crc.to_le_bytes());
        t.extend_from_slice(&self.offset.to_le_bytes());
        t.extend_from_slice(&END_MAGIC);
        self.out
            .write_all(&t)
            .map_err(|e| Error::io("writing the artifact trailer", e))?;
        self.out
            .flush()
            .map_err(|e| Error::io("flushing the artifact", e))?;
        Ok((self.out, self.offset + t.len() as u64))
    }
}

/// CRC-32 of a trailer (everything but its CRC field at bytes 28..32).
pub(crate) fn trailer_crc(t: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&t[0..28]);
    h.update(&t[32..]);
    h.finalize()
}
