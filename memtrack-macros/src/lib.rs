//! The `#[memtrack]` attribute: track the allocations of one function.
//!
//! Use it through the `memtrack` crate (`memtrack::memtrack`), which re-exports it and pins
//! this crate's exact version. See that crate's documentation for what is recorded.
//!
//! ```ignore
//! #[memtrack::memtrack]
//! fn parse_json() { /* ... */ }
//!
//! #[memtrack::memtrack(name = "parse/large", output = "target/memtrack")]
//! #[test]
//! fn parses_large_input() { /* ... */ }
//! ```
//!
//! Options: `name = "…"` (default: the function's path, e.g. `my_crate::bench::parse_json`),
//! `output = "…"` (directory of the artifact; default `$MEMTRACK_DIR`, else
//! `<target dir>/memtrack`), `crate = path` (where `memtrack` is, if renamed),
//! `backend = "auto"|"ebpf"|"alloc"` (which recorder; default `$MEMTRACK_BACKEND`, else `auto`),
//! `scope = "threads"|"process"` (the function's thread and the threads it spawns, the
//! default; or every thread of the process). A `#[memtrack]` function called inside another's
//! session joins it (no artifact of its own; its own limits are refused there).
//! `in_memory`: write no artifact (the report and its limits are all there is).
//! `locks`: also record lock waits (`SessionBuilder::lock_waits(true)`: every context switch
//! of the recorded threads, classified by stack; the summary line gives their totals). It
//! needs the eBPF tracker: with `backend = "alloc"` it is a compile error, and when `auto`
//! picks the allocator recorder at run time, recording does not start and says why.
//! Limits for tests: `max_allocations = N`, `max_bytes = N` (bytes allocated in total),
//! `max_peak = N` (peak live heap bytes), `max_blocks = N` (most heap blocks live at once),
//! `no_leaks` (no heap block live at the end); expectations: `allocations = N` (exactly),
//! `min_allocations = N`. Values are non-negative integer literals (`65_536`), each limit
//! passes at its value, contradictory ones are compile errors, and a violation panics with the
//! measured numbers when the body ends, at the location of the function (see
//! `memtrack::Limits`).
//! `async fn` is refused at compile time: the tracker counts whole threads, and while an async
//! function awaits, other tasks run on its threads.

mod attr;
mod expand;

use proc_macro::TokenStream;

/// Records every allocation the function's body makes. The calls of one function in a process
/// are one recording of N calls: one artifact (each call bounded, so `memtrack show` and
/// `compare` give per-call figures) and one summary line, printed when the recording is
/// finished (`memtrack::finish_calls()` or the end of the process), even when calls of other
/// `#[memtrack]` functions come in between. Limits hold per call: a call that breaks one panics when its body returns, at the
/// function's location. See the crate docs for the options.
#[proc_macro_attribute]
pub fn memtrack(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = match attr::Args::parse(args.into()) {
        Ok(a) => a,
        Err(e) => return e.to_compile_error().into(),
    };
    let item = match syn::parse::<syn::ItemFn>(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let item: proc_macro2::TokenStream = item.into();
            return syn::Error::new_spanned(
                item,
                "#[memtrack] goes on a function (free fn, method, #[test] or benchmark fn)",
            )
            .to_compile_error()
            .into();
        }
    };
    expand::expand(args, item).into()
}
