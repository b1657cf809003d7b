#[memtrack::memtrack]
struct NotAFunction;

#[memtrack::memtrack]
const fn constant() -> u8 {
    1
}

fn main() {}
