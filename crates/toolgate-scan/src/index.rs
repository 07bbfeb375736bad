//! The function index: every `.rs` file under the roots parsed once, every function analysed
//! once, and the rules that resolve a call to the functions it may reach.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use super::visit::{self as fnvisit, Aliases, CallRef, Findings, Site};
use super::{ScanError, ScanStats, rules};

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
    /// For each struct (by ident), its named fields and the type idents each field's type
    /// mentions (`Arc<BookingStore>`: `Arc`, `BookingStore`). Structs of the same name in
    /// different modules are merged (over-approximation).
    fields: HashMap<String, HashMap<String, Vec<String>>>,
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
                    for it in &imp.items {
                        if let syn::ImplItem::Fn(f) = it
                            && !fnvisit::is_cfg_test(&f.attrs)
                        {
                            self.push(FnEntry {
                                ident: f.sig.ident.to_string(),
                                owner: Owner::Method {
                                    self_ty: self_ty.clone(),
                                    trait_name: trait_name.clone(),
                                },
                                file,
                                tool: tool_name(&f.attrs, &f.sig.ident),
                                findings: fnvisit::analyze_fn(
                                    aliases,
                                    &f.attrs,
                                    &f.sig,
                                    Some(&f.block),
                                ),
                            });
                        }
                    }
                }
                syn::Item::Struct(st) if !fnvisit::is_cfg_test(&st.attrs) => {
                    let fields = self.fields.entry(st.ident.to_string()).or_default();
                    for field in &st.fields {
                        if let Some(name) = &field.ident {
                            let types = fields.entry(name.to_string()).or_default();
                            type_idents(&field.ty, types);
                        }
                    }
                }
                syn::Item::Trait(t) if !fnvisit::is_cfg_test(&t.attrs) => {
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
            CallRef::SelfMethod(name) => (name.as_str(), Some("Self"), None),
            CallRef::FieldMethod { field, method } => {
                return self.resolve_field(caller, field, method);
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
            Some(q) if self.modules.contains(q) || self.crates.contains(q) => pick(&|o| match o {
                Owner::Free { krate, module } => match module.last() {
                    Some(m) => m == q,
                    None => krate == q,
                },
                Owner::Method { .. } => false,
            }),
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

impl Index {
    /// `self.field.method(..)` in a method of `caller`'s type: the methods `method` of every type
    /// the field's declared type mentions (so `store: Arc<BookingStore>` reaches
    /// `BookingStore::method`). Nothing when the caller's struct or the field is not in the
    /// scanned sources: the type is unknown, as for any other receiver.
    fn resolve_field(&self, caller: &FnEntry, field: &str, method: &str) -> Vec<usize> {
        let Owner::Method {
            self_ty: Some(ty), ..
        } = &caller.owner
        else {
            return Vec::new();
        };
        let Some(types) = self.fields.get(ty).and_then(|fields| fields.get(field)) else {
            return Vec::new();
        };
        let Some(candidates) = self.by_name.get(method) else {
            return Vec::new();
        };
        candidates
            .iter()
            .copied()
            .filter(|&i| match &self.fns[i].owner {
                Owner::Method {
                    self_ty: Some(t), ..
                } => types.contains(t),
                _ => false,
            })
            .collect()
    }
}

/// Collects the last segment of every path in `ty`, generic arguments included.
fn type_idents(ty: &syn::Type, out: &mut Vec<String>) {
    match ty {
        syn::Type::Path(p) => {
            for segment in &p.path.segments {
                if let syn::PathArguments::AngleBracketed(args) = &segment.arguments {
                    for arg in &args.args {
                        if let syn::GenericArgument::Type(inner) = arg {
                            type_idents(inner, out);
                        }
                    }
                }
            }
            if let Some(last) = p.path.segments.last() {
                out.push(last.ident.to_string());
            }
        }
        syn::Type::Reference(r) => type_idents(&r.elem, out),
        syn::Type::Paren(p) => type_idents(&p.elem, out),
        syn::Type::Group(g) => type_idents(&g.elem, out),
        syn::Type::Array(a) => type_idents(&a.elem, out),
        syn::Type::Slice(s) => type_idents(&s.elem, out),
        syn::Type::Tuple(t) => t.elems.iter().for_each(|e| type_idents(e, out)),
        _ => {}
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
