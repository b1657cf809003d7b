//! Rebuilds the checked-in BPF object `memtrack-bpf/src/bpf/memtrack.bpf.o` with clang.
//!
//! ```text
//! cargo run -p memtrack-bpf --bin memtrack-bpf-gen            # rewrite the object
//! cargo run -p memtrack-bpf --bin memtrack-bpf-gen -- --check # fail if it is stale
//! ```
//!
//! `CLANG` names the compiler (default `clang`). The build runs from the workspace root with
//! relative paths and `-fdebug-prefix-map=<root>=.`, so the object (its BTF line info) is
//! byte-identical in every checkout; CI regenerates it and runs `git diff --exit-code`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The object, relative to the workspace root.
const OBJECT: &str = "memtrack-bpf/src/bpf/memtrack.bpf.o";
/// The source, relative to the workspace root.
const SOURCE: &str = "memtrack-bpf/src/bpf/memtrack.bpf.c";

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("memtrack-bpf-gen: unknown argument {other:?} (expected nothing or --check)");
            return ExitCode::from(2);
        }
    };
    let root: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate lives in a workspace folder")
        .to_path_buf();
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    let out = std::env::temp_dir().join(format!("memtrack.bpf.{}.o", std::process::id()));
    let status = Command::new(&clang)
        .current_dir(&root)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror",
        ])
        .arg(format!("-fdebug-prefix-map={}=.", root.display()))
        .args(["-c", SOURCE, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("memtrack-bpf-gen: {clang} failed ({s})");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!(
                "memtrack-bpf-gen: cannot run {clang}: {e} (install it: apt-get install -y clang)"
            );
            return ExitCode::FAILURE;
        }
    }
    let fresh = match std::fs::read(&out) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("memtrack-bpf-gen: cannot read {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
    };
    let _ = std::fs::remove_file(&out);
    let target = root.join(OBJECT);
    if check {
        if std::fs::read(&target).ok().as_deref() == Some(&fresh[..]) {
            println!("{OBJECT} is up to date");
            return ExitCode::SUCCESS;
        }
        eprintln!("{OBJECT} is stale: run `cargo run -p memtrack-bpf --bin memtrack-bpf-gen`");
        return ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::write(&target, &fresh) {
        eprintln!("memtrack-bpf-gen: cannot write {}: {e}", target.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {OBJECT} ({} bytes)", fresh.len());
    ExitCode::SUCCESS
}
