//! The `#[memtrack]` attribute (track the allocations of one function) will live here; it is
//! re-exported by the `memtrack` crate. This crate is part of the workspace from the start so
//! the layout and the version pinning between the two crates are fixed early.
