//! `locks`: a flag, alone or with the other options (limits, `in_memory`, the eBPF or automatic
//! backend, `crate = path`), on functions and methods; only compiled (recording needs
//! privileges, which the runtime tests in `tests/session_locks.rs` and `tests/test_attribute.rs`
//! cover).
use memtrack::memtrack;

#[memtrack(locks)]
fn locks_only() {}

#[memtrack(name = "contended", locks, in_memory, backend = "ebpf", scope = "process")]
fn with_options() -> u32 {
    7
}

#[memtrack(backend = "auto", locks, max_allocations = 1_000, no_leaks)]
fn with_limits() {}

#[memtrack(locks, crate = ::memtrack)]
fn with_crate() {}

struct S;

impl S {
    #[memtrack(locks)]
    fn method(&self) -> usize {
        1
    }
}

fn main() {
    let _ = (locks_only as fn(), with_options as fn() -> u32, with_limits as fn());
    let _ = (with_crate as fn(), S::method as fn(&S) -> usize);
}
