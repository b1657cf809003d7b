//! ELF64 files through the `object` crate: function symbols and the virtual-address → file-offset
//! mapping uprobes need. The file is memory-mapped, so only the pages that are read (headers,
//! symbol and string tables, the first bytes of probed functions) are touched. Untrusted input
//! never panics: `object` bounds-checks every header and table against the bytes.

use std::ops::Deref;
use std::path::{Path, PathBuf};

use object::LittleEndian;
use object::elf::{
    FileHeader64, NT_GNU_BUILD_ID, PT_LOAD, PT_NOTE, SHT_DYNSYM, SHT_SYMTAB, STT_FUNC,
};
use object::read::elf::{FileHeader, ProgramHeader, SectionTable, Sym, SymbolTable};

use crate::{Error, Result};

/// Little-endian only: `endian()` refuses a big-endian file.
type Header = FileHeader64<LittleEndian>;

/// A defined function symbol of an ELF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfSymbol<'a> {
    /// The symbol's name (mangled for C++; no `@VERSION`: versions live in `.gnu.version`).
    pub name: &'a str,
    /// Its virtual address in the file's own address space (`st_value`).
    pub vaddr: u64,
    /// Its size in bytes (`st_size`; 0 if unknown).
    pub size: u64,
}

/// The bytes of an ELF file: mapped from disk, or handed over by the caller.
#[derive(Debug)]
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A little-endian ELF64 file, validated once, its loadable segments read.
#[derive(Debug)]
pub struct Elf {
    path: PathBuf,
    data: Bytes,
    /// (vaddr, file offset, file size) of each PT_LOAD segment.
    loads: Vec<(u64, u64, u64)>,
}

/// The parsed views `Elf` re-derives from its bytes on demand (cheap: the header and the
/// section header table; `object`'s tables borrow the bytes, so they cannot live in `Elf`).
struct Parsed<'a> {
    endian: LittleEndian,
    sections: SectionTable<'a, Header, &'a [u8]>,
}

fn parse(data: &[u8]) -> object::read::Result<Parsed<'_>> {
    let header = Header::parse(data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, data)?;
    Ok(Parsed { endian, sections })
}

impl Elf {
    /// Maps the file at `path` and validates it. Nothing but the headers is read here; the
    /// symbol tables are read by [`Elf::functions`] (a release binary with line tables is tens
    /// of MB, its symbol tables a few: reading it whole would slow a cold session's start).
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let data = if len == 0 {
            // mmap refuses an empty mapping; an empty file is reported as not ELF below.
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is private and read-only. Were the file truncated while
            // mapped, reading past its new end would raise SIGBUS; memtrack maps libraries
            // and executables the target process itself has mapped and is running, which
            // are replaced by a rename (a new inode), never truncated in place.
            Bytes::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::from_bytes(path, data)
    }

    /// Parses `data` (the contents of `path`, which is only used in errors).
    pub fn parse(path: &Path, data: Vec<u8>) -> Result<Self> {
        Self::from_bytes(path, Bytes::Owned(data))
    }

