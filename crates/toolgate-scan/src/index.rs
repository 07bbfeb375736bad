//! The function index: every `.rs` file under the roots parsed once, every function analysed
//! once, and the rules that resolve a call to the functions it may reach.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use super::visit::{self as fnvisit, Aliases, Binding, CallRef, Findings, Recv, Site, TypePath};
use super::{ScanError, ScanStats, rules};

/// Generic parameters and the trait paths bounding them.
type Bounds = HashMap<String, Vec<TypePath>>;

/// How deep type inference follows bindings and chains before it gives up (a `let` bound to
/// itself through a chain, or a very long chain).
const MAX_DEPTH: usize = 12;

/// Where a function lives, which decides which calls can reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Owner {
    /// A free function (or a foreign one from an `extern` block).
    Free {
        /// The crate's name with `-` replaced by `_`, empty when the file is not under `src/`.
        krate: String,
        /// The module path inside the crate.
        module: Vec<String>,
    },
    /// A method in an impl block or a default method in a trait.
    Method {
        /// The implementing type's last path segment (`None` for a trait's default method).
        self_ty: Option<String>,
        /// The trait's last path segment, for trait impls and trait definitions.
        trait_name: Option<String>,
    },
}

/// One indexed function.
#[derive(Debug, Clone)]
pub(super) struct FnEntry {
    pub(super) ident: String,
    pub(super) owner: Owner,
    pub(super) file: usize,
    /// The tool name when the function carries `#[tool]`: the attribute's `name = ".."` or the
    /// function's ident.
    pub(super) tool: Option<String>,
    pub(super) findings: Findings,
}

/// All functions of the scanned sources.
#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) files: Vec<PathBuf>,
    pub(super) fns: Vec<FnEntry>,
    by_name: HashMap<String, Vec<usize>>,
    /// Every module name seen (file modules and inline `mod`s).
    modules: HashSet<String>,
    /// Every crate name seen.
    crates: HashSet<String>,
    /// For each struct (by ident), its fields (tuple fields by index) and the type paths each
    /// field's type mentions (`Arc<BookingStore>`: `std::sync::Arc`, `BookingStore`). Structs
    /// of the same name in different modules are merged (over-approximation).
    fields: HashMap<String, HashMap<String, Vec<TypePath>>>,
    /// For each struct, the generic parameters of its declaration and of every impl of it, with
    /// their bounds (a field `store: S` of `struct Server<S: Store>` reaches `Store`'s impls).
    struct_generics: HashMap<String, Bounds>,
    /// Every struct, enum and union ident, and every impl's self type.
    types: HashSet<String>,
    /// Every trait ident.
    traits: HashSet<String>,
    /// For each type, the traits it implements in the scanned sources.
    impls_of: HashMap<String, HashSet<String>>,
    /// `type Name = ..;` aliases: the type paths the alias names.
    type_aliases: HashMap<String, Vec<TypePath>>,
    pub(super) stats: ScanStats,
}

impl Index {
    /// Parses every `.rs` file under the roots. Unreadable or unparsable files are errors that
    /// name the file: a scan that silently skipped one could miss a capability.
    pub(super) fn load(roots: &[PathBuf]) -> Result<Index, ScanError> {
        let mut files = Vec::new();
        let mut seen = HashSet::new();
        for root in roots {
            collect_rs_files(root, &mut files, &mut seen)?;
        }
        let mut index = Index::default();
        for path in files {
            let text = fs::read_to_string(&path).map_err(|source| ScanError::Read {
                path: path.clone(),
                source,
            })?;
            let ast = syn::parse_file(&text).map_err(|e| {
                let start = e.span().start();
                ScanError::Parse {
                    path: path.clone(),
                    line: start.line,
                    column: start.column + 1,
                    message: e.to_string(),
                }
            })?;
            index.stats.files += 1;
            index.stats.lines += text.lines().count();
            let file = index.files.len();
            let (krate, module) = module_path(&path);
            index.files.push(path);
            index.crates.insert(krate.clone());
            index.modules.extend(module.iter().cloned());
            let aliases = collect_aliases(&ast);
            index.add_items(&ast.items, file, &aliases, &krate, &module);
        }
        Ok(index)
    }

