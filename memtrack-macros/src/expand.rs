//! Generating the tracked function.
//!
//! ```ignore
//! fn f(args) -> R {
//!     let __memtrack_guard = ::memtrack::__private::start(NAME, OUTPUT);
//!     BODY
//! }
//! ```
//! The guard is the first local, so it is dropped last: after every local of the body and
//! during unwinding from a panic. The return value is moved out before that, so whatever the
//! caller later does with it is not counted.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ItemFn;
use syn::spanned::Spanned;

use crate::attr::Args;

pub(crate) fn expand(args: Args, mut item: ItemFn) -> TokenStream {
    if let Some(a) = &item.sig.asyncness {
        return syn::Error::new_spanned(
            a,
            "#[memtrack] does not support `async fn`: the tracker counts whole threads, and \
             other tasks run on them while this function awaits; put #[memtrack] on a \
             synchronous function, or call `memtrack::start` where the async code is driven",
        )
        .to_compile_error();
    }
    if let Some(c) = &item.sig.constness {
        return syn::Error::new_spanned(c, "#[memtrack] cannot track a `const fn`")
            .to_compile_error();
    }
    let krate = args
        .krate
        .map(|p| quote!(#p))
        .unwrap_or_else(|| quote!(::memtrack));
    let name = match args.name {
        Some(n) => quote!(#n),
        // The function's path, methods included: the path of an item nested in the body names
        // its enclosing impl type too (`crate::module::Type::method::__memtrack_here`).
        None => quote! {{
            fn __memtrack_here() {}
            #krate::__private::fn_path(::core::any::type_name_of_val(&__memtrack_here))
        }},
    };
    let output = match args.output {
        Some(o) => quote!(::core::option::Option::Some(#o)),
        None => quote!(::core::option::Option::None),
    };
    let body = &item.block;
    let span = body.span();
    let block = quote_spanned! {span=>
        {
            let __memtrack_guard = #krate::__private::start(#name, #output);
            #body
        }
    };
    match syn::parse2(block) {
        Ok(b) => *item.block = b,
        Err(e) => return e.to_compile_error(),
    }
    quote!(#item)
}
