//! Where in a function to put its entry uprobe: see [`place_probe`] for the rule.

/// Most instructions skipped before the probed one.
pub const MAX_SKIP: usize = 4;
/// Most bytes of the function examined for the prefix.
pub const MAX_PREFIX: usize = 32;

/// Why a [`Placement`] was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementRule {
    /// The instruction at the offset is emulated by the kernel.
    Emulated,
    /// No emulated instruction was reachable by skipping whitelisted ones: offset 0 (the
    /// kernel single-steps it).
    Fallback,
    /// An emulated instruction was found, but a branch inside the function may target it:
    /// offset 0.
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

/// What one decoded instruction allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// The kernel emulates it: probe here.
    Emulated,
    /// Safe to skip (see the module docs).
    Skip,
}

/// rdi, rsi, rdx, rcx, r8, r9 (argument registers) and rsp, by register number.
fn is_protected(reg: u8) -> bool {
    matches!(reg, 1 | 2 | 4 | 6 | 7 | 8 | 9)
}

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

/// Decodes one instruction at the start of `code`: its length and class, or `None` if it is
/// not one this decoder knows (then the caller falls back to offset 0).
fn decode(code: &[u8]) -> Option<(usize, Class)> {
    for nop in KERNEL_NOPS {
        if code.starts_with(nop) {
            return Some((nop.len(), Class::Emulated));
        }
    }
    if code.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        return Some((4, Class::Skip)); // endbr64
    }
    let (rex, rest) = match code.first()? {
        r @ 0x40..=0x4f => (*r, &code[1..]),
        _ => (0, code),
    };
    let p = usize::from(rex != 0);
    let op = *rest.first()?;
    let rex_b = (rex & 1) << 3;
    let rex_r = (rex & 4) << 1;
    let w = rex & 8 != 0;
    let modrm = rest.get(1).copied();
    let reg_form = |m: u8| m >> 6 == 3;
    match op {
        // push reg; with a REX prefix only REX.B (0x41) is emulated.
        0x50..=0x57 if rex == 0 || rex == 0x41 => Some((p + 1, Class::Emulated)),
        // jcc rel8, jmp rel8, jmp rel32, call rel32 (no prefixes).
        0x70..=0x7f | 0xeb if rex == 0 => Some((2, Class::Emulated)),
        0xe8 | 0xe9 if rex == 0 => Some((5, Class::Emulated)),
        0x0f if rex == 0 && matches!(rest.get(1), Some(0x80..=0x8f)) => Some((6, Class::Emulated)),
        // test/cmp r/m, reg (register form): flags only.
        0x84 | 0x85 | 0x38 | 0x39 | 0x3a | 0x3b if reg_form(modrm?) => Some((p + 2, Class::Skip)),
        // test al/eax, imm.
        0xa8 => Some((p + 2, Class::Skip)),
        0xa9 => Some((p + 5, Class::Skip)),
        // cmp r/m, imm8 (0x80, 0x83) / imm32 (0x81): register form or RIP-relative memory.
        0x80 | 0x81 | 0x83 if (modrm? >> 3) & 7 == 7 => {
            let m = modrm?;
            let imm = if op == 0x81 { 4 } else { 1 };
            match m >> 6 {
                3 => Some((p + 2 + imm, Class::Skip)),
                0 if m & 7 == 5 => Some((p + 2 + 4 + imm, Class::Skip)),
                _ => None,
            }
        }
        // test r/m, imm (register form): f6 /0 ib, f7 /0 id.
        0xf6 | 0xf7 if reg_form(modrm?) && (modrm? >> 3) & 7 == 0 => {
            Some((p + 2 + if op == 0xf6 { 1 } else { 4 }, Class::Skip))
        }
        // mov imm -> reg (b8+r: imm32, imm64 with REX.W), destination unprotected.
        0xb8..=0xbf if !is_protected((op - 0xb8) | rex_b) => {
            Some((p + 1 + if w { 8 } else { 4 }, Class::Skip))
        }
        // mov reg -> r/m (0x89) and r/m -> reg (0x8b), register form, destination unprotected.
        0x89 if reg_form(modrm?) && !is_protected((modrm? & 7) | rex_b) => {
            Some((p + 2, Class::Skip))
        }
        0x8b if reg_form(modrm?) && !is_protected(((modrm? >> 3) & 7) | rex_r) => {
            Some((p + 2, Class::Skip))
        }
        _ => None,
    }
}

