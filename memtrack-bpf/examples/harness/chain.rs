//! A call chain of known depth with frame pointers, written in assembly so that it does not
//! depend on how rustc was asked to compile this crate (Rust code omits frame pointers unless
//! built with `-C force-frame-pointers=yes`).
//!
//! `mt_chain(n, size)` calls itself `n` times, each frame doing `push rbp; mov rbp, rsp`, and
//! the innermost returns `malloc(size)`. A user stack walked at malloc's return therefore starts
//! with `mt_chain_site` (the return address of the malloc call) followed by `mt_chain_ret` (the
//! return address of the recursive call) `n` times, then `mt_chain`'s caller.

use std::arch::global_asm;
use std::ffi::c_void;

global_asm!(
    ".text",
    ".globl mt_chain",
    ".type mt_chain, @function",
    "mt_chain:",
    "push rbp",
    "mov rbp, rsp",
    "test rdi, rdi",
    "jz 2f",
    "dec rdi",
    "call mt_chain",
    ".globl mt_chain_ret",
    "mt_chain_ret:",
    "pop rbp",
    "ret",
    "2:",
    "mov rdi, rsi",
    "call {malloc}",
    ".globl mt_chain_site",
    "mt_chain_site:",
    "pop rbp",
    "ret",
    ".size mt_chain, . - mt_chain",
    malloc = sym libc::malloc,
);

unsafe extern "C" {
    /// `malloc(size)` called `n` frames down.
    pub fn mt_chain(n: usize, size: usize) -> *mut c_void;
    /// A label: the return address of `mt_chain`'s recursive call.
    pub fn mt_chain_ret();
    /// A label: the return address of `mt_chain`'s call of malloc.
    pub fn mt_chain_site();
}
