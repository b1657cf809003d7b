//! A minimal, bounds-checked reader of little-endian ELF64 files: function symbols and the
//! virtual-address → file-offset mapping uprobes need. Untrusted input never panics.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const PT_LOAD: u32 = 1;
const SYM_SIZE: usize = 24;

/// A defined function symbol of an ELF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSymbol {
    /// The symbol's name (mangled for C++).
    pub name: String,
    /// Its virtual address in the file's own address space (`st_value`).
    pub vaddr: u64,
    /// Its size in bytes (`st_size`; 0 if unknown).
    pub size: u64,
}

/// An ELF64 little-endian file: its headers and symbol tables held in memory.
#[derive(Debug)]
pub struct Elf {
    path: PathBuf,
    /// The file's bytes. From [`Elf::open`], only the headers and symbol and string tables
    /// are read (the rest is zero pages, never touched); [`Elf::bytes`] reads the file.
    data: Vec<u8>,
    /// The file, when `data` holds only part of it.
    file: Option<std::fs::File>,
    /// (vaddr, file offset, file size) of each PT_LOAD segment.
    loads: Vec<(u64, u64, u64)>,
    /// (symbol table offset, size, string table offset, string table size).
    symtabs: Vec<(usize, usize, usize, usize)>,
}

fn u16_at(d: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(o..o.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(d: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}

impl Elf {
    /// Reads and parses the file at `path`: only its headers and symbol and string tables,
    /// not the whole file (reading all 36 MB of a release binary with line tables took 23–78 ms
    /// of a cold eBPF session's start here; its tables are a few MB).
    pub fn open(path: &Path) -> Result<Self> {
        use std::os::unix::fs::FileExt;
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = usize::try_from(file.metadata().map_err(io)?.len()).unwrap_or(usize::MAX);
        // Zeroed with calloc: a large block is fresh zero pages, so what is not read below
        // costs neither time nor memory.
        let mut data = vec![0u8; len];
        // Fills data[off..off + n] (clamped to the file) from the file; `parse` then checks
        // every range as if the whole file had been read.
        let fill = |data: &mut Vec<u8>, off: usize, n: usize| -> Result<()> {
            let end = off.saturating_add(n).min(len);
            if off < end {
                file.read_exact_at(&mut data[off..end], off as u64)
                    .map_err(io)?;
            }
            Ok(())
        };
        fill(&mut data, 0, 64)?;
        let (phoff, shoff) = (u64_at(&data, 0x20), u64_at(&data, 0x28));
        let (phentsize, phnum) = (u16_at(&data, 0x36), u16_at(&data, 0x38));
        let (shentsize, shnum) = (u16_at(&data, 0x3a), u16_at(&data, 0x3c));
        if let (Some(off), Some(es), Some(n)) = (phoff, phentsize, phnum) {
            fill(&mut data, off as usize, usize::from(es) * usize::from(n))?;
        }
        if let (Some(off), Some(es), Some(n)) = (shoff, shentsize, shnum) {
            let (off, es) = (off as usize, usize::from(es));
            fill(&mut data, off, es * usize::from(n))?;
            let section = |data: &[u8], i: usize| {
                let o = off.checked_add(i.checked_mul(es)?)?;
                Some((
                    u32_at(data, o.checked_add(4)?)?,
                    u64_at(data, o.checked_add(24)?)? as usize,
                    u64_at(data, o.checked_add(32)?)? as usize,
                    u32_at(data, o.checked_add(40)?)? as usize,
                ))
            };
            for i in 0..usize::from(n) {
                let Some((ty, t_off, t_size, link)) = section(&data, i) else {
                    break;
                };
                if ty != SHT_SYMTAB && ty != SHT_DYNSYM {
                    continue;
                }
                fill(&mut data, t_off, t_size)?;
                if let Some((_, s_off, s_size, _)) = section(&data, link) {
                    fill(&mut data, s_off, s_size)?;
                }
            }
        }
        let mut elf = Self::parse(path, data)?;
        elf.file = Some(file);
        Ok(elf)
    }

    /// Parses `data` (the contents of `path`, which is only used in errors).
    pub fn parse(path: &Path, data: Vec<u8>) -> Result<Self> {
        let bad = |what| Error::BadElf {
            path: path.to_owned(),
            what,
        };
        if data.get(0..4) != Some(b"\x7fELF") {
            return Err(bad("no ELF magic"));
        }
        if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
            return Err(bad("not ELF64 little-endian"));
        }
        let phoff = u64_at(&data, 0x20).ok_or(bad("truncated header"))? as usize;
        let shoff = u64_at(&data, 0x28).ok_or(bad("truncated header"))? as usize;
        let phentsize = u16_at(&data, 0x36).ok_or(bad("truncated header"))? as usize;
        let phnum = u16_at(&data, 0x38).ok_or(bad("truncated header"))? as usize;
        let shentsize = u16_at(&data, 0x3a).ok_or(bad("truncated header"))? as usize;
        let shnum = u16_at(&data, 0x3c).ok_or(bad("truncated header"))? as usize;

        let mut loads = Vec::new();
        if phnum > 0 && phentsize < 56 {
            return Err(bad("program header entries too small"));
        }
        for i in 0..phnum {
            let o = i
                .checked_mul(phentsize)
                .and_then(|x| x.checked_add(phoff))
                .ok_or(bad("program header offset overflows"))?;
            let ty = u32_at(&data, o).ok_or(bad("program header outside the file"))?;
            if ty != PT_LOAD {
                continue;
            }
            let get = |f| {
                u64_at(&data, o.saturating_add(f)).ok_or(bad("program header outside the file"))
            };
            loads.push((get(16)?, get(8)?, get(32)?));
        }

        let mut symtabs = Vec::new();
        if shnum > 0 && shentsize < 64 {
            return Err(bad("section header entries too small"));
        }
        let section = |i: usize| -> Result<(u32, usize, usize, u32)> {
            let o = i
                .checked_mul(shentsize)
                .and_then(|x| x.checked_add(shoff))
                .ok_or(bad("section header offset overflows"))?;
            let ty =
                u32_at(&data, o.saturating_add(4)).ok_or(bad("section header outside the file"))?;
            let off = u64_at(&data, o.saturating_add(24))
                .ok_or(bad("section header outside the file"))?;
            let size = u64_at(&data, o.saturating_add(32))
                .ok_or(bad("section header outside the file"))?;
            let link = u32_at(&data, o.saturating_add(40))
                .ok_or(bad("section header outside the file"))?;
            Ok((ty, off as usize, size as usize, link))
        };
        for i in 0..shnum {
            let (ty, off, size, link) = section(i)?;
            if ty != SHT_SYMTAB && ty != SHT_DYNSYM {
                continue;
            }
            let (_, str_off, str_size, _) = section(link as usize)?;
            let in_file = |o: usize, s: usize| o.checked_add(s).is_some_and(|e| e <= data.len());
            if !in_file(off, size) || !in_file(str_off, str_size) {
                return Err(bad("symbol table outside the file"));
            }
            symtabs.push((off, size, str_off, str_size));
        }
        Ok(Self {
            path: path.to_owned(),
            data,
            file: None,
            loads,
            symtabs,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every defined function symbol of `.symtab` and `.dynsym` (a name may appear in both).
    /// GNU indirect functions are left out: their address is the resolver's, not the code's.
    pub fn functions(&self) -> impl Iterator<Item = ElfSymbol> + '_ {
        self.symtabs
            .iter()
            .flat_map(move |&(off, size, str_off, str_size)| {
                let table = &self.data[off..off + size];
                let strings = &self.data[str_off..str_off + str_size];
                table.chunks_exact(SYM_SIZE).filter_map(move |s| {
                    let info = s[4];
                    let shndx = u16_at(s, 6)?;
                    let vaddr = u64_at(s, 8)?;
                    if info & 0xf != STT_FUNC || shndx == 0 || vaddr == 0 {
                        return None;
                    }
                    let name_off = u32_at(s, 0)? as usize;
                    let rest = strings.get(name_off..)?;
                    let end = rest.iter().position(|&b| b == 0)?;
                    let name = std::str::from_utf8(&rest[..end]).ok()?.to_owned();
                    Some(ElfSymbol {
                        name,
                        vaddr,
                        size: u64_at(s, 16)?,
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

    /// Up to `len` bytes of the file from `offset` (fewer at the end of the file, none if the
    /// file cannot be read there any more).
    pub fn bytes(&self, offset: u64, len: usize) -> std::borrow::Cow<'_, [u8]> {
        let start = (offset as usize).min(self.data.len());
        let end = start.saturating_add(len).min(self.data.len());
        match &self.file {
            None => std::borrow::Cow::Borrowed(&self.data[start..end]),
            Some(f) => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; end - start];
                let mut got = 0;
                while got < buf.len() {
                    match f.read_at(&mut buf[got..], (start + got) as u64) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                buf.truncate(got);
                std::borrow::Cow::Owned(buf)
            }
        }
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
        hdr[..6].copy_from_slice(b"\x7fELF\x02\x01");
        hdr[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff
        hdr[0x3a] = 64; // e_shentsize
        hdr[0x3c] = 1; // e_shnum
        assert!(Elf::parse(p, hdr).is_err());
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
        // The partial read gives the same symbols and code bytes as reading the whole file.
        let whole = Elf::parse(&exe, std::fs::read(&exe).unwrap()).unwrap();
        assert!(elf.functions().eq(whole.functions()));
        assert_eq!(elf.bytes(off, 64), whole.bytes(off, 64));
    }
}
