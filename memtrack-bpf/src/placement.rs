//! Where in a function to put its entry uprobe: see [`place_probe`] for the rule.

use iced_x86::{Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, OpAccess, Register};

/// Most instructions skipped before the probed one.
pub const MAX_SKIP: usize = 16;
/// Most bytes of the function examined for the prefix.
pub const MAX_PREFIX: usize = 64;

/// Why a [`Placement`] was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementRule {
    /// The instruction at the offset is emulated by the kernel.
    Emulated,
    /// No emulated instruction was reachable by skipping whitelisted ones: offset 0 (the
    /// kernel single-steps it).
    Fallback,
    /// An emulated instruction was found, but a branch inside the function may target it or
    /// an instruction skipped before it: offset 0.
    BranchTarget,
}

/// The offset within a function at which to attach its entry probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Bytes from the function's first instruction.
    pub offset: u64,
    /// Why.
    pub rule: PlacementRule,
}

/// The x86-64 SysV argument registers, in order.
const ARGS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// The kernel's canonical nops (x86_nops[1..=8]), which it emulates as `jmp +0`.
const KERNEL_NOPS: [&[u8]; 8] = [
    &[0x90],
    &[0x66, 0x90],
    &[0x0f, 0x1f, 0x00],
    &[0x0f, 0x1f, 0x40, 0x00],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// Whether the x86-64 kernel emulates the instruction at the start of `code` instead of
/// single-stepping it (arch/x86/kernel/uprobes.c: `branch_setup_xol_ops`,
/// `push_setup_xol_ops`, nops). This is the kernel's own test, on the encoding, so it stays a
/// match on bytes: `push reg` with no prefix or REX.B alone (0x41), `jmp`/`jcc` rel8/rel32 and
/// `call rel32` with no prefix, the canonical nops.
fn kernel_emulates(code: &[u8]) -> bool {
    KERNEL_NOPS.iter().any(|nop| code.starts_with(nop))
        || matches!(
            code,
            [0x50..=0x57 | 0x70..=0x7f | 0xeb | 0xe8 | 0xe9, ..]
                | [0x41, 0x50..=0x57, ..]
                | [0x0f, 0x80..=0x8f, ..]
        )
}

/// Could a direct branch inside `body` land in `1..=end` (on the probed instruction or on one
/// skipped before it, from where execution would reach the probe a second time)? Every byte
/// position is treated as a possible instruction start, on the raw encodings of
/// `jmp`/`jcc`/`call` rel8/rel32 (an over-approximation: data or the middle of an instruction
/// may look like a branch, and any hit only costs the cheaper placement).
fn may_branch_into(body: &[u8], end: usize) -> bool {
    let lands = |at: usize, len: usize, disp: i64| {
        let t = (at + len) as i64 + disp;
        t >= 1 && t <= end as i64
    };
    (0..body.len()).any(|i| {
        let b = &body[i..];
        match b {
            [0x70..=0x7f | 0xeb, d, ..] => lands(i, 2, i64::from(*d as i8)),
            [0xe8 | 0xe9, d @ ..] if d.len() >= 4 => lands(
                i,
                5,
                i64::from(i32::from_le_bytes([d[0], d[1], d[2], d[3]])),
            ),
            [0x0f, 0x80..=0x8f, d @ ..] if d.len() >= 4 => lands(
                i,
                6,
                i64::from(i32::from_le_bytes([d[0], d[1], d[2], d[3]])),
            ),
            _ => false,
        }
    })
}

/// Chooses the entry-probe offset for a function whose code is `body` (from its first byte;
/// its whole symbol size if known, else at least its first 64 bytes), for a BPF program that
/// reads the first `args` argument registers (rdi, rsi, rdx, rcx, r8, r9;
/// [`crate::Entry::args_read`]) and the stack pointer.
///
/// Measured on this kind of machine (EBPF-NOTES.md): a uprobe on an instruction the kernel
/// emulates costs ~0.75 µs per hit (`push`), one it must single-step out of line ~10 µs
/// (`test rdi,rdi`), and the kernel's `nop5` optimisation ~0.5 µs. glibc 2.36 `free` starts
/// with `test %rdi,%rdi`; probing the `je` at `free+3` is 8× cheaper and rdi still holds the
/// pointer.
///
/// # The rule
///
/// Decode the function's first instructions (iced-x86; at most 16 of them, within 64 bytes).
/// Probe the first one the x86-64 kernel emulates (arch/x86/kernel/uprobes.c): `push reg`
/// (with or without REX.B), `jmp`/`jcc` rel8/rel32, `call rel32`, and the kernel's canonical
/// nops (`x86_nops[1..=8]`, which includes `nop5`). An instruction before it may be skipped
/// (run natively before the probe fires) only if it is on this whitelist:
///
/// - it transfers no control (iced's flow control is `Next`: no branch, call, return,
///   syscall, interrupt), so every call reaches the probe;
/// - it writes none of the `args` argument registers the program reads, and not rsp, so at
///   the later offset the arguments, the stack pointer and the return address at `[rsp]` are
///   exactly those of the entry (a return probe hijacks `[rsp]`);
/// - it writes no memory (which could be the return address).
///
/// Anything else (an instruction the decoder does not know, the end of the bytes) →
/// offset 0.
///
/// A jump from inside the function to the probed instruction or to one skipped before it
/// would make the probe fire a second time in one call (a phantom event). This function
/// therefore scans every byte position of the function body (its symbol size) for a
/// `jmp`/`jcc`/`call` rel8/rel32 encoding whose target is in `1..=offset`; this
/// over-approximates and any hit falls back to offset 0, which is always correct, only
/// slower. (Jumps from other functions into the prologue, which compilers do not emit, are
/// not looked for.)
pub fn place_probe(body: &[u8], args: usize) -> Placement {
    let prefix = &body[..body.len().min(MAX_PREFIX)];
    let protected = &ARGS[..args.min(ARGS.len())];
    let mut decoder = Decoder::with_ip(64, prefix, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut at = 0usize;
    for _ in 0..=MAX_SKIP {
        if kernel_emulates(&prefix[at..]) {
            if at > 0 && may_branch_into(body, at) {
                return Placement {
                    offset: 0,
                    rule: PlacementRule::BranchTarget,
                };
            }
            return Placement {
                offset: at as u64,
                rule: PlacementRule::Emulated,
            };
        }
        if !decoder.can_decode() {
            break;
        }
        let insn = decoder.decode();
        if insn.is_invalid() || insn.flow_control() != FlowControl::Next {
            break;
        }
        let used = info.info(&insn);
        let writes = |a: OpAccess| {
            matches!(
                a,
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
        };
        let clobbers = used.used_registers().iter().any(|r| {
            writes(r.access()) && {
                let full = r.register().full_register();
                full == Register::RSP || protected.contains(&full)
            }
        });
        if clobbers || used.used_memory().iter().any(|m| writes(m.access())) {
            break;
        }
        at += insn.len();
        if at >= prefix.len() {
            break;
        }
    }
    Placement {
        offset: 0,
        rule: PlacementRule::Fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Placement {
        Placement {
            offset,
            rule: PlacementRule::Emulated,
        }
    }
    const FALLBACK: Placement = Placement {
        offset: 0,
        rule: PlacementRule::Fallback,
    };

    // Bytes from Debian glibc 2.36-9+deb12u14 and libstdc++ 12 (objdump -d).
    #[test]
    fn glibc_2_36_entry_points() {
        // malloc: push %r12
        assert_eq!(place_probe(&[0x41, 0x54, 0x55, 0x53], 6), at(0));
        // free: test %rdi,%rdi; je rel32; push %rbp
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(place_probe(&free, 6), at(3));
        // memalign/aligned_alloc: cmpb $0,0x140e71(%rip); je +7
        let memalign = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0x74, 0x07, 0xe9];
        assert_eq!(place_probe(&memalign, 6), at(7));
        // posix_memalign: cmpb $0,..(%rip); push %r12
        let pm = [
            0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54, 0x49, 0x89, 0xd4,
        ];
        assert_eq!(place_probe(&pm, 6), at(7));
        // reallocarray: mov %rsi,%rax; mul %rdx (writes rdx): not skippable past `mul`.
        let ra = [0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6];
        assert_eq!(place_probe(&ra, 6), FALLBACK);
    }

    #[test]
    fn libstdcxx_entry_points() {
        // operator delete(void*): endbr64; jmp free@plt
        let del = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 0x87, 0x2f, 0xff, 0xff, 0x0f, 0x1f,
        ];
        assert_eq!(place_probe(&del, 6), at(4));
        // operator new(size_t): endbr64; test %rdi,%rdi; mov $1,%eax; push %rbx
        let new = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x53, 0x48,
        ];
        assert_eq!(place_probe(&new, 6), at(12));
    }

    #[test]
    fn never_skips_writes_to_argument_registers_or_rsp() {
        // mov %rdi,%rbp is fine; mov %rsi,%rdi is not.
        assert_eq!(place_probe(&[0x48, 0x89, 0xfd, 0x55], 6), at(3));
        assert_eq!(place_probe(&[0x48, 0x89, 0xf7, 0x55], 6), FALLBACK);
        // mov $1,%edi / mov $1,%r9d / mov %rax,%rsp
        assert_eq!(place_probe(&[0xbf, 1, 0, 0, 0, 0x55], 6), FALLBACK);
        assert_eq!(place_probe(&[0x41, 0xb9, 1, 0, 0, 0, 0x55], 6), FALLBACK);
        assert_eq!(place_probe(&[0x48, 0x89, 0xc4, 0x55], 6), FALLBACK);
        // sub $8,%rsp writes rsp: it stops the scan.
        assert_eq!(place_probe(&[0x48, 0x83, 0xec, 0x08, 0x55], 6), FALLBACK);
        // push with a REX.W prefix is not emulated by the kernel.
        assert_eq!(place_probe(&[0x48, 0x55], 6), FALLBACK);
    }

    #[test]
    fn kernel_nops_are_emulated_and_empty_input_falls_back() {
        assert_eq!(place_probe(&[0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55], 6), at(0));
        assert_eq!(place_probe(&[0xf3, 0x0f, 0x1e, 0xfa, 0x90], 6), at(4));
        assert_eq!(place_probe(&[], 6), FALLBACK);
        assert_eq!(place_probe(&[0x48, 0x85], 6), FALLBACK);
        // Only skippable instructions until the end of the bytes.
        assert_eq!(place_probe(&[0x48, 0x85, 0xff], 6), FALLBACK);
    }

    #[test]
    fn a_branch_to_the_probed_offset_falls_back() {
        // test %rdi,%rdi; je +2; push %rbp; ret; jmp back to offset 3 (eb f8: 8+2-8... ).
        let mut body = vec![0x48, 0x85, 0xff, 0x74, 0x02, 0x55, 0xc3, 0x90];
        // At position 8: jmp rel8 to 3 => 3 - (8 + 2) = -7.
        body.extend_from_slice(&[0xeb, (-7i8) as u8]);
        assert_eq!(
            place_probe(&body, 6),
            Placement {
                offset: 0,
                rule: PlacementRule::BranchTarget
            }
        );
        // A rel32 jcc from far away to offset 3.
        let mut body = vec![0x48, 0x85, 0xff, 0x74, 0x02, 0x55, 0xc3];
        body.resize(100, 0xcc);
        let disp = 3i32 - (100 + 6);
        body.extend_from_slice(&[0x0f, 0x85]);
        body.extend_from_slice(&disp.to_le_bytes());
        assert_eq!(place_probe(&body, 6).rule, PlacementRule::BranchTarget);
    }

    /// Placement past instructions that write only registers the program does not read
    /// (bytes from Debian's libjemalloc 5.3, libmimalloc 2.0 and libstdc++ 12, objdump -d).
    #[test]
    fn skips_writes_to_registers_the_program_does_not_read() {
        // jemalloc sdallocx(p, size, flags): mov %rdi,%r8; cmp $0x1000,%rsi; ja. Free reads
        // rdi only.
        let sdallocx = [
            0x49, 0x89, 0xf8, 0x48, 0x81, 0xfe, 0x00, 0x10, 0x00, 0x00, 0x77, 0x0c,
        ];
        assert_eq!(place_probe(&sdallocx, 1), at(10));
        assert_eq!(place_probe(&sdallocx, 6), FALLBACK);
        // jemalloc rallocx(p, size, flags): xor %ecx,%ecx; jmp. Rallocx reads rdi, rsi.
        let rallocx = [0x31, 0xc9, 0xe9, 0xe9, 0x1c, 0xff, 0xff];
        assert_eq!(place_probe(&rallocx, 2), at(2));
        assert_eq!(place_probe(&rallocx, 4), FALLBACK);
        // mimalloc free: mov %rdi,%rcx; test %rdi,%rdi; je.
        let mi_free = [0x48, 0x89, 0xf9, 0x48, 0x85, 0xff, 0x74, 0x5d];
        assert_eq!(place_probe(&mi_free, 1), at(6));
        // libstdc++ operator delete(void*, size_t, align_val_t): endbr64; mov %rdx,%rsi; jmp.
        let del = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x89, 0xd6, 0xe9, 0x74, 0x12, 0xff, 0xff,
        ];
        assert_eq!(place_probe(&del, 1), at(7));
        assert_eq!(place_probe(&del, 2), FALLBACK);
        // jemalloc free: nine loads, shifts, masks and a compare (TLS and RIP-relative reads
        // into rax, rcx, rdx) before its first branch, a jne rel32 at +0x30.
        let je_free = [
            0x48, 0x89, 0xf8, 0x48, 0x8b, 0x15, 0x0e, 0x53, 0x0a, 0x00, 0x48, 0x89, 0xf9, 0x48,
            0xc1, 0xe8, 0x1a, 0x48, 0x81, 0xe1, 0x00, 0x00, 0x00, 0xc0, 0x25, 0xf0, 0x00, 0x00,
            0x00, 0x64, 0x48, 0x03, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x48, 0x01, 0xd0, 0x48,
            0x3b, 0x88, 0xb0, 0x01, 0x00, 0x00, 0x0f, 0x85, 0x8a, 0x00, 0x00, 0x00,
        ];
        assert_eq!(place_probe(&je_free, 1), at(0x30));
    }

    #[test]
    fn never_skips_control_transfers_or_memory_writes() {
        // glibc brk: mov $12,%eax; syscall; ... — a syscall is not skipped.
        let brk = [
            0xb8, 0x0c, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x8b, 0x15, 0x55,
        ];
        assert_eq!(place_probe(&brk, 1), FALLBACK);
        // mov %rax,(%rsp) would overwrite the return address a return probe hijacks.
        assert_eq!(place_probe(&[0x48, 0x89, 0x04, 0x24, 0x55], 1), FALLBACK);
        // mov %rax,0x8(%rdi): any memory write stops the scan.
        assert_eq!(place_probe(&[0x48, 0x89, 0x47, 0x08, 0x55], 1), FALLBACK);
        // ret, and an indirect jmp *%rax.
        assert_eq!(place_probe(&[0xc3, 0x55], 1), FALLBACK);
        assert_eq!(place_probe(&[0xff, 0xe0, 0x55], 1), FALLBACK);
        // A VEX instruction is not decoded (no_vex): the scan stops.
        assert_eq!(place_probe(&[0xc5, 0xf8, 0x77, 0x55], 1), FALLBACK);
    }

    #[test]
    fn a_branch_into_the_skipped_instructions_falls_back() {
        // mov %rdi,%rcx; test %rdi,%rdi; je +2; ret; ret; then a jmp back to offset 3 (the
        // test, skipped before the probe at +6).
        let mut body = vec![0x48, 0x89, 0xf9, 0x48, 0x85, 0xff, 0x74, 0x02, 0xc3, 0xc3];
        assert_eq!(place_probe(&body, 1), at(6));
        body.extend_from_slice(&[0xeb, (3i8 - 12) as u8]);
        assert_eq!(place_probe(&body, 1).rule, PlacementRule::BranchTarget);
    }
}
