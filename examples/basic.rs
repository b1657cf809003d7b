//! `#[memtrack]` on a function: every allocation its body makes is recorded into
//! `target/memtrack/<name>.memtrack`, and a one-line summary is printed when the program ends
//! (the function's calls in a process are one recording).
//!
//! Run (needs root, or CAP_BPF + CAP_PERFMON): `cargo run --release --example basic`
//! Then: `cargo run --release -p memtrack-cli -- show target/memtrack/build_index.memtrack`

use std::collections::HashMap;

use memtrack::memtrack;

/// Counts word frequencies: a `HashMap` that grows, and one `String` per distinct word.
#[memtrack(name = "build_index")]
fn build_index(text: &str) -> HashMap<String, usize> {
    let mut index = HashMap::new();
    for word in text.split_whitespace() {
        *index.entry(word.to_lowercase()).or_insert(0) += 1;
    }
    index
}

fn main() {
    let text = "the quick brown fox jumps over the lazy dog ".repeat(2_000)
        + &(0..5_000).map(|i| format!("word{i} ")).collect::<String>();
    let index = build_index(&text);
    println!("{} distinct words", index.len());
}
