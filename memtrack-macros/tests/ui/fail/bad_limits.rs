#[memtrack::memtrack(max_allocations = -1)]
fn negative() {}

#[memtrack::memtrack(max_peak = -(4))]
fn negative_expression() {}

#[memtrack::memtrack(max_bytes = 1.5)]
fn not_an_integer() {}

#[memtrack::memtrack(max_peak = "4096")]
fn a_string() {}

#[memtrack::memtrack(max_bytes = 1024u64)]
fn suffixed() {}

#[memtrack::memtrack(max_bytes = 18_446_744_073_709_551_616)]
fn too_large() {}

#[memtrack::memtrack(max_allocations = 1, max_allocations = 2)]
fn repeated() {}

#[memtrack::memtrack(no_leaks, no_leaks)]
fn repeated_flag() {}

#[memtrack::memtrack(no_leaks = true)]
fn flag_with_value() {}

#[memtrack::memtrack(max_peak)]
fn no_value() {}

const LIMIT: u64 = 5;

#[memtrack::memtrack(max_allocations = LIMIT)]
fn not_a_literal() {}

#[memtrack::memtrack(max_allocs = 5)]
fn unknown() {}

#[memtrack::memtrack(allocations = 3, max_allocations = 2)]
fn exact_and_max() {}

#[memtrack::memtrack(min_allocations = 1, allocations = 3)]
fn min_and_exact() {}

#[memtrack::memtrack(min_allocations = 5, max_allocations = 4)]
fn min_above_max() {}

#[memtrack::memtrack(max_blocks = -1)]
fn negative_blocks() {}

fn main() {}
