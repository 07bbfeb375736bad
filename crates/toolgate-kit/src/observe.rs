//! What the kit can see of the world: observations, their differences, and a filesystem observer.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::error::ObserveError;

/// One observable record: a file, a row, a captured outbound request, a queued job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// Digest of the record's content: equal digests mean equal content.
    pub content: String,
    /// Digest of metadata that changes without the content changing (a file's mtime and inode):
    /// a change here alone is a *touch*, which still contradicts `readOnlyHint`.
    pub meta: Option<String>,
    /// Content digests of this record's earlier states it merely extends (for a file: its
    /// content up to each line end). A record whose previous `content` is in here was *appended
    /// to*: an added effect, not replaced state.
    #[serde(skip)]
    pub prefixes: BTreeSet<String>,
}

impl Item {
    /// A record identified by the digest of its content (any string that changes when it does).
    pub fn new(content: impl Into<String>) -> Self {
        Item {
            content: content.into(),
            meta: None,
            prefixes: BTreeSet::new(),
        }
    }

    /// With metadata (a change of metadata alone is reported as a touch).
    #[must_use]
    pub fn with_meta(mut self, meta: impl Into<String>) -> Self {
        self.meta = Some(meta.into());
        self
    }

    /// With the content digests of the earlier states this record extends (append-only records).
    #[must_use]
    pub fn with_prefixes(mut self, prefixes: impl IntoIterator<Item = String>) -> Self {
        self.prefixes.extend(prefixes);
        self
    }
}

/// A snapshot of everything an observer can see: record name -> record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// The records by name.
    pub items: BTreeMap<String, Item>,
}

impl Observation {
    /// An empty observation.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the record `name`.
    pub fn insert(&mut self, name: impl Into<String>, item: Item) {
        self.items.insert(name.into(), item);
    }

    /// What changed from `self` (before) to `after`.
    pub fn diff(&self, after: &Observation) -> Delta {
        let mut changes = Vec::new();
        for (name, old) in &self.items {
            let kind = match after.items.get(name) {
                None => Some(ChangeKind::Removed),
                Some(new) if new.content != old.content => {
                    if new.prefixes.contains(&old.content) {
                        Some(ChangeKind::Appended)
                    } else {
                        Some(ChangeKind::Modified)
                    }
                }
                Some(new) if new.meta != old.meta => Some(ChangeKind::Touched),
                Some(_) => None,
            };
            if let Some(kind) = kind {
                changes.push(Change {
                    item: name.clone(),
                    kind,
                });
            }
        }
        for name in after.items.keys() {
            if !self.items.contains_key(name) {
                changes.push(Change {
                    item: name.clone(),
                    kind: ChangeKind::Added,
                });
            }
        }
        changes.sort_by(|a, b| a.item.cmp(&b.item));
        Delta { changes }
    }
}

/// How the outcome of two identical calls at once differs from the outcome of one call, both
/// from the same starting state `start`. `one` and `again` are two single calls' outcomes: a
/// record whose content they agree on is compared by content (a lost update or an edit applied
/// twice shows); a record on which they disagree holds something that differs per call (a
/// timestamp, a process id), so it is compared by how it changed from `start` and, for a record
/// that grew, by how many line ends it gained. Returns the differing records (changes from `one`
/// to `pair`) and the names of the records compared by shape.
pub(crate) fn outcome_difference(
    start: &Observation,
    one: &Observation,
    again: &Observation,
    pair: &Observation,
) -> (Delta, Vec<String>) {
    let content = |o: &Observation, name: &str| o.items.get(name).map(|i| i.content.clone());
    let kind_from_start = |o: &Observation, name: &str| {
        let mut before = Observation::new();
        let mut after = Observation::new();
        if let Some(item) = start.items.get(name) {
            before.insert(name, item.clone());
        }
        if let Some(item) = o.items.get(name) {
            after.insert(name, item.clone());
        }
        before
            .diff(&after)
            .content_changes()
            .changes
            .first()
            .map(|c| c.kind)
    };
    // Line ends gained since the start: the prefixes are one per line end (and the empty one).
    let lines = |o: &Observation, name: &str| o.items.get(name).map_or(0, |i| i.prefixes.len());
    let mut shaped = Vec::new();
    let differing: BTreeSet<String> = one
        .items
        .keys()
        .chain(pair.items.keys())
        .filter(|name| content(one, name) != content(pair, name))
        .filter(|name| {
            if content(one, name) == content(again, name) {
                return true;
            }
            shaped.push((*name).clone());
            kind_from_start(one, name) != kind_from_start(pair, name)
                || lines(one, name) != lines(pair, name)
        })
        .cloned()
        .collect();
    shaped.sort();
    shaped.dedup();
    let changes = one
        .diff(pair)
        .changes
        .into_iter()
        .filter(|c| differing.contains(&c.item))
        .collect();
    (Delta { changes }, shaped)
}

