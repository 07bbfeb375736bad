//! The entitlement scanner: finds what a tool's handler can do by reading its Rust source.
//!
//! Entitlements are never declared by the tool's author: the scanner parses every `.rs` file
//! under the source roots with `syn`, locates each handler (a function carrying rmcp's `#[tool]`
//! attribute), and reads its body and, transitively, the bodies of every function of the scanned
//! sources it calls. The result is a set of capability families with the evidence for each (file,
//! line, what, and the call chain from the handler), plus the evasion signals found on the way.
//!
//! # Call resolution
//!
//! There is no type checker, so resolution reads declarations and is deliberately conservative:
//! when in doubt a call reaches more functions, never fewer, within the scanned sources.
//!
//! | call | reaches |
//! |------|---------|
//! | `foo(..)`, `.map(foo)` | every free function named `foo` |
//! | `self.foo(..)`, `Self::foo(..)` | methods `foo` of the caller's impl type (any impl block, trait impls included) and trait default methods `foo` |
//! | `Type::foo(..)`, `Trait::foo(..)`, `<T as Trait>::foo` | methods `foo` in impls of `Type`, impls of `Trait` and `Trait`'s default |
//! | `module::foo(..)`, `crate_name::foo(..)` | free functions `foo` of modules named `module` (or the crate root); any free function `foo` when that module has none (a `pub use` re-export) |
//! | `crate::`/`super::`/`self::` paths | every free function `foo` |
//! | `value.foo(..)` | methods `foo` of the value's types (below): a local type's impls and the default methods of the traits it implements; a local trait's impls and default (`dyn Trait`, a bound `S: Trait`) |
//! | std and external crates | nothing; the path tables below apply |
//!
//! A value's types come from declarations, read syntactically:
//!
//! | value | types |
//! |-------|-------|
//! | `self` | the caller's impl type |
//! | `base.field`, `base.0` | every type the field's declared type names, generic arguments included (`store: Arc<Mutex<Store>>`: `Arc`, `Mutex`, `Store`), of every struct among `base`'s types |
//! | a variable | its declared type (`let s: Store`, a parameter `store: &Store`, a typed closure parameter), or its initialiser's types (`let s = Store::open(..)`, `let g = self.state.lock()`, `if let Some(c) = &*guard`, `for b in ..`, `match` arms); patterns pass the whole value's types through |
//! | `base.method(..)` | the declared return types of the indexed methods it reaches; when none, `base`'s types (std and external methods pass their receiver's types through: `self.state.lock().await.unwrap()` keeps `Store`) |
//! | `path(..)` | the return types of the indexed functions it reaches; else, for `Type::new(..)`, `Type` |
//! | `Type { .. }` | `Type` |
//! | `.await`, `?`, `&`, `*`, `(..)` | the inner value's types |
//!
//! Throughout, `Self` is the owner, a generic parameter is its bounds (from the item, its impl
//! blocks and `where` clauses), and a local `type` alias is what it names. Scopes are flattened:
//! a name bound twice has both bindings' types.
//!
//! A method call on a value whose types match the path table gets that family at the call
//! (`self.http.get(..)` with `http: reqwest::Client` is `network`). A call that reaches no
//! indexed method, matches no rule, and whose receiver's declared type comes from a crate that
//! was not scanned and is not known inert (std, tokio, serde, rmcp, toolgate's crates, ... see
//! `rules::INERT_ROOTS`) is **unresolved**: [`ScanReport::unresolved`] names it as written
//! (`self.github.issues`, `client.put_object`, `self.session.lock(..).await.current`), and the
//! lockfile records it, so what the scanner could not see is never a silent `false`. Lock and
//! unwrap calls of std's wrappers are looked through, and a chain is judged once, at its first
//! call on the foreign value. Values whose type is unknown (closure parameters, results of
//! external functions, names from glob imports) are not judged.
//!
//! A leading `use` alias is expanded first (`use std::fs::write; write(..)` is `std::fs::write`).
//! Closures, async blocks, nested items and the arguments of macros are part of the enclosing
//! function. Macro bodies that parse as comma-separated expressions (`format!`, `vec!`, `println!`)
//! are scanned as expressions; others (`json!`) token by token for literals, paths, `path(..)`
//! calls and `self.method(..)` calls. Items under `#[cfg(test)]`, and a crate's `tests/`,
//! `benches/`, `examples/` and `fixtures/` directories, are not shipped code and are skipped, as
//! are hidden directories and `target/`. A visited set makes recursion terminate.
//!
//! # Families
//!
//! Paths (in calls, types, struct literals, function references) match after alias expansion;
//! "`a::b`" means those segments appear contiguously anywhere in the path, "`a::*`" that the path
//! starts with crate `a`.
//!
//! | family | paths | syntax and method calls |
//! |--------|-------|-------------------------|
//! | `filesystemRead` | `fs::{read, read_to_string, read_dir, read_link, metadata, symlink_metadata, canonicalize, exists, try_exists}` (std and tokio), `File::open`, `File::open_buffered`, `OpenOptions` | `.read_dir()`, `.read_link()`, `.canonicalize()`, `.symlink_metadata()`, `.try_exists()`, `.exists()`, `.is_file()`, `.is_dir()` |
//! | `filesystemWrite` | `fs::{write, create_dir, create_dir_all, remove_file, remove_dir, remove_dir_all, rename, copy, hard_link, soft_link, symlink, symlink_file, symlink_dir, set_permissions}` (std and tokio), `File::create`, `File::create_new` | `OpenOptions` in a function that calls `.write(`/`.append(`/`.create(`/`.create_new(`/`.truncate(` |
//! | `network` | `TcpStream`, `TcpListener`, `UdpSocket`, `UnixStream`, `UnixListener`, `UnixDatagram`, `net::ToSocketAddrs`, `tokio::net`, `reqwest::*`, `hyper::*`, `hyper_util::*`, `ureq::*`, `surf::*`, `isahc::*`, `attohttpc::*`, `curl::*`, `tungstenite::*`, `tokio_tungstenite::*`, `tonic::*`, `sqlx::*`, `tokio_postgres::*`, `postgres::*`, `deadpool_postgres::*`, `redis::*`, `mongodb::*` | |
//! | `subprocess` | `process::Command`, `Command::new` (not under `clap::`), `unistd::{fork, execv, execve, execvp}`, `libc::{fork, system}`, `duct::*`, `subprocess::*` | |
//! | `crypto` | `sha2::*`, `sha1::*`, `sha3::*`, `md5::*`, `md_5::*`, `hmac::*`, `ring::*`, `aes::*`, `aes_gcm::*`, `chacha20::*`, `chacha20poly1305::*`, `ed25519::*`, `ed25519_dalek::*`, `x25519_dalek::*`, `rsa::*`, `openssl::*`, `blake2::*`, `blake3::*`, `p256::*`, `k256::*`, `ecdsa::*`, `Sha256`, `Sha384`, `Sha512`, `Sha1`, `Md5`, `Hmac`, `Aes256Gcm`, `ChaCha20Poly1305`, `Sha256Digest` | |
//! | `unsafeFfi` | `libloading::*`, `dlopen`, `dlsym` | `unsafe` blocks, `unsafe fn`, `extern` fns and blocks, calls to functions of `extern` blocks (`#[link]` noted), `#[no_mangle]`/`#[export_name]`/`#[unsafe(..)]` |
//! | `environment` | `env::{var, var_os, vars, vars_os, set_var, remove_var}`, `dotenv::*`, `dotenvy::*`, `envy::*` | |
//!
//! Deliberately absent: `process::exit` (not a process), `std::net` address types (plain values),
//! `env!`/`option_env!` (compile time), `env::args` (not the environment).
//!
//! Our own crates' APIs, whose names say nothing to the std tables:
//!
//! | API | family |
//! |-----|--------|
//! | `.commit(..)` on any receiver, unless its declared type is known and foreign (`tx.commit()` on an `sqlx::Transaction`) | `filesystemWrite` |
//! | `TempFile`, `replace_file` (the storage floor's writers, any mention) | `filesystemWrite` |
//! | `.write(..)` / `.list()` on a receiver named `*notes*` | `filesystemWrite` / `filesystemRead` |
//! | `FileAuditLog` (any mention), `AuditSink::append`, `.append(..)` on a receiver named `*audit*` | `filesystemWrite` |
//!
//! # Evasion heuristics
//!
//! On every string, byte-string and C-string literal the handler reaches, including those inside
//! macro arguments:
//!
//! - `base64_blob`: at least 16 characters, all of the base64 alphabet (standard or URL-safe,
//!   padding optional), decoding to UTF-8 that is at least 90% printable. The decoded text is
//!   reported and checked against the string-pattern table. Such a literal is not also reported
//!   as `high_entropy_literal`.
//! - `high_entropy_literal`: at least 20 characters, no whitespace, letters and digits mixed,
//!   Shannon entropy above 4.0 bits per character. Entropy alone does not separate a key from
//!   prose (English reaches about 4.1 bits per character) or from dotted identifiers and format
//!   strings (`behavior.outputSchemaDigest`): the whitespace rule excludes prose, the digit rule
//!   identifiers (a random 20-character token lacks a digit about 3% of the time).
//!   Hexadecimal digests stay at or below 4.0 bits by construction.
//! - `escape_density`: at least 3 `\x`, `\u{..}` or `\0` escapes in the literal's source text,
//!   and more than 15% as many escapes as decoded characters. `\n`, `\t`, `\\`, `\"` are how
//!   ordinary strings are written and do not count. The value is reported and checked.
//! - `char_codes`: an array or `vec![..]` of at least 4 integer literals that are all printable
//!   ASCII, in a function that also builds strings from numbers (`from_utf8`, `from_utf8_lossy`,
//!   `from_utf16`, `from_u32`, `from_digit`, `char::from`, `as char`); or at least 4 integer
//!   literals cast `as char` or passed to `char::from`/`char::from_u32` in one function. The
//!   decoded text is reported and checked. An integer array alone is data, not evasion.
//!
//! String-pattern table, matched case-insensitively on decoded hidden text only: `/bin/sh`,
//! `sh -c`, `bash`, `rm -rf`, `curl`, `wget`, `powershell`, `cmd.exe` reveal `subprocess`;
//! `http://`, `https://` reveal `network`. Visible literals are not matched: the call that uses
//! them is found by the tables above, and matching prose would flag every error message that
//! mentions a URL or a tool named `rm_rf`.
//!
//! # Claims
//!
//! [`check_claims`]: a tool whose effective `readOnlyHint` is true (absent reads as false) while
//! its handler writes files, spawns a process or opens a network connection, through any chain
//! of the calls above, is a violation. Unresolved calls are not violations (what they do is
//! unknown); the lockfile shows them, and a new one is a RISKY change.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use toolgate_contract::{Entitlements, ToolDefinition};

