//! Which symbols get which BPF program, and finding them in an ELF file.

use std::collections::HashMap;

use crate::{Elf, Entry, Placement, Result, place_probe_for};
#[cfg(doc)]
use crate::{PROG_ENTRY, PROG_RET};

/// One allocator entry point memtrack probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The symbol (mangled for C++).
    pub symbol: &'static str,
    /// Where its arguments are: the cookie of its site on [`PROG_ENTRY`]'s link.
    pub entry: Entry,
}

const fn p(symbol: &'static str, entry: Entry) -> ProbeSpec {
    ProbeSpec { symbol, entry }
}

/// Entry points of libc's malloc family, also jemalloc's unprefixed names. jemalloc builds
/// use the same names with a `je_` or `_rjem_` (tikv-jemallocator) prefix: see `PREFIXED`.
const LIBC: &[ProbeSpec] = &[
    p("malloc", Entry::Malloc),
    p("calloc", Entry::Calloc),
    p("realloc", Entry::Realloc),
    p("reallocarray", Entry::Reallocarray),
    p("free", Entry::Free),
    p("aligned_alloc", Entry::Memalign),
    p("memalign", Entry::Memalign),
    p("posix_memalign", Entry::PosixMemalign),
    p("valloc", Entry::Valloc),
    p("pvalloc", Entry::Valloc),
    p("mallocx", Entry::Mallocx),
    p("rallocx", Entry::Rallocx),
    p("dallocx", Entry::Free),
    p("sdallocx", Entry::Free),
];

/// Prefixes under which jemalloc exports the `LIBC` names.
const PREFIXED: &[&str] = &["je_", "_rjem_"];

/// mimalloc's own API (its `malloc` override, if any, is covered by `LIBC`).
const MIMALLOC: &[ProbeSpec] = &[
    p("mi_malloc", Entry::Malloc),
    p("mi_malloc_small", Entry::Malloc),
    p("mi_mallocn", Entry::Mallocn),
    p("mi_calloc", Entry::Calloc),
    p("mi_zalloc", Entry::Zalloc),
    p("mi_zalloc_small", Entry::Zalloc),
    p("mi_realloc", Entry::Realloc),
    p("mi_reallocf", Entry::Realloc),
    p("mi_reallocn", Entry::Reallocarray),
    p("mi_malloc_aligned", Entry::AlignedSizeFirst),
    p("mi_zalloc_aligned", Entry::AlignedSizeFirst),
    p("mi_aligned_alloc", Entry::Memalign),
    p("mi_memalign", Entry::Memalign),
    p("mi_posix_memalign", Entry::PosixMemalign),
    p("mi_valloc", Entry::Valloc),
    p("mi_pvalloc", Entry::Valloc),
    p("mi_new", Entry::Malloc),
    p("mi_new_n", Entry::Mallocn),
    p("mi_new_aligned", Entry::AlignedSizeFirst),
    p("mi_new_realloc", Entry::Realloc),
    p("mi_new_reallocn", Entry::Reallocarray),
    p("mi_free", Entry::Free),
    // Wrappers that call (tail-jump to) mi_free: they bracket it like operator delete, else
    // one call would be recorded twice (mi_free_size is also mimalloc's sized delete).
    p("mi_free_size", Entry::FreeOuter),
    p("mi_free_aligned", Entry::FreeOuter),
    p("mi_free_size_aligned", Entry::FreeOuter),
];

/// C++ `operator new`/`delete` (Itanium mangling, 64-bit `size_t` = `m`). `delete` calls
/// `free`, so it brackets it with a return probe and only the outer call is recorded.
const CXX: &[ProbeSpec] = &[
    p("_Znwm", Entry::Malloc),
    p("_Znam", Entry::Malloc),
    p("_ZnwmRKSt9nothrow_t", Entry::Malloc),
    p("_ZnamRKSt9nothrow_t", Entry::Malloc),
    p("_ZnwmSt11align_val_t", Entry::AlignedSizeFirst),
    p("_ZnamSt11align_val_t", Entry::AlignedSizeFirst),
    p(
        "_ZnwmSt11align_val_tRKSt9nothrow_t",
        Entry::AlignedSizeFirst,
    ),
    p(
        "_ZnamSt11align_val_tRKSt9nothrow_t",
        Entry::AlignedSizeFirst,
    ),
    p("_ZdlPv", Entry::FreeOuter),
    p("_ZdaPv", Entry::FreeOuter),
    p("_ZdlPvm", Entry::FreeOuter),
    p("_ZdaPvm", Entry::FreeOuter),
    p("_ZdlPvRKSt9nothrow_t", Entry::FreeOuter),
    p("_ZdaPvRKSt9nothrow_t", Entry::FreeOuter),
    p("_ZdlPvSt11align_val_t", Entry::FreeOuter),
    p("_ZdaPvSt11align_val_t", Entry::FreeOuter),
    p("_ZdlPvmSt11align_val_t", Entry::FreeOuter),
    p("_ZdaPvmSt11align_val_t", Entry::FreeOuter),
    p("_ZdlPvSt11align_val_tRKSt9nothrow_t", Entry::FreeOuter),
    p("_ZdaPvSt11align_val_tRKSt9nothrow_t", Entry::FreeOuter),
];

