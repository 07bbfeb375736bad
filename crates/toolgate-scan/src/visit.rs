//! What one function's own code does: capability sites, evasion findings and the calls to follow.
//! Each function is analysed once, whatever the number of tools that reach it.

use std::collections::{HashMap, HashSet};

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, Expr, Lit, Member, Token};

use super::evasion::{self, CHAR_CODES, CHAR_CODES_MIN};
use super::rules::{self, ANY_RECEIVER_METHODS, NAMED_RECEIVER_METHODS, PATH_RULES, UNSAFE_FFI};

/// `use` aliases of one file: the local name and the full path it stands for.
pub(super) type Aliases = HashMap<String, Vec<String>>;

/// A capability found in a function, before the call chain is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Site {
    pub(super) family: &'static str,
    pub(super) line: usize,
    pub(super) what: String,
}

/// An evasion heuristic's hit in a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EvasionSite {
    pub(super) kind: &'static str,
    pub(super) line: usize,
    pub(super) decoded: Option<String>,
}

/// A type as the scanner knows it: the segments of a path after `use` aliases were expanded
/// (`["reqwest", "Client"]`, `["BookingStore"]`, `["Self"]`).
pub(super) type TypePath = Vec<String>;

/// A method call's receiver, as far as syntax tells. `&`, `*` and `(..)` are dropped; `?` and
/// `.await` are kept for reports but do not change which methods can be reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Recv {
    /// `self`.
    SelfValue,
    /// A local variable or parameter.
    Var(String),
    /// `base.field` (tuple fields by index: `self.0`).
    Field(Box<Recv>, String),
    /// `base.method(..)`.
    Method(Box<Recv>, String),
    /// `path(..)`: a function or constructor call, the path expanded.
    Call(Vec<String>),
    /// `Type { .. }`: a struct literal.
    Literal(TypePath),
    /// `base.await`.
    Await(Box<Recv>),
    /// `base?`.
    Try(Box<Recv>),
    /// Anything else (a block, a closure's result, a macro): the type is unknown.
    Unknown,
}

impl Recv {
    /// The receiver as it reads in the source, for reports: `self.client`,
    /// `self.pool.acquire(..)`, `store`.
    pub(super) fn render(&self) -> String {
        match self {
            Recv::SelfValue => "self".to_owned(),
            Recv::Var(name) => name.clone(),
            Recv::Field(base, field) => format!("{}.{field}", base.render()),
            Recv::Method(base, method) => format!("{}.{method}(..)", base.render()),
            Recv::Call(path) => format!("{}(..)", path.join("::")),
            Recv::Literal(path) => format!("{} {{ .. }}", path.join("::")),
            Recv::Await(base) => format!("{}.await", base.render()),
            Recv::Try(base) => format!("{}?", base.render()),
            Recv::Unknown => "(..)".to_owned(),
        }
    }
}

/// What a local name is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Binding {
    /// A declared type (`let s: Store`, a typed parameter).
    Typed(Vec<TypePath>),
    /// The value of an expression (`let s = Store::new(..)`, `if let Ok(g) = self.state.lock()`).
    /// Patterns are transparent: `Some(x)`, `Ok(x)`, `(a, b)` bind to the whole value's types,
    /// which over-approximates (the element types are among its generic arguments).
    Value(Recv),
}

/// A call (or function reference) to resolve against the index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum CallRef {
    /// `foo(..)`, `path::foo(..)`, `Type::foo(..)`, `Self::foo(..)`, `.map(foo)`: the path
    /// after `use` aliases were expanded.
    Path(Vec<String>),
    /// `receiver.method(..)`, resolved through the receiver's type (see [`Recv`]).
    Method {
        /// The receiver.
        recv: Recv,
        /// The method called on it.
        method: String,
        /// The 1-based line of the method name.
        line: usize,
    },
}

