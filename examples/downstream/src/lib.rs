//! The code under test: a tokenizer that allocates one `String` per token.

/// Splits `src` into lower-cased identifier and number tokens.
pub fn tokenize(src: &str) -> Vec<String> {
    src.split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}
