//! The crate's mode as two cfgs of its own, so that the modules name one cfg instead of every
//! way a mode is chosen:
//! - `memtrack_instructions`: instructions mode, by feature `instructions` (what `memtrack
//!   bench` enables: the suite's other dependencies are built as in timing mode) or by
//!   `--cfg memtrack_bench="instructions"`;
//! - `memtrack_measured`: memory or instructions mode (any `memtrack_bench` cfg, or the feature).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(memtrack_instructions, memtrack_measured)");
    // Cargo sets CARGO_CFG_MEMTRACK_BENCH when the target's rustflags hold any `--cfg
    // memtrack_bench`: empty for the name alone, else the values, comma-separated.
    let cfg = std::env::var("CARGO_CFG_MEMTRACK_BENCH").ok();
    let instructions = std::env::var_os("CARGO_FEATURE_INSTRUCTIONS").is_some()
        || cfg
            .as_deref()
            .is_some_and(|v| v.split(',').any(|v| v == "instructions"));
    if instructions {
        println!("cargo::rustc-cfg=memtrack_instructions");
    }
    if instructions || cfg.is_some() {
        println!("cargo::rustc-cfg=memtrack_measured");
    }
}
