//! Reading artifacts: header and trailer parsing, recovery of unfinished files, per-frame decode,
//! a streaming event iterator and an ordered parallel frame decoder.
//!
//! Files are read with positioned reads (`pread`), one frame at a time: memory stays bounded by
//! a few frames however large the artifact is.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rayon::prelude::*;

use super::FormatError as Error;
use super::codec::{
    Definitions, FLAG_DEFINITIONS, FLAG_PLAIN_ADDR, FLAG_PLAIN_TS, FLAG_REFS, FLAG_STACKS,
    KNOWN_FLAGS, PAD, decode_definitions, decode_events,
};
use super::write::{frame_crc, trailer_crc};
use super::{
    END_MAGIC, FRAME_HEADER, FRAME_MAGIC, Final, HEADER_FIXED, INDEX_ENTRY, MAGIC,
    MAX_DEFINITIONS_LEN, MAX_FRAME_EVENTS, MAX_RAW_LEN, Metadata, TAIL, TRAILER_MAGIC,
    VERSION_MAJOR,
};
use crate::event::Event;
use crate::stack::{Module, ModuleId, Stack, StackId};

type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the bytes come from: a file read with `pread`, or a buffer.
enum Source {
    File(File),
    Bytes(Vec<u8>),
}

impl Source {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        match self {
            Source::File(f) => f.read_exact_at(buf, offset),
            Source::Bytes(b) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                match b.get(start..).and_then(|s| s.get(..buf.len())) {
                    Some(s) => {
                        buf.copy_from_slice(s);
                        Ok(())
                    }
                    None => Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            }
        }
    }
}

/// One frame as the index (or a recovery scan) describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FrameInfo {
    /// Byte offset of the frame header in the file.
    pub offset: u64,
    /// Number of events in the frame.
    pub events: u32,
    /// Compressed payload length in bytes.
    pub payload_len: u32,
    /// Timestamp of the first event (ns, CLOCK_MONOTONIC).
    pub first_ts: u64,
    /// Timestamp of the last event (ns, CLOCK_MONOTONIC).
    pub last_ts: u64,
}

/// Whether an artifact was finished by its writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completeness {
    /// Header, every frame and the trailer are present and agree.
    Complete,
    /// The trailer was missing (the writer was killed or crashed): the complete frames were
    /// recovered by scanning; `reason` says what was missing and what was dropped. The final
    /// metadata (lost-event count) is unknown, so such a file is not a whole recording.
    Recovered {
        /// What was missing and what was dropped, for the user.
        reason: String,
    },
}

/// The call stacks of a recording and the modules their frames are in (format 1.5), gathered
/// from the definitions of every frame: what [`Reader::stacks`] returns. Empty for a recording
/// without stacks (every file before 1.5, and recorders that capture none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackTable {
    modules: BTreeMap<ModuleId, Module>,
    stacks: BTreeMap<StackId, Stack>,
}

impl StackTable {
    /// The stack `id`; `None` for [`StackId::NONE`] and for an id no frame defines.
    pub fn stack(&self, id: StackId) -> Option<&Stack> {
        self.stacks.get(&id)
    }

    /// The module `id`; `None` for [`ModuleId::UNKNOWN`] and for an id no frame defines.
    pub fn module(&self, id: ModuleId) -> Option<&Module> {
        self.modules.get(&id)
    }

    /// Every stack, by increasing id.
    pub fn stacks(&self) -> impl ExactSizeIterator<Item = (StackId, &Stack)> {
        self.stacks.iter().map(|(id, s)| (*id, s))
    }

    /// Every module, by increasing id.
    pub fn modules(&self) -> impl ExactSizeIterator<Item = (ModuleId, &Module)> {
        self.modules.iter().map(|(id, m)| (*id, m))
    }

