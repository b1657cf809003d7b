//! Parsing `#[memtrack(...)]` options.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, Lit, LitStr, Meta, Path, Token, UnOp};

/// The options of one `#[memtrack]`.
#[derive(Default)]
pub(crate) struct Args {
    pub name: Option<LitStr>,
    pub output: Option<LitStr>,
    pub backend: Option<LitStr>,
    pub scope: Option<LitStr>,
    pub krate: Option<Path>,
    pub in_memory: Option<Span>,
    /// `locks`: also record lock waits (the eBPF tracker's context switches).
    pub locks: Option<Span>,
    pub limits: LimitArgs,
}

/// `max_allocations = N`, `allocations = N` (exactly), `min_allocations = N`, `max_bytes = N`,
/// `max_peak = N`, `max_blocks = N` (non-negative integer literals, `_` separators allowed, no
/// suffix) and the flag `no_leaks`; each value keeps its span.
#[derive(Default)]
pub(crate) struct LimitArgs {
    pub max_allocations: Option<(u64, Span)>,
    pub allocations: Option<(u64, Span)>,
    pub min_allocations: Option<(u64, Span)>,
    pub max_blocks: Option<(u64, Span)>,
    pub max_bytes: Option<(u64, Span)>,
    pub max_peak: Option<(u64, Span)>,
    pub no_leaks: Option<Span>,
}

impl LimitArgs {
    /// Takes `meta` if it is a limit (`Ok(true)`); `Ok(false)` leaves it to the other options.
    fn take(&mut self, meta: &Meta) -> syn::Result<bool> {
        let key = meta.path();
        if key.is_ident("no_leaks") {
            if self.no_leaks.is_some() {
                return Err(twice(key));
            }
            let Meta::Path(p) = meta else {
                return Err(syn::Error::new_spanned(
                    meta,
                    "`no_leaks` is a flag: write `no_leaks`, without a value",
                ));
            };
            self.no_leaks = Some(p.span());
            return Ok(true);
        }
        let slot = if key.is_ident("max_allocations") {
            &mut self.max_allocations
        } else if key.is_ident("max_bytes") {
            &mut self.max_bytes
        } else if key.is_ident("max_peak") {
            &mut self.max_peak
        } else if key.is_ident("allocations") {
            &mut self.allocations
        } else if key.is_ident("min_allocations") {
            &mut self.min_allocations
        } else if key.is_ident("max_blocks") {
            &mut self.max_blocks
        } else {
            return Ok(false);
        };
        if slot.is_some() {
            return Err(twice(key));
        }
        *slot = Some(integer(meta)?);
        Ok(true)
    }

    /// Refuses limits no function can keep, spanned at the value that conflicts.
    fn check_conflicts(&self) -> syn::Result<()> {
        if let Some((n, _)) = self.allocations {
            for (name, other) in [
                ("max_allocations", self.max_allocations),
                ("min_allocations", self.min_allocations),
            ] {
                if let Some((_, span)) = other {
                    return Err(syn::Error::new(
                        span,
                        format!(
                            "`allocations = {n}` already pins the count exactly: remove \
                             `{name}`, or replace `allocations` with a range"
                        ),
                    ));
                }
            }
        }
        if let (Some((min, span)), Some((max, _))) = (self.min_allocations, self.max_allocations)
            && min > max
        {
            return Err(syn::Error::new(
                span,
                format!(
                    "`min_allocations = {min}` is above `max_allocations = {max}`: no function \
                     can keep both"
                ),
            ));
        }
        Ok(())
    }
}

fn twice(key: &Path) -> syn::Error {
    syn::Error::new_spanned(
        key,
        format!(
            "`{}` is given twice",
            key.get_ident().expect("ident option")
        ),
    )
}

