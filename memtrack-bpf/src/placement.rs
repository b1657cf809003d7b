//! Where in a function to put its entry uprobe: see [`place_probe`] for the rule.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, OpAccess, OpKind, Register,
};

use crate::{ArgReg, Entry};

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
    /// Where the first three arguments are at `offset` ([`ArgReg::ENTRY`] unless the skipped
    /// instructions copied one elsewhere; only the arguments the program reads are tracked).
    pub args: [ArgReg; 3],
}

impl Placement {
    /// At the function's first instruction, for `rule`.
    const fn at_entry(rule: PlacementRule) -> Self {
        Self {
            offset: 0,
            rule,
            args: ArgReg::ENTRY,
        }
    }

    /// The bits of a site's cookie that say where its arguments are (`MT_COOKIE_ARG`).
    pub fn cookie_bits(&self) -> u64 {
        self.args
            .iter()
            .enumerate()
            .map(|(i, r)| r.cookie_bits(i))
            .fold(0, |a, b| a | b)
    }
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

/// The registers the BPF program can read an argument from, and their `MT_REG_*`.
const READABLE: [(Register, ArgReg); 7] = [
    (Register::RDI, ArgReg::Rdi),
    (Register::RSI, ArgReg::Rsi),
    (Register::RDX, ArgReg::Rdx),
    (Register::RCX, ArgReg::Rcx),
    (Register::R8, ArgReg::R8),
    (Register::R9, ArgReg::R9),
    (Register::RAX, ArgReg::Rax),
];

/// What a register holds, in terms of the call's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Val {
    /// Argument `i`.
    Arg(usize),
    /// The low 64 bits of argument `i` times argument `j` (`i < j`), as `mul` leaves them.
    Product(usize, usize),
}

/// What each general-purpose register holds, by the prologue so far: the entry's argument
/// registers hold their own; a 64-bit register-to-register `mov` copies; a 64-bit `mul` of
/// two arguments leaves their product in rax; any other write forgets.
#[derive(Clone)]
struct Holders(Vec<(Register, Val)>);

impl Holders {
    fn entry() -> Self {
        Self(
            ARGS.iter()
                .enumerate()
                .map(|(i, &r)| (r, Val::Arg(i)))
                .collect(),
        )
    }

    fn get(&self, r: Register) -> Option<Val> {
        self.0.iter().find(|(h, _)| *h == r).map(|&(_, v)| v)
    }

    fn forget(&mut self, r: Register) {
        self.0.retain(|(h, _)| *h != r);
    }

    /// Where `v` can be read: argument `i`'s own register if it still holds it, else the first
    /// readable register that does.
    fn find(&self, v: Val) -> Option<ArgReg> {
        let own = match v {
            Val::Arg(i) => ARGS.get(i).filter(|&&r| self.get(r) == Some(v)),
            Val::Product(..) => None,
        };
        own.into_iter()
            .chain(READABLE.iter().map(|(r, _)| r))
            .find(|&&r| self.get(r) == Some(v))
            .and_then(|r| READABLE.iter().find(|(x, _)| x == r).map(|&(_, a)| a))
    }

    /// Where the program finds the first three arguments, if it can read all it needs: the
    /// first `args`, of which `product`'s two only through their product (then the first
    /// is read from where the product is and the second is the constant 1).
    fn locate(&self, args: usize, product: Option<(usize, usize)>) -> Option<[ArgReg; 3]> {
        let mut out = ArgReg::ENTRY;
        for i in 0..args {
            if i >= 3 {
                // Not encodable in the cookie: must stay in its own register.
                if self.get(ARGS[i]) != Some(Val::Arg(i)) {
                    return None;
                }
                continue;
            }
            match (self.find(Val::Arg(i)), product) {
                (Some(r), _) => out[i] = r,
                (None, Some((a, b))) if i == a || i == b => {}
                (None, _) => return None,
            }
        }
        if let Some((a, b)) = product {
            let both = self.find(Val::Arg(a)).is_some() && self.find(Val::Arg(b)).is_some();
            if !both {
                out[a] = self.find(Val::Product(a, b))?;
                out[b] = ArgReg::One;
            }
        }
        Some(out)
    }
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
/// reads the function's first `args` arguments ([`crate::Entry::args_read`]) and the stack
/// pointer.
///
/// Why: a uprobe on an instruction the kernel emulates (`push`, a jump, `nop5`) costs under a
/// microsecond per hit, one it must single-step out of line (`test rdi,rdi`) ~10 µs. glibc's
/// `free` starts with `test %rdi,%rdi`, so it is probed at the `je` at `free+3`, where rdi
/// still holds the pointer.
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
/// - it writes not rsp, so at the later offset the stack pointer and the return address at
///   `[rsp]` are those of the entry (the nesting logic compares stack pointers, and a return
///   probe hijacks `[rsp]`);
/// - after it, every argument the program reads is still in a register the program can read
///   (rdi, rsi, rdx, rcx, r8, r9, rax): a 64-bit register-to-register `mov` copies an
///   argument, any other write to a register loses what it held. The first three arguments
///   may so move to another register ([`Placement::args`] says where, and the site's cookie
///   tells the program: mimalloc's entry points load their heap into rdi and pass the
///   caller's arguments on in rsi, rdx, rcx); the others must stay in their own;
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
    place(body, args, None)
}

