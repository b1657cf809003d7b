//! Every kind of function `#[memtrack]` supports. Only compiled (and `main` run, which calls
//! nothing tracked): recording needs privileges, which the runtime tests cover.
use memtrack::memtrack;

#[memtrack]
fn free_fn() {
    let _v = vec![1u8; 16];
}

#[memtrack(name = "custom name", output = "target/ui-memtrack")]
fn returns_value(n: usize) -> Vec<u8> {
    vec![0; n]
}

#[memtrack]
fn returns_result(s: &str) -> Result<u32, std::num::ParseIntError> {
    let n: u32 = s.parse()?;
    if n == 0 {
        return Ok(1);
    }
    Ok(n * 2)
}

#[memtrack]
fn generic<T: Clone + Default>(n: usize) -> Vec<T> {
    vec![T::default(); n]
}

#[memtrack]
fn with_lifetimes<'a>(s: &'a str, _t: &str) -> &'a str {
    s.trim()
}

#[memtrack]
fn returns_impl(n: u8) -> impl Iterator<Item = u8> {
    0..n
}

struct Parser {
    buf: Vec<u8>,
}

impl Parser {
    #[memtrack]
    fn method(&mut self, n: usize) -> usize {
        self.buf.extend(std::iter::repeat_n(7, n));
        self.buf.len()
    }

    #[memtrack(name = "Parser::new")]
    fn new() -> Self {
        Parser { buf: Vec::new() }
    }
}

trait Bench {
    fn run(&self) -> u64;
}

impl Bench for Parser {
    #[memtrack]
    fn run(&self) -> u64 {
        self.buf.iter().map(|&b| b as u64).sum()
    }
}

#[memtrack]
#[allow(dead_code)]
fn attribute_order_a() {}

#[allow(dead_code)]
#[memtrack]
fn attribute_order_b() {}

#[memtrack]
#[must_use]
fn keeps_other_attributes() -> u8 {
    1
}

fn main() {
    let _: fn() = free_fn;
    let _: fn(usize) -> Vec<u8> = returns_value;
    let _: fn(&str) -> Result<u32, std::num::ParseIntError> = returns_result;
    let _: fn(usize) -> Vec<String> = generic::<String>;
    let _ = with_lifetimes;
    let _ = returns_impl;
    let _: fn(&mut Parser, usize) -> usize = Parser::method;
    let _: fn() -> Parser = Parser::new;
    let _ = <Parser as Bench>::run;
    let _ = keeps_other_attributes;
}

#[memtrack(backend = "alloc")]
fn with_backend() {}

#[memtrack(backend = "ebpf", max_allocations = 10)]
fn with_backend_and_limits() {}

#[allow(dead_code)]
fn uses_backends() {
    with_backend();
    with_backend_and_limits();
}