/// Everything the scanner keeps of one function.
#[derive(Debug, Clone, Default)]
pub(super) struct Findings {
    pub(super) sites: Vec<Site>,
    pub(super) evasion: Vec<EvasionSite>,
    pub(super) calls: Vec<CallRef>,
    /// Every local name (parameters, `let`, `if let`, `for`, `match` arms, typed closure
    /// parameters) and what it is bound to. Scopes are flattened: a name bound twice has both
    /// bindings (over-approximation).
    pub(super) bindings: HashMap<String, Vec<Binding>>,
    /// The function's own generic parameters and the trait paths that bound them.
    pub(super) generics: HashMap<String, Vec<TypePath>>,
    /// The types the function's return type names (`Self` included as written).
    pub(super) returns: Vec<TypePath>,
    /// `.commit(..)` sites and their receivers: a site unless the receiver's declared type is
    /// known and foreign (a database transaction's commit is not toolgate's commit store).
    pub(super) commits: Vec<(Site, Recv)>,
}

/// Analyses a function: its attributes, signature and body (closures, async blocks, nested
/// items and macro arguments included).
pub(super) fn analyze_fn(
    aliases: &Aliases,
    attrs: &[Attribute],
    sig: &syn::Signature,
    block: Option<&syn::Block>,
) -> Findings {
    let mut v = FnVisitor::new(aliases);
    for attr in attrs {
        // `#[unsafe(no_mangle)]`, `#[no_mangle]` and `#[export_name]` export the function to
        // foreign code.
        let path = attr.path();
        if path.is_ident("unsafe") || path.is_ident("no_mangle") || path.is_ident("export_name") {
            v.site(
                UNSAFE_FFI,
                line(attr.pound_token.span),
                "exported symbol".to_owned(),
            );
        }
    }
    v.visit_signature(sig);
    v.out.generics = generic_bounds(aliases, &sig.generics);
    v.out.returns = match &sig.output {
        syn::ReturnType::Type(_, ty) => type_paths(aliases, ty),
        syn::ReturnType::Default => Vec::new(),
    };
    for input in &sig.inputs {
        if let syn::FnArg::Typed(arg) = input {
            let types = type_paths(aliases, &arg.ty);
            v.bind(&arg.pat, &Binding::Typed(types));
        }
    }
    if let Some(block) = block {
        v.visit_block(block);
    }
    v.finish()
}

/// Expands a leading `use` alias of a path.
fn expand_with(aliases: &Aliases, segs: Vec<String>) -> Vec<String> {
    match segs.first().and_then(|first| aliases.get(first)) {
        Some(full) => full.iter().chain(&segs[1..]).cloned().collect(),
        None => segs,
    }
}

/// Every type path a type mentions, outer first, generic arguments, `dyn`/`impl` bounds and
/// reference, slice, array and tuple elements included: `Arc<Mutex<Store>>` names `Arc`,
/// `Mutex` and `Store`; `Box<dyn Backend + Send>` names `Box`, `Backend` and `Send`.
pub(super) fn type_paths(aliases: &Aliases, ty: &syn::Type) -> Vec<TypePath> {
    let mut out = Vec::new();
    collect_type_paths(aliases, ty, &mut out);
    out
}

fn collect_type_paths(aliases: &Aliases, ty: &syn::Type, out: &mut Vec<TypePath>) {
    match ty {
        syn::Type::Path(p) => {
            if let Some(qself) = &p.qself {
                collect_type_paths(aliases, &qself.ty, out);
            }
            out.push(expand_with(aliases, segments(&p.path)));
            path_arguments(aliases, &p.path, out);
        }
        syn::Type::Reference(r) => collect_type_paths(aliases, &r.elem, out),
        syn::Type::Ptr(r) => collect_type_paths(aliases, &r.elem, out),
        syn::Type::Paren(p) => collect_type_paths(aliases, &p.elem, out),
        syn::Type::Group(g) => collect_type_paths(aliases, &g.elem, out),
        syn::Type::Array(a) => collect_type_paths(aliases, &a.elem, out),
        syn::Type::Slice(s) => collect_type_paths(aliases, &s.elem, out),
        syn::Type::Tuple(t) => t
            .elems
            .iter()
            .for_each(|e| collect_type_paths(aliases, e, out)),
        syn::Type::TraitObject(t) => bound_paths(aliases, &t.bounds, out),
        syn::Type::ImplTrait(t) => bound_paths(aliases, &t.bounds, out),
        _ => {}
    }
}