mod evasion;
mod index;
mod rules;
mod visit;

use index::Index;
use visit::{CallRef, Recv};

/// A tool and the function that handles it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct HandlerRef {
    /// The tool's name as clients see it.
    pub tool: String,
    /// The handler function's ident.
    pub function: String,
}

/// Why the scanner believes a handler has a capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evidence {
    /// The family, as named by [`Entitlements::families`] (`filesystemWrite`, ...).
    pub family: &'static str,
    /// The file of the site.
    pub file: PathBuf,
    /// The 1-based line of the site.
    pub line: usize,
    /// What was found, for example `std::fs::write` or `permit.commit(..)`.
    pub what: String,
    /// The call chain from the handler to the function of the site, both included.
    pub via: Vec<String>,
}

/// A literal or character-code sequence that looks like it hides something.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EvasionFinding {
    /// `high_entropy_literal`, `base64_blob`, `escape_density` or `char_codes`.
    pub kind: &'static str,
    /// The file of the literal.
    pub file: PathBuf,
    /// The 1-based line of the literal.
    pub line: usize,
    /// The decoded text, when the heuristic decodes (all but `high_entropy_literal`).
    pub decoded: Option<String>,
}

/// A method call the scanner could not follow: the receiver's declared type comes from a crate
/// it did not read and does not know (`self.client.send` on an `aws_sdk_s3::Client`). What that
/// call can do is unknown, so it is recorded rather than read as "no capability".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unresolved {
    /// The receiver as written and the method: `self.client.send`, `pool.acquire(..).execute`.
    pub call: String,
    /// The file of the call.
    pub file: PathBuf,
    /// The 1-based line of the method name.
    pub line: usize,
    /// The call chain from the handler to the function of the call, both included.
    pub via: Vec<String>,
}