    fn from_bytes(path: &Path, data: Bytes) -> Result<Self> {
        let bad = |e: object::read::Error| Error::BadElf {
            path: path.to_owned(),
            what: e.to_string(),
        };
        let bytes: &[u8] = &data;
        let p = parse(bytes).map_err(bad)?;
        // Check the symbol tables once, so that `functions` can treat a failure as impossible.
        for ty in [SHT_SYMTAB, SHT_DYNSYM] {
            p.sections.symbols(p.endian, bytes, ty).map_err(bad)?;
        }
        let header = Header::parse(bytes).map_err(bad)?;
        let loads = header
            .program_headers(p.endian, bytes)
            .map_err(bad)?
            .iter()
            .filter(|ph| ph.p_type(p.endian) == PT_LOAD)
            .map(|ph| {
                (
                    ph.p_vaddr(p.endian),
                    ph.p_offset(p.endian),
                    ph.p_filesz(p.endian),
                )
            })
            .collect();
        Ok(Self {
            path: path.to_owned(),
            data,
            loads,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every defined function symbol of `.symtab` and `.dynsym` (a name may appear in both).
    /// GNU indirect functions are left out: their address is the resolver's, not the code's.
    pub fn functions(&self) -> impl Iterator<Item = ElfSymbol<'_>> + '_ {
        let data: &[u8] = &self.data;
        // Validated in `from_bytes`: these do not fail.
        let tables: Vec<(LittleEndian, SymbolTable<'_, Header, &[u8]>)> = parse(data)
            .into_iter()
            .flat_map(|p| {
                [SHT_SYMTAB, SHT_DYNSYM].map(|ty| {
                    (
                        p.endian,
                        p.sections.symbols(p.endian, data, ty).unwrap_or_default(),
                    )
                })
            })
            .collect();
        tables.into_iter().flat_map(|(endian, table)| {
            let strings = table.strings();
            table.symbols().iter().filter_map(move |s| {
                let vaddr = s.st_value(endian);
                if s.st_type() != STT_FUNC || s.is_undefined(endian) || vaddr == 0 {
                    return None;
                }
                let name = std::str::from_utf8(s.name(endian, strings).ok()?).ok()?;
                Some(ElfSymbol {
                    name,
                    vaddr,
                    size: s.st_size(endian),
                })
            })
        })
    }

    /// The file offset of virtual address `vaddr` (what a uprobe is attached at), if a
    /// loadable segment holds it in the file.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.loads.iter().find_map(|&(seg_vaddr, seg_off, filesz)| {
            let delta = vaddr.checked_sub(seg_vaddr)?;
            (delta < filesz).then(|| seg_off + delta)
        })
    }

    /// The GNU build id (the `NT_GNU_BUILD_ID` note of a `PT_NOTE` segment: what the loader
    /// maps, so a stripped file has it too), if the file has one.
    pub fn build_id(&self) -> Option<&[u8]> {
        let bytes: &[u8] = &self.data;
        let header = Header::parse(bytes).ok()?;
        let endian = header.endian().ok()?;
        for ph in header.program_headers(endian, bytes).ok()? {
            if ph.p_type(endian) != PT_NOTE {
                continue;
            }
            let Ok(Some(mut notes)) = ph.notes(endian, bytes) else {
                continue;
            };
            while let Ok(Some(note)) = notes.next() {
                if note.name() == b"GNU" && note.n_type(endian) == NT_GNU_BUILD_ID {
                    return Some(note.desc());
                }
            }
        }
        None
    }

    /// Up to `len` bytes of the file from `offset` (fewer at the end of the file).
    pub fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.data.len());
        let end = start.saturating_add(len).min(self.data.len());
        &self.data[start..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage_without_panicking() {
        let p = Path::new("x");
        assert!(Elf::parse(p, vec![]).is_err());
        assert!(Elf::parse(p, b"\x7fELF\x02\x01".to_vec()).is_err());
        let mut hdr = vec![0u8; 64];
        hdr[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        hdr[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff
        hdr[0x3a] = 64; // e_shentsize
        hdr[0x3c] = 1; // e_shnum
        let err = Elf::parse(p, hdr).unwrap_err().to_string();
        assert!(
            err.starts_with("x: not a valid little-endian ELF64 file: "),
            "{err}"
        );
        // A 32-bit ELF file.
        let mut hdr = vec![0u8; 52];
        hdr[..7].copy_from_slice(b"\x7fELF\x01\x01\x01");
        assert!(Elf::parse(p, hdr).is_err());
        // An empty file on disk.
        let empty = std::env::temp_dir().join(format!("memtrack-bpf-empty-{}", std::process::id()));
        std::fs::write(&empty, b"").unwrap();
        let r = Elf::open(&empty);
        std::fs::remove_file(&empty).unwrap();
        assert!(matches!(r, Err(Error::BadElf { .. })), "{r:?}");
    }

    #[test]
    fn finds_its_own_main() {
        let exe = std::env::current_exe().unwrap();
        let elf = Elf::open(&exe).unwrap();
        let main = elf
            .functions()
            .find(|s| s.name == "main")
            .expect("main in .symtab");
        let off = elf
            .file_offset(main.vaddr)
            .expect("main is in a PT_LOAD segment");
        assert!(!elf.bytes(off, 16).is_empty());
        // The mapping gives the same symbols and code bytes as reading the whole file.
        let whole = Elf::parse(&exe, std::fs::read(&exe).unwrap()).unwrap();
        assert!(elf.functions().eq(whole.functions()));
        assert_eq!(elf.bytes(off, 64), whole.bytes(off, 64));
    }

    #[test]
    fn reads_the_gnu_build_id_note() {
        // rustc links test binaries with --build-id (20 bytes, SHA-1); `file` and `readelf -n`
        // read the same note.
        let exe = std::env::current_exe().unwrap();
        let elf = Elf::open(&exe).unwrap();
        let id = elf.build_id().expect("a build id");
        assert_eq!(id.len(), 20);
        let out = std::process::Command::new("readelf")
            .args(["-n"])
            .arg(&exe)
            .output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout);
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            assert!(text.contains(&hex), "readelf -n: {text}");
        }
    }
}
