//! Path containment (the storage floor's, since it is a question about the filesystem; the
//! gate's check over it is `toolgate_rmcp`'s `checks/paths.rs`): does an (absolute, lexically normalised) path, once symbolic links are
//! followed, lie inside one of the allowed roots?
//!
//! [`resolve_within`] canonicalizes each root, then resolves the path the way the kernel would,
//! one component at a time: existing components are looked up with `lstat`, symbolic links are
//! followed (relative targets from the link's directory, at most [`MAX_SYMLINK_HOPS`] links), and
//! from the first component that does not exist on, the rest is appended as is. The result must
//! lie inside a canonical root, compared component by component (`/srv/data2` is not inside
//! `/srv/data`).
//!
//! A *dangling* symbolic link (one whose target does not exist) is followed too: it is an escape
//! unless its target resolves inside a root. This matters because creating a file "at" a
//! dangling link creates its target; appending the link's name lexically would let a link inside
//! the root authorize a write anywhere.
//!
//! # Time of check, time of use
//!
//! The check inspects the filesystem now; the handler opens the path later. Anyone who can change
//! the tree under a root in between (replace a directory by a symbolic link) can make the open
//! land elsewhere. This check is therefore a policy decision, not a sandbox. Handlers that write
//! should open the returned path relative to a descriptor of the root with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6+), or at least with `O_NOFOLLOW` on the last
//! component, and should not let untrusted parties write inside the roots.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

/// The most symbolic links followed while resolving one path (the Linux limit).
pub const MAX_SYMLINK_HOPS: u32 = 40;

/// Why a path is refused. Messages name the configured roots but never the path, which is caller
/// input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// No roots were given, so nothing is inside one.
    #[error(
        "path_no_roots: no allowed root directories are configured, so no path is allowed; \
         configure at least one root"
    )]
    NoRoots,
    /// An allowed root cannot be canonicalized (missing, or not accessible).
    #[error(
        "path_root_unavailable: the allowed root {root} cannot be resolved ({source}); create it \
         or correct the configured roots"
    )]
    Root {
        /// The root as configured.
        root: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The path is relative.
    #[error(
        "path_not_absolute: the path is not absolute; pass an absolute path inside one of the \
         allowed roots"
    )]
    NotAbsolute,
    /// The path contains `..`.
    #[error(
        "path_not_normalized: the path contains `..` components; normalise it before checking it"
    )]
    NotNormalized,
    /// The path resolves outside every root.
    #[error(
        "path_escapes: the path resolves outside every allowed root ({}), for example through a \
         symbolic link; use a path inside one of them that does not pass through a link leading \
         out",
        display_roots(.roots)
    )]
    Escapes {
        /// The canonical roots.
        roots: Vec<PathBuf>,
    },
    /// The path cannot be resolved (a symbolic link loop, a file used as a directory, ...).
    #[error(
        "path_unresolvable: the path cannot be resolved ({reason}); use a path whose existing \
         components are directories and that has no symbolic link loops"
    )]
    Unresolvable {
        /// What went wrong.
        reason: &'static str,
    },
    /// A component could not be inspected (for example permission denied).
    #[error(
        "path_io: a component of the path could not be inspected ({source}); check the \
         permissions below the allowed roots"
    )]
    Io {
        /// The operating system's error (it does not contain the path).
        source: io::Error,
    },
}

impl PathError {
    /// A short, stable code for tool results, e.g. `path_escapes`.
    pub fn code(&self) -> &'static str {
        match self {
            PathError::NoRoots => "path_no_roots",
            PathError::Root { .. } => "path_root_unavailable",
            PathError::NotAbsolute => "path_not_absolute",
            PathError::NotNormalized => "path_not_normalized",
            PathError::Escapes { .. } => "path_escapes",
            PathError::Unresolvable { .. } => "path_unresolvable",
            PathError::Io { .. } => "path_io",
        }
    }
}