/// What one tool's handler can do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScanReport {
    /// The capability families found.
    pub entitlements: Entitlements,
    /// One entry per site, in breadth-first order from the handler (shortest chains first).
    pub evidence: Vec<Evidence>,
    /// The evasion signals found in the handler's reach.
    pub evasion: Vec<EvasionFinding>,
    /// The calls in the handler's reach that could not be followed.
    pub unresolved: Vec<Unresolved>,
}

impl ScanReport {
    /// The evasion kinds found, sorted and deduplicated, as [`toolgate_contract::HandlerFacts::evasion`]
    /// records them.
    pub fn evasion_kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self.evasion.iter().map(|e| e.kind.to_owned()).collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// The unresolved calls, sorted and deduplicated, as
    /// [`toolgate_contract::HandlerFacts::unresolved`] records them.
    pub fn unresolved_calls(&self) -> Vec<String> {
        let mut calls: Vec<String> = self.unresolved.iter().map(|u| u.call.clone()).collect();
        calls.sort();
        calls.dedup();
        calls
    }

    fn merge(&mut self, other: ScanReport) {
        self.entitlements = self.entitlements.union(other.entitlements);
        for e in other.evidence {
            if !self.evidence.contains(&e) {
                self.evidence.push(e);
            }
        }
        for e in other.evasion {
            if !self.evasion.contains(&e) {
                self.evasion.push(e);
            }
        }
        for u in other.unresolved {
            if !self.unresolved.contains(&u) {
                self.unresolved.push(u);
            }
        }
    }
}