    fn push(&mut self, entry: FnEntry) {
        self.by_name
            .entry(entry.ident.clone())
            .or_default()
            .push(self.fns.len());
        self.fns.push(entry);
    }

    fn add_items(
        &mut self,
        items: &[syn::Item],
        file: usize,
        aliases: &Aliases,
        krate: &str,
        module: &[String],
    ) {
        for item in items {
            match item {
                syn::Item::Fn(f) if !fnvisit::is_cfg_test(&f.attrs) => self.push(FnEntry {
                    ident: f.sig.ident.to_string(),
                    owner: Owner::Free {
                        krate: krate.to_owned(),
                        module: module.to_vec(),
                    },
                    file,
                    tool: tool_name(&f.attrs, &f.sig.ident),
                    findings: fnvisit::analyze_fn(aliases, &f.attrs, &f.sig, Some(&f.block)),
                }),
                syn::Item::Impl(imp) if !fnvisit::is_cfg_test(&imp.attrs) => {
                    let self_ty = type_ident(&imp.self_ty);
                    let trait_name = imp
                        .trait_
                        .as_ref()
                        .and_then(|(_, path, _)| path.segments.last())
                        .map(|s| s.ident.to_string());
                    let impl_generics = fnvisit::generic_bounds(aliases, &imp.generics);
                    if let Some(ty) = &self_ty {
                        self.types.insert(ty.clone());
                        if let Some(tr) = &trait_name {
                            self.impls_of
                                .entry(ty.clone())
                                .or_default()
                                .insert(tr.clone());
                        }
                        merge_bounds(
                            self.struct_generics.entry(ty.clone()).or_default(),
                            &impl_generics,
                        );
                    }
                    for it in &imp.items {
                        if let syn::ImplItem::Fn(f) = it
                            && !fnvisit::is_cfg_test(&f.attrs)
                        {
                            let mut findings =
                                fnvisit::analyze_fn(aliases, &f.attrs, &f.sig, Some(&f.block));
                            merge_bounds(&mut findings.generics, &impl_generics);
                            self.push(FnEntry {
                                ident: f.sig.ident.to_string(),
                                owner: Owner::Method {
                                    self_ty: self_ty.clone(),
                                    trait_name: trait_name.clone(),
                                },
                                file,
                                tool: tool_name(&f.attrs, &f.sig.ident),
                                findings,
                            });
                        }
                    }
                }
                syn::Item::Struct(st) if !fnvisit::is_cfg_test(&st.attrs) => {
                    let ident = st.ident.to_string();
                    self.types.insert(ident.clone());
                    merge_bounds(
                        self.struct_generics.entry(ident.clone()).or_default(),
                        &fnvisit::generic_bounds(aliases, &st.generics),
                    );
                    let fields = self.fields.entry(ident).or_default();
                    for (n, field) in st.fields.iter().enumerate() {
                        let name = match &field.ident {
                            Some(name) => name.to_string(),
                            None => n.to_string(),
                        };
                        let types = fields.entry(name).or_default();
                        types.extend(fnvisit::type_paths(aliases, &field.ty));
                    }
                }
                syn::Item::Enum(e) if !fnvisit::is_cfg_test(&e.attrs) => {
                    self.types.insert(e.ident.to_string());
                }
                syn::Item::Union(u) if !fnvisit::is_cfg_test(&u.attrs) => {
                    self.types.insert(u.ident.to_string());
                }
                syn::Item::Type(t) if !fnvisit::is_cfg_test(&t.attrs) => {
                    self.type_aliases
                        .entry(t.ident.to_string())
                        .or_default()
                        .extend(fnvisit::type_paths(aliases, &t.ty));
                }
                syn::Item::Trait(t) if !fnvisit::is_cfg_test(&t.attrs) => {
                    self.traits.insert(t.ident.to_string());
                    for it in &t.items {
                        if let syn::TraitItem::Fn(f) = it
                            && let Some(block) = &f.default
                        {
                            self.push(FnEntry {
                                ident: f.sig.ident.to_string(),
                                owner: Owner::Method {
                                    self_ty: None,
                                    trait_name: Some(t.ident.to_string()),
                                },
                                file,
                                tool: tool_name(&f.attrs, &f.sig.ident),
                                findings: fnvisit::analyze_fn(
                                    aliases,
                                    &f.attrs,
                                    &f.sig,
                                    Some(block),
                                ),
                            });
                        }
                    }
                }
                syn::Item::Mod(m) if !fnvisit::is_cfg_test(&m.attrs) => {
                    if let Some((_, items)) = &m.content {
                        let mut inner = module.to_vec();
                        inner.push(m.ident.to_string());
                        self.modules.insert(m.ident.to_string());
                        self.add_items(items, file, aliases, krate, &inner);
                    }
                }
                syn::Item::ForeignMod(fm) => {
                    // A foreign function has no body to read: calling it is the capability.
                    let linked = fm.attrs.iter().any(|a| a.path().is_ident("link"));
                    for it in &fm.items {
                        if let syn::ForeignItem::Fn(f) = it {
                            let line = f.sig.ident.span().start().line;
                            let mut findings = Findings::default();
                            findings.sites.push(Site {
                                family: rules::UNSAFE_FFI,
                                line,
                                what: if linked {
                                    format!("extern fn {} (#[link])", f.sig.ident)
                                } else {
                                    format!("extern fn {}", f.sig.ident)
                                },
                            });
                            self.push(FnEntry {
                                ident: f.sig.ident.to_string(),
                                owner: Owner::Free {
                                    krate: krate.to_owned(),
                                    module: module.to_vec(),
                                },
                                file,
                                tool: None,
                                findings,
                            });
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The functions that implement a handler: those named `function` that carry `#[tool]`, or
    /// every function of that name when none does.
    pub(super) fn handler_fns(&self, function: &str) -> Vec<usize> {
        let all = self.by_name.get(function).map(Vec::as_slice).unwrap_or(&[]);
        let tools: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&i| self.fns[i].tool.is_some())
            .collect();
        if tools.is_empty() {
            all.to_vec()
        } else {
            tools
        }
    }

    /// The indexed functions a call in `caller` may reach. Calls that name no indexed function
    /// (std, external crates, closures held in variables) resolve to nothing.
    pub(super) fn resolve(&self, caller: &FnEntry, call: &CallRef) -> Vec<usize> {
        let (name, qualifier, root) = match call {
            CallRef::Method {
                recv: Recv::SelfValue,
                method,
                ..
            } => (method.as_str(), Some("Self"), None),
            CallRef::Method { recv, method, .. } => {
                return self.methods_of(&self.type_of(caller, recv, 0), method);
            }
            CallRef::Path(segs) => {
                let Some(name) = segs.last() else {
                    return Vec::new();
                };
                let qualifier = (segs.len() >= 2).then(|| segs[segs.len() - 2].as_str());
                (name.as_str(), qualifier, segs.first().map(String::as_str))
            }
        };
        let Some(candidates) = self.by_name.get(name) else {
            return Vec::new();
        };
        let pick = |keep: &dyn Fn(&Owner) -> bool| -> Vec<usize> {
            candidates
                .iter()
                .copied()
                .filter(|&i| keep(&self.fns[i].owner))
                .collect()
        };
        match qualifier {
            // `foo(..)`: a free function of that name, in any module (over-approximation).
            None => pick(&|o| matches!(o, Owner::Free { .. })),
            // `self.foo(..)` and `Self::foo(..)`: methods of the caller's type or trait, and
            // trait default methods the type may inherit.
            Some("Self") => match &caller.owner {
                Owner::Method {
                    self_ty: Some(ty), ..
                } => pick(&|o| match o {
                    Owner::Method { self_ty, .. } => {
                        self_ty.as_deref().is_none_or(|t| t == ty.as_str())
                    }
                    Owner::Free { .. } => false,
                }),
                Owner::Method {
                    self_ty: None,
                    trait_name: Some(tr),
                } => pick(&|o| matches!(o, Owner::Method { trait_name: Some(t), .. } if t == tr)),
                _ => Vec::new(),
            },
            // `Type::foo(..)` or `Trait::foo(..)`.
            Some(q) if q.starts_with(|c: char| c.is_ascii_uppercase()) => pick(&|o| match o {
                Owner::Method {
                    self_ty,
                    trait_name,
                } => self_ty.as_deref() == Some(q) || trait_name.as_deref() == Some(q),
                Owner::Free { .. } => false,
            }),
            // `crate::foo`, `super::foo`, `self::foo`: some free function of ours.
            Some("crate" | "super" | "self") => pick(&|o| matches!(o, Owner::Free { .. })),
            // `module::foo(..)`: free functions of a module of that name (or the root of a crate
            // of that name).
            // A `pub use` re-export moves the function out of that module's files: when the
            // module has none of that name, any free function of ours may be it.
            Some(q) if self.modules.contains(q) || self.crates.contains(q) => {
                let in_module = pick(&|o| match o {
                    Owner::Free { krate, module } => match module.last() {
                        Some(m) => m == q,
                        None => krate == q,
                    },
                    Owner::Method { .. } => false,
                });
                if in_module.is_empty() {
                    pick(&|o| matches!(o, Owner::Free { .. }))
                } else {
                    in_module
                }
            }
            // A path into one of our crates through a module we could not place (`#[path]`):
            // any free function of that name.
            Some(_)
                if root.is_some_and(|r| {
                    matches!(r, "crate" | "super" | "self") || self.crates.contains(r)
                }) =>
            {
                pick(&|o| matches!(o, Owner::Free { .. }))
            }
            // std and external crates.
            Some(_) => Vec::new(),
        }
    }
}

/// What a method call on a non-`self` receiver reaches, beyond the indexed functions.
#[derive(Debug, Default)]
pub(super) struct MethodTarget {
    /// The indexed methods the call may reach.
    pub(super) callees: Vec<usize>,
    /// Families the receiver's declared type has by the path table (`reqwest::Client`:
    /// `network`), with the type.
    pub(super) families: Vec<(&'static str, String)>,
    /// Whether the call is unresolved: no indexed method, no family, and the receiver's type
    /// comes from a crate the scanner neither read nor knows to be inert.
    pub(super) unresolved: bool,
}

impl Index {
    /// Resolves `recv.method(..)` where `recv` is not `self`: the receiver's types are inferred
    /// from declarations (see [`Index::type_of`]).
    pub(super) fn method_target(
        &self,
        caller: &FnEntry,
        recv: &Recv,
        method: &str,
    ) -> MethodTarget {
        let types = self.type_of(caller, recv, 0);
        let callees = self.methods_of(&types, method);
        // A lock, an unwrap or a clone of std's passes its value through (`self.client.lock()`
        // holds the client): the call on what it yields is the one to judge. And in a chain of
        // methods that are not indexed (`client.get(..).send()`), the types pass through
        // unchanged: the first call of the chain was judged already.
        if (callees.is_empty() && self.is_pass_through(&types, method))
            || self.judged(caller, recv, 0)
        {
            return MethodTarget {
                callees,
                ..MethodTarget::default()
            };
        }
        let mut families: Vec<(&'static str, String)> = Vec::new();
        for ty in &types {
            for rule in rules::PATH_RULES {
                if rules::matches(rule, ty) && !families.iter().any(|(f, _)| *f == rule.family) {
                    families.push((rule.family, ty.join("::")));
                }
            }
        }
        let unresolved =
            callees.is_empty() && families.is_empty() && types.iter().any(|t| self.is_opaque(t));
        MethodTarget {
            callees,
            families,
            unresolved,
        }
    }

    /// Whether a `.commit(..)` on `recv` may be toolgate's commit store: yes unless every type
    /// the receiver is declared with comes from another crate than toolgate's and ours.
    pub(super) fn may_be_own_commit(&self, caller: &FnEntry, recv: &Recv) -> bool {
        let types = self.type_of(caller, recv, 0);
        types.is_empty()
            || types.iter().any(|t| {
                let root = t.first().map(String::as_str).unwrap_or_default();
                root.starts_with("toolgate")
                    || t.len() == 1
                    || !self.is_opaque(t) && !rules::INERT_ROOTS.contains(&root)
            })
    }

    /// Whether `recv` is the result of a method call already judged by [`Index::method_target`]:
    /// a method that is not indexed and not a pass-through, directly or through the variable
    /// it was bound to (`let request = client.get(..); request.send()`).
    fn judged(&self, caller: &FnEntry, recv: &Recv, depth: usize) -> bool {
        if depth > MAX_DEPTH {
            return false;
        }
        match recv {
            Recv::Method(base, inner) => {
                let types = self.type_of(caller, base, 0);
                self.methods_of(&types, inner).is_empty() && !self.is_pass_through(&types, inner)
                    || self.judged(caller, base, depth + 1)
            }
            Recv::Await(base) | Recv::Try(base) => self.judged(caller, base, depth + 1),
            Recv::Var(name) => {
                let bindings = caller.findings.bindings.get(name);
                bindings.is_some_and(|all| {
                    !all.is_empty()
                        && all.iter().all(|b| match b {
                            Binding::Value(value) => self.judged(caller, value, depth + 1),
                            Binding::Typed(_) => false,
                        })
                })
            }
            _ => false,
        }
    }

    /// Whether `method` on these types is a std wrapper handing out what it wraps (a lock, an
    /// `Option`'s unwrap, an `Arc`'s clone).
    fn is_pass_through(&self, types: &[TypePath], method: &str) -> bool {
        rules::PASS_THROUGH_METHODS.contains(&method)
            && types.iter().any(|t| match t.as_slice() {
                [one] => rules::PRELUDE_WRAPPERS.contains(&one.as_str()),
                [root, ..] => rules::INERT_ROOTS.contains(&root.as_str()),
                [] => false,
            })
    }

    /// Whether a type path names a type from a crate that was not scanned and is not known to
    /// be inert. Single-segment names that are neither local nor imported by name (std's
    /// prelude, a glob import) are not judged: their origin is unknown.
    fn is_opaque(&self, ty: &TypePath) -> bool {
        let (Some(root), Some(last)) = (ty.first(), ty.last()) else {
            return false;
        };
        ty.len() >= 2
            && !rules::INERT_ROOTS.contains(&root.as_str())
            && !matches!(root.as_str(), "crate" | "self" | "super" | "Self")
            && !self.crates.contains(root)
            && !self.modules.contains(root)
            && !self.types.contains(last)
            && !self.traits.contains(last)
    }

    /// The methods named `method` of the types: methods of a local type (its impls, and the
    /// default methods of the traits it implements), and methods of a local trait (every impl of
    /// it and its defaults, which is how `dyn Trait` and a bound `S: Trait` are reached).
    fn methods_of(&self, types: &[TypePath], method: &str) -> Vec<usize> {
        let Some(candidates) = self.by_name.get(method) else {
            return Vec::new();
        };
        // Local types of the set, the traits they implement (whose default methods they
        // inherit), and local traits of the set (`dyn Trait`, a bound), reached in every impl.
        let mut names: HashSet<&str> = HashSet::new();
        let mut inherited: HashSet<&str> = HashSet::new();
        let mut traits: HashSet<&str> = HashSet::new();
        for ty in types {
            let Some(last) = ty.last() else { continue };
            if self.types.contains(last) {
                names.insert(last);
                if let Some(implemented) = self.impls_of.get(last) {
                    inherited.extend(implemented.iter().map(String::as_str));
                }
            }
            if self.traits.contains(last) {
                traits.insert(last);
            }
        }
        candidates
            .iter()
            .copied()
            .filter(|&i| match &self.fns[i].owner {
                Owner::Method {
                    self_ty: Some(t),
                    trait_name,
                } => {
                    names.contains(t.as_str())
                        || trait_name.as_deref().is_some_and(|tr| traits.contains(tr))
                }
                Owner::Method {
                    self_ty: None,
                    trait_name: Some(tr),
                } => traits.contains(tr.as_str()) || inherited.contains(tr.as_str()),
                _ => false,
            })
            .collect()
    }

    /// The types a receiver may have, from declarations only: `self` is the caller's impl type,
    /// a field has its declared type, a variable its declared type or its initialiser's, a call
    /// of an indexed function or method its return type (`Self` read as the owner), a
    /// constructor path `Type::new(..)` of a type that is not indexed that type. Other methods
    /// (std's, external crates') are transparent: `self.state.lock().unwrap()` keeps the types
    /// of `self.state` (`Arc`, `Mutex`, `Store`), which over-approximates. Generic parameters
    /// are replaced by their bounds, aliases by what they name. Empty when unknown.
    pub(super) fn type_of(&self, caller: &FnEntry, recv: &Recv, depth: usize) -> Vec<TypePath> {
        if depth > MAX_DEPTH {
            return Vec::new();
        }
        let self_ty = match &caller.owner {
            Owner::Method {
                self_ty: Some(ty), ..
            } => Some(ty.as_str()),
            Owner::Method {
                self_ty: None,
                trait_name: Some(tr),
            } => Some(tr.as_str()),
            _ => None,
        };
        let local = |paths: &[TypePath]| self.concrete(paths, &caller.findings.generics, self_ty);
        let mut out = match recv {
            Recv::SelfValue => self_ty
                .map(|t| vec![vec![t.to_owned()]])
                .unwrap_or_default(),
            Recv::Var(name) => {
                let mut out = Vec::new();
                for binding in caller.findings.bindings.get(name).into_iter().flatten() {
                    match binding {
                        Binding::Typed(paths) => out.extend(local(paths)),
                        Binding::Value(value) => {
                            out.extend(self.type_of(caller, value, depth + 1));
                        }
                    }
                }
                out
            }
            Recv::Field(base, field) => {
                let mut out = Vec::new();
                for ty in self.type_of(caller, base, depth + 1) {
                    let Some(last) = ty.last() else { continue };
                    if let Some(paths) = self.fields.get(last).and_then(|f| f.get(field)) {
                        let empty = Bounds::new();
                        let bounds = self.struct_generics.get(last).unwrap_or(&empty);
                        out.extend(self.concrete(paths, bounds, Some(last)));
                    }
                }
                out
            }
            Recv::Method(base, method) => {
                let base_types = self.type_of(caller, base, depth + 1);
                let callees = self.methods_of(&base_types, method);
                if callees.is_empty() {
                    base_types
                } else {
                    self.returns(&callees)
                }
            }
            Recv::Call(path) => {
                let callees = self.resolve(caller, &CallRef::Path(path.clone()));
                if !callees.is_empty() {
                    self.returns(&callees)
                } else if path.len() >= 2
                    && path[path.len() - 2].starts_with(|c: char| c.is_ascii_uppercase())
                {
                    local(&[path[..path.len() - 1].to_vec()])
                } else {
                    Vec::new()
                }
            }
            Recv::Literal(path) => local(std::slice::from_ref(path)),
            Recv::Await(base) | Recv::Try(base) => self.type_of(caller, base, depth + 1),
            Recv::Unknown => Vec::new(),
        };
        out.sort();
        out.dedup();
        out
    }

    /// The return types of the functions, each read in its own context.
    fn returns(&self, fns: &[usize]) -> Vec<TypePath> {
        let mut out = Vec::new();
        for &i in fns {
            let entry = &self.fns[i];
            let owner = match &entry.owner {
                Owner::Method {
                    self_ty,
                    trait_name,
                } => self_ty.as_deref().or(trait_name.as_deref()),
                Owner::Free { .. } => None,
            };
            out.extend(self.concrete(&entry.findings.returns, &entry.findings.generics, owner));
        }
        out
    }

    /// Replaces `Self` by the owner, a generic parameter by its bounds and a local type alias by
    /// the types it names.
    fn concrete(
        &self,
        paths: &[TypePath],
        generics: &Bounds,
        owner: Option<&str>,
    ) -> Vec<TypePath> {
        let mut out = Vec::new();
        let mut pending: Vec<(TypePath, usize)> = paths.iter().map(|p| (p.clone(), 0)).collect();
        while let Some((path, depth)) = pending.pop() {
            let single = (path.len() == 1).then(|| path[0].as_str());
            match single {
                Some("Self") => {
                    if let Some(owner) = owner {
                        out.push(vec![owner.to_owned()]);
                    }
                }
                Some(name) if generics.contains_key(name) => {
                    out.extend(generics[name].iter().cloned());
                }
                _ => match path.last().and_then(|last| self.type_aliases.get(last)) {
                    Some(named) if depth < MAX_DEPTH => {
                        pending.extend(named.iter().map(|p| (p.clone(), depth + 1)));
                    }
                    _ => out.push(path),
                },
            }
        }
        out
    }
}

fn merge_bounds(into: &mut Bounds, from: &Bounds) {
    for (name, bounds) in from {
        let slot = into.entry(name.clone()).or_default();
        for bound in bounds {
            if !slot.contains(bound) {
                slot.push(bound.clone());
            }
        }
    }
}

/// The last segment of an impl's self type (`Foo` for `Foo<T>`, `&Foo`, `path::Foo`).
fn type_ident(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Type::Reference(r) => type_ident(&r.elem),
        syn::Type::Paren(p) => type_ident(&p.elem),
        syn::Type::Group(g) => type_ident(&g.elem),
        _ => None,
    }
}

/// The tool name when the attributes carry rmcp's `#[tool]` (or `#[rmcp::tool]`): the
/// top-level `name = ".."` argument, else the function's ident.
fn tool_name(attrs: &[syn::Attribute], ident: &syn::Ident) -> Option<String> {
    let attr = attrs
        .iter()
        .find(|a| a.path().segments.last().is_some_and(|s| s.ident == "tool"))?;
    let explicit = match &attr.meta {
        syn::Meta::List(list) => {
            // Read the tokens rather than parsing rmcp's argument grammar, which this crate
            // does not own: a top-level `name`, `=`, string literal.
            let toks: Vec<proc_macro2::TokenTree> = list.tokens.clone().into_iter().collect();
            toks.windows(3).find_map(|w| match (&w[0], &w[1], &w[2]) {
                (
                    proc_macro2::TokenTree::Ident(i),
                    proc_macro2::TokenTree::Punct(p),
                    proc_macro2::TokenTree::Literal(l),
                ) if i == "name" && p.as_char() == '=' => match syn::Lit::new(l.clone()) {
                    syn::Lit::Str(s) => Some(s.value()),
                    _ => None,
                },
                _ => None,
            })
        }
        _ => None,
    };
    Some(explicit.unwrap_or_else(|| ident.to_string()))
}

/// The crate and module of a file, from its path: the directory above the last `src` names
/// the crate, the components below it the modules (`lib.rs`, `main.rs` and `mod.rs` add none).
fn module_path(path: &Path) -> (String, Vec<String>) {
    let comps: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let src = comps.iter().rposition(|c| c == "src");
    let (krate, rest) = match src {
        Some(i) if i > 0 => (comps[i - 1].replace('-', "_"), &comps[i + 1..]),
        _ => (String::new(), &comps[comps.len().saturating_sub(1)..]),
    };
    let mut module: Vec<String> = Vec::new();
    for (n, comp) in rest.iter().enumerate() {
        let is_file = n + 1 == rest.len();
        let name = if is_file {
            comp.strip_suffix(".rs").unwrap_or(comp)
        } else {
            comp.as_str()
        };
        if !(is_file && matches!(name, "lib" | "main" | "mod")) {
            module.push(name.to_owned());
        }
    }
    (krate, module)
}

/// `use` aliases of a file, from every `use` item at any depth (an import inside a function
/// body applies to the whole file here: an over-approximation that only widens matching).
fn collect_aliases(file: &syn::File) -> Aliases {
    struct Uses(Aliases);
    impl<'ast> Visit<'ast> for Uses {
        fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
            add_use_tree(&mut self.0, Vec::new(), &item.tree);
        }
    }
    let mut uses = Uses(Aliases::new());
    uses.visit_file(file);
    uses.0
}

fn add_use_tree(aliases: &mut Aliases, prefix: Vec<String>, tree: &syn::UseTree) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut next = prefix;
            next.push(p.ident.to_string());
            add_use_tree(aliases, next, &p.tree);
        }
        syn::UseTree::Name(n) => {
            if n.ident == "self" {
                if let Some(last) = prefix.last() {
                    aliases.insert(last.clone(), prefix.clone());
                }
            } else {
                let mut full = prefix;
                full.push(n.ident.to_string());
                aliases.insert(n.ident.to_string(), full);
            }
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix;
            if r.ident != "self" {
                full.push(r.ident.to_string());
            }
            aliases.insert(r.rename.to_string(), full);
        }
        syn::UseTree::Group(g) => {
            for item in &g.items {
                add_use_tree(aliases, prefix.clone(), item);
            }
        }
        // Glob imports name nothing; the tables match bare type names (`TcpStream`) anyway.
        syn::UseTree::Glob(_) => {}
    }
}

/// Appends the `.rs` files under `root` in sorted order (so evidence order is stable), skipping
/// hidden directories, `target/`, and a crate's `tests/`, `benches/`, `examples/` and
/// `fixtures/` (a directory next to a `Cargo.toml`): no handler in `src/` can call into them, and
/// fixtures may be deliberately unparsable.
fn collect_rs_files(
    root: &Path,
    out: &mut Vec<PathBuf>,
    seen: &mut HashSet<PathBuf>,
) -> Result<(), ScanError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ScanError::Read { path, source }
    };
    let meta = fs::metadata(root).map_err(read_err(root))?;
    if meta.is_file() {
        if root.extension().is_some_and(|e| e == "rs") {
            let key = fs::canonicalize(root).map_err(read_err(root))?;
            if seen.insert(key) {
                out.push(root.to_path_buf());
            }
        }
        return Ok(());
    }
    let mut entries: Vec<(PathBuf, fs::FileType)> = Vec::new();
    for entry in fs::read_dir(root).map_err(read_err(root))? {
        let entry = entry.map_err(read_err(root))?;
        let file_type = entry.file_type().map_err(read_err(&entry.path()))?;
        entries.push((entry.path(), file_type));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let is_crate_dir = entries
        .iter()
        .any(|(p, t)| t.is_file() && p.file_name().is_some_and(|n| n == "Cargo.toml"));
    for (path, file_type) in entries {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if file_type.is_dir() {
            let skip = name.starts_with('.')
                || name == "target"
                || (is_crate_dir
                    && matches!(name.as_str(), "tests" | "benches" | "examples" | "fixtures"));
            if !skip {
                collect_rs_files(&path, out, seen)?;
            }
        } else if file_type.is_file() && name.ends_with(".rs") {
            let key = fs::canonicalize(&path).map_err(read_err(&path))?;
            if seen.insert(key) {
                out.push(path);
            }
        }
        // Symbolic links are not followed: they could loop, and a workspace's sources are
        // real files.
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_paths_from_file_paths() {
        let check = |p: &str, krate: &str, module: &[&str]| {
            let (k, m) = module_path(Path::new(p));
            assert_eq!(
                (k.as_str(), m),
                (krate, module.iter().map(|s| s.to_string()).collect())
            );
        };
        check("crates/toolgate-server/src/lib.rs", "toolgate_server", &[]);
        check(
            "crates/toolgate-server/src/tools.rs",
            "toolgate_server",
            &["tools"],
        );
        check("x/src/a/mod.rs", "x", &["a"]);
        check("x/src/a/b.rs", "x", &["a", "b"]);
        check("loose.rs", "", &["loose"]);
    }
}
