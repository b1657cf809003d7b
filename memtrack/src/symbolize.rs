//! Offline symbolization (feature `symbolize`): recorded frames to function, file:line and
//! inlined frames, from the files alone. The guide is [`Symbolizer`]'s documentation.

use std::fmt;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized};
use rustc_hash::FxHashMap;

use crate::analysis::{Attribution, Metric, Site, Sites};
use crate::artifact::{FormatError, Reader};
use crate::stack::{Frame, Module, ModuleId, Stack};

/// [`Symbolizer::symbolize_sites`]'s answer: each site's recorded stack, and its frames'
/// symbols (per frame, inlined functions first).
pub type SymbolizedSites<'r> = (Vec<&'r Stack>, Vec<Vec<Vec<SymFrame>>>);

/// How [`Frame::BROKEN`] prints (where a frame-pointer chain left the code).
pub const BROKEN_NAME: &str = "[frame pointers end here]";

/// One frame of a symbolized address: a function (maybe inlined into the next frame) at a file
/// and line, or, when the address cannot be named, the module and offset it was recorded as.
///
/// Its [`Display`](fmt::Display) is `function (file:line)`, with ` [inlined]` after a frame
/// inlined into the next one, or the fallback `module+0xOFFSET` (module is the file's base
/// name; an address outside any file prints as the bare `0xADDRESS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymFrame {
    /// The function, demangled (Rust paths without their hash, C++ with its parameter types);
    /// `None` when the address could not be named: the frame is a fallback.
    pub function: Option<String>,
    /// The source file of the line, as the debug information names it (usually absolute).
    pub file: Option<String>,
    /// The line in `file` (from 1): of the address itself in the innermost frame, of the call
    /// to the next inner frame in the others.
    pub line: Option<u32>,
    /// This function was inlined into the next frame of the same address (no call happened).
    pub inlined: bool,
    /// The base name of the module's file; empty for an address outside any file
    /// ([`ModuleId::UNKNOWN`]).
    pub module: String,
    /// The offset in the module's file as recorded (for a frame of a [`Stack`], the return
    /// address's); the absolute address when `module` is empty.
    pub offset: u64,
}

impl SymFrame {
    /// The fallback frame `module+0xOFFSET` of `offset` in `module`.
    pub fn fallback(module: &Module, offset: u64) -> SymFrame {
        SymFrame {
            function: None,
            file: None,
            line: None,
            inlined: false,
            module: basename(&module.path).to_string(),
            offset,
        }
    }

    /// The fallback frame of an address outside any file-backed mapping (a frame of
    /// [`ModuleId::UNKNOWN`]): printed as `0xADDRESS`.
    pub fn unknown(address: u64) -> SymFrame {
        SymFrame {
            function: None,
            file: None,
            line: None,
            inlined: false,
            module: String::new(),
            offset: address,
        }
    }

    /// Whether the frame names a function (else it is a fallback).
    pub fn is_resolved(&self) -> bool {
        self.function.is_some()
    }
}

impl fmt::Display for SymFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.function {
            Some(function) => {
                f.write_str(function)?;
                match (&self.file, self.line) {
                    (Some(file), Some(line)) => write!(f, " ({file}:{line})")?,
                    (Some(file), None) => write!(f, " ({file})")?,
                    _ => {}
                }
                if self.inlined {
                    f.write_str(" [inlined]")?;
                }
                Ok(())
            }
            None if self.module.is_empty() && self.offset == Frame::BROKEN.offset => {
                f.write_str(BROKEN_NAME)
            }
            None if self.module.is_empty() => write!(f, "{:#x}", self.offset),
            None => write!(f, "{}+{:#x}", self.module, self.offset),
        }
    }
}

/// Whether a module's frames can be symbolized, and if not why: checked once per module, when
/// its first frame is symbolized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleStatus {
    /// The file at the module's path is the one recorded: its frames are named where symbols
    /// cover them.
    Usable,
    /// The file cannot be read (deleted or moved since the recording, or not readable by this
    /// user): the I/O error.
    Unreadable(String),
    /// The file is not an ELF file blazesym can read: its error.
    NotElf(String),
    /// The file's build id is not the recorded one: it was rebuilt or replaced since the
    /// recording (`None`: no build id).
    BuildIdMismatch {
        /// The build id recorded with the module.
        recorded: Option<Vec<u8>>,
        /// The build id of the file found at its path.
        found: Option<Vec<u8>>,
    },
    /// The file changed while it was being read: it is not known which version was read.
    Changed,
}