/// A limit's value: a non-negative integer literal without suffix (`1_000` is fine).
fn integer(meta: &Meta) -> syn::Result<(u64, Span)> {
    const EXPECTED: &str = "expected a non-negative integer literal, e.g. `65_536`";
    let Meta::NameValue(nv) = meta else {
        return Err(syn::Error::new_spanned(meta, "expected `option = N`"));
    };
    match ungroup(&nv.value) {
        Expr::Lit(ExprLit {
            lit: Lit::Int(n), ..
        }) => {
            // syn reads `-1` in an attribute as one negative literal.
            if n.base10_digits().starts_with('-') {
                return Err(syn::Error::new_spanned(n, "a limit cannot be negative"));
            }
            if !n.suffix().is_empty() {
                return Err(syn::Error::new_spanned(
                    n,
                    "write the limit without a type suffix, e.g. `65_536`",
                ));
            }
            Ok((n.base10_parse::<u64>()?, n.span()))
        }
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => Err(syn::Error::new_spanned(
            &nv.value,
            "a limit cannot be negative",
        )),
        other => Err(syn::Error::new_spanned(other, EXPECTED)),
    }
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

/// The expression inside the invisible groups that `macro_rules!` puts around a `$x:literal`
/// or `$x:expr` fragment, so that `#[memtrack(max_allocations = $n)]` works in a macro.
fn ungroup(mut e: &Expr) -> &Expr {
    while let Expr::Group(g) = e {
        e = &g.expr;
    }
    e
}

fn string(meta: &Meta) -> syn::Result<LitStr> {
    match meta {
        Meta::NameValue(nv) => match ungroup(&nv.value) {
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
                Opt::Meta(meta) => args.take(&meta)?,
            }
        }
        args.limits.check_conflicts()?;
        args.check_locks_backend()?;
        Ok(args)
    }

    /// Takes one option other than `crate`: a limit, a flag, or a string option.
    fn take(&mut self, meta: &Meta) -> syn::Result<()> {
        if self.limits.take(meta)? {
            return Ok(());
        }
        if meta.path().is_ident("locks") {
            return self.take_locks(meta);
        }
        if meta.path().is_ident("in_memory") {
            return self.take_in_memory(meta);
        }
        self.take_string(meta)
    }

    /// `locks`, a flag.
    fn take_locks(&mut self, meta: &Meta) -> syn::Result<()> {
        if self.locks.is_some() {
            return Err(twice(meta.path()));
        }
        let Meta::Path(p) = meta else {
            return Err(syn::Error::new_spanned(
                meta,
                "`locks` is a flag: write `locks`, without a value",
            ));
        };
        self.locks = Some(p.span());
        Ok(())
    }

    /// `in_memory`, a flag that `output` contradicts.
    fn take_in_memory(&mut self, meta: &Meta) -> syn::Result<()> {
        if self.in_memory.is_some() {
            return Err(twice(meta.path()));
        }
        let Meta::Path(p) = meta else {
            return Err(syn::Error::new_spanned(
                meta,
                "`in_memory` is a flag: write `in_memory`, without a value",
            ));
        };
        if self.output.is_some() {
            return Err(syn::Error::new_spanned(
                p,
                "`in_memory` writes no artifact, so `output` has no use: keep one",
            ));
        }
        self.in_memory = Some(p.span());
        Ok(())
    }

    /// `name`, `output`, `backend` or `scope`: a string that is not empty and is one of the
    /// option's values; any other key is an unknown option.
    fn take_string(&mut self, meta: &Meta) -> syn::Result<()> {
        let key = meta.path();
        let slot = if key.is_ident("name") {
            &mut self.name
        } else if key.is_ident("output") {
            &mut self.output
        } else if key.is_ident("backend") {
            &mut self.backend
        } else if key.is_ident("scope") {
            &mut self.scope
        } else {
            return Err(syn::Error::new_spanned(
                key,
                "unknown #[memtrack] option: expected `name = \"…\"`, \
                 `output = \"…\"`, `backend = \"auto\"|\"ebpf\"|\"alloc\"`, \
                 `scope = \"threads\"|\"process\"`, `crate = path`, `in_memory`, `locks`, \
                 `max_allocations = N`, `allocations = N`, `min_allocations = N`, \
                 `max_bytes = N`, `max_peak = N`, `max_blocks = N` or `no_leaks`",
            ));
        };
        if slot.is_some() {
            return Err(twice(key));
        }
        let value = string(meta)?;
        check_value(key, &value)?;
        if key.is_ident("output") && self.in_memory.is_some() {
            return Err(syn::Error::new_spanned(
                key,
                "`in_memory` writes no artifact, so `output` has no use: keep one",
            ));
        }
        *slot = Some(value);
        Ok(())
    }

    /// Refuses `locks` with the allocator recorder, which cannot see lock waits.
    fn check_locks_backend(&self) -> syn::Result<()> {
        if let (Some(span), Some(b)) = (self.locks, &self.backend)
            && b.value() == "alloc"
        {
            return Err(syn::Error::new(
                span,
                "`locks` needs the eBPF tracker: lock waits are context switches the kernel \
                 reports, which the allocator recorder (`backend = \"alloc\"`) cannot see; \
                 remove `backend = \"alloc\"` (the eBPF tracker needs root or CAP_BPF + \
                 CAP_PERFMON) or `locks`",
            ));
        }
        Ok(())
    }
}

/// Refuses an empty string option, and a `backend` or `scope` that is none of their values.
fn check_value(key: &Path, value: &LitStr) -> syn::Result<()> {
    if value.value().is_empty() {
        return Err(syn::Error::new_spanned(value, "must not be empty"));
    }
    if key.is_ident("backend") && !matches!(value.value().as_str(), "auto" | "ebpf" | "alloc") {
        return Err(syn::Error::new_spanned(
            value,
            "unknown backend: expected \"auto\", \"ebpf\" or \"alloc\"",
        ));
    }
    if key.is_ident("scope") && !matches!(value.value().as_str(), "threads" | "process") {
        return Err(syn::Error::new_spanned(
            value,
            "unknown scope: expected \"threads\" (the function's thread and \
             the threads it spawns, the default) or \"process\"",
        ));
    }
    Ok(())
}