/// How much source a scan read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// `.rs` files parsed.
    pub files: usize,
    /// Lines in them.
    pub lines: usize,
}

/// A tool that claims more than its handler honours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimViolation {
    /// The tool.
    pub tool: String,
    /// The annotation it claims, `readOnlyHint`.
    pub claim: &'static str,
    /// The evidence that contradicts the claim (`filesystemWrite`, `subprocess`, `network`).
    pub evidence: Vec<Evidence>,
}

impl fmt::Display for ClaimViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tool `{}` claims {}: true, but its handler changes the world:",
            self.tool, self.claim
        )?;
        for e in &self.evidence {
            write!(
                f,
                " {} ({}) at {}:{} via {};",
                e.family,
                e.what,
                e.file.display(),
                e.line,
                e.via.join(" -> ")
            )?;
        }
        write!(
            f,
            " set read_only_hint = false in its #[tool] annotations, or remove the effect"
        )
    }
}

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScanError {
    /// A source root, directory or file could not be read.
    #[error(
        "cannot read {path}: {source}; check that the source root exists and is readable, or remove it from the roots"
    )]
    Read {
        /// The path that failed.
        path: PathBuf,
        /// The I/O error (a non-UTF-8 file is `InvalidData`).
        #[source]
        source: std::io::Error,
    },
    /// A `.rs` file under the roots is not valid Rust.
    #[error(
        "cannot parse {path} at line {line}, column {column}: {message}; fix the syntax error (the scanner parses every .rs file under its roots and cannot vouch for a file it cannot read) or move the file out of the roots"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// syn's message.
        message: String,
    },
    /// No function of the scanned sources has the handler's name.
    #[error(
        "no function `{function}` (handler of tool `{tool}`) in the scanned sources; add the source root that defines it, or correct the HandlerRef"
    )]
    HandlerNotFound {
        /// The tool.
        tool: String,
        /// The function looked for.
        function: String,
    },
}

/// Finds every function carrying a `#[tool]` or `#[tool(...)]` attribute (rmcp's macro) in the
/// `.rs` files under the roots; the tool name is the attribute's `name = "..."` if present, else
/// the function's ident. In file order, then source order.
pub fn find_tool_handlers(source_roots: &[PathBuf]) -> Result<Vec<HandlerRef>, ScanError> {
    let index = Index::load(source_roots)?;
    Ok(index
        .fns
        .iter()
        .filter_map(|f| {
            f.tool.as_ref().map(|tool| HandlerRef {
                tool: tool.clone(),
                function: f.ident.clone(),
            })
        })
        .collect())
}

/// Scans each handler and everything it calls in the sources under the roots. The key is the
/// tool name; handler refs that share a tool name are merged (union).
pub fn scan_handlers(
    source_roots: &[PathBuf],
    handlers: &[HandlerRef],
) -> Result<BTreeMap<String, ScanReport>, ScanError> {
    scan_handlers_with_stats(source_roots, handlers).map(|(reports, _)| reports)
}