impl fmt::Display for ModuleStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn hex(id: &Option<Vec<u8>>) -> String {
            match id {
                Some(id) => id.iter().map(|b| format!("{b:02x}")).collect(),
                None => "none".to_string(),
            }
        }
        match self {
            ModuleStatus::Usable => f.write_str("symbolized"),
            ModuleStatus::Unreadable(e) => write!(
                f,
                "cannot read the file ({e}): run where the recorded files are at their paths"
            ),
            ModuleStatus::NotElf(e) => write!(f, "not a readable ELF file ({e})"),
            ModuleStatus::BuildIdMismatch { recorded, found } => write!(
                f,
                "build id {} is not the recorded {}: the file was rebuilt or replaced since the \
                 recording; symbolize with the recorded build",
                hex(found),
                hex(recorded)
            ),
            ModuleStatus::Changed => f.write_str("the file changed while it was being read"),
        }
    }
}

/// What a [`Symbolizer`] keeps of one module.
struct ModuleCache {
    status: ModuleStatus,
    /// The file read: the module's path, or its copy in a build-id directory.
    file: String,
    basename: String,
    /// Offset looked up → its frames (with `offset` the looked-up one).
    frames: FxHashMap<u64, Vec<SymFrame>>,
}

/// Symbolizes recorded frames (a module and a file offset) from the files they were recorded
/// in: the function, file and line of each, with the functions inlined there (feature
/// `symbolize`).
///
/// Symbolization happens when a recording is shown, never while recording, and needs nothing
/// but the files: the process may be long gone. It is [blazesym](https://docs.rs/blazesym)'s
/// (the libbpf project's symbolizer: ELF symbols and DWARF, inlined functions, Rust legacy
/// `_ZN…` and v0 `_R…` names side by side, C++ names, split debug information found through
/// debug links and `/usr/lib/debug/.build-id`).
///
/// **Never a wrong name.** A frame whose module cannot be read (deleted, moved), whose file has
/// another build id than the one recorded (rebuilt since), or whose address no symbol covers
/// (a stripped file) is the fallback `module+0xOFFSET` ([`SymFrame::is_resolved`] is false),
/// never an error and never the name of whatever code is now at that offset. A symbol without
/// a size (assembly, some stripped files) names only its own first byte: an address past it may
/// be in the next, unnamed function. [`status`](Self::status) tells why a module's frames are
/// not named. A module recorded without a build id is trusted if its file has none either.
///
/// **Cached per module.** Each file is parsed once (its ELF and DWARF tables stay mapped while
/// the symbolizer lives) and every offset resolved is remembered, so that the many stacks
/// sharing frames cost one lookup per distinct frame.
///
/// ```no_run
/// use memtrack::{stack::Module, symbolize::Symbolizer};
///
/// let mut sym = Symbolizer::new();
/// let libc = Module { path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(), build_id: None };
/// for frame in &sym.symbolize(&libc, &[0x2a1ca])[0] {
///     println!("{frame}"); // e.g. `__libc_start_call_main (…/libc_start_call_main.h:58)`
/// }
/// ```
pub struct Symbolizer {
    blaze: blazesym::symbolize::Symbolizer,
    modules: FxHashMap<Module, ModuleCache>,
    /// Directories of files named by build id (`ab/cdef…`), looked in when the file at a
    /// module's path is not the recorded one.
    build_id_dirs: Vec<PathBuf>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Symbolizer")
            .field("modules", &self.modules.len())
            .finish_non_exhaustive()
    }
}

impl Symbolizer {
    /// A symbolizer with an empty cache: DWARF and ELF symbols, file and line, inlined
    /// functions, demangled names.
    pub fn new() -> Symbolizer {
        let blaze = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            // The file a module's build id was checked against is the one kept: blazesym
            // opens it right after the check (`verify`) and must not re-open a newer file.
            .enable_auto_reload(false)
            .build();
        Symbolizer {
            blaze,
            modules: FxHashMap::default(),
            build_id_dirs: Vec::new(),
        }
    }