fn path_arguments(aliases: &Aliases, path: &syn::Path, out: &mut Vec<TypePath>) {
    for segment in &path.segments {
        if let syn::PathArguments::AngleBracketed(args) = &segment.arguments {
            for arg in &args.args {
                if let syn::GenericArgument::Type(inner) = arg {
                    collect_type_paths(aliases, inner, out);
                }
            }
        }
    }
}

fn bound_paths(
    aliases: &Aliases,
    bounds: &Punctuated<syn::TypeParamBound, Token![+]>,
    out: &mut Vec<TypePath>,
) {
    for bound in bounds {
        if let syn::TypeParamBound::Trait(t) = bound {
            out.push(expand_with(aliases, segments(&t.path)));
            path_arguments(aliases, &t.path, out);
        }
    }
}

/// The generic type parameters of an item and the trait paths bounding each, from the
/// parameter list and the `where` clause (`<S: Store>`, `where S: Store + Send`).
pub(super) fn generic_bounds(
    aliases: &Aliases,
    generics: &syn::Generics,
) -> HashMap<String, Vec<TypePath>> {
    let mut out: HashMap<String, Vec<TypePath>> = HashMap::new();
    for param in generics.type_params() {
        let bounds = out.entry(param.ident.to_string()).or_default();
        bound_paths(aliases, &param.bounds, bounds);
    }
    if let Some(clause) = &generics.where_clause {
        for predicate in &clause.predicates {
            if let syn::WherePredicate::Type(p) = predicate
                && let syn::Type::Path(ty) = &p.bounded_ty
                && let Some(ident) = ty.path.get_ident()
            {
                let bounds = out.entry(ident.to_string()).or_default();
                bound_paths(aliases, &p.bounds, bounds);
            }
        }
    }
    out
}

/// Whether an item carries `#[cfg(test)]`: test code is not part of what a handler can reach
/// in the shipped binary.
pub(super) fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

/// The line of a span's start. Nodes are asked for the span of their first token:
/// `Spanned::span` would build a token stream per node, and the scanner needs the line of
/// nearly every path.
fn line(span: proc_macro2::Span) -> usize {
    span.start().line
}

fn path_line(path: &syn::Path) -> usize {
    match (&path.leading_colon, path.segments.first()) {
        (Some(colon), _) => line(colon.spans[0]),
        (None, Some(first)) => line(first.ident.span()),
        (None, None) => 0,
    }
}

fn segments(path: &syn::Path) -> Vec<String> {
    path.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// The name a receiver goes by: the variable, the field, or the method that produced it.
fn receiver_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        Expr::Field(f) => match &f.member {
            Member::Named(ident) => Some(ident.to_string()),
            Member::Unnamed(_) => receiver_name(&f.base),
        },
        Expr::MethodCall(m) => Some(m.method.to_string()),
        Expr::Call(c) => receiver_name(&c.func),
        Expr::Reference(r) => receiver_name(&r.expr),
        Expr::Paren(p) => receiver_name(&p.expr),
        Expr::Try(t) => receiver_name(&t.expr),
        Expr::Await(a) => receiver_name(&a.base),
        _ => None,
    }
}

fn int_literal(expr: &Expr) -> Option<u32> {
    match expr {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse::<u32>().ok(),
        _ => None,
    }
}

