//! Parsing `#[memtrack(...)]` options.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Lit, LitStr, Meta, Path, Token};

/// The options of one `#[memtrack]`.
#[derive(Default)]
pub(crate) struct Args {
    pub name: Option<LitStr>,
    pub output: Option<LitStr>,
    pub krate: Option<Path>,
}

/// `crate = path` does not parse as `Meta` (`crate` is a keyword), so options are parsed by hand.
enum Opt {
    Crate(Span, Path),
    Meta(Meta),
}

impl Parse for Opt {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(Token![crate]) {
            let kw: Token![crate] = input.parse()?;
            input.parse::<Token![=]>()?;
            Ok(Opt::Crate(kw.span, input.parse()?))
        } else {
            Ok(Opt::Meta(input.parse()?))
        }
    }
}

fn string(meta: &Meta) -> syn::Result<LitStr> {
    match meta {
        Meta::NameValue(nv) => match &nv.value {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => Ok(s.clone()),
            other => Err(syn::Error::new_spanned(other, "expected a string literal")),
        },
        _ => Err(syn::Error::new_spanned(
            meta,
            "expected `option = \"value\"`",
        )),
    }
}

impl Args {
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Self> {
        let opts = Punctuated::<Opt, Token![,]>::parse_terminated.parse2(tokens)?;
        let mut args = Args::default();
        for opt in opts {
            match opt {
                Opt::Crate(span, path) => {
                    if args.krate.is_some() {
                        return Err(syn::Error::new(span, "`crate` is given twice"));
                    }
                    args.krate = Some(path);
                }
                Opt::Meta(meta) => {
                    let key = meta.path();
                    let slot = if key.is_ident("name") {
                        &mut args.name
                    } else if key.is_ident("output") {
                        &mut args.output
                    } else {
                        return Err(syn::Error::new_spanned(
                            key,
                            "unknown #[memtrack] option: expected `name = \"…\"`, \
                             `output = \"…\"` or `crate = path`",
                        ));
                    };
                    if slot.is_some() {
                        return Err(syn::Error::new_spanned(
                            key,
                            format!(
                                "`{}` is given twice",
                                key.get_ident().expect("ident option")
                            ),
                        ));
                    }
                    let value = string(&meta)?;
                    if value.value().is_empty() {
                        return Err(syn::Error::new_spanned(&value, "must not be empty"));
                    }
                    *slot = Some(value);
                }
            }
        }
        Ok(args)
    }
}