    /// Also looks for a module's file in `dir`, laid out as a `.build-id` directory (the file
    /// of build id `abcdef…` at `dir/ab/cdef…`), when the file at the module's path is not the
    /// recorded one (rebuilt since, or gone): `memtrack bench` keeps there a copy of each
    /// executable it recorded, so that its artifacts stay named after the suite is rebuilt.
    /// A copy is used only if its build id is the recorded one.
    #[must_use]
    pub fn with_build_ids(mut self, dir: impl Into<PathBuf>) -> Symbolizer {
        self.build_id_dirs.push(dir.into());
        self
    }

    /// Symbolizes `offsets` (file offsets of instructions) in `module`: one `Vec` per offset,
    /// its inlined frames first (innermost), the function the address is in last; a single
    /// fallback frame where the address cannot be named (see [`Symbolizer`]). Never fails.
    ///
    /// A return address (every frame of a recorded [`Stack`]) belongs to the instruction
    /// before it: symbolize `offset − 1`, or use [`symbolize_stacks`](Self::symbolize_stacks).
    pub fn symbolize(&mut self, module: &Module, offsets: &[u64]) -> Vec<Vec<SymFrame>> {
        let cache = self.resolve(module, offsets);
        offsets
            .iter()
            .map(|off| {
                cache
                    .frames
                    .get(off)
                    .cloned()
                    .unwrap_or_else(|| vec![SymFrame::fallback(module, *off)])
            })
            .collect()
    }

