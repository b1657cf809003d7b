//! The code under test: a tokenizer that allocates one `String` per token, and a printer that
//! joins tokens back into one `String`.

/// The identifier and number tokens of `src`, lower-cased: one allocation for the vector (sized
/// up front) and one per token.
pub fn tokenize(src: &str) -> Vec<String> {
    let words = || {
        src.split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|t| !t.is_empty())
    };
    let mut tokens = Vec::with_capacity(words().count());
    tokens.extend(words().map(str::to_lowercase));
    tokens
}

/// `tokens` separated by single spaces: one allocation.
pub fn render(tokens: &[String]) -> String {
    tokens.join(" ")
}