/// How one record changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChangeKind {
    /// A new record: an added effect.
    Added,
    /// The record kept its previous content and grew: an added effect.
    Appended,
    /// Only metadata changed (a file touched, rewritten with the same bytes, or replaced by an
    /// identical copy): still a write.
    Touched,
    /// The previous content was replaced: state lost or replaced.
    Modified,
    /// The record is gone: state lost.
    Removed,
}

impl ChangeKind {
    /// The word used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Appended => "appended",
            ChangeKind::Touched => "touched",
            ChangeKind::Modified => "modified",
            ChangeKind::Removed => "removed",
        }
    }

    /// Whether this change loses or replaces earlier state (what `destructiveHint=false` denies).
    pub fn loses_state(self) -> bool {
        matches!(self, ChangeKind::Modified | ChangeKind::Removed)
    }

    /// Whether this change is to a record's content or existence, as opposed to a touch of its
    /// metadata alone. A repeat that only touches leaves the same content: no added effect for
    /// `idempotentHint`, while it is still a write for `readOnlyHint`.
    pub fn changes_content(self) -> bool {
        !matches!(self, ChangeKind::Touched)
    }
}

/// One changed record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The record's name.
    pub item: String,
    /// How it changed.
    pub kind: ChangeKind,
}

/// Every change between two observations, sorted by record name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Delta {
    /// The changes.
    pub changes: Vec<Change>,
}

impl Delta {
    /// No observable change.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The changes that lose or replace state.
    pub fn losses(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.kind.loses_state())
    }

    /// How many changes are of `kind`.
    pub fn count(&self, kind: ChangeKind) -> usize {
        self.changes.iter().filter(|c| c.kind == kind).count()
    }

    /// The changes to content or existence, without metadata-only touches (see
    /// [`ChangeKind::changes_content`]).
    pub fn content_changes(&self) -> Delta {
        Delta {
            changes: self
                .changes
                .iter()
                .filter(|c| c.kind.changes_content())
                .cloned()
                .collect(),
        }
    }

    /// The metadata-only touches.
    pub fn touches(&self) -> Delta {
        Delta {
            changes: self
                .changes
                .iter()
                .filter(|c| !c.kind.changes_content())
                .cloned()
                .collect(),
        }
    }
}

impl fmt::Display for Delta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            return f.write_str("none");
        }
        for (index, change) in self.changes.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {}", change.kind.as_str(), change.item)?;
        }
        Ok(())
    }
}

/// A copy of the observed state taken by [`Observer::save`], opaque to the kit, which hands it
/// back to [`Observer::restore`] of the same observer.
pub struct SavedState(Box<dyn Any + Send + Sync>);

impl SavedState {
    /// Wraps an observer's own copy of its state.
    pub fn new(state: impl Any + Send + Sync) -> Self {
        SavedState(Box::new(state))
    }

    /// The copy, if it is a `T` (an observer's `restore` reads back what its `save` stored).
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for SavedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SavedState(..)")
    }
}