/// [`scan_handlers`], also returning how much source was parsed (for throughput measurements).
pub fn scan_handlers_with_stats(
    source_roots: &[PathBuf],
    handlers: &[HandlerRef],
) -> Result<(BTreeMap<String, ScanReport>, ScanStats), ScanError> {
    let index = Index::load(source_roots)?;
    let mut reports: BTreeMap<String, ScanReport> = BTreeMap::new();
    for handler in handlers {
        let starts = index.handler_fns(&handler.function);
        if starts.is_empty() {
            return Err(ScanError::HandlerNotFound {
                tool: handler.tool.clone(),
                function: handler.function.clone(),
            });
        }
        let report = reach(&index, &starts);
        reports
            .entry(handler.tool.clone())
            .or_default()
            .merge(report);
    }
    Ok((reports, index.stats))
}

/// Breadth-first walk from the handler functions over resolved calls, each function once.
fn reach(index: &Index, starts: &[usize]) -> ScanReport {
    let mut report = ScanReport::default();
    let mut visited: HashSet<usize> = HashSet::new();
    let mut queue: VecDeque<(usize, Vec<String>)> = VecDeque::new();
    for &start in starts {
        if visited.insert(start) {
            queue.push_back((start, vec![index.fns[start].ident.clone()]));
        }
    }
    while let Some((at, via)) = queue.pop_front() {
        let entry = &index.fns[at];
        let file = &index.files[entry.file];
        let commits = entry
            .findings
            .commits
            .iter()
            .filter(|(_, recv)| index.may_be_own_commit(entry, recv))
            .map(|(site, _)| site);
        for site in entry.findings.sites.iter().chain(commits) {
            set_family(&mut report.entitlements, site.family);
            report.evidence.push(Evidence {
                family: site.family,
                file: file.clone(),
                line: site.line,
                what: site.what.clone(),
                via: via.clone(),
            });
        }
        for e in &entry.findings.evasion {
            report.evasion.push(EvasionFinding {
                kind: e.kind,
                file: file.clone(),
                line: e.line,
                decoded: e.decoded.clone(),
            });
        }
        for call in &entry.findings.calls {
            let callees = match call {
                CallRef::Method { recv, method, line } if *recv != Recv::SelfValue => {
                    let target = index.method_target(entry, recv, method);
                    let own: HashSet<&str> =
                        entry.findings.sites.iter().map(|s| s.family).collect();
                    for (family, ty) in &target.families {
                        if !own.contains(family) {
                            set_family(&mut report.entitlements, family);
                            report.evidence.push(Evidence {
                                family,
                                file: file.clone(),
                                line: *line,
                                what: format!("{}.{method}(..) on {ty}", recv.render()),
                                via: via.clone(),
                            });
                        }
                    }
                    if target.unresolved {
                        report.unresolved.push(Unresolved {
                            call: format!("{}.{method}", recv.render()),
                            file: file.clone(),
                            line: *line,
                            via: via.clone(),
                        });
                    }
                    target.callees
                }
                _ => index.resolve(entry, call),
            };
            for callee in callees {
                if visited.insert(callee) {
                    let mut next = via.clone();
                    next.push(index.fns[callee].ident.clone());
                    queue.push_back((callee, next));
                }
            }
        }
    }
    report
}

fn set_family(ent: &mut Entitlements, family: &str) {
    match family {
        rules::FS_READ => ent.filesystem_read = true,
        rules::FS_WRITE => ent.filesystem_write = true,
        rules::NETWORK => ent.network = true,
        rules::SUBPROCESS => ent.subprocess = true,
        rules::CRYPTO => ent.crypto = true,
        rules::UNSAFE_FFI => ent.unsafe_ffi = true,
        rules::ENVIRONMENT => ent.environment = true,
        // Every family string comes from the constants above; an unknown one is ignored
        // rather than turned into a panic.
        _ => {}
    }
}

/// A tool whose effective annotations claim `readOnlyHint: true` while its handler writes files,
/// spawns a process or opens a network connection: a violation, not a warning.
pub fn check_claims(def: &ToolDefinition, report: &ScanReport) -> Option<ClaimViolation> {
    if !def.annotations.effective().read_only_hint || !report.entitlements.mutates() {
        return None;
    }
    let evidence = report
        .evidence
        .iter()
        .filter(|e| {
            matches!(
                e.family,
                rules::FS_WRITE | rules::SUBPROCESS | rules::NETWORK
            )
        })
        .cloned()
        .collect();
    Some(ClaimViolation {
        tool: def.name.clone(),
        claim: "readOnlyHint",
        evidence,
    })
}