/// [`place_probe`] for a site of shape `entry`: its [`Entry::args_read`], and its two
/// arguments that the program only multiplies ([`Entry::product_args`]) may be replaced by
/// their product (glibc's `reallocarray` multiplies them before its first branch).
pub fn place_probe_for(body: &[u8], entry: Entry) -> Placement {
    place(body, entry.args_read(), entry.product_args())
}

fn place(body: &[u8], args: usize, product: Option<(usize, usize)>) -> Placement {
    let prefix = &body[..body.len().min(MAX_PREFIX)];
    let args = args.min(ARGS.len());
    let mut decoder = Decoder::with_ip(64, prefix, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut holders = Holders::entry();
    let mut at = 0usize;
    for _ in 0..=MAX_SKIP {
        if kernel_emulates(&prefix[at..]) {
            if at > 0 && may_branch_into(body, at) {
                return Placement::at_entry(PlacementRule::BranchTarget);
            }
            let placed = holders
                .locate(args, product)
                .expect("checked after every skip");
            return Placement {
                offset: at as u64,
                rule: PlacementRule::Emulated,
                args: placed,
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
        if used.used_memory().iter().any(|m| writes(m.access())) {
            break;
        }
        let mut next = holders.clone();
        // A 64-bit register copy: the destination holds what the source held.
        let copied = (matches!(insn.code(), Code::Mov_rm64_r64 | Code::Mov_r64_rm64)
            && insn.op0_kind() == OpKind::Register
            && insn.op1_kind() == OpKind::Register)
            .then(|| holders.get(insn.op1_register()))
            .flatten()
            .map(|v| (insn.op0_register(), v));
        // mul r64: rdx:rax = rax * r64; the low half of a product of two arguments.
        let multiplied = (insn.code() == Code::Mul_rm64 && insn.op0_kind() == OpKind::Register)
            .then(
                || match (holders.get(Register::RAX), holders.get(insn.op0_register())) {
                    (Some(Val::Arg(a)), Some(Val::Arg(b))) if a != b => {
                        Some((Register::RAX, Val::Product(a.min(b), a.max(b))))
                    }
                    _ => None,
                },
            )
            .flatten();
        let mut rsp = false;
        for r in used.used_registers().iter().filter(|r| writes(r.access())) {
            let full = r.register().full_register();
            rsp |= full == Register::RSP;
            next.forget(full);
        }
        next.0.extend(copied.into_iter().chain(multiplied));
        if rsp || next.locate(args, product).is_none() {
            break;
        }
        holders = next;
        at += insn.len();
        if at >= prefix.len() {
            break;
        }
    }
    Placement::at_entry(PlacementRule::Fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Placement {
        Placement {
            offset,
            rule: PlacementRule::Emulated,
            args: ArgReg::ENTRY,
        }
    }
    fn moved(offset: u64, args: [ArgReg; 3]) -> Placement {
        Placement {
            offset,
            rule: PlacementRule::Emulated,
            args,
        }
    }
    const FALLBACK: Placement = Placement::at_entry(PlacementRule::Fallback);

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
            Placement::at_entry(PlacementRule::BranchTarget)
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

    /// mimalloc 2.0's entry points load the thread's heap into rdi and pass the caller's
    /// arguments on in the next registers: the probe goes past the copies and the placement
    /// says where each argument went (Debian's libmimalloc 2.0, objdump -d).
    #[test]
    fn follows_arguments_copied_to_other_registers() {
        use ArgReg::*;
        // malloc: mov ..(%rip),%rax; mov %rdi,%rsi; mov %fs:(%rax),%rdi; cmp $0x400,%rsi; ja
        let malloc = [
            0x48, 0x8b, 0x05, 0x49, 0xb4, 0x00, 0x00, 0x48, 0x89, 0xfe, 0x64, 0x48, 0x8b, 0x38,
            0x48, 0x81, 0xfe, 0x00, 0x04, 0x00, 0x00, 0x77, 0x29,
        ];
        assert_eq!(place_probe(&malloc, 1), moved(0x15, [Rsi, Rsi, Rdx]));
        // calloc(n, size): mov ..(%rip),%rdx; mov %rdi,%rax; mov %fs:(%rdx),%rdi;
        // cmp $1,%rax; je
        let calloc = [
            0x48, 0x8b, 0x15, 0xc9, 0xad, 0x00, 0x00, 0x48, 0x89, 0xf8, 0x64, 0x48, 0x8b, 0x3a,
            0x48, 0x83, 0xf8, 0x01, 0x74, 0x08,
        ];
        assert_eq!(place_probe(&calloc, 2), moved(0x12, [Rax, Rsi, Rdx]));
        // A third argument read from rdx would be lost (the first mov overwrites it).
        assert_eq!(place_probe(&calloc, 3), FALLBACK);
        // realloc(p, size): ...; mov %rsi,%rdx; mov %rdi,%rsi; mov %fs:(%rax),%rax;
        // mov %rax,%rdi; jmp mi_heap_realloc
        let realloc = [
            0x48, 0x8b, 0x05, 0x49, 0xa9, 0x00, 0x00, 0x48, 0x89, 0xf2, 0x48, 0x89, 0xfe, 0x64,
            0x48, 0x8b, 0x00, 0x48, 0x89, 0xc7, 0xe9, 0xf7, 0x4e, 0xff, 0xff,
        ];
        assert_eq!(place_probe(&realloc, 2), moved(0x14, [Rsi, Rdx, Rdx]));
        // mi_reallocn(p, n, size): the three arguments shift to rsi, rdx, rcx.
        let reallocn = [
            0x48, 0x8b, 0x05, 0x29, 0xa9, 0x00, 0x00, 0x48, 0x89, 0xd1, 0x48, 0x89, 0xf2, 0x48,
            0x89, 0xfe, 0x64, 0x48, 0x8b, 0x00, 0x48, 0x89, 0xc7, 0xe9, 0xc4, 0x49, 0xff, 0xff,
        ];
        assert_eq!(place_probe(&reallocn, 3), moved(0x17, [Rsi, Rdx, Rcx]));
        // mi_new_reallocn(p, n, size): mov %rsi,%rax; mov %rdx,%rsi; cmp $1,%rax; je
        let new_reallocn = [
            0x48, 0x89, 0xf0, 0x48, 0x89, 0xd6, 0x48, 0x83, 0xf8, 0x01, 0x74, 0x08,
        ];
        assert_eq!(place_probe(&new_reallocn, 3), moved(10, [Rdi, Rax, Rdx]));
        // mi_memalign(align, size): swaps rdi and rsi through rax, then jmp.
        let memalign = [
            0x48, 0x89, 0xf8, 0x48, 0x89, 0xf7, 0x48, 0x89, 0xc6, 0xe9, 0x52, 0x3b, 0xff, 0xff,
        ];
        assert_eq!(place_probe(&memalign, 2), moved(9, [Rsi, Rdi, Rdx]));
        // The cookie bits: rsi (2) for the first argument, rdi (1) for the second.
        assert_eq!(place_probe(&memalign, 2).cookie_bits(), 2 << 8 | 1 << 12);
        assert_eq!(place_probe(&calloc, 2).cookie_bits(), 7 << 8);
        assert_eq!(at(3).cookie_bits(), 0);
        // A 32-bit copy truncates: not followed (mov %edi,%esi; then rdi overwritten).
        assert_eq!(
            place_probe(&[0x89, 0xfe, 0x64, 0x48, 0x8b, 0x38, 0x55], 1),
            FALLBACK
        );
    }

    /// glibc 2.36 `reallocarray(p, n, size)`: mov %rsi,%rax; mul %rdx; mov %rax,%rsi;
    /// jo; jmp realloc. At the `jo` rdx is the product's high half, but the program only needs
    /// n * size: it reads the product from rsi and 1 as the third argument.
    #[test]
    fn a_product_of_two_arguments_replaces_them() {
        use ArgReg::*;
        let ra = [
            0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6, 0x70, 0x05, 0xe9, 0x40, 0xb8,
            0xf8, 0xff,
        ];
        assert_eq!(
            place_probe_for(&ra, Entry::Reallocarray),
            moved(9, [Rdi, Rsi, One])
        );
        assert_eq!(
            place_probe_for(&ra, Entry::Reallocarray).cookie_bits(),
            8 << 16
        );
        // Without the product rule (three arguments read separately): offset 0.
        assert_eq!(place_probe(&ra, 3), FALLBACK);
        // realloc reads rsi as the size itself: the product is not its argument.
        assert_eq!(place_probe_for(&ra, Entry::Realloc), FALLBACK);
        // A product with a non-argument (mul %rcx after rax = n) is not one.
        let other = [0x48, 0x89, 0xf0, 0x48, 0x31, 0xc9, 0x48, 0xf7, 0xe1, 0x55];
        assert_eq!(place_probe_for(&other, Entry::Reallocarray), FALLBACK);
    }
}