/// libc's syscall wrappers: the exported names and glibc's internal aliases (the same
/// addresses; malloc calls `__mmap`, `__munmap`, `__mremap` and, through `sbrk`, `__brk`).
const SYSCALLS: &[ProbeSpec] = &[
    p("mmap", Entry::Mmap),
    p("mmap64", Entry::Mmap),
    p("__mmap", Entry::Mmap),
    p("munmap", Entry::Munmap),
    p("__munmap", Entry::Munmap),
    p("mremap", Entry::Mremap),
    p("__mremap", Entry::Mremap),
    p("brk", Entry::Brk),
    p("__brk", Entry::Brk),
];

/// Every probed entry point: the libc names (also under jemalloc's `je_` and `_rjem_`
/// prefixes, and jemalloc's `mallocx`/`rallocx`/`dallocx`/`sdallocx`), mimalloc's `mi_*`,
/// C++ `operator new`/`delete` (all sized, aligned and nothrow variants), and libc's
/// mmap/munmap/mremap/brk wrappers ([`Entry::is_syscall`]).
pub static PROBES: &[&[ProbeSpec]] = &[LIBC, MIMALLOC, CXX, SYSCALLS];

/// Looks `name` up among [`PROBES`], stripping a jemalloc prefix for the libc names. Also
/// returns the table's rank: when several probed names alias one function, the lowest rank
/// wins (libc and mimalloc before C++, whose `delete` programs need a costlier return probe).
fn spec_for(name: &str) -> Option<(u8, ProbeSpec)> {
    let find = |list: &[ProbeSpec], n: &str| list.iter().find(|s| s.symbol == n).copied();
    if let Some(s) = find(LIBC, name) {
        return Some((0, s));
    }
    if let Some(s) = find(MIMALLOC, name) {
        return Some((1, s));
    }
    if let Some(s) = find(CXX, name) {
        return Some((2, s));
    }
    if let Some(s) = find(SYSCALLS, name) {
        return Some((3, s));
    }
    PREFIXED
        .iter()
        .find_map(|pre| Some((0, find(LIBC, name.strip_prefix(pre)?)?)))
}

/// A probe to attach: which entry point at which file offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSite {
    /// The symbol as named in the file.
    pub symbol: String,
    /// The entry point's shape: [`PROG_ENTRY`]'s cookie for this site.
    pub entry: Entry,
    /// Whether [`PROG_RET`] is attached as a return probe at the same offset.
    pub ret: bool,
    /// File offset of the symbol's first instruction.
    pub symbol_offset: u64,
    /// File offset to attach at: `symbol_offset + placement.offset`.
    pub offset: u64,
    /// How the offset within the function was chosen.
    pub placement: Placement,
}

impl ProbeSite {
    /// The BPF cookie of this site's entry and return probes: its [`Entry`] in the low byte
    /// and where the placement found the arguments above it (`MT_COOKIE_ARG` of memtrack.h;
    /// equal to [`Entry::cookie`] when the prologue moved none).
    pub fn cookie(&self) -> u64 {
        self.entry.cookie() | self.placement.cookie_bits()
    }
}

/// The probe sites of the ELF file at `path`; empty if it defines no allocator entry point.
pub fn probe_sites(path: &std::path::Path) -> Result<Vec<ProbeSite>> {
    Ok(probe_sites_in(&Elf::open(path)?))
}

/// The probe sites of an opened ELF file. Each function gets one site even if several probed
/// names alias it (glibc's `aligned_alloc` is `memalign`; mimalloc's `malloc` may be
/// `mi_malloc`): two probes at one address would record each call twice.
pub fn probe_sites_in(elf: &Elf) -> Vec<ProbeSite> {
    // symbol offset -> (rank, symbol, spec, size)
    let mut best: HashMap<u64, (u8, &str, ProbeSpec, u64)> = HashMap::new();
    for sym in elf.functions() {
        let Some((rank, spec)) = spec_for(sym.name) else {
            continue;
        };
        let Some(offset) = elf.file_offset(sym.vaddr) else {
            continue;
        };
        match best.get(&offset) {
            Some((r, name, ..)) if (*r, *name) <= (rank, sym.name) => {}
            _ => {
                best.insert(offset, (rank, sym.name, spec, sym.size));
            }
        }
    }
    let mut sites: Vec<ProbeSite> = best
        .into_iter()
        .map(|(symbol_offset, (_, symbol, spec, size))| {
            // The branch-target scan needs the whole body; bound it for absurd sizes.
            let len = (size as usize).clamp(crate::placement::MAX_PREFIX, 1 << 20);
            let placement = place_probe_for(elf.bytes(symbol_offset, len), spec.entry);
            ProbeSite {
                symbol: symbol.to_owned(),
                entry: spec.entry,
                ret: spec.entry.needs_return(),
                symbol_offset,
                offset: symbol_offset + placement.offset,
                placement,
            }
        })
        .collect();
    sites.sort_by_key(|s| s.offset);
    sites
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_programs() {
        let entry = |n| spec_for(n).map(|(_, s)| s.entry);
        assert_eq!(entry("malloc"), Some(Entry::Malloc));
        assert_eq!(entry("_rjem_sdallocx"), Some(Entry::Free));
        assert_eq!(entry("je_posix_memalign"), Some(Entry::PosixMemalign));
        assert_eq!(entry("mi_zalloc"), Some(Entry::Zalloc));
        assert_eq!(entry("_ZdlPv"), Some(Entry::FreeOuter));
        assert_eq!(entry("je_mi_malloc"), None);
        assert_eq!(entry("mallocfoo"), None);
        assert!(!Entry::Free.needs_return() && Entry::FreeOuter.needs_return());
        // An alias of free and operator delete is probed as free (no return probe).
        assert!(spec_for("free").unwrap().0 < spec_for("_ZdlPv").unwrap().0);
    }
}
