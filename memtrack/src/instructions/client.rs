//! Valgrind's client requests, the ones counting instructions per benchmark needs: whether the
//! program runs under valgrind, and callgrind's zero and dump of its counters.
//!
//! A client request is a sequence of instructions that does nothing on a real CPU (four
//! rotations of `rdi` by 128 bits in all, then `xchg rbx, rbx`) and that valgrind's JIT
//! recognises: `rax` points at the request and its five arguments, `rdx` gets the answer (left
//! as it was outside valgrind). The codes and the sequence are valgrind's ABI, from
//! `valgrind.h` and `callgrind.h` (x86-64 Linux); on other targets every request answers its
//! default and does nothing.

use std::ffi::CStr;

/// `VG_USERREQ__RUNNING_ON_VALGRIND` (valgrind.h).
const RUNNING_ON_VALGRIND: u64 = 0x1001;
/// `VG_USERREQ_TOOL_BASE('C','T')`: callgrind's first request (callgrind.h).
const CALLGRIND_BASE: u64 = (b'C' as u64) << 24 | (b'T' as u64) << 16;
/// `VG_USERREQ__ZERO_STATS`.
const ZERO_STATS: u64 = CALLGRIND_BASE + 1;
/// `VG_USERREQ__DUMP_STATS_AT`.
const DUMP_STATS_AT: u64 = CALLGRIND_BASE + 3;

/// Sends request `code` with `arg1` and returns valgrind's answer, or `default` when not
/// running under valgrind.
#[inline(always)]
fn request(default: u64, code: u64, arg1: u64) -> u64 {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let args: [u64; 6] = [code, arg1, 0, 0, 0, 0];
        let mut answer = default;
        // SAFETY: outside valgrind the sequence leaves every register as it was (rdi is rotated
        // by 3+13+61+51 = 128 bits; `xchg rbx, rbx` swaps a register with itself) but the
        // flags; under valgrind it reads `args` through rax and writes the answer to rdx.
        unsafe {
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") answer,
                options(nostack),
            );
        }
        answer
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (code, arg1);
        default
    }
}

/// Whether this process runs under valgrind (any tool).
pub fn running_on_valgrind() -> bool {
    request(0, RUNNING_ON_VALGRIND, 0) != 0
}

/// Sets callgrind's counters of every thread to zero (`CALLGRIND_ZERO_STATS`); nothing
/// outside callgrind.
#[inline(always)]
pub fn zero_stats() {
    request(0, ZERO_STATS, 0);
}

/// Writes callgrind's counters since the last zero or dump to a new output file, whose
/// `desc: Trigger:` line is `Client Request: <what>`, and sets them to zero
/// (`CALLGRIND_DUMP_STATS_AT`); nothing outside callgrind. The file is written before this
/// returns.
#[inline(always)]
pub fn dump_stats_at(what: &CStr) {
    request(0, DUMP_STATS_AT, what.as_ptr() as u64);
}