    /// The stacks of `sites` as `reader`'s table holds them (an empty stack for the site of
    /// the allocations without one), each with its frames symbolized as
    /// [`Symbolizer::symbolize_stacks`] does: what `show --top`, the exports and attribution
    /// all start from.
    pub fn symbolize_sites<'r>(
        &mut self,
        reader: &'r Reader,
        sites: &Sites,
    ) -> Result<SymbolizedSites<'r>, FormatError> {
        static NONE: Stack = Stack {
            frames: Vec::new(),
            truncated: false,
        };
        let table = reader.stacks()?;
        let stacks: Vec<&'r Stack> = sites
            .sites
            .iter()
            .map(|s| match s.stack.is_none() {
                true => Ok(&NONE),
                false => reader.stack(s.stack),
            })
            .collect::<Result<_, _>>()?;
        let named = self.symbolize_stacks(&stacks, |id| table.module(id));
        Ok((stacks, named))
    }

    /// Symbolizes recorded stacks, whose modules `module` looks up: per stack, per frame (the
    /// innermost first), its frames as [`symbolize`](Self::symbolize) gives them. The frames are
    /// return addresses: each is looked up at `offset − 1` (the call instruction, not the one
    /// after it, which may be another line or function) but keeps its recorded offset. A frame
    /// of [`ModuleId::UNKNOWN`] or of a module `module` does not know is a fallback.
    ///
    /// Every distinct (module, offset) of all the stacks is looked up once, in one batch per
    /// module: call it with every stack to show rather than stack by stack.
    pub fn symbolize_stacks<'m>(
        &mut self,
        stacks: &[&Stack],
        module: impl Fn(ModuleId) -> Option<&'m Module>,
    ) -> Vec<Vec<Vec<SymFrame>>> {
        let mut wanted: FxHashMap<ModuleId, Vec<u64>> = FxHashMap::default();
        for stack in stacks {
            for fr in &stack.frames {
                if fr.module != ModuleId::UNKNOWN {
                    wanted
                        .entry(fr.module)
                        .or_default()
                        .push(fr.offset.saturating_sub(1));
                }
            }
        }
        for (id, offsets) in wanted {
            if let Some(m) = module(id) {
                self.resolve(m, &offsets);
            }
        }
        // Every frame is resolved now (or its module is not usable): read-only from here.
        type Entry<'a> = Option<(&'a Module, Option<&'a ModuleCache>)>;
        let mut caches: FxHashMap<ModuleId, Entry<'_>> = FxHashMap::default();
        stacks
            .iter()
            .map(|stack| {
                stack
                    .frames
                    .iter()
                    .map(|fr| {
                        if fr.module == ModuleId::UNKNOWN {
                            return vec![SymFrame::unknown(fr.offset)];
                        }
                        let cache = *caches
                            .entry(fr.module)
                            .or_insert_with(|| module(fr.module).map(|m| (m, self.modules.get(m))));
                        let Some((m, cache)) = cache else {
                            return vec![SymFrame {
                                module: format!("[module {}]", fr.module.0),
                                ..SymFrame::unknown(fr.offset)
                            }];
                        };
                        match cache.and_then(|c| c.frames.get(&fr.offset.saturating_sub(1))) {
                            Some(frames) => frames
                                .iter()
                                .map(|f| SymFrame {
                                    offset: fr.offset,
                                    ..f.clone()
                                })
                                .collect(),
                            None => vec![SymFrame::fallback(m, fr.offset)],
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Whether `module`'s frames can be named, and if not why (checked and cached here if no
    /// frame of it was symbolized yet).
    pub fn status(&mut self, module: &Module) -> &ModuleStatus {
        &self.resolve(module, &[]).status
    }

    /// The cache of `module` with every offset of `offsets` resolved into it.
    fn resolve(&mut self, module: &Module, offsets: &[u64]) -> &ModuleCache {
        if !self.modules.contains_key(module) {
            let (status, file) = self.locate(module);
            self.modules.insert(
                module.clone(),
                ModuleCache {
                    status,
                    file,
                    basename: basename(&module.path).to_string(),
                    frames: FxHashMap::default(),
                },
            );
        }
        let cache = self.modules.get_mut(module).expect("inserted above");
        if cache.status != ModuleStatus::Usable {
            return cache;
        }
        let mut missing: Vec<u64> = offsets
            .iter()
            .copied()
            .filter(|o| !cache.frames.contains_key(o))
            .collect();
        if missing.is_empty() {
            return cache;
        }
        missing.sort_unstable();
        missing.dedup();
        let before = stat(&cache.file);
        if !std::fs::metadata(&cache.file).is_ok_and(|m| m.is_file()) {
            // Replaced since `verify` by something blazesym must not open (a FIFO).
            cache.status = ModuleStatus::Changed;
            return cache;
        }
        let src = Source::Elf(Elf::new(&cache.file));
        // An error of the whole batch (the file vanished since `verify`) leaves every offset a
        // fallback; per-address errors come back as `Symbolized::Unknown`.
        let results = self
            .blaze
            .symbolize(&src, Input::FileOffset(&missing))
            .unwrap_or_default();
        if cache.frames.is_empty() && before != stat(&cache.file) {
            // The first read of the file (blazesym keeps what it read now) may not be of the
            // file whose build id `verify` checked.
            cache.status = ModuleStatus::Changed;
            return cache;
        }
        for (i, off) in missing.iter().enumerate() {
            let frames = match results.get(i) {
                Some(Symbolized::Sym(sym)) => frames(sym, &cache.basename, *off),
                _ => None,
            };
            let frames = frames.unwrap_or_else(|| vec![SymFrame::fallback(module, *off)]);
            cache.frames.insert(*off, frames);
        }
        cache
    }
}

impl Symbolizer {
    /// The file to read `module` from and its status: the file at its path when it is the
    /// recorded one, else a copy of the recorded build in a build-id directory, else the path's
    /// status.
    fn locate(&self, module: &Module) -> (ModuleStatus, String) {
        let status = verify(module);
        if status == ModuleStatus::Usable {
            return (status, module.path.clone());
        }
        let Some(id) = module.build_id.as_deref().filter(|id| id.len() > 1) else {
            return (status, module.path.clone());
        };
        let id = hex(id);
        for dir in &self.build_id_dirs {
            let copy = dir.join(&id[..2]).join(&id[2..]);
            let Some(copy) = copy.to_str() else { continue };
            let candidate = Module {
                path: copy.to_string(),
                build_id: module.build_id.clone(),
            };
            if verify(&candidate) == ModuleStatus::Usable {
                return (ModuleStatus::Usable, candidate.path);
            }
        }
        (status, module.path.clone())
    }
}

/// The frames of a resolved symbol, innermost first; `None` when the name cannot be trusted.
fn frames(sym: &Sym<'_>, module: &str, offset: u64) -> Option<Vec<SymFrame>> {
    if sym.size.is_none() && sym.offset != 0 {
        // A sizeless ELF symbol that blazesym extends up to the next symbol: the address may be
        // in an unnamed function after it (stripped code, hand-written assembly).
        return None;
    }
    let frame = |name: &str, code: Option<&CodeInfo<'_>>, inlined: bool| SymFrame {
        function: Some(name.to_string()),
        file: code.map(|c| c.to_path().to_string_lossy().into_owned()),
        line: code.and_then(|c| c.line),
        inlined,
        module: module.to_string(),
        offset,
    };
    // blazesym lists the inlined functions outermost first, each with the line *in it* of the
    // next one's call; `sym.code_info` is the line in the outer function.
    let mut out: Vec<SymFrame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| frame(&f.name, f.code_info.as_ref(), true))
        .collect();
    out.push(frame(&sym.name, sym.code_info.as_deref(), false));
    Some(out)
}

/// Whether the file at `module.path` is the one recorded, by its build id.
fn verify(module: &Module) -> ModuleStatus {
    if let Err(e) = open_regular(Path::new(&module.path)) {
        return ModuleStatus::Unreadable(e);
    }
    match blazesym::helper::read_elf_build_id(Path::new(&module.path)) {
        Err(e) => ModuleStatus::NotElf(e.to_string()),
        Ok(found) => {
            let found = found.map(|id| id.into_owned());
            if found == module.build_id {
                ModuleStatus::Usable
            } else {
                ModuleStatus::BuildIdMismatch {
                    recorded: module.build_id.clone(),
                    found,
                }
            }
        }
    }
}

/// Opens `path` if it is a regular file. An artifact names its modules' paths, and an artifact
/// may come from anyone: a FIFO there would hang the reader, a terminal or a device (as root,
/// `/dev/watchdog`) would be acted on by the mere open. So the path is examined first without
/// opening it, then opened without blocking and without becoming a controlling terminal, and
/// what was opened examined again (the name may have been swapped in between).
fn open_regular(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let kind = |t: std::fs::FileType| {
        if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        }
    };
    let not_regular = |t| format!("{} is {}, not a regular file", path.display(), kind(t));
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    Ok(file)
}

/// The identity of the file at `path` (device, inode, size, modification time), to notice a
/// file replaced or rewritten between two reads.
fn stat(path: &str) -> Option<(u64, u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// One frame of a [`SiteKey`]: what identifies it across two builds of a program.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KeyFrame {
    /// A named frame: its function and source file, never its line or address (an edit that
    /// moves code does not change them).
    Function {
        /// The demangled function.
        function: String,
        /// Its source file, if the debug information names one.
        file: Option<String>,
    },
    /// A frame that could not be named, in a module with a build id: the same offset in the
    /// same build is the same code.
    Offset {
        /// The module's file base name.
        module: String,
        /// Its build id, in hex.
        build_id: String,
        /// The file offset (the return address).
        offset: u64,
    },
    /// A frame that could not be named and whose code cannot be identified across recordings
    /// (no build id, or outside any file): it matches nothing in another recording.
    Unmatched {
        /// The recording it is of ([`site_keys`]'s `recording`).
        recording: u32,
        /// The module's file base name (empty outside any file).
        module: String,
        /// The file offset, or the absolute address outside any file.
        offset: u64,
    },
}

impl fmt::Display for KeyFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFrame::Function {
                function,
                file: Some(file),
            } => write!(f, "{function} ({})", basename(file)),
            KeyFrame::Function {
                function,
                file: None,
            } => f.write_str(function),
            KeyFrame::Offset { module, offset, .. } => write!(f, "{module}+{offset:#x}"),
            KeyFrame::Unmatched { module, offset, .. } if module.is_empty() => {
                write!(f, "{offset:#x} (unmatched)")
            }
            KeyFrame::Unmatched { module, offset, .. } => {
                write!(f, "{module}+{offset:#x} (unmatched)")
            }
        }
    }
}