/// The author's view of the state a tool can affect.
///
/// `observe` must be a pure read: the kit calls it before and after every case (on a blocking
/// thread). Name records stably (a file's relative path, a row's primary key, a request's
/// sequence number) so additions, changes and removals can be told apart.
///
/// Two optional capabilities let the kit set the state up, and each is used only while no server
/// the kit started is running: [`Observer::save`] with [`Observer::restore`] (the concurrent pair
/// is then compared, record by record, with one call from the same starting state, and the
/// overwrite case puts the state back afterwards), and [`Observer::seed`] (the overwrite case's
/// [`Seed::record`](crate::Seed::record)). [`FsObserver`] implements all three.
pub trait Observer: Send + Sync + 'static {
    /// A snapshot of everything observable now.
    fn observe(&self) -> Result<Observation, ObserveError>;

    /// Lines for the report: what is watched, and what is deliberately ignored and why.
    fn describe(&self) -> Vec<String> {
        Vec::new()
    }

    /// A copy of the observed state that [`Observer::restore`] can put back, or `None` (the
    /// default) when this observer cannot restore. Without it the concurrent pair is compared
    /// with case 1 by the number of changed records only, where a lost update or an edit applied
    /// twice does not show: the report then marks a claimed `idempotentHint: true` untested with
    /// that reason, never held. A wrapper around another observer must forward `save`,
    /// `restore` and `seed` too, or it weakens the matrix (and the report says so).
    fn save(&self) -> Result<Option<SavedState>, ObserveError> {
        Ok(None)
    }

    /// Puts back the state `saved` (from this observer's [`Observer::save`]) holds, so that the
    /// next observation has the same records with the same content (metadata may differ).
    fn restore(&self, saved: &SavedState) -> Result<(), ObserveError> {
        let _ = saved;
        Err(ObserveError::message(
            "this observer cannot restore state; implement Observer::save and Observer::restore together",
        ))
    }

    /// Creates or replaces the record `record` (named as [`Observer::observe`] names it) with
    /// `content`, for [`Seed::record`](crate::Seed::record). The default cannot write.
    fn seed(&self, record: &str, content: &[u8]) -> Result<(), ObserveError> {
        let _ = content;
        Err(ObserveError::message(format!(
            "this observer cannot write the record `{record}`; implement Observer::seed, or seed with Seed::call (a preparatory tool call)"
        )))
    }
}

/// One ignore rule of an [`FsObserver`].
#[derive(Debug, Clone)]
struct Ignore {
    pattern: String,
    reason: String,
}

impl Ignore {
    /// Whether `relative` (a `/`-separated path under a root) is ignored.
    ///
    /// `name/` ignores every directory called `name` and everything under it; a pattern with a
    /// `/` is matched against the whole relative path; any other pattern against the file name.
    /// `*` matches any run of characters except `/`.
    fn matches(&self, relative: &str, is_dir: bool) -> bool {
        if let Some(dir) = self.pattern.strip_suffix('/') {
            let components: Vec<&str> = relative.split('/').collect();
            let dirs = if is_dir {
                &components[..]
            } else {
                &components[..components.len().saturating_sub(1)]
            };
            return dirs.iter().any(|c| glob(dir, c));
        }
        if self.pattern.contains('/') {
            return glob(&self.pattern, relative);
        }
        let name = relative.rsplit('/').next().unwrap_or(relative);
        glob(&self.pattern, name)
    }
}

/// `*`-only glob matching (no `/` crossing).
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Classic two-pointer wildcard match with backtracking to the last star.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            if t[st] == '/' {
                return false;
            }
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Observes every file and directory under some directories.
///
/// A file is the record `<root name>/<relative path>`. Its content digest is the SHA-256 of its
/// bytes without trailing NUL bytes (preallocated, zero-filled space is not content), its
/// metadata is its length, mtime in nanoseconds and inode (so a touch or an identical rewrite is
/// seen), and its prefixes are the digests of its content up to each line end (so an append is
/// told apart from a rewrite). A directory is a record with a fixed content and no metadata (its
/// mtime changes with its entries, which are records themselves). A root that does not exist
/// yet is simply empty. Ignores are explicit and listed in the report with their reasons.
///
/// It can save and restore what it observes (ignored paths are left alone) and seed a record: a
/// file `<root name>/<relative path>`.
#[derive(Debug, Clone)]
pub struct FsObserver {
    roots: Vec<(String, PathBuf)>,
    ignores: Vec<Ignore>,
}

