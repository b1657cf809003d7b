//! Where a function keeps its return address, from its module's call frame information
//! (`.eh_frame`, which stripped libraries keep too): for a thread blocked in a library built
//! without frame pointers (glibc), the BPF program sends the words above the stack pointer
//! that point into the same code (`scan_words` in memtrack.bpf.c), and only the word in the
//! slot the unwind info names is the caller; the others are stale words of earlier calls.

use std::ops::Range;

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, NativeEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use object::{Object, ObjectSection, ObjectSegment};
use rustc_hash::FxHashMap;

/// One module's `.eh_frame` (and its search table), and how its file maps to addresses.
struct Cfi {
    data: Vec<u8>,
    /// The section's address and its bytes in `data`.
    eh_frame: (u64, Range<usize>),
    eh_frame_hdr: Option<(u64, Range<usize>)>,
    /// Loaded segments: (file offset, address, size in the file).
    segments: Vec<(u64, u64, u64)>,
}

impl Cfi {
    fn load(path: &str) -> Option<Cfi> {
        let data = std::fs::read(path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let section = |name: &str| {
            let s = file.section_by_name(name)?;
            let (off, size) = s.file_range()?;
            Some((s.address(), off as usize..(off + size) as usize))
        };
        let eh_frame = section(".eh_frame")?;
        let eh_frame_hdr = section(".eh_frame_hdr");
        let segments = file
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (off, s.address(), size)
            })
            .collect();
        drop(file);
        Some(Cfi {
            data,
            eh_frame,
            eh_frame_hdr,
            segments,
        })
    }

    /// The slot, in 8-byte words above the stack pointer, of the return address of the
    /// function executing at file offset `offset`, when its frame is found from the stack
    /// pointer (CFA = rsp + a constant, the return address saved at an offset from it).
    fn return_slot(&self, offset: u64) -> Option<u64> {
        let address = self
            .segments
            .iter()
            .find(|&&(off, _, size)| off <= offset && offset < off + size)
            .map(|&(off, addr, _)| offset - off + addr)?;
        let eh_frame = EhFrame::new(&self.data[self.eh_frame.1.clone()], NativeEndian);
        let mut bases = BaseAddresses::default().set_eh_frame(self.eh_frame.0);
        let mut ctx = Box::new(UnwindContext::new());
        let row = match &self.eh_frame_hdr {
            Some((addr, range)) => {
                bases = bases.set_eh_frame_hdr(*addr);
                let hdr = EhFrameHdr::new(&self.data[range.clone()], NativeEndian)
                    .parse(&bases, 8)
                    .ok()?;
                match hdr.table() {
                    Some(table) => table
                        .unwind_info_for_address(
                            &eh_frame,
                            &bases,
                            &mut ctx,
                            address,
                            EhFrame::cie_from_offset,
                        )
                        .ok()?,
                    None => eh_frame
                        .unwind_info_for_address(
                            &bases,
                            &mut ctx,
                            address,
                            EhFrame::cie_from_offset,
                        )
                        .ok()?,
                }
            }
            None => eh_frame
                .unwind_info_for_address(&bases, &mut ctx, address, EhFrame::cie_from_offset)
                .ok()?,
        };
        let CfaRule::RegisterAndOffset {
            register,
            offset: cfa,
        } = *row.cfa()
        else {
            return None;
        };
        let RegisterRule::Offset(ra) = row.register(X86_64::RA) else {
            return None;
        };
        let at = cfa + ra;
        (register == X86_64::RSP && at >= 0 && at % 8 == 0).then_some(at as u64 / 8)
    }
}

/// Return-address slots by (module path, file offset), each module's unwind info read once.
#[derive(Default)]
pub(crate) struct ReturnSlots {
    modules: FxHashMap<String, Option<Cfi>>,
    slots: FxHashMap<(String, u64), Option<u64>>,
}

impl ReturnSlots {
    /// The slot (words above the stack pointer) of the return address of the function running
    /// at file offset `offset` of the module at `path`; `None` when its unwind info does not
    /// say (no `.eh_frame`, a frame found from another register).
    pub(crate) fn slot(&mut self, path: &str, offset: u64) -> Option<u64> {
        let key = (path.to_string(), offset);
        if let Some(s) = self.slots.get(&key) {
            return *s;
        }
        let cfi = self
            .modules
            .entry(path.to_string())
            .or_insert_with(|| Cfi::load(path));
        let s = cfi.as_ref().and_then(|c| c.return_slot(offset));
        self.slots.insert(key, s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary's own `main` at its first instruction: the return address is at the
    /// stack pointer (nothing pushed yet).
    #[test]
    fn a_function_entry_has_its_return_address_at_the_stack_pointer() {
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        use object::ObjectSymbol;
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok("main") && s.address() != 0)
            .expect("a main symbol");
        let seg = file
            .segments()
            .find(|s| s.address() <= sym.address() && sym.address() < s.address() + s.size())
            .unwrap();
        let offset = sym.address() - seg.address() + seg.file_range().0;
        let mut slots = ReturnSlots::default();
        assert_eq!(slots.slot(exe.to_str().unwrap(), offset), Some(0));
    }
}