    /// Whether the recording has no stacks.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Adds the definitions of one frame. A second definition of an id must be the same; a
    /// stack's modules must be defined (in this frame or before) or be [`ModuleId::UNKNOWN`].
    fn add(&mut self, defs: Definitions) -> Result<(), String> {
        for (id, m) in defs.modules {
            match self.modules.get(&id) {
                Some(old) if *old != m => {
                    return Err(format!(
                        "module {} is defined twice, as {} and as {}",
                        id.0, old.path, m.path
                    ));
                }
                Some(_) => {}
                None => {
                    self.modules.insert(id, m);
                }
            }
        }
        for (id, st) in defs.stacks {
            if let Some(f) = st
                .frames
                .iter()
                .find(|f| f.module != ModuleId::UNKNOWN && !self.modules.contains_key(&f.module))
            {
                return Err(format!(
                    "stack {} has a frame in module {}, which no frame defines before it",
                    id.0, f.module.0
                ));
            }
            match self.stacks.get(&id) {
                Some(old) if *old != st => {
                    return Err(format!("stack {} is defined twice, differently", id.0));
                }
                Some(_) => {}
                None => {
                    self.stacks.insert(id, st);
                }
            }
        }
        Ok(())
    }
}

/// An open artifact. See the module docs.
///
/// Call stacks (format 1.5) are in two places: each event's [`Event::stack`] id, decoded with
/// the events, and the definitions of the stacks and modules, which a frame carries for the
/// stacks its events are the first to use (so a prefix of whole frames has every stack its
/// events name). [`Reader::stacks`] gathers the definitions of every frame into one
/// [`StackTable`] (reading only the frames that have definitions, once);
/// [`Reader::frame_definitions`] gives one frame's.
pub struct Reader {
    src: Source,
    path: PathBuf,
    len: u64,
    meta: Metadata,
    minor: u16,
    frames: Vec<FrameInfo>,
    fin: Option<Final>,
    completeness: Completeness,
    /// [`Reader::stacks`], read on first use.
    table: OnceLock<StackTable>,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Reader {
    /// Opens the artifact at `path`: reads and checks the header and the trailer, or recovers
    /// the frame list by scanning when the trailer is missing (see [`Reader::completeness`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file =
            File::open(&path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?
            .len();
        Self::from_source(Source::File(file), len, path)
    }

    /// Opens an artifact held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let len = bytes.len() as u64;
        Self::from_source(Source::Bytes(bytes), len, PathBuf::from("<memory>"))
    }

    fn from_source(src: Source, len: u64, path: PathBuf) -> Result<Self> {
        let mut r = Reader {
            src,
            path,
            len,
            meta: Metadata::now(0, super::Backend::Other),
            minor: 0,
            frames: Vec::new(),
            fin: None,
            completeness: Completeness::Complete,
            table: OnceLock::new(),
        };
        let data_start = r.read_header()?;
        if !r.read_trailer(data_start)? {
            r.scan(data_start)?;
        }
        Ok(r)
    }

