//! The expansion uses absolute paths and prefixed locals: shadowing common names, renaming the
//! crate and user locals named like ours must not break it.
#![allow(dead_code, unused_variables, non_camel_case_types)]

extern crate memtrack as renamed_memtrack;

mod shadows {
    pub struct Result;
    pub struct Option;
    pub struct Some;
    pub struct None;
    pub struct Limits;
    pub struct Guard;
    pub mod std {}
    pub mod core {}
    pub mod memtrack {}
}

// Unused on purpose: the expansion must not pick these up.
#[allow(unused_imports)]
use shadows::*;

#[renamed_memtrack::memtrack(crate = renamed_memtrack)]
fn renamed_crate() -> u32 {
    let guard = 1;
    let __memtrack_here = 2;
    guard + __memtrack_here
}

#[renamed_memtrack::memtrack(crate = ::renamed_memtrack, name = "n")]
fn absolute_crate_path() {}

#[renamed_memtrack::memtrack(crate = renamed_memtrack, max_bytes = 1, no_leaks)]
fn renamed_crate_with_limits() -> u32 {
    let __memtrack_guard = 3;
    __memtrack_guard
}

fn main() {
    let _ = renamed_crate;
    let _ = renamed_crate_with_limits;
    let _ = absolute_crate_path;
}