/// A call site's identity across recordings of two builds: its frames, innermost first
/// (inlined functions as frames of their own), as [`KeyFrame`]s. Empty for the allocations
/// without a stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct SiteKey(pub Vec<KeyFrame>);

impl SiteKey {
    /// Whether some frame matches nothing in another recording.
    pub fn is_unmatched(&self) -> bool {
        self.0
            .iter()
            .any(|f| matches!(f, KeyFrame::Unmatched { .. }))
    }
}

impl fmt::Display for SiteKey {
    /// The frames, innermost first, joined by ` ← `; `[no stack]` when there are none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("[no stack]");
        }
        for (i, fr) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ← ")?;
            }
            write!(f, "{fr}")?;
        }
        Ok(())
    }
}

/// The sites of one recording keyed for [`attribute`](crate::analysis::attribute): [`site_keys`]'s result.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct KeyedSites {
    /// Every site with its key.
    pub sites: Vec<(SiteKey, Site)>,
    /// How many of them have a frame that matches nothing in another recording.
    pub unmatched: usize,
    /// The modules whose frames could not be named, with why (the path and the reason).
    pub unnamed_modules: Vec<(String, String)>,
}

/// Keys every site of `sites` (the recording `reader` reads) by its symbolized frames, so that
/// sites of two builds match by function and file (see [`KeyFrame`]). `recording` tells the
/// recordings apart in the frames that cannot be matched: give each recording compared its
/// own number. A stack the reader's tables do not define is an error (a corrupt artifact).
pub fn site_keys(
    sym: &mut Symbolizer,
    reader: &Reader,
    sites: &Sites,
    recording: u32,
) -> Result<KeyedSites, FormatError> {
    let mut out = KeyedSites::default();
    if !sites.has_stacks() {
        out.sites = sites
            .sites
            .iter()
            .map(|s| (SiteKey::default(), *s))
            .collect();
        return Ok(out);
    }
    let table = reader.stacks()?;
    let (stacks, named) = sym.symbolize_sites(reader, sites)?;
    let mut modules: Vec<ModuleId> = Vec::new();
    for ((site, stack), frames) in sites.sites.iter().zip(&stacks).zip(named) {
        let mut key = Vec::new();
        for (recorded, syms) in stack.frames.iter().zip(frames) {
            let module = table.module(recorded.module);
            for s in syms {
                key.push(match (&s.function, module) {
                    (Some(function), _) => KeyFrame::Function {
                        function: function.clone(),
                        file: s.file.clone(),
                    },
                    (None, Some(m)) if m.build_id.is_some() => KeyFrame::Offset {
                        module: s.module.clone(),
                        build_id: hex(m.build_id.as_deref().unwrap_or_default()),
                        offset: recorded.offset,
                    },
                    (None, _) => KeyFrame::Unmatched {
                        recording,
                        module: s.module.clone(),
                        offset: recorded.offset,
                    },
                });
            }
            modules.push(recorded.module);
        }
        let key = SiteKey(key);
        if key.is_unmatched() {
            out.unmatched += 1;
        }
        out.sites.push((key, *site));
    }
    modules.sort();
    modules.dedup();
    for m in modules.into_iter().filter_map(|id| table.module(id)) {
        let status = sym.status(m);
        if *status != ModuleStatus::Usable {
            out.unnamed_modules
                .push((m.path.clone(), status.to_string()));
        }
    }
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The call sites of two recordings (a base and a head, e.g. two builds of one benchmark)
/// keyed by [`site_keys`] so that they match across builds: what regression attribution
/// ([`SiteComparison::attribution`], `memtrack compare`) and `memtrack flamegraph --diff` both
/// start from, so that they match sites the same way.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct SiteComparison {
    /// The base's sites, keyed ([`site_keys`]'s recording 0).
    pub base: KeyedSites,
    /// The head's sites, keyed (recording 1).
    pub head: KeyedSites,
}