    fn read(&self, offset: u64, len: usize, what: &str) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.src
            .read_at(offset, &mut buf)
            .map_err(|e| Error::io(format!("reading {} of {}", what, self.path.display()), e))?;
        Ok(buf)
    }

    fn header_err(&self, problem: impl Into<String>) -> Error {
        Error::CorruptHeader {
            path: self.path.clone(),
            problem: problem.into(),
        }
    }

    /// Parses the header; returns the offset of the first frame.
    fn read_header(&mut self) -> Result<u64> {
        if self.len < MAGIC.len() as u64 || self.read(0, MAGIC.len(), "the header")? != MAGIC {
            return Err(Error::NotAnArtifact {
                path: self.path.clone(),
            });
        }
        if self.len < HEADER_FIXED as u64 {
            return Err(self.header_err(format!(
                "the file is {} bytes long, shorter than a header",
                self.len
            )));
        }
        let fixed = self.read(0, HEADER_FIXED, "the header")?;
        let (major, minor) = (
            u16::from_le_bytes([fixed[8], fixed[9]]),
            u16::from_le_bytes([fixed[10], fixed[11]]),
        );
        if major != VERSION_MAJOR {
            return Err(Error::UnsupportedVersion {
                path: self.path.clone(),
                major,
                minor,
                supported: VERSION_MAJOR,
                tool: concat!("memtrack ", env!("CARGO_PKG_VERSION")),
            });
        }
        let meta_len = le32(&fixed, 12) as u64;
        if HEADER_FIXED as u64 + meta_len > self.len {
            return Err(self.header_err(format!(
                "metadata of {meta_len} bytes runs past the end of the {}-byte file",
                self.len
            )));
        }
        let json = self.read(HEADER_FIXED as u64, meta_len as usize, "the header")?;
        let mut h = crc32fast::Hasher::new();
        h.update(&fixed[..16]);
        h.update(&json);
        if h.finalize() != le32(&fixed, 16) {
            return Err(self.header_err("checksum mismatch: the header is damaged"));
        }
        self.meta = serde_json::from_slice(&json)
            .map_err(|e| self.header_err(format!("metadata is not valid: {e}")))?;
        self.minor = minor;
        Ok(HEADER_FIXED as u64 + meta_len)
    }

    fn trailer_err(&self, offset: u64, problem: impl Into<String>) -> Error {
        Error::CorruptTrailer {
            path: self.path.clone(),
            offset,
            problem: problem.into(),
        }
    }

    /// Parses the trailer if the file ends with the end magic. `Ok(false)`: no trailer.
    fn read_trailer(&mut self, data_start: u64) -> Result<bool> {
        if self.len < data_start + TAIL as u64 {
            return Ok(false);
        }
        let tail = self.read(self.len - TAIL as u64, TAIL, "the tail")?;
        if tail[8..] != END_MAGIC {
            return Ok(false);
        }
        let t_off = le64(&tail, 0);
        let t_end = self.len - TAIL as u64;
        if t_off < data_start || t_off > t_end.saturating_sub(32) {
            return Err(self.trailer_err(
                t_off,
                format!("the tail points to offset {t_off}, outside the file's data ({data_start}..{t_end})"),
            ));
        }
        // The fixed head first: its lengths must fill the span up to the tail, so that a
        // damaged pointer far from the end is refused before that span is read.
        let head = self.read(t_off, 32, "the trailer")?;
        if head[0..4] != TRAILER_MAGIC {
            return Err(self.trailer_err(t_off, "no trailer magic at the offset the tail gives"));
        }
        let n = le64(&head, 8);
        let json_len = le32(&head, 24) as u64;
        if n.checked_mul(INDEX_ENTRY as u64)
            .and_then(|b| b.checked_add(32 + json_len))
            != Some(t_end - t_off)
        {
            return Err(self.trailer_err(
                t_off,
                format!(
                    "index and metadata lengths do not fill the trailer ({} bytes up to the \
                     tail): the trailer or the tail's pointer is damaged",
                    t_end - t_off
                ),
            ));
        }
        let t = self.read(t_off, (t_end - t_off) as usize, "the trailer")?;
        if trailer_crc(&t) != le32(&t, 28) {
            return Err(self.trailer_err(t_off, "checksum mismatch: the trailer is damaged"));
        }
        let frames = self.read_index(&t, n as usize, t_off, data_start)?;
        let json = &t[32 + n as usize * INDEX_ENTRY..];
        let fin: Final = serde_json::from_slice(json)
            .map_err(|e| self.trailer_err(t_off, format!("final metadata is not valid: {e}")))?;
        self.frames = frames;
        self.fin = Some(fin);
        Ok(true)
    }

    /// The `n` index entries of trailer `t` (at `t_off`): each frame where the previous one
    /// ends, from `data_start` up to the trailer, their events summing to the trailer's total.
    fn read_index(
        &self,
        t: &[u8],
        n: usize,
        t_off: u64,
        data_start: u64,
    ) -> Result<Vec<FrameInfo>> {
        let total = le64(t, 16);
        let mut frames = Vec::with_capacity(n);
        let (mut expect, mut sum) = (data_start, 0u64);
        for i in 0..n {
            let e = &t[32 + i * INDEX_ENTRY..32 + (i + 1) * INDEX_ENTRY];
            let f = FrameInfo {
                offset: le64(e, 0),
                events: le32(e, 8),
                payload_len: le32(e, 12),
                first_ts: le64(e, 16),
                last_ts: le64(e, 24),
            };
            if f.offset != expect {
                return Err(self.trailer_err(
                    t_off,
                    format!("index entry {i} says frame {i} starts at {}, but the previous frame ends at {expect}", f.offset),
                ));
            }
            expect = f.offset + FRAME_HEADER as u64 + f.payload_len as u64;
            sum += f.events as u64;
            frames.push(f);
        }
        if expect != t_off {
            return Err(self.trailer_err(
                t_off,
                format!("the frames end at {expect} but the trailer starts at {t_off}"),
            ));
        }
        if sum != total {
            return Err(self.trailer_err(
                t_off,
                format!("the index counts {sum} events but the trailer says {total}"),
            ));
        }
        Ok(frames)
    }

    /// Rebuilds the frame list of a file without a trailer, frame by frame, checking each CRC.
    fn scan(&mut self, data_start: u64) -> Result<()> {
        let mut pos = data_start;
        let dropped = loop {
            if pos == self.len {
                break None;
            }
            let frame = self.frames.len() as u64;
            if self.len - pos < FRAME_HEADER as u64 {
                break Some(format!(
                    "{} bytes of an incomplete frame header at offset {pos}",
                    self.len - pos
                ));
            }
            let hdr = self.read(pos, FRAME_HEADER, "a frame header")?;
            if hdr[0..4] == TRAILER_MAGIC {
                break Some(format!("an incomplete trailer at offset {pos}"));
            }
            let info = self.check_frame_header(frame, pos, &hdr)?;
            let end = pos + FRAME_HEADER as u64 + info.payload_len as u64;
            if end > self.len {
                break Some(format!(
                    "frame {frame} at offset {pos}: {} of its {} payload bytes",
                    self.len - pos - FRAME_HEADER as u64,
                    info.payload_len
                ));
            }
            let payload = self.read(
                pos + FRAME_HEADER as u64,
                info.payload_len as usize,
                "a frame",
            )?;
            if frame_crc(&hdr, &payload) != le32(&hdr, 20) {
                return Err(self.frame_err(frame, pos, "checksum mismatch: the frame is damaged"));
            }
            self.frames.push(info);
            pos = end;
        };
        let events: u64 = self.frames.iter().map(|f| f.events as u64).sum();
        let mut reason = format!(
            "the trailer is missing: the writer did not finish (killed or crashed?). \
             Recovered {} complete frames ({events} events) by scanning",
            self.frames.len()
        );
        if let Some(d) = dropped {
            reason.push_str(&format!("; dropped {d}"));
        }
        reason.push_str("; the lost-event count and final totals are unknown");
        self.completeness = Completeness::Recovered { reason };
        Ok(())
    }

    fn frame_err(&self, frame: u64, offset: u64, problem: impl Into<String>) -> Error {
        Error::CorruptFrame {
            path: self.path.clone(),
            frame,
            offset,
            problem: problem.into(),
        }
    }

    fn check_frame_header(&self, frame: u64, offset: u64, hdr: &[u8]) -> Result<FrameInfo> {
        if hdr[0..4] != FRAME_MAGIC {
            return Err(self.frame_err(frame, offset, "no frame magic"));
        }
        let flags = le32(hdr, 4);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(self.frame_err(
                frame,
                offset,
                format!("unknown frame flags {flags:#x} (written by a newer memtrack?)"),
            ));
        }
        let info = FrameInfo {
            offset,
            events: le32(hdr, 8),
            payload_len: le32(hdr, 16),
            first_ts: le64(hdr, 24),
            last_ts: le64(hdr, 32),
        };
        if info.events > MAX_FRAME_EVENTS || le32(hdr, 12) > MAX_RAW_LEN {
            return Err(self.frame_err(frame, offset, "frame header announces an impossible size"));
        }
        Ok(info)
    }

    /// The header's metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// The format version of the file, `(major, minor)`.
    pub fn version(&self) -> (u16, u16) {
        (VERSION_MAJOR, self.minor)
    }

    /// The trailer's final metadata; `None` when the file was recovered without a trailer.
    pub fn final_metadata(&self) -> Option<&Final> {
        self.fin.as_ref()
    }

    /// Whether the writer finished the file.
    pub fn completeness(&self) -> &Completeness {
        &self.completeness
    }

    /// The frames, in file order.
    pub fn frames(&self) -> &[FrameInfo] {
        &self.frames
    }

    /// Number of events in all frames.
    pub fn event_count(&self) -> u64 {
        self.frames.iter().map(|f| f.events as u64).sum()
    }

    /// Size of the file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.len
    }

    /// The file's path (`<memory>` for [`Reader::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads frame `index` whole and checks its header against the index and its CRC: the
    /// record (header and payload) is in `rec`, which must be `FRAME_HEADER + payload_len` long.
    fn read_frame(&self, index: usize, rec: &mut [u8]) -> Result<()> {
        let info = self.frames[index];
        let (frame, offset) = (index as u64, info.offset);
        self.src
            .read_at(offset, rec)
            .map_err(|e| self.frame_err(frame, offset, format!("cannot read: {e}")))?;
        let (hdr, payload) = rec.split_at(FRAME_HEADER);
        let got = self.check_frame_header(frame, offset, hdr)?;
        if got != info {
            return Err(self.frame_err(frame, offset, "frame header disagrees with the index"));
        }
        if frame_crc(hdr, payload) != le32(hdr, 20) {
            return Err(self.frame_err(frame, offset, "checksum mismatch: the frame is damaged"));
        }
        Ok(())
    }

    /// Splits a payload of a frame with flags `flags` into its definitions' zstd frame (empty
    /// without [`FLAG_DEFINITIONS`]) and its events' zstd frame.
    fn split_payload<'p>(
        &self,
        index: usize,
        flags: u32,
        payload: &'p [u8],
    ) -> Result<(&'p [u8], &'p [u8])> {
        if flags & FLAG_DEFINITIONS == 0 {
            return Ok((&[], payload));
        }
        let info = self.frames[index];
        let len = payload
            .get(..4)
            .map(|b| le32(b, 0) as usize)
            .filter(|&n| n <= payload.len() - 4)
            .ok_or_else(|| {
                self.frame_err(
                    index as u64,
                    info.offset,
                    "the definitions block runs past the end of the payload",
                )
            })?;
        Ok((&payload[4..4 + len], &payload[4 + len..]))
    }

    /// Decompresses the zstd frame `z` of frame `index` into `raw` (followed by [`PAD`] zero
    /// bytes), after checking that it declares `expected` bytes (at most `max`).
    fn decompress(
        &self,
        index: usize,
        what: &str,
        z: &[u8],
        expected: Option<usize>,
        max: u64,
        raw: &mut Vec<u8>,
    ) -> Result<()> {
        let (frame, offset) = (index as u64, self.frames[index].offset);
        let n = match zstd::zstd_safe::get_frame_content_size(z) {
            Ok(Some(n)) if expected.is_none_or(|e| e as u64 == n) && n <= max => n as usize,
            Ok(Some(n)) => {
                return Err(self.frame_err(
                    frame,
                    offset,
                    match expected {
                        Some(e) => format!("zstd frame holds {n} bytes, header says {e}"),
                        None => format!("{what} of {n} bytes, more than the {max} allowed"),
                    },
                ));
            }
            _ => {
                return Err(self.frame_err(
                    frame,
                    offset,
                    format!("{what} is not a zstd frame with a content size"),
                ));
            }
        };
        DECOMPRESS.with(|d| {
            let dec = &mut *d.borrow_mut();
            raw.clear();
            raw.reserve(n + PAD);
            let got = dec
                .decompress_to_buffer(z, raw)
                .map_err(|e| self.frame_err(frame, offset, format!("zstd: {e}")))?;
            raw.resize(got + PAD, 0);
            if got != n {
                return Err(self.frame_err(
                    frame,
                    offset,
                    format!("{what} decompressed to {got} bytes, its zstd frame says {n}"),
                ));
            }
            Ok(())
        })
    }

    /// Decodes frame `index`, appending its events to `out`. Checks the frame header against the
    /// index, the CRC, the decompressed length and every column.
    pub fn decode_frame(&self, index: usize, out: &mut Vec<Event>) -> Result<()> {
        let info = self.frames[index];
        let (frame, offset) = (index as u64, info.offset);
        let mut rec = vec_from_tls(FRAME_HEADER + info.payload_len as usize);
        let res = (|| {
            self.read_frame(index, &mut rec)?;
            let (hdr, payload) = rec.split_at(FRAME_HEADER);
            let flags = le32(hdr, 4);
            let raw_len = le32(hdr, 12) as usize;
            // Check sizes before allocating for them: damaged input must not make us reserve
            // hundreds of MiB (a frame's payload is at most ~72 bytes per event, 9 more with
            // stacks and 9 more with refs, see FORMAT.md).
            let columns = |flag| if flags & flag != 0 { 9 } else { 0 };
            let per_event = 72 + columns(FLAG_STACKS) + columns(FLAG_REFS);
            if raw_len > 99 + per_event * info.events as usize {
                return Err(self.frame_err(
                    frame,
                    offset,
                    format!(
                        "payload length {raw_len} is impossible for {} events",
                        info.events
                    ),
                ));
            }
            let (_, z) = self.split_payload(index, flags, payload)?;
            // Plain columns (addr's, ts's) follow the zstd frame.
            let (z, plain) = if flags & (FLAG_PLAIN_ADDR | FLAG_PLAIN_TS) != 0 {
                let n = zstd::zstd_safe::find_frame_compressed_size(z)
                    .map_err(|_| self.frame_err(frame, offset, "payload is not a zstd frame"))?;
                z.split_at(n)
            } else {
                (z, &[][..])
            };
            RAW.with(|raw| {
                let raw = &mut *raw.borrow_mut();
                self.decompress(index, "payload", z, Some(raw_len), u64::MAX, raw)?;
                if !plain.is_empty() {
                    raw.truncate(raw_len);
                    raw.extend_from_slice(plain);
                    raw.resize(raw.len() + PAD, 0);
                }
                decode_events(raw, info.events, flags, out)
                    .map_err(|p| self.frame_err(frame, offset, p))
            })
        })();
        vec_to_tls(rec);
        res
    }

    /// The modules and stacks frame `index` defines (format 1.5; empty for a frame without
    /// definitions and every frame of an older file). Checks the frame's CRC.
    pub fn frame_definitions(&self, index: usize) -> Result<Definitions> {
        let info = self.frames[index];
        let (frame, offset) = (index as u64, info.offset);
        let hdr = self.read(offset, FRAME_HEADER, "a frame header")?;
        let flags = self
            .check_frame_header(frame, offset, &hdr)
            .map(|_| le32(&hdr, 4))?;
        if flags & FLAG_DEFINITIONS == 0 {
            return Ok(Definitions::default());
        }
        let mut rec = vec![0u8; FRAME_HEADER + info.payload_len as usize];
        self.read_frame(index, &mut rec)?;
        let (defs, _) = self.split_payload(index, flags, &rec[FRAME_HEADER..])?;
        let mut raw = Vec::new();
        self.decompress(
            index,
            "the definitions block",
            defs,
            None,
            MAX_DEFINITIONS_LEN,
            &mut raw,
        )?;
        decode_definitions(&raw).map_err(|p| self.frame_err(frame, offset, p))
    }

    /// Stack `id` of the recording's table ([`Reader::stacks`]); [`Error::UndefinedStack`]
    /// if no frame defines it (an event naming it is then damaged).
    pub fn stack(&self, id: StackId) -> Result<&Stack> {
        self.stacks()?
            .stack(id)
            .ok_or_else(|| Error::UndefinedStack {
                path: self.path.clone(),
                stack: id.0,
            })
    }

    /// The call stacks of the recording and their modules (format 1.5): the definitions of
    /// every frame, read on the first call (only frames with definitions are read whole) and
    /// kept. Empty for a file without stacks. An error names the frame whose definitions are
    /// damaged or contradict an earlier frame's.
    pub fn stacks(&self) -> Result<&StackTable> {
        if let Some(t) = self.table.get() {
            return Ok(t);
        }
        let mut table = StackTable::default();
        for index in 0..self.frames.len() {
            let defs = self.frame_definitions(index)?;
            table
                .add(defs)
                .map_err(|p| self.frame_err(index as u64, self.frames[index].offset, p))?;
        }
        Ok(self.table.get_or_init(|| table))
    }

    /// A streaming iterator over every event, in order, decoding one frame at a time. After an
    /// error (which names the frame and offset) it yields nothing more.
    pub fn events(&self) -> Events<'_> {
        Events {
            reader: self,
            frame: 0,
            buf: Vec::new(),
            pos: 0,
            failed: false,
        }
    }

    /// Decodes frames in parallel (on the current rayon pool, a window of frames at a time) and
    /// calls `f` with each frame's events **in file order**, overlapping `f` on one window with
    /// decoding of the next. Stops at the first error (of a frame or of `f`).
    pub fn for_each_frame<F>(&self, mut f: F) -> Result<()>
    where
        F: FnMut(usize, &[Event]) -> Result<()> + Send,
    {
        let n = self.frames.len();
        let window = (rayon::current_num_threads() * 2).max(2);
        let mut cur: Vec<Vec<Event>> = (0..window).map(|_| Vec::new()).collect();
        let mut next: Vec<Vec<Event>> = (0..window).map(|_| Vec::new()).collect();
        self.decode_window(0, &mut cur)?;
        let mut start = 0;
        while start < n {
            let next_start = start + window;
            let here = window.min(n - start);
            let (decoded, consumed) = rayon::join(
                || self.decode_window(next_start, &mut next),
                || {
                    for (k, evs) in cur[..here].iter().enumerate() {
                        f(start + k, evs)?;
                    }
                    Ok::<(), Error>(())
                },
            );
            consumed?;
            decoded?;
            std::mem::swap(&mut cur, &mut next);
            start = next_start;
        }
        Ok(())
    }

    fn decode_window(&self, start: usize, bufs: &mut [Vec<Event>]) -> Result<()> {
        let n = self.frames.len().saturating_sub(start).min(bufs.len());
        bufs[..n]
            .par_iter_mut()
            .enumerate()
            .map(|(k, buf)| {
                buf.clear();
                self.decode_frame(start + k, buf)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .collect()
    }
}

thread_local! {
    static DECOMPRESS: RefCell<zstd::bulk::Decompressor<'static>> = RefCell::new(
        zstd::bulk::Decompressor::new().expect("zstd decompression context"),
    );
    /// The decompressed events' payload of the frame being decoded.
    static RAW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static RECORD: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Takes this thread's reusable record buffer, sized to `len`.
fn vec_from_tls(len: usize) -> Vec<u8> {
    let mut v = RECORD.with(|r| std::mem::take(&mut *r.borrow_mut()));
    v.clear();
    v.resize(len, 0);
    v
}

fn vec_to_tls(v: Vec<u8>) {
    RECORD.with(|r| *r.borrow_mut() = v);
}

/// Iterator returned by [`Reader::events`].
pub struct Events<'a> {
    reader: &'a Reader,
    frame: usize,
    buf: Vec<Event>,
    pos: usize,
    failed: bool,
}

impl Iterator for Events<'_> {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        while self.pos == self.buf.len() {
            if self.failed || self.frame == self.reader.frames.len() {
                return None;
            }
            self.buf.clear();
            self.pos = 0;
            let r = self.reader.decode_frame(self.frame, &mut self.buf);
            self.frame += 1;
            if let Err(e) = r {
                self.failed = true;
                return Some(Err(e));
            }
        }
        self.pos += 1;
        Some(Ok(self.buf[self.pos - 1]))
    }
}
