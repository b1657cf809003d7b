//! Generating the tracked function.
//!
//! ```ignore
//! fn f(args) -> R {
//!     let __memtrack_guard = ::memtrack::__private::start(
//!         NAME,
//!         ::memtrack::Limits::new().max_allocations(N), // and the other limits
//!         |s: ::memtrack::SessionBuilder| s.output_dir(OUTPUT).backend(BACKEND), // and so on
//!         FAIL,
//!     );
//!     BODY_STATEMENTS
//! }
//! ```
//! Every option is a call of the public, typed API (`Limits`, `SessionBuilder`,
//! `BackendChoice`, `Scope`); the guard only holds the session for the body's duration.
//! The guard is the first local, so it is dropped last: after every local of the body and
//! during unwinding from a panic. The return value is moved out before that, so whatever the
//! caller later does with it is not counted. The body's statements are spliced into the
//! function's block (not nested as a block of their own), so a body such as `{ 42 }` does not
//! become `{ let g = …; { 42 } }`, which warns `unused_braces` in the user's crate.
//!
//! With limits, the guard's drop fails on a violated limit. `FAIL` is a closure that panics,
//! generated here with the span of the function's name: the panic happens in the guard's
//! `Drop` (where `#[track_caller]` does not reach), but its location is the user's function,
//! not memtrack's source.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{ItemFn, Signature};

use crate::attr::{Args, LimitArgs};

pub(crate) fn expand(args: Args, mut item: ItemFn) -> TokenStream {
    if let Some(e) = unsupported(&item.sig) {
        return e.to_compile_error();
    }
    let krate = args
        .krate
        .as_ref()
        .map(|p| quote!(#p))
        .unwrap_or_else(|| quote!(::memtrack));
    let name = match &args.name {
        Some(n) => quote!(#n),
        // The function's path, methods included: the path of an item nested in the body names
        // its enclosing impl type too (`crate::module::Type::method::__memtrack_here`).
        None => quote! {{
            fn __memtrack_here() {}
            #krate::__private::fn_path(::core::any::type_name_of_val(&__memtrack_here))
        }},
    };
    let session = session_calls(&args, &krate);
    // The location a failure reports: `panic!` spanned at the function's name.
    let fn_span = item.sig.ident.span();
    let fail = quote_spanned! {fn_span=>
        |__memtrack_message: ::std::string::String| ::core::panic!("{}", __memtrack_message)
    };
    let limits = limit_calls(&args.limits);
    let start = quote! {
        #krate::__private::start(
            #name,
            #krate::Limits::new()
                #limits,
            |__memtrack_session: #krate::SessionBuilder| {
                __memtrack_session #session
            },
            #fail,
        )
    };
    let guard: syn::Stmt = match syn::parse2(quote! { let __memtrack_guard = #start; }) {
        Ok(s) => s,
        Err(e) => return e.to_compile_error(),
    };
    item.block.stmts.insert(0, guard);
    quote!(#item)
}

/// The error for a function the guard cannot track: an `async fn` or a `const fn`.
fn unsupported(sig: &Signature) -> Option<syn::Error> {
    if let Some(a) = &sig.asyncness {
        return Some(syn::Error::new_spanned(
            a,
            "#[memtrack] does not support `async fn`: the tracker counts whole threads, and \
             other tasks run on them while this function awaits; put #[memtrack] on a \
             synchronous function, or call `memtrack::start` where the async code is driven",
        ));
    }
    if let Some(c) = &sig.constness {
        return Some(syn::Error::new_spanned(
            c,
            "#[memtrack] cannot track a `const fn`",
        ));
    }
    None
}

/// The attribute's options as the builder's own calls, each keeping the span of the
/// user's option; the spellings were checked in `attr`.
fn session_calls(args: &Args, krate: &TokenStream) -> TokenStream {
    let output = args
        .output
        .as_ref()
        .map(|o| quote_spanned!(o.span()=> .output_dir(#o)));
    let backend = args.backend.as_ref().map(|b| {
        let variant = match b.value().as_str() {
            "ebpf" => quote_spanned!(b.span()=> Ebpf),
            "alloc" => quote_spanned!(b.span()=> Alloc),
            _ => quote_spanned!(b.span()=> Auto),
        };
        quote_spanned!(b.span()=> .backend(#krate::BackendChoice::#variant))
    });
    let scope = args.scope.as_ref().map(|s| {
        let variant = match s.value().as_str() {
            "process" => quote_spanned!(s.span()=> Process),
            _ => quote_spanned!(s.span()=> Threads),
        };
        quote_spanned!(s.span()=> .scope(#krate::Scope::#variant))
    });
    let in_memory = args
        .in_memory
        .map(|span| quote_spanned!(span=> .in_memory(true)));
    let locks = args
        .locks
        .map(|span| quote_spanned!(span=> .lock_waits(true)));
    quote!(#output #backend #scope #in_memory #locks)
}

/// The limits as calls on `Limits::new()`, in the order the guard has always made them.
fn limit_calls(l: &LimitArgs) -> TokenStream {
    let max_allocations = l
        .max_allocations
        .map(value)
        .map(|n| quote!(.max_allocations(#n)));
    let allocations = l
        .allocations
        .map(value)
        .map(|n| quote!(.expect_allocations(#n)));
    let min_allocations = l
        .min_allocations
        .map(value)
        .map(|n| quote!(.min_allocations(#n)));
    let max_blocks = l.max_blocks.map(value).map(|n| quote!(.max_blocks(#n)));
    let max_bytes = l.max_bytes.map(value).map(|n| quote!(.max_bytes(#n)));
    let max_peak = l.max_peak.map(value).map(|n| quote!(.max_peak(#n)));
    let no_leaks = l.no_leaks.map(|span| quote_spanned!(span=> .no_leaks()));
    quote! {
        #max_allocations #allocations #min_allocations #max_bytes #max_peak
        #max_blocks #no_leaks
    }
}

/// A limit's value as a literal with the span of the user's literal.
fn value((n, span): (u64, Span)) -> Literal {
    let mut lit = Literal::u64_suffixed(n);
    lit.set_span(span);
    lit
}