fn display_roots(roots: &[PathBuf]) -> String {
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolves `path` (absolute, without `..`) following symbolic links and returns the resolved
/// path if it lies inside one of `roots` (see the [module documentation](self)).
///
/// Roots are canonicalized on every call; a root that does not exist is an error naming it.
pub fn resolve_within(roots: &[PathBuf], path: &Path) -> Result<PathBuf, PathError> {
    if roots.is_empty() {
        return Err(PathError::NoRoots);
    }
    let canonical_roots = roots
        .iter()
        .map(|root| {
            fs::canonicalize(root).map_err(|source| PathError::Root {
                root: root.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !path.is_absolute() {
        return Err(PathError::NotAbsolute);
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(PathError::NotNormalized);
    }
    let resolved = resolve(path)?;
    if canonical_roots
        .iter()
        .any(|root| resolved.starts_with(root))
    {
        Ok(resolved)
    } else {
        Err(PathError::Escapes {
            roots: canonical_roots,
        })
    }
}

/// One step of resolution.
enum Step {
    Root(PathBuf),
    Parent,
    Name(OsString),
}

fn steps_of(path: &Path) -> Vec<Step> {
    let mut steps = Vec::new();
    for component in path.components() {
        match component {
            // On Windows a prefix and the root directory come as two components; keep them
            // together as the starting point.
            Component::Prefix(prefix) => steps.push(Step::Root(PathBuf::from(prefix.as_os_str()))),
            Component::RootDir => match steps.last_mut() {
                Some(Step::Root(prefix)) => prefix.push(Component::RootDir),
                _ => steps.push(Step::Root(PathBuf::from(Component::RootDir.as_os_str()))),
            },
            Component::CurDir => {}
            Component::ParentDir => steps.push(Step::Parent),
            Component::Normal(name) => steps.push(Step::Name(name.to_os_string())),
        }
    }
    steps
}

/// Resolves like the kernel: existing components through `lstat` and `readlink`, the part from
/// the first missing component on lexically.
fn resolve(path: &Path) -> Result<PathBuf, PathError> {
    // A stack of steps still to take, the next one last.
    let mut pending = steps_of(path);
    pending.reverse();
    let mut resolved = PathBuf::new();
    let mut missing = false;
    let mut hops = 0u32;
    while let Some(step) = pending.pop() {
        match step {
            Step::Root(root) => resolved = root,
            Step::Parent => {
                if missing {
                    // The kernel fails on `missing/..` too; creating it is impossible.
                    return Err(PathError::Unresolvable {
                        reason: "a symbolic link target goes up (`..`) from a directory that does \
                                 not exist",
                    });
                }
                resolved.pop();
            }
            Step::Name(name) => {
                let candidate = resolved.join(&name);
                if missing {
                    resolved = candidate;
                    continue;
                }
                match fs::symlink_metadata(&candidate) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        hops += 1;
                        if hops > MAX_SYMLINK_HOPS {
                            return Err(PathError::Unresolvable {
                                reason: "too many levels of symbolic links",
                            });
                        }
                        let target =
                            fs::read_link(&candidate).map_err(|source| PathError::Io { source })?;
                        // Relative targets continue from `resolved`, the link's directory.
                        let mut steps = steps_of(&target);
                        steps.reverse();
                        pending.extend(steps);
                    }
                    Ok(meta) => {
                        if !meta.is_dir() && !pending.is_empty() {
                            return Err(PathError::Unresolvable {
                                reason: "a component that is not a directory is followed by \
                                         more components",
                            });
                        }
                        resolved = candidate;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        missing = true;
                        resolved = candidate;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                        return Err(PathError::Unresolvable {
                            reason: "a component that is not a directory is followed by more \
                                     components",
                        });
                    }
                    Err(source) => return Err(PathError::Io { source }),
                }
            }
        }
    }
    Ok(resolved)
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A canonical temporary directory with `root/` (containing `sub/file.txt`) and `outside/`.
    struct Tree {
        _dir: tempfile::TempDir,
        base: PathBuf,
        root: PathBuf,
    }

    fn tree() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        let root = base.join("root");
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("sub/file.txt"), b"x").unwrap();
        fs::create_dir_all(base.join("outside")).unwrap();
        fs::write(base.join("outside/secret"), b"s").unwrap();
        Tree {
            _dir: dir,
            base,
            root,
        }
    }

    fn escapes(result: Result<PathBuf, PathError>) -> bool {
        matches!(result, Err(PathError::Escapes { .. }))
    }

    #[test]
    fn existing_file_and_root_itself_are_inside() {
        let t = tree();
        let roots = [t.root.clone()];
        let file = t.root.join("sub/file.txt");
        assert_eq!(resolve_within(&roots, &file).unwrap(), file);
        assert_eq!(resolve_within(&roots, &t.root).unwrap(), t.root);
    }

    #[test]
    fn non_existing_leaf_and_nested_dirs_inside_root() {
        let t = tree();
        let roots = [t.root.clone()];
        let leaf = t.root.join("sub/new.txt");
        assert_eq!(resolve_within(&roots, &leaf).unwrap(), leaf);
        let deep = t.root.join("a/b/c/new.txt");
        assert_eq!(resolve_within(&roots, &deep).unwrap(), deep);
    }

    #[test]
    fn sibling_with_common_prefix_is_outside() {
        let t = tree();
        fs::create_dir(t.base.join("root2")).unwrap();
        let roots = [t.root.clone()];
        assert!(escapes(resolve_within(&roots, &t.base.join("root2/x"))));
        assert!(escapes(resolve_within(
            &roots,
            &t.base.join("outside/secret")
        )));
        assert!(escapes(resolve_within(&roots, Path::new("/"))));
    }

    #[test]
    fn symlink_to_outside_escapes() {
        let t = tree();
        symlink(t.base.join("outside"), t.root.join("out")).unwrap();
        symlink("../outside/secret", t.root.join("rel")).unwrap();
        let roots = [t.root.clone()];
        assert!(escapes(resolve_within(&roots, &t.root.join("out/secret"))));
        assert!(escapes(resolve_within(&roots, &t.root.join("out/new"))));
        assert!(escapes(resolve_within(&roots, &t.root.join("out"))));
        assert!(escapes(resolve_within(&roots, &t.root.join("rel"))));
    }

    #[test]
    fn symlink_to_inside_is_resolved() {
        let t = tree();
        symlink(t.root.join("sub"), t.root.join("abs")).unwrap();
        symlink("sub", t.root.join("rel")).unwrap();
        // A chain: link -> link -> dir.
        symlink("rel", t.root.join("chain")).unwrap();
        let roots = [t.root.clone()];
        let want = t.root.join("sub/file.txt");
        assert_eq!(
            resolve_within(&roots, &t.root.join("abs/file.txt")).unwrap(),
            want
        );
        assert_eq!(
            resolve_within(&roots, &t.root.join("rel/file.txt")).unwrap(),
            want
        );
        assert_eq!(
            resolve_within(&roots, &t.root.join("chain/file.txt")).unwrap(),
            want
        );
        assert_eq!(
            resolve_within(&roots, &t.root.join("rel/new")).unwrap(),
            t.root.join("sub/new")
        );
    }

    #[test]
    fn symlink_out_and_back_in_is_inside() {
        let t = tree();
        symlink(t.root.join("sub"), t.base.join("outside/back")).unwrap();
        symlink(t.base.join("outside"), t.root.join("out")).unwrap();
        let roots = [t.root.clone()];
        assert_eq!(
            resolve_within(&roots, &t.root.join("out/back/file.txt")).unwrap(),
            t.root.join("sub/file.txt")
        );
    }

    #[test]
    fn dangling_symlink_escapes_unless_its_target_is_inside() {
        let t = tree();
        symlink(t.base.join("outside/not-yet"), t.root.join("dangling-out")).unwrap();
        symlink("sub/not-yet", t.root.join("dangling-in")).unwrap();
        symlink("../outside/missing/deeper", t.root.join("dangling-rel-out")).unwrap();
        let roots = [t.root.clone()];
        assert!(escapes(resolve_within(
            &roots,
            &t.root.join("dangling-out")
        )));
        assert!(escapes(resolve_within(
            &roots,
            &t.root.join("dangling-rel-out")
        )));
        assert_eq!(
            resolve_within(&roots, &t.root.join("dangling-in")).unwrap(),
            t.root.join("sub/not-yet")
        );
        // Through a dangling link to a missing directory, deeper components follow its target.
        symlink(t.base.join("outside/nodir"), t.root.join("dangling-dir")).unwrap();
        assert!(escapes(resolve_within(
            &roots,
            &t.root.join("dangling-dir/x/y")
        )));
    }

    #[test]
    fn root_that_is_a_symlink_is_canonicalized() {
        let t = tree();
        let link_root = t.base.join("root-link");
        symlink(&t.root, &link_root).unwrap();
        let roots = [link_root.clone()];
        assert_eq!(
            resolve_within(&roots, &link_root.join("sub/file.txt")).unwrap(),
            t.root.join("sub/file.txt")
        );
        // The real path is inside too (it is the same directory).
        assert_eq!(
            resolve_within(&roots, &t.root.join("sub/new")).unwrap(),
            t.root.join("sub/new")
        );
        assert!(escapes(resolve_within(
            &roots,
            &t.base.join("outside/secret")
        )));
    }

    #[test]
    fn several_roots() {
        let t = tree();
        let roots = [t.root.clone(), t.base.join("outside")];
        assert_eq!(
            resolve_within(&roots, &t.base.join("outside/secret")).unwrap(),
            t.base.join("outside/secret")
        );
    }

    #[test]
    fn missing_root_is_named() {
        let t = tree();
        let missing = t.base.join("no-such-root");
        let err =
            resolve_within(&[t.root.clone(), missing.clone()], &t.root.join("x")).unwrap_err();
        assert_eq!(err.code(), "path_root_unavailable");
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
        assert_eq!(
            resolve_within(&[], &t.root).unwrap_err().code(),
            "path_no_roots"
        );
    }

    #[test]
    fn relative_or_unnormalized_input_is_refused() {
        let t = tree();
        let roots = [t.root.clone()];
        assert_eq!(
            resolve_within(&roots, Path::new("sub/file.txt"))
                .unwrap_err()
                .code(),
            "path_not_absolute"
        );
        assert_eq!(
            resolve_within(&roots, &t.root.join("sub/../../outside/secret"))
                .unwrap_err()
                .code(),
            "path_not_normalized"
        );
    }

    #[test]
    fn loops_and_files_used_as_dirs_are_unresolvable() {
        let t = tree();
        symlink("loop-b", t.root.join("loop-a")).unwrap();
        symlink("loop-a", t.root.join("loop-b")).unwrap();
        symlink("self", t.root.join("self")).unwrap();
        let roots = [t.root.clone()];
        for p in ["loop-a", "self/x", "sub/file.txt/x"] {
            let err = resolve_within(&roots, &t.root.join(p)).unwrap_err();
            assert_eq!(err.code(), "path_unresolvable", "{p}: {err}");
        }
        // A link target going up from a missing directory cannot be created.
        symlink("missing/../../outside", t.root.join("up")).unwrap();
        assert_eq!(
            resolve_within(&roots, &t.root.join("up/x"))
                .unwrap_err()
                .code(),
            "path_unresolvable"
        );
    }

    #[test]
    fn escape_message_names_roots_but_not_the_path() {
        let t = tree();
        symlink(t.base.join("outside"), t.root.join("out")).unwrap();
        let roots = [t.root.clone()];
        let err = resolve_within(&roots, &t.root.join("out/very-secret-name")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("path_escapes: "), "{msg}");
        assert!(msg.contains(&t.root.display().to_string()), "{msg}");
        assert!(!msg.contains("very-secret-name"), "{msg}");
        assert!(!msg.contains("/outside"), "{msg}");
    }
}