struct FnVisitor<'a> {
    aliases: &'a Aliases,
    out: Findings,
    seen_sites: HashSet<(&'static str, usize, String)>,
    seen_calls: HashSet<CallRef>,
    /// Line of the first `OpenOptions` mention.
    open_options: Option<usize>,
    /// Whether a builder method that makes `OpenOptions` write was called.
    write_method: bool,
    /// Whether the function builds strings from numbers (`from_utf8`, `as char`, ...).
    string_builder: bool,
    /// Integer arrays of printable codes: line and decoded text.
    int_arrays: Vec<(usize, String)>,
    /// Integer literals cast to `char` or passed to `char::from`, in source order.
    char_casts: Vec<(usize, u32)>,
}

impl<'a> FnVisitor<'a> {
    fn new(aliases: &'a Aliases) -> Self {
        FnVisitor {
            aliases,
            out: Findings::default(),
            seen_sites: HashSet::new(),
            seen_calls: HashSet::new(),
            open_options: None,
            write_method: false,
            string_builder: false,
            int_arrays: Vec::new(),
            char_casts: Vec::new(),
        }
    }

    fn site(&mut self, family: &'static str, line: usize, what: String) {
        if self.seen_sites.insert((family, line, what.clone())) {
            self.out.sites.push(Site { family, line, what });
        }
    }

    fn call(&mut self, call: CallRef) {
        if self.seen_calls.insert(call.clone()) {
            self.out.calls.push(call);
        }
    }

    /// Replaces a leading `use` alias by the path it stands for.
    fn expand(&self, segs: Vec<String>) -> Vec<String> {
        expand_with(self.aliases, segs)
    }

    /// The receiver an expression stands for (see [`Recv`]).
    fn recv(&self, expr: &Expr) -> Recv {
        match expr {
            Expr::Path(p) if p.path.is_ident("self") => Recv::SelfValue,
            Expr::Path(p) if p.qself.is_none() => match p.path.get_ident() {
                Some(ident) => Recv::Var(ident.to_string()),
                None => Recv::Unknown,
            },
            Expr::Field(f) => {
                let name = match &f.member {
                    Member::Named(ident) => ident.to_string(),
                    Member::Unnamed(index) => index.index.to_string(),
                };
                Recv::Field(Box::new(self.recv(&f.base)), name)
            }
            Expr::MethodCall(m) => {
                Recv::Method(Box::new(self.recv(&m.receiver)), m.method.to_string())
            }
            Expr::Call(c) => match &*c.func {
                Expr::Path(p) if p.qself.is_none() => Recv::Call(self.expand(segments(&p.path))),
                _ => Recv::Unknown,
            },
            Expr::Struct(s) if s.qself.is_none() => Recv::Literal(self.expand(segments(&s.path))),
            Expr::Reference(r) => self.recv(&r.expr),
            Expr::Paren(p) => self.recv(&p.expr),
            Expr::Group(g) => self.recv(&g.expr),
            Expr::Try(t) => Recv::Try(Box::new(self.recv(&t.expr))),
            Expr::Await(a) => Recv::Await(Box::new(self.recv(&a.base))),
            Expr::Index(i) => self.recv(&i.expr),
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => self.recv(&u.expr),
            _ => Recv::Unknown,
        }
    }

    /// Binds every name a pattern introduces to `value` (see [`Binding`]).
    fn bind(&mut self, pat: &syn::Pat, value: &Binding) {
        match pat {
            syn::Pat::Ident(p) => {
                let slot = self.out.bindings.entry(p.ident.to_string()).or_default();
                if !slot.contains(value) {
                    slot.push(value.clone());
                }
                if let Some((_, sub)) = &p.subpat {
                    self.bind(sub, value);
                }
            }
            syn::Pat::Type(t) => {
                let declared = Binding::Typed(type_paths(self.aliases, &t.ty));
                self.bind(&t.pat, &declared);
            }
            syn::Pat::Reference(r) => self.bind(&r.pat, value),
            syn::Pat::Paren(p) => self.bind(&p.pat, value),
            syn::Pat::TupleStruct(t) => t.elems.iter().for_each(|e| self.bind(e, value)),
            syn::Pat::Tuple(t) => t.elems.iter().for_each(|e| self.bind(e, value)),
            syn::Pat::Slice(t) => t.elems.iter().for_each(|e| self.bind(e, value)),
            syn::Pat::Or(o) => o.cases.iter().for_each(|c| self.bind(c, value)),
            _ => {}
        }
    }

