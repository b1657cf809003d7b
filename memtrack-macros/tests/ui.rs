//! Compile tests of `#[memtrack]`: what must expand and build, and what must be refused with
//! a spanned error (expected messages in `tests/ui/fail/*.stderr`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
