//! What `#[memtrack]` expands to. Not public API: no SemVer guarantees.

use crate::session::{Session, SessionBuilder};

/// The guard a `#[memtrack]` function holds for the duration of its body; dropping it
/// finishes the session (see [`Session`]'s `Drop`).
pub struct Guard {
    _session: Option<Session>,
}

/// Starts the session of a `#[memtrack]` function, after any session running in this process
/// ends (so parallel tests take turns). Never panics: if recording cannot start, it says why
/// on stderr and the function runs unrecorded.
pub fn start(name: &str, output: Option<&str>) -> Guard {
    let mut b = SessionBuilder::new(name);
    if let Some(dir) = output {
        b = b.output_dir(dir);
    }
    match b.start_waiting() {
        Ok(s) => Guard { _session: Some(s) },
        Err(e) => {
            eprintln!("memtrack: {name}: not recorded: {e}");
            Guard { _session: None }
        }
    }
}

/// The path of the function a `#[memtrack]` expansion is in, from the type name of an item
/// nested in it (`crate::module::Type::method::__memtrack_here`).
pub fn fn_path(type_name: &'static str) -> &'static str {
    type_name
        .strip_suffix("::__memtrack_here")
        .unwrap_or(type_name)
}

/// The name of the session running in this process (for tests of the attribute).
pub fn active_session() -> Option<String> {
    crate::session::active_name()
}