/// Could a direct branch inside `body` land on `target`? Every byte position is treated as a
/// possible instruction start (over-approximation, see the module docs).
fn may_branch_to(body: &[u8], target: usize) -> bool {
    let rel = |at: usize, len: usize, disp: i64| (at + len) as i64 + disp == target as i64;
    (0..body.len()).any(|i| {
        let b = &body[i..];
        match b {
            [0x70..=0x7f | 0xeb, d, ..] => rel(i, 2, i64::from(*d as i8)),
            [0xe8 | 0xe9, d @ ..] if d.len() >= 4 => rel(
                i,
                5,
                i64::from(i32::from_le_bytes([d[0], d[1], d[2], d[3]])),
            ),
            [0x0f, 0x80..=0x8f, d @ ..] if d.len() >= 4 => rel(
                i,
                6,
                i64::from(i32::from_le_bytes([d[0], d[1], d[2], d[3]])),
            ),
            _ => false,
        }
    })
}

/// Chooses the entry-probe offset for a function whose code is `body` (from its first byte;
/// its whole symbol size if known, else at least its first 32 bytes).
///
/// Measured on this kind of machine (EBPF-NOTES.md): a uprobe on an instruction the kernel
/// emulates costs ~0.75 µs per hit (`push`), one it must single-step out of line ~10 µs
/// (`test rdi,rdi`), and the kernel's `nop5` optimisation ~0.5 µs. glibc 2.36 `free` starts
/// with `test %rdi,%rdi`; probing the `je` at `free+3` is 8× cheaper and rdi still holds the
/// pointer.
///
/// # The rule
///
/// Decode the function's first instructions (at most 4 of them, within
/// 32 bytes). Probe the first one the x86-64 kernel emulates (arch/x86/kernel/
/// uprobes.c): `push reg` (with or without REX.B), `jmp`/`jcc` rel8/rel32, `call rel32`, and the
/// kernel's canonical nops (`x86_nops[1..=8]`, which includes `nop5`). An instruction may be
/// skipped only if it is on this whitelist of instructions that transfer no control and write
/// no argument register (rdi, rsi, rdx, rcx, r8, r9) and not rsp — so at the later offset the
/// arguments, the stack pointer and the return address at `[rsp]` are exactly those of the
/// entry:
///
/// - `endbr64`;
/// - `test`/`cmp` (flags only): register/register, register/immediate, and `cmp` of a
///   RIP-relative memory operand with an immediate;
/// - `mov` of an immediate or of a register into a register other than the above.
///
/// Anything else (unknown instruction, end of the bytes) → offset 0.
///
/// A jump from inside the function straight to the probed offset would make the probe fire
/// a second time in one call (a phantom event). This function therefore scans every
/// byte position of the function body (its symbol size) for a `jmp`/`jcc`/`call` rel8/rel32
/// encoding whose target is the chosen offset; this over-approximates (data or the middle of
/// an instruction may look like a branch) and any hit falls back to offset 0, which is always
/// correct, only slower.
pub fn place_probe(body: &[u8]) -> Placement {
    let prefix = &body[..body.len().min(MAX_PREFIX)];
    let mut at = 0usize;
    for _ in 0..=MAX_SKIP {
        match decode(&prefix[at..]) {
            Some((_, Class::Emulated)) => {
                if at > 0 && may_branch_to(body, at) {
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
            Some((len, Class::Skip)) if at + len < prefix.len() => at += len,
            _ => break,
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
        assert_eq!(place_probe(&[0x41, 0x54, 0x55, 0x53]), at(0));
        // free: test %rdi,%rdi; je rel32; push %rbp
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55];
        assert_eq!(place_probe(&free), at(3));
        // memalign/aligned_alloc: cmpb $0,0x140e71(%rip); je +7
        let memalign = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0x74, 0x07, 0xe9];
        assert_eq!(place_probe(&memalign), at(7));
        // posix_memalign: cmpb $0,..(%rip); push %r12
        let pm = [
            0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54, 0x49, 0x89, 0xd4,
        ];
        assert_eq!(place_probe(&pm), at(7));
        // reallocarray: mov %rsi,%rax; mul %rdx (writes rdx): not skippable past `mul`.
        let ra = [0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6];
        assert_eq!(place_probe(&ra), FALLBACK);
    }

    #[test]
    fn libstdcxx_entry_points() {
        // operator delete(void*): endbr64; jmp free@plt
        let del = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 0x87, 0x2f, 0xff, 0xff, 0x0f, 0x1f,
        ];
        assert_eq!(place_probe(&del), at(4));
        // operator new(size_t): endbr64; test %rdi,%rdi; mov $1,%eax; push %rbx
        let new = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x53, 0x48,
        ];
        assert_eq!(place_probe(&new), at(12));
    }

    #[test]
    fn never_skips_writes_to_argument_registers_or_rsp() {
        // mov %rdi,%rbp is fine; mov %rsi,%rdi is not.
        assert_eq!(place_probe(&[0x48, 0x89, 0xfd, 0x55]), at(3));
        assert_eq!(place_probe(&[0x48, 0x89, 0xf7, 0x55]), FALLBACK);
        // mov $1,%edi / mov $1,%r9d / mov %rax,%rsp
        assert_eq!(place_probe(&[0xbf, 1, 0, 0, 0, 0x55]), FALLBACK);
        assert_eq!(place_probe(&[0x41, 0xb9, 1, 0, 0, 0, 0x55]), FALLBACK);
        assert_eq!(place_probe(&[0x48, 0x89, 0xc4, 0x55]), FALLBACK);
        // sub $8,%rsp (unknown to the decoder) stops the scan.
        assert_eq!(place_probe(&[0x48, 0x83, 0xec, 0x08, 0x55]), FALLBACK);
        // push with a REX.W prefix is not emulated by the kernel.
        assert_eq!(place_probe(&[0x48, 0x55]), FALLBACK);
    }

    #[test]
    fn kernel_nops_are_emulated_and_empty_input_falls_back() {
        assert_eq!(place_probe(&[0x0f, 0x1f, 0x44, 0x00, 0x00, 0x55]), at(0));
        assert_eq!(place_probe(&[0xf3, 0x0f, 0x1e, 0xfa, 0x90]), at(4));
        assert_eq!(place_probe(&[]), FALLBACK);
        assert_eq!(place_probe(&[0x48, 0x85]), FALLBACK);
        // Only skippable instructions until the end of the bytes.
        assert_eq!(place_probe(&[0x48, 0x85, 0xff]), FALLBACK);
    }

    #[test]
    fn a_branch_to_the_probed_offset_falls_back() {
        // test %rdi,%rdi; je +2; push %rbp; ret; jmp back to offset 3 (eb f8: 8+2-8... ).
        let mut body = vec![0x48, 0x85, 0xff, 0x74, 0x02, 0x55, 0xc3, 0x90];
        // At position 8: jmp rel8 to 3 => 3 - (8 + 2) = -7.
        body.extend_from_slice(&[0xeb, (-7i8) as u8]);
        assert_eq!(
            place_probe(&body),
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
        assert_eq!(place_probe(&body).rule, PlacementRule::BranchTarget);
    }
}
