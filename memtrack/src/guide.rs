//! The guide's pages (`docs/src`) and the README as doctests: each Rust block in them compiles,
//! and runs unless its fence says `no_run` or `ignore` (with the reason in the prose beside
//! it), under `cargo test --doc -p memtrack-profiler`. Compiled only for doctests: the published crate
//! holds none of these files.

/// `README.md`.
#[doc = include_str!("../../README.md")]
pub struct Readme;

/// `docs/src/getting-started.md`.
#[doc = include_str!("../../docs/src/getting-started.md")]
pub struct GettingStarted;

/// `docs/src/sessions.md`.
#[doc = include_str!("../../docs/src/sessions.md")]
pub struct Sessions;

/// `docs/src/recorders.md`.
#[doc = include_str!("../../docs/src/recorders.md")]
pub struct Recorders;

/// `docs/src/criterion.md`: its examples use criterion, through the feature.
#[cfg(feature = "criterion")]
#[doc = include_str!("../../docs/src/criterion.md")]
pub struct Criterion;

/// `docs/src/ci.md`.
#[doc = include_str!("../../docs/src/ci.md")]
pub struct Ci;

/// `docs/src/locks.md`.
#[doc = include_str!("../../docs/src/locks.md")]
pub struct Locks;
