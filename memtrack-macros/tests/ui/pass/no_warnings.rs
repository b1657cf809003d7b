//! The expansion adds no warning to the user's crate, whatever the function's shape: this file
//! is compiled with every warning denied (a user building with `-D warnings` must not break).
#![deny(warnings)]

use memtrack::memtrack;

// One-line bodies are where rustc's `unused_braces` looks (a user's report).
#[rustfmt::skip]
#[memtrack]
fn answer() -> u32 { 42 }

#[rustfmt::skip]
#[memtrack(max_allocations = 3)]
fn answer_limited() -> u32 { 42 }

#[rustfmt::skip]
#[memtrack]
fn one_line_unit() { () }

#[memtrack]
fn unit() {}

#[memtrack]
fn unit_statement() {
    let _v = vec![1u8; 16];
}

#[memtrack]
fn block_tail() -> u32 {
    {
        let x = 1;
        x + 1
    }
}

#[memtrack]
fn early_return(n: u32) -> u32 {
    if n == 0 {
        return 1;
    }
    n * 2
}

#[memtrack]
fn question_mark(s: &str) -> Result<u32, std::num::ParseIntError> {
    let n: u32 = s.parse()?;
    Ok(n)
}

#[memtrack]
fn generic<T: Clone + Default>(n: usize) -> Vec<T> {
    vec![T::default(); n]
}

#[memtrack]
fn borrowed<'a>(s: &'a str) -> &'a str {
    s.trim()
}

#[memtrack]
fn opaque(n: u8) -> impl Iterator<Item = u8> {
    0..n
}

#[memtrack]
fn diverges() -> ! {
    panic!("never called")
}

#[memtrack]
fn unsafe_body() -> u8 {
    let x = 5u8;
    // SAFETY: a valid pointer to a live local.
    unsafe { *std::ptr::addr_of!(x) }
}

#[memtrack]
fn match_tail(n: u8) -> &'static str {
    match n {
        0 => "zero",
        _ => "more",
    }
}

#[memtrack]
fn with_item() -> u8 {
    fn helper() -> u8 {
        3
    }
    helper()
}

#[memtrack(name = "limited", max_allocations = 10, max_bytes = 1_024, max_peak = 512, no_leaks)]
fn limited() -> u32 {
    7
}

#[memtrack(in_memory, allocations = 3, max_blocks = 2, max_peak = 1_000)]
fn expectations() -> u32 {
    7
}

#[memtrack(min_allocations = 1, max_allocations = 1, in_memory)]
fn min_and_max() {}

struct S(u32);

impl S {
    #[memtrack]
    fn get(&self) -> u32 {
        self.0
    }

    #[memtrack]
    fn take(self) -> u32 {
        self.0
    }

    #[memtrack(max_allocations = 1)]
    fn set(&mut self, v: u32) {
        self.0 = v
    }
}

#[memtrack]
#[must_use]
fn must_use() -> u8 {
    1
}

#[memtrack]
#[test]
fn a_test() {}

fn main() {
    let _ = (answer, answer_limited, one_line_unit);
    let _ = (unit, unit_statement, block_tail, early_return, question_mark);
    let _ = (generic::<u8>, borrowed, opaque, unsafe_body, match_tail, with_item, limited);
    let _ = (S::get, S::take, S::set, must_use, expectations, min_and_max);
    let _: fn() -> ! = diverges;
}
