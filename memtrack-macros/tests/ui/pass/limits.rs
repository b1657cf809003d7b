//! Limits: integer literals with or without `_` separators, `no_leaks` as a flag, in any order
//! and combined with the other options; only compiled (recording needs privileges, which the
//! runtime tests in `tests/session.rs` cover).
use memtrack::memtrack;

#[memtrack(max_allocations = 3)]
fn allocations_only() {}

#[memtrack(no_leaks)]
fn no_leaks_only() {}

#[memtrack(
    name = "all",
    max_allocations = 1_000,
    max_bytes = 65_536,
    max_peak = 0,
    no_leaks,
    output = "target/ui-memtrack"
)]
fn all_limits() -> u8 {
    1
}

#[memtrack(no_leaks, max_peak = 18_446_744_073_709_551_615)]
fn largest_limit() {}

#[memtrack(max_bytes = 0x10_000)]
fn hex_limit() {}

struct S;

impl S {
    #[memtrack(max_allocations = 10)]
    fn method(&self, n: usize) -> usize {
        n
    }
}

#[memtrack(max_allocations = 5)]
#[test]
fn limited_test() {}

fn main() {
    let _: fn() = allocations_only;
    let _: fn() = no_leaks_only;
    let _: fn() -> u8 = all_limits;
    let _: fn() = largest_limit;
    let _: fn() = hex_limit;
    let _: fn(&S, usize) -> usize = S::method;
}
