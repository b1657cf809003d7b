#[memtrack::memtrack(nmae = "typo")]
fn unknown() {}

#[memtrack::memtrack(name = "a", name = "b")]
fn repeated() {}

#[memtrack::memtrack(name = 5)]
fn not_a_string() {}

#[memtrack::memtrack(output)]
fn no_value() {}

#[memtrack::memtrack(crate = memtrack, crate = memtrack)]
fn repeated_crate() {}

#[memtrack::memtrack(name = "")]
fn empty_name() {}

fn main() {}

#[memtrack::memtrack(backend = "dtrace")]
fn unknown_backend() {}

#[memtrack::memtrack(scope = "thread")]
fn unknown_scope() {}