impl FsObserver {
    /// Observes every file under each of `dirs`; a record's name starts with its root's last
    /// path component (`#2`, `#3`... when two roots share one).
    pub fn new<P: Into<PathBuf>>(dirs: impl IntoIterator<Item = P>) -> Self {
        let mut roots: Vec<(String, PathBuf)> = Vec::new();
        for dir in dirs {
            let dir = dir.into();
            let base = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "root".to_owned());
            let mut label = base.clone();
            let mut n = 2;
            while roots.iter().any(|(l, _)| *l == label) {
                label = format!("{base}#{n}");
                n += 1;
            }
            roots.push((label, dir));
        }
        FsObserver {
            roots,
            ignores: Vec::new(),
        }
    }

    /// Ignores matching paths, for the stated reason (printed in the report).
    ///
    /// `name/` ignores directories called `name` and all they contain; a pattern containing `/`
    /// matches the path relative to a root; any other pattern matches file names. `*` matches any
    /// characters except `/`.
    #[must_use]
    pub fn ignore(mut self, pattern: impl Into<String>, reason: impl Into<String>) -> Self {
        self.ignores.push(Ignore {
            pattern: pattern.into(),
            reason: reason.into(),
        });
        self
    }

    fn ignored(&self, relative: &str, is_dir: bool) -> bool {
        self.ignores.iter().any(|i| i.matches(relative, is_dir))
    }

    /// Every entry under `dir` that is not ignored, parents before their children, in path
    /// order.
    fn walk(
        &self,
        label: &str,
        root: &Path,
        dir: &Path,
        out: &mut Vec<Entry>,
    ) -> Result<(), ObserveError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            // A root not created yet, or a directory removed while walking: nothing to see.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ObserveError::new(format!("list {}", dir.display()), e)),
        };
        let mut paths = Vec::new();
        for entry in entries {
            match entry {
                Ok(entry) => paths.push(entry.path()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ObserveError::new(format!("list {}", dir.display()), e)),
            }
        }
        paths.sort();
        for path in paths {
            let relative = path
                .strip_prefix(root)
                .map(|r| r.to_string_lossy().replace('\\', "/"))
                .unwrap_or_else(|_| path.to_string_lossy().into_owned());
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ObserveError::new(format!("stat {}", path.display()), e)),
            };
            let is_dir = meta.is_dir();
            if self.ignored(&relative, is_dir) {
                continue;
            }
            let name = format!("{label}/{relative}");
            if is_dir {
                out.push(Entry {
                    name: format!("{name}/"),
                    path: path.clone(),
                    kind: EntryKind::Dir,
                    meta,
                });
                self.walk(label, root, &path, out)?;
            } else {
                let kind = if meta.file_type().is_symlink() {
                    EntryKind::Symlink
                } else {
                    EntryKind::File
                };
                out.push(Entry {
                    name,
                    path,
                    kind,
                    meta,
                });
            }
        }
        Ok(())
    }

    fn entries(&self) -> Result<Vec<Entry>, ObserveError> {
        let mut out = Vec::new();
        for (label, root) in &self.roots {
            self.walk(label, root, root, &mut out)?;
        }
        Ok(out)
    }

    /// The path of the record `record` (`<root name>/<relative path>`), refusing names that
    /// would leave the root.
    fn path_of(&self, record: &str) -> Result<PathBuf, ObserveError> {
        let known = || {
            self.roots
                .iter()
                .map(|(label, _)| format!("{label}/"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some((label, relative)) = record.split_once('/') else {
            return Err(ObserveError::message(format!(
                "the record name `{record}` has no root: name records `<root>/<relative path>` with a root of {}",
                known()
            )));
        };
        let Some((_, root)) = self.roots.iter().find(|(l, _)| l == label) else {
            return Err(ObserveError::message(format!(
                "the record name `{record}` starts with no observed root: use one of {}",
                known()
            )));
        };
        let relative = Path::new(relative);
        let plain = relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain || relative.as_os_str().is_empty() {
            return Err(ObserveError::message(format!(
                "the record name `{record}` is not a plain relative path under {} (no `..`, no leading `/`)",
                root.display()
            )));
        }
        Ok(root.join(relative))
    }
}

/// One entry under a root that is not ignored.
struct Entry {
    /// The record's name (a directory's ends with `/`).
    name: String,
    path: PathBuf,
    kind: EntryKind,
    meta: std::fs::Metadata,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    Dir,
    Symlink,
    File,
}

/// What [`FsObserver::save`](Observer::save) keeps of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SavedEntry {
    Dir,
    Symlink(PathBuf),
    File {
        bytes: Vec<u8>,
        permissions: std::fs::Permissions,
    },
}

impl SavedEntry {
    fn kind(&self) -> EntryKind {
        match self {
            SavedEntry::Dir => EntryKind::Dir,
            SavedEntry::Symlink(_) => EntryKind::Symlink,
            SavedEntry::File { .. } => EntryKind::File,
        }
    }
}

/// An [`FsObserver`]'s saved state: every observed entry, parents first.
#[derive(Debug)]
struct FsSaved(Vec<(PathBuf, SavedEntry)>);

fn io_error(what: String) -> impl FnOnce(std::io::Error) -> ObserveError {
    move |e| ObserveError::new(what, e)
}

#[cfg(unix)]
fn make_symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn make_symlink(_target: &Path, _link: &Path) -> std::io::Result<()> {
    Err(std::io::Error::other(
        "restoring symlinks is supported on Unix only",
    ))
}

/// The largest file whose line-end prefixes are digested (beyond it, a change is a rewrite).
const PREFIX_LIMIT: usize = 64 << 20;

fn file_item(bytes: &[u8]) -> Item {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let content = &bytes[..end];
    let mut hasher = Sha256::new();
    let mut prefixes = BTreeSet::new();
    if content.len() <= PREFIX_LIMIT {
        let mut start = 0;
        for (index, &byte) in content.iter().enumerate() {
            if byte == b'\n' {
                hasher.update(&content[start..=index]);
                start = index + 1;
                if start < content.len() {
                    prefixes.insert(hex(&hasher.clone().finalize()));
                }
            }
        }
        hasher.update(&content[start..]);
    } else {
        hasher.update(content);
    }
    // The empty prefix: a file that was empty (or only padding) and grew was appended to.
    if !content.is_empty() {
        prefixes.insert(hex(&Sha256::new().finalize()));
    }
    Item {
        content: hex(&hasher.finalize()),
        meta: None,
        prefixes,
    }
}

fn file_meta(meta: &std::fs::Metadata) -> String {
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(meta);
    #[cfg(not(unix))]
    let inode = 0u64;
    format!("len={} mtime_ns={mtime_ns} ino={inode}", meta.len())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

impl Observer for FsObserver {
    fn observe(&self) -> Result<Observation, ObserveError> {
        let mut out = Observation::new();
        for entry in self.entries()? {
            let item = match entry.kind {
                EntryKind::Dir => Item::new("directory"),
                EntryKind::Symlink => {
                    let target = std::fs::read_link(&entry.path)
                        .map(|t| t.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    Item::new(format!("symlink:{target}")).with_meta(file_meta(&entry.meta))
                }
                EntryKind::File => {
                    let bytes = match std::fs::read(&entry.path) {
                        Ok(bytes) => bytes,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => {
                            return Err(ObserveError::new(
                                format!("read {}", entry.path.display()),
                                e,
                            ));
                        }
                    };
                    file_item(&bytes).with_meta(file_meta(&entry.meta))
                }
            };
            out.insert(entry.name, item);
        }
        Ok(out)
    }

    /// Copies every observed file (its bytes and permissions), symlink and directory into memory;
    /// ignored paths are neither saved nor restored.
    fn save(&self) -> Result<Option<SavedState>, ObserveError> {
        let mut saved = Vec::new();
        for entry in self.entries()? {
            let copy = match entry.kind {
                EntryKind::Dir => SavedEntry::Dir,
                EntryKind::Symlink => SavedEntry::Symlink(
                    std::fs::read_link(&entry.path)
                        .map_err(io_error(format!("read the link {}", entry.path.display())))?,
                ),
                EntryKind::File => SavedEntry::File {
                    bytes: std::fs::read(&entry.path)
                        .map_err(io_error(format!("read {}", entry.path.display())))?,
                    permissions: entry.meta.permissions(),
                },
            };
            saved.push((entry.path, copy));
        }
        Ok(Some(SavedState::new(FsSaved(saved))))
    }

    /// Removes what was created since the save (children first), then writes back every saved
    /// entry whose content, type or permissions differ. A directory created since the save that
    /// holds ignored files cannot be removed, and that is an error naming it.
    fn restore(&self, saved: &SavedState) -> Result<(), ObserveError> {
        let Some(FsSaved(saved)) = saved.downcast_ref::<FsSaved>() else {
            return Err(ObserveError::message(
                "FsObserver::restore was given a state another observer saved",
            ));
        };
        let kept: BTreeMap<&Path, EntryKind> =
            saved.iter().map(|(p, c)| (p.as_path(), c.kind())).collect();
        for entry in self.entries()?.iter().rev() {
            if kept.get(entry.path.as_path()) == Some(&entry.kind) {
                continue;
            }
            let removed = match entry.kind {
                EntryKind::Dir => std::fs::remove_dir(&entry.path),
                EntryKind::Symlink | EntryKind::File => std::fs::remove_file(&entry.path),
            };
            match removed {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ObserveError::new(
                        format!(
                            "restore: remove {}, created since the state was saved (a directory that still holds ignored files cannot be removed)",
                            entry.path.display()
                        ),
                        e,
                    ));
                }
            }
        }
        for (path, copy) in saved {
            match copy {
                SavedEntry::Dir => std::fs::create_dir_all(path)
                    .map_err(io_error(format!("restore: create {}", path.display())))?,
                SavedEntry::Symlink(target) => {
                    if std::fs::read_link(path).ok().as_deref() != Some(target.as_path()) {
                        let _ = std::fs::remove_file(path);
                        make_symlink(target, path).map_err(io_error(format!(
                            "restore: link {} to {}",
                            path.display(),
                            target.display()
                        )))?;
                    }
                }
                SavedEntry::File { bytes, permissions } => {
                    if std::fs::read(path).ok().as_ref() != Some(bytes) {
                        std::fs::write(path, bytes)
                            .map_err(io_error(format!("restore: write {}", path.display())))?;
                    }
                    let current = std::fs::metadata(path)
                        .map_err(io_error(format!("restore: stat {}", path.display())))?;
                    if current.permissions() != *permissions {
                        std::fs::set_permissions(path, permissions.clone()).map_err(io_error(
                            format!("restore: set the permissions of {}", path.display()),
                        ))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes `content` to `<root>/<relative path>`, creating its parent directories.
    fn seed(&self, record: &str, content: &[u8]) -> Result<(), ObserveError> {
        let path = self.path_of(record)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io_error(format!("seed: create {}", parent.display())))?;
        }
        std::fs::write(&path, content).map_err(io_error(format!("seed: write {}", path.display())))
    }

    fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .roots
            .iter()
            .map(|(label, root)| format!("files under {} (as {label}/)", root.display()))
            .collect();
        lines.extend(
            self.ignores
                .iter()
                .map(|i| format!("ignored {}: {}", i.pattern, i.reason)),
        );
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_stars_within_one_component() {
        assert!(glob("audit*.jsonl", "audit.jsonl"));
        assert!(glob("audit*.jsonl", "audit.checkpoints.jsonl"));
        assert!(!glob("audit*.jsonl", "audit.jsonl.bak"));
        assert!(glob("*.lock", ".lock"));
        assert!(!glob("a*c", "a/c"));
        assert!(glob("notes/*.json", "notes/x.json"));
    }

    #[test]
    fn ignore_rules_cover_dirs_paths_and_names() {
        let dir = Ignore {
            pattern: "checkpoints/".into(),
            reason: String::new(),
        };
        assert!(dir.matches("checkpoints", true));
        assert!(dir.matches("a/checkpoints/x", false));
        assert!(!dir.matches("checkpoints", false));
        let name = Ignore {
            pattern: "*.lock".into(),
            reason: String::new(),
        };
        assert!(name.matches("effects/.lock", false));
        assert!(!name.matches("effects/journal", false));
    }

    #[test]
    fn appends_rewrites_touches_and_padding_are_told_apart() {
        let old = file_item(b"one\n\0\0\0\0").with_meta("m1");
        let appended = file_item(b"one\ntwo\n\0\0").with_meta("m2");
        let rewritten = file_item(b"uno\n").with_meta("m2");
        let touched = file_item(b"one\n").with_meta("m2");
        let kind = |after: &Item| {
            let mut a = Observation::new();
            a.insert("f", old.clone());
            let mut b = Observation::new();
            b.insert("f", after.clone());
            a.diff(&b).changes.first().map(|c| c.kind)
        };
        assert_eq!(kind(&appended), Some(ChangeKind::Appended));
        assert_eq!(kind(&rewritten), Some(ChangeKind::Modified));
        assert_eq!(kind(&touched), Some(ChangeKind::Touched));
        assert_eq!(kind(&old), None);
        let empty = file_item(b"");
        let mut a = Observation::new();
        a.insert("f", empty);
        let mut b = Observation::new();
        b.insert("f", file_item(b"x\n"));
        assert_eq!(a.diff(&b).changes[0].kind, ChangeKind::Appended);
        assert_eq!(b.diff(&a).changes[0].kind, ChangeKind::Modified);
        assert_eq!(
            a.diff(&Observation::new()).changes[0].kind,
            ChangeKind::Removed
        );
        assert_eq!(
            Observation::new().diff(&a).changes[0].kind,
            ChangeKind::Added
        );
    }

    #[test]
    fn fs_observer_sees_files_and_skips_ignored_ones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        std::fs::create_dir_all(root.join("checkpoints")).unwrap();
        std::fs::write(root.join("a.txt"), b"a").unwrap();
        std::fs::write(root.join("audit.jsonl"), b"{}\n").unwrap();
        std::fs::write(root.join("checkpoints/c"), b"c").unwrap();
        let observer = FsObserver::new([&root, &dir.path().join("missing")])
            .ignore("audit*.jsonl", "governance record")
            .ignore("checkpoints/", "governance record");
        let seen = observer.observe().unwrap();
        let names: Vec<&String> = seen.items.keys().collect();
        assert_eq!(names, ["state/a.txt"]);
        assert!(observer.describe().iter().any(|l| l.contains("governance")));
    }

    #[test]
    fn fs_observer_restores_what_it_saved_and_seeds_records() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        std::fs::create_dir_all(root.join("keep/deep")).unwrap();
        std::fs::write(root.join("keep/a.txt"), b"a\n").unwrap();
        std::fs::write(root.join("keep/deep/b.txt"), b"b\n").unwrap();
        std::fs::write(root.join("gone.txt"), b"gone\n").unwrap();
        std::fs::write(root.join("audit.jsonl"), b"1\n").unwrap();
        let observer = FsObserver::new([&root]).ignore("audit*.jsonl", "governance record");
        let before = observer.observe().unwrap();
        let saved = observer.save().unwrap().expect("FsObserver can restore");

        observer.seed("state/new/dir/c.txt", b"c\n").unwrap();
        std::fs::write(root.join("keep/a.txt"), b"changed\n").unwrap();
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        std::fs::remove_dir_all(root.join("keep/deep")).unwrap();
        std::fs::write(root.join("audit.jsonl"), b"1\n2\n").unwrap();
        let changed = observer.observe().unwrap();
        assert!(changed.items.contains_key("state/new/dir/c.txt"));
        assert!(!before.diff(&changed).is_empty());

        observer.restore(&saved).unwrap();
        let after = observer.observe().unwrap();
        assert!(
            before.diff(&after).content_changes().is_empty(),
            "{}",
            before.diff(&after)
        );
        assert!(!root.join("new").exists());
        // Ignored files are neither saved nor restored.
        assert_eq!(std::fs::read(root.join("audit.jsonl")).unwrap(), b"1\n2\n");

        for bad in ["nowhere/x.txt", "state/../x.txt", "state/", "x"] {
            let e = observer.seed(bad, b"").unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(!dir.path().join("x.txt").exists());
    }

    #[test]
    fn outcomes_are_compared_by_content_unless_single_calls_disagree() {
        let obs = |items: &[(&str, &[u8])]| {
            let mut o = Observation::new();
            for (name, bytes) in items {
                o.insert(*name, file_item(bytes));
            }
            o
        };
        let start = obs(&[("log", b"# log\n"), ("journal", b"")]);
        let one = obs(&[
            ("log", b"# log\n- a\n"),
            ("journal", b"t=1 begin\nt=1 done\n"),
        ]);
        let again = obs(&[
            ("log", b"# log\n- a\n"),
            ("journal", b"t=2 begin\nt=2 done\n"),
        ]);
        // Same shape of journal, other timestamps; the same log: no difference.
        let pair = obs(&[
            ("log", b"# log\n- a\n"),
            ("journal", b"t=3 begin\nt=3 done\n"),
        ]);
        let (delta, shaped) = outcome_difference(&start, &one, &again, &pair);
        assert!(delta.is_empty(), "{delta}");
        assert_eq!(shaped, ["journal"]);
        // The edit applied twice, and a journal that grew twice as much: both differ.
        let doubled = obs(&[
            ("log", b"# log\n- a\n- a\n"),
            ("journal", b"t=3 begin\nt=3 done\nt=4 begin\nt=4 done\n"),
        ]);
        let (delta, _) = outcome_difference(&start, &one, &again, &doubled);
        assert_eq!(delta.to_string(), "modified journal, appended log");
        // A record only the pair created differs too.
        let extra = obs(&[
            ("log", b"# log\n- a\n"),
            ("journal", b"t=5 begin\nt=5 done\n"),
            ("copy", b"x"),
        ]);
        let (delta, _) = outcome_difference(&start, &one, &again, &extra);
        assert_eq!(delta.to_string(), "added copy");
    }
}