    /// Matches a path against the path table and the string-builder list.
    fn check_path(&mut self, segs: &[String], line: usize) {
        let mut families: Vec<&'static str> = Vec::new();
        for rule in PATH_RULES {
            if !families.contains(&rule.family) && rules::matches(rule, segs) {
                families.push(rule.family);
            }
        }
        for family in families {
            self.site(family, line, segs.join("::"));
        }
        if segs.iter().any(|s| s == "OpenOptions") && self.open_options.is_none() {
            self.open_options = Some(line);
        }
        if let Some(last) = segs.last() {
            let char_from = segs.len() >= 2 && segs[segs.len() - 2] == "char" && last == "from";
            if char_from || rules::STRING_BUILDERS.contains(&last.as_str()) {
                self.string_builder = true;
            }
        }
    }

    /// Runs the literal heuristics and the string-pattern table on a decoded hit.
    fn check_literal(&mut self, token_text: &str, value: &str, line: usize) {
        for hit in evasion::check_literal(token_text, value) {
            self.evasion(hit.kind, line, hit.decoded);
        }
    }

    fn evasion(&mut self, kind: &'static str, line: usize, decoded: Option<String>) {
        if let Some(text) = &decoded {
            for (pattern, family) in evasion::pattern_families(text) {
                self.site(
                    family,
                    line,
                    format!("{kind} decodes to {text:?}, which contains {pattern:?}"),
                );
            }
        }
        self.out.evasion.push(EvasionSite {
            kind,
            line,
            decoded,
        });
    }

    fn check_int_array<'e>(&mut self, elems: impl IntoIterator<Item = &'e Expr>, line: usize) {
        let codes: Option<Vec<u32>> = elems.into_iter().map(int_literal).collect();
        if let Some(codes) = codes
            && codes.len() >= CHAR_CODES_MIN
            && let Some(text) = evasion::decode_char_codes(&codes)
        {
            self.int_arrays.push((line, text));
        }
    }

    /// A single-segment path passed as an argument may be a function reference
    /// (`.map_err(tool_error)`); following it over-approximates when it is a variable.
    fn fn_reference_args<'e>(&mut self, args: impl IntoIterator<Item = &'e Expr>) {
        for arg in args {
            if let Expr::Path(p) = arg
                && p.path.segments.len() == 1
                && !p.path.is_ident("self")
            {
                let segs = self.expand(segments(&p.path));
                self.call(CallRef::Path(segs));
            }
        }
    }

    /// The fallback for macro bodies that are not a comma-separated list of expressions
    /// (`json!({..})`, `matches!(x, Pat)`): string literals, paths, `path(..)` calls and
    /// `self.method(..)` calls, read straight from the tokens.
    fn walk_tokens(&mut self, tokens: TokenStream) {
        let toks: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                TokenTree::Group(g) => self.walk_tokens(g.stream()),
                TokenTree::Literal(l) => {
                    let lit = Lit::new(l.clone());
                    self.visit_lit(&lit);
                }
                TokenTree::Ident(first) => {
                    let line = first.span().start().line;
                    let mut segs = vec![first.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (toks.get(j), toks.get(j + 1), toks.get(j + 2))
                    {
                        if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
                        {
                            segs.push(next.to_string());
                            j += 3;
                        } else {
                            break;
                        }
                    }
                    let segs = self.expand(segs);
                    self.check_path(&segs, line);
                    let is_paren = |t: Option<&TokenTree>| matches!(t, Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis);
                    if is_paren(toks.get(j)) {
                        self.call(CallRef::Path(segs.clone()));
                    }
                    if segs.len() == 1
                        && segs[0] == "self"
                        && let (Some(TokenTree::Punct(dot)), Some(TokenTree::Ident(method))) =
                            (toks.get(j), toks.get(j + 1))
                        && dot.as_char() == '.'
                        && is_paren(toks.get(j + 2))
                    {
                        self.call(CallRef::Method {
                            recv: Recv::SelfValue,
                            method: method.to_string(),
                            line: method.span().start().line,
                        });
                    }
                    i = j;
                    continue;
                }
                TokenTree::Punct(_) => {}
            }
            i += 1;
        }
    }

    fn finish(mut self) -> Findings {
        if let Some(line) = self.open_options
            && self.write_method
        {
            self.site(
                rules::FS_WRITE,
                line,
                "OpenOptions with .write/.append/.create/.truncate".to_owned(),
            );
        }
        if self.string_builder {
            for (line, text) in std::mem::take(&mut self.int_arrays) {
                self.evasion(CHAR_CODES, line, Some(text));
            }
        }
        if self.char_casts.len() >= CHAR_CODES_MIN {
            let line = self.char_casts[0].0;
            let codes: Vec<u32> = self.char_casts.iter().map(|&(_, c)| c).collect();
            if let Some(text) = evasion::decode_char_codes(&codes) {
                self.evasion(CHAR_CODES, line, Some(text));
            }
        }
        self.out
    }
}