impl SiteComparison {
    /// Keys the sites of both recordings (`base_sites` of the recording `base` reads, and the
    /// head's likewise) with one symbolizer: [`site_keys`] with recording 0 for the base and 1
    /// for the head. A stack a reader's tables do not define is an error (a corrupt artifact).
    pub fn new(
        sym: &mut Symbolizer,
        base: &Reader,
        base_sites: &Sites,
        head: &Reader,
        head_sites: &Sites,
    ) -> Result<SiteComparison, FormatError> {
        Ok(SiteComparison {
            base: site_keys(sym, base, base_sites, 0)?,
            head: site_keys(sym, head, head_sites, 1)?,
        })
    }

    /// The sites ranked by their contribution to the change of `metric` from the base to the
    /// head ([`attribute`](crate::analysis::attribute) of the keyed sites): base, head and delta of
    /// each, new and vanished sites included.
    pub fn attribution(&self, metric: Metric) -> Attribution<SiteKey> {
        crate::analysis::attribute(metric, &self.base.sites, &self.head.sites)
    }

    /// The modules of either side whose frames could not be named (path, why), each once.
    pub fn unnamed_modules(&self) -> Vec<(String, String)> {
        let mut out = self.base.unnamed_modules.clone();
        for m in &self.head.unnamed_modules {
            if !out.contains(m) {
                out.push(m.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file offset of `addr` in this process's executable, from `/proc/self/maps`.
    fn exe_offset(addr: u64) -> u64 {
        let exe = std::env::current_exe().unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (range, off) = (f[0], u64::from_str_radix(f[2], 16).unwrap());
            let (lo, hi) = range.split_once('-').unwrap();
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).unwrap(),
                u64::from_str_radix(hi, 16).unwrap(),
            );
            if (lo..hi).contains(&addr) && f.get(5).is_some_and(|p| Path::new(p) == exe) {
                return addr - lo + off;
            }
        }
        panic!("{addr:#x} is in no mapping of {}", exe.display());
    }

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    /// A module whose file is gone is read from a build-id directory holding a copy of the
    /// recorded build, and only from a copy whose build id is the recorded one.
    #[test]
    fn a_module_gone_from_its_path_is_read_from_a_build_id_directory() {
        let exe = std::env::current_exe().unwrap();
        let id = blazesym::helper::read_elf_build_id(&exe)
            .unwrap()
            .expect("test binaries have a build id")
            .into_owned();
        let gone = Module {
            path: "/nonexistent/memtrack-test-exe".into(),
            build_id: Some(id.clone()),
        };
        let store = tempfile::tempdir().unwrap();
        let hexed = hex(&id);
        let copy = store.path().join(&hexed[..2]).join(&hexed[2..]);
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        let offset = exe_offset(a_function_to_find as *const () as usize as u64);
        assert_eq!(a_function_to_find(), 7);

        // Another file under the recorded build's name is not used.
        std::fs::write(&copy, b"not the recorded build").unwrap();
        let mut sym = Symbolizer::new().with_build_ids(store.path());
        assert!(matches!(sym.status(&gone), ModuleStatus::Unreadable(_)));

        std::fs::copy(&exe, &copy).unwrap();
        let mut plain = Symbolizer::new();
        assert!(matches!(plain.status(&gone), ModuleStatus::Unreadable(_)));
        assert!(!plain.symbolize(&gone, &[offset])[0][0].is_resolved());
        let mut sym = Symbolizer::new().with_build_ids(store.path());
        assert_eq!(sym.status(&gone), &ModuleStatus::Usable);
        let frames = &sym.symbolize(&gone, &[offset])[0];
        let outer = frames.last().unwrap();
        assert!(
            outer
                .function
                .as_deref()
                .is_some_and(|f| f.ends_with("a_function_to_find")),
            "{frames:?}"
        );
        assert_eq!(outer.module, "memtrack-test-exe");
    }

    /// A module whose path is a FIFO (or a terminal, a device) is never opened for reading: it
    /// is unreadable, named as what it is, and symbolizing its frames returns at once.
    #[test]
    fn a_module_that_is_not_a_regular_file_is_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.to_str().unwrap().to_string();
        std::thread::spawn(move || {
            for path in [path.as_str(), "/dev/null"] {
                let m = Module {
                    path: path.to_string(),
                    build_id: None,
                };
                let mut sym = Symbolizer::new();
                let status = sym.status(&m).clone();
                let frames = sym.symbolize(&m, &[0x1000]);
                tx.send((status, frames[0][0].is_resolved())).unwrap();
            }
        });
        let wait = std::time::Duration::from_secs(20);
        for (path, kind) in [
            (fifo.to_str().unwrap(), "a FIFO"),
            ("/dev/null", "a character device"),
        ] {
            let (status, resolved) = rx.recv_timeout(wait).expect("symbolizing hung");
            assert_eq!(
                status,
                ModuleStatus::Unreadable(format!("{path} is {kind}, not a regular file"))
            );
            assert!(!resolved);
        }
    }

    /// A frame outside any file prints as its address, except the broken chain's marker.
    #[test]
    fn unknown_frames_print_as_addresses_or_the_broken_chain() {
        assert_eq!(SymFrame::unknown(0x7f00_1234).to_string(), "0x7f001234");
        assert_eq!(
            SymFrame::unknown(Frame::BROKEN.offset).to_string(),
            BROKEN_NAME
        );
    }
}