impl<'ast> Visit<'ast> for FnVisitor<'_> {
    // Attributes inside bodies (`#[allow]`, doc comments on closures) are not behaviour.
    fn visit_attribute(&mut self, _: &'ast Attribute) {}

    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[Attribute] = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            _ => &[],
        };
        if !is_cfg_test(attrs) {
            visit::visit_item(self, item);
        }
    }

    // Imports are not usage; they only feed the alias table (collected per file).
    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {}

    fn visit_item_foreign_mod(&mut self, item: &'ast syn::ItemForeignMod) {
        self.site(
            UNSAFE_FFI,
            line(item.abi.extern_token.span),
            "extern block".to_owned(),
        );
        visit::visit_item_foreign_mod(self, item);
    }

    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        if let Some(unsafety) = &sig.unsafety {
            self.site(UNSAFE_FFI, line(unsafety.span), "unsafe fn".to_owned());
        }
        if let Some(abi) = &sig.abi {
            self.site(
                UNSAFE_FFI,
                line(abi.extern_token.span),
                "extern fn".to_owned(),
            );
        }
        visit::visit_signature(self, sig);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segs = self.expand(segments(path));
        self.check_path(&segs, path_line(path));
        visit::visit_path(self, path);
    }

    fn visit_expr_path(&mut self, expr: &'ast syn::ExprPath) {
        // Any multi-segment path in value position may be a call or a function reference.
        if expr.path.segments.len() >= 2 {
            let segs = self.expand(segments(&expr.path));
            self.call(CallRef::Path(segs));
        }
        visit::visit_expr_path(self, expr);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let Expr::Path(p) = &*call.func {
            if p.path.segments.len() == 1 {
                let segs = self.expand(segments(&p.path));
                self.call(CallRef::Path(segs));
            }
            let last = p.path.segments.last().map(|s| s.ident.to_string());
            let is_char_ctor = p.path.segments.len() >= 2
                && p.path.segments[p.path.segments.len() - 2].ident == "char"
                && matches!(last.as_deref(), Some("from" | "from_u32"));
            if is_char_ctor
                && call.args.len() == 1
                && let Some(code) = call.args.first().and_then(int_literal)
            {
                self.char_casts
                    .push((line(call.paren_token.span.open()), code));
            }
        }
        self.fn_reference_args(&call.args);
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let method = call.method.to_string();
        let line = line(call.method.span());
        let recv = self.recv(&call.receiver);
        if recv != Recv::Unknown {
            self.call(CallRef::Method {
                recv,
                method: method.clone(),
                line,
            });
        }
        for &(name, family) in ANY_RECEIVER_METHODS {
            if method == name && name == rules::OWN_COMMIT {
                let recv = self.recv(&call.receiver);
                self.out.commits.push((
                    Site {
                        family,
                        line,
                        what: format!(".{method}(..)"),
                    },
                    recv,
                ));
            } else if method == name {
                self.site(family, line, format!(".{method}(..)"));
            }
        }
        if let Some(receiver) = receiver_name(&call.receiver) {
            let receiver = receiver.to_lowercase();
            for &(name, word, family) in NAMED_RECEIVER_METHODS {
                if method == name && receiver.contains(word) {
                    self.site(family, line, format!("{receiver}.{method}(..)"));
                }
            }
        }
        if rules::OPEN_OPTIONS_WRITE_METHODS.contains(&method.as_str()) {
            self.write_method = true;
        }
        self.fn_reference_args(&call.args);
        visit::visit_expr_method_call(self, call);
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        let value = match &local.init {
            Some(init) => Binding::Value(self.recv(&init.expr)),
            None => Binding::Typed(Vec::new()),
        };
        self.bind(&local.pat, &value);
        visit::visit_local(self, local);
    }

    fn visit_expr_let(&mut self, expr: &'ast syn::ExprLet) {
        let value = Binding::Value(self.recv(&expr.expr));
        self.bind(&expr.pat, &value);
        visit::visit_expr_let(self, expr);
    }

    fn visit_expr_for_loop(&mut self, expr: &'ast syn::ExprForLoop) {
        let value = Binding::Value(self.recv(&expr.expr));
        self.bind(&expr.pat, &value);
        visit::visit_expr_for_loop(self, expr);
    }

    fn visit_expr_match(&mut self, expr: &'ast syn::ExprMatch) {
        let value = Binding::Value(self.recv(&expr.expr));
        for arm in &expr.arms {
            self.bind(&arm.pat, &value);
        }
        visit::visit_expr_match(self, expr);
    }

    fn visit_expr_closure(&mut self, expr: &'ast syn::ExprClosure) {
        // Only typed closure parameters say what they hold; `|s| ..` stays unknown.
        for input in &expr.inputs {
            if let syn::Pat::Type(_) = input {
                self.bind(input, &Binding::Typed(Vec::new()));
            }
        }
        visit::visit_expr_closure(self, expr);
    }

    fn visit_expr_unsafe(&mut self, expr: &'ast syn::ExprUnsafe) {
        self.site(
            UNSAFE_FFI,
            line(expr.unsafe_token.span),
            "unsafe block".to_owned(),
        );
        visit::visit_expr_unsafe(self, expr);
    }

    fn visit_expr_cast(&mut self, cast: &'ast syn::ExprCast) {
        if let syn::Type::Path(t) = &*cast.ty
            && t.path.is_ident("char")
        {
            self.string_builder = true;
            if let Some(code) = int_literal(&cast.expr) {
                self.char_casts.push((line(cast.as_token.span), code));
            }
        }
        visit::visit_expr_cast(self, cast);
    }

    fn visit_expr_array(&mut self, array: &'ast syn::ExprArray) {
        self.check_int_array(&array.elems, line(array.bracket_token.span.open()));
        visit::visit_expr_array(self, array);
    }

    fn visit_lit(&mut self, lit: &'ast Lit) {
        match lit {
            Lit::Str(s) => self.check_literal(&s.token().to_string(), &s.value(), line(s.span())),
            Lit::ByteStr(s) => {
                let value = String::from_utf8_lossy(&s.value()).into_owned();
                self.check_literal(&s.token().to_string(), &value, line(s.span()));
            }
            Lit::CStr(s) => {
                let value = s.value().to_string_lossy().into_owned();
                self.check_literal(&s.token().to_string(), &value, line(s.span()));
            }
            _ => {}
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        let parsed = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated);
        match parsed {
            Ok(exprs) => {
                if mac.path.is_ident("vec") {
                    self.check_int_array(&exprs, path_line(&mac.path));
                }
                for expr in &exprs {
                    self.visit_expr(expr);
                }
            }
            Err(_) => self.walk_tokens(mac.tokens.clone()),
        }
    }
}
