//! The scanner's tables: which paths, method calls and decoded strings mean which capability.
//!
//! They are data so that the module docs of [`super`] and the code cannot drift apart silently:
//! every row here has a line in the tables there.

/// Family names, exactly as [`toolgate_contract::Entitlements::families`] writes them.
pub(super) const FS_READ: &str = "filesystemRead";
pub(super) const FS_WRITE: &str = "filesystemWrite";
pub(super) const NETWORK: &str = "network";
pub(super) const SUBPROCESS: &str = "subprocess";
pub(super) const CRYPTO: &str = "crypto";
pub(super) const UNSAFE_FFI: &str = "unsafeFfi";
pub(super) const ENVIRONMENT: &str = "environment";

/// How a rule matches the segments of a path after `use` aliases were expanded.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pat {
    /// These segments appear contiguously anywhere in the path (`["fs", "write"]` matches
    /// `std::fs::write`, `tokio::fs::write` and `fs::write` after `use std::fs`).
    Seq(&'static [&'static str]),
    /// The path starts with this crate (`reqwest::get`, `sha2::Sha256`).
    Root(&'static str),
}

/// One row of the path table.
#[derive(Debug, Clone, Copy)]
pub(super) struct PathRule {
    pub(super) pat: Pat,
    pub(super) family: &'static str,
    /// Roots for which the rule does not apply, because the same name means something harmless
    /// there (`clap::Command::new` builds a command-line parser, not a process).
    pub(super) unless_root: &'static [&'static str],
}

const fn seq(segs: &'static [&'static str], family: &'static str) -> PathRule {
    PathRule {
        pat: Pat::Seq(segs),
        family,
        unless_root: &[],
    }
}

const fn root(name: &'static str, family: &'static str) -> PathRule {
    PathRule {
        pat: Pat::Root(name),
        family,
        unless_root: &[],
    }
}

/// The path table. A path may match rows of several families; each family is reported once per
/// path occurrence.
pub(super) const PATH_RULES: &[PathRule] = &[
    // filesystemRead: std::fs and tokio::fs readers, File::open, OpenOptions (write is decided
    // from the builder methods, see `OPEN_OPTIONS_WRITE_METHODS`).
    seq(&["fs", "read"], FS_READ),
    seq(&["fs", "read_to_string"], FS_READ),
    seq(&["fs", "read_dir"], FS_READ),
    seq(&["fs", "read_link"], FS_READ),
    seq(&["fs", "metadata"], FS_READ),
    seq(&["fs", "symlink_metadata"], FS_READ),
    seq(&["fs", "canonicalize"], FS_READ),
    seq(&["fs", "exists"], FS_READ),
    seq(&["fs", "try_exists"], FS_READ),
    seq(&["File", "open"], FS_READ),
    seq(&["File", "open_buffered"], FS_READ),
    seq(&["OpenOptions"], FS_READ),
    // filesystemWrite: std::fs and tokio::fs writers, File::create, our own stores.
    seq(&["fs", "write"], FS_WRITE),
    seq(&["fs", "create_dir"], FS_WRITE),
    seq(&["fs", "create_dir_all"], FS_WRITE),
    seq(&["fs", "remove_file"], FS_WRITE),
    seq(&["fs", "remove_dir"], FS_WRITE),
    seq(&["fs", "remove_dir_all"], FS_WRITE),
    seq(&["fs", "rename"], FS_WRITE),
    seq(&["fs", "copy"], FS_WRITE),
    seq(&["fs", "hard_link"], FS_WRITE),
    seq(&["fs", "soft_link"], FS_WRITE),
    seq(&["fs", "symlink"], FS_WRITE),
    seq(&["fs", "symlink_file"], FS_WRITE),
    seq(&["fs", "symlink_dir"], FS_WRITE),
    seq(&["fs", "set_permissions"], FS_WRITE),
    seq(&["File", "create"], FS_WRITE),
    seq(&["File", "create_new"], FS_WRITE),
    seq(&["TempFile"], FS_WRITE),
    seq(&["replace_file"], FS_WRITE),
    seq(&["FileAuditLog"], FS_WRITE),
    seq(&["AuditSink", "append"], FS_WRITE),
    // network: sockets and HTTP clients. The address types of std::net (IpAddr, SocketAddr) are
    // plain values and deliberately absent.
    seq(&["TcpStream"], NETWORK),
    seq(&["TcpListener"], NETWORK),
    seq(&["UdpSocket"], NETWORK),
    seq(&["UnixStream"], NETWORK),
    seq(&["UnixListener"], NETWORK),
    seq(&["UnixDatagram"], NETWORK),
    seq(&["net", "ToSocketAddrs"], NETWORK),
    seq(&["tokio", "net"], NETWORK),
    root("reqwest", NETWORK),
    root("hyper", NETWORK),
    root("hyper_util", NETWORK),
    root("ureq", NETWORK),
    root("surf", NETWORK),
    root("isahc", NETWORK),
    root("attohttpc", NETWORK),
    root("curl", NETWORK),
    root("tungstenite", NETWORK),
    root("tokio_tungstenite", NETWORK),
    // gRPC clients and database clients talk to a server over a socket.
    root("tonic", NETWORK),
    root("sqlx", NETWORK),
    root("tokio_postgres", NETWORK),
    root("postgres", NETWORK),
    root("deadpool_postgres", NETWORK),
    root("redis", NETWORK),
    root("mongodb", NETWORK),
    // subprocess: std::process and tokio::process commands. `process::exit` is not a process.
    seq(&["process", "Command"], SUBPROCESS),
    PathRule {
        pat: Pat::Seq(&["Command", "new"]),
        family: SUBPROCESS,
        unless_root: &["clap"],
    },
    seq(&["unistd", "fork"], SUBPROCESS),
    seq(&["unistd", "execv"], SUBPROCESS),
    seq(&["unistd", "execve"], SUBPROCESS),
    seq(&["unistd", "execvp"], SUBPROCESS),
    seq(&["libc", "fork"], SUBPROCESS),
    seq(&["libc", "system"], SUBPROCESS),
    root("duct", SUBPROCESS),
    root("subprocess", SUBPROCESS),
    // crypto: hashing, MACs, signatures, ciphers; our own digest type hashes too.
    root("sha2", CRYPTO),
    root("sha1", CRYPTO),
    root("sha3", CRYPTO),
    root("md5", CRYPTO),
    root("md_5", CRYPTO),
    root("hmac", CRYPTO),
    root("ring", CRYPTO),
    root("aes", CRYPTO),
    root("aes_gcm", CRYPTO),
    root("chacha20", CRYPTO),
    root("chacha20poly1305", CRYPTO),
    root("ed25519", CRYPTO),
    root("ed25519_dalek", CRYPTO),
    root("x25519_dalek", CRYPTO),
    root("rsa", CRYPTO),
    root("openssl", CRYPTO),
    root("blake2", CRYPTO),
    root("blake3", CRYPTO),
    root("p256", CRYPTO),
    root("k256", CRYPTO),
    root("ecdsa", CRYPTO),
    seq(&["Sha256"], CRYPTO),
    seq(&["Sha384"], CRYPTO),
    seq(&["Sha512"], CRYPTO),
    seq(&["Sha1"], CRYPTO),
    seq(&["Md5"], CRYPTO),
    seq(&["Hmac"], CRYPTO),
    seq(&["Aes256Gcm"], CRYPTO),
    seq(&["ChaCha20Poly1305"], CRYPTO),
    seq(&["Sha256Digest"], CRYPTO),
    // unsafeFfi: dynamic loading (unsafe blocks, unsafe and extern fns are syntax, see visit.rs).
    root("libloading", UNSAFE_FFI),
    seq(&["dlopen"], UNSAFE_FFI),
    seq(&["dlsym"], UNSAFE_FFI),
    // environment: environment variables. `env!` and `option_env!` read the build environment
    // at compile time and are deliberately absent.
    seq(&["env", "var"], ENVIRONMENT),
    seq(&["env", "var_os"], ENVIRONMENT),
    seq(&["env", "vars"], ENVIRONMENT),
    seq(&["env", "vars_os"], ENVIRONMENT),
    seq(&["env", "set_var"], ENVIRONMENT),
    seq(&["env", "remove_var"], ENVIRONMENT),
    root("dotenv", ENVIRONMENT),
    root("dotenvy", ENVIRONMENT),
    root("envy", ENVIRONMENT),
];

/// Crates whose values the scanner trusts to have no capability beyond what the path table
/// already says (std's `fs` and `process` paths, tokio's `fs`, `net` and `process`): a method
/// call on a value of one of their types is not reported as unresolved.
pub(super) const INERT_ROOTS: &[&str] = &[
    "std",
    "core",
    "alloc",
    "serde",
    "serde_json",
    "rmcp",
    "tokio",
    "futures",
    "futures_util",
    "async_trait",
    "chrono",
    "time",
    "uuid",
    "tracing",
    "log",
    "anyhow",
    "thiserror",
    "schemars",
    "regex",
    "bytes",
    "parking_lot",
    "dashmap",
    "once_cell",
    "indexmap",
    "url",
    // toolgate's own crates: their writers are in the tables (`TempFile`, `replace_file`,
    // `.commit(..)`, `FileAuditLog`); the rest a handler calls is the gate's bookkeeping
    // (`permit.record_outcome(..)` sets what the gate records after the handler).
    "toolgate",
    "toolgate_rmcp",
    "toolgate_audit",
    "toolgate_commit",
    "toolgate_storage",
    "toolgate_policy",
    "toolgate_contract",
    "toolgate_canon",
];

/// Methods of std's (and tokio's, parking_lot's...) wrappers that hand out the value they wrap:
/// the scanner looks through them to the call on that value (`self.client.lock().await.send()`).
pub(super) const PASS_THROUGH_METHODS: &[&str] = &[
    "lock",
    "read",
    "write",
    "try_lock",
    "try_read",
    "try_write",
    "blocking_lock",
    "blocking_read",
    "blocking_write",
    "lock_owned",
    "read_owned",
    "write_owned",
    "unwrap",
    "expect",
    "clone",
    "as_ref",
    "as_mut",
    "as_deref",
    "borrow",
    "borrow_mut",
    "deref",
    "deref_mut",
    "get_mut",
    "load",
    "load_full",
    "into_inner",
];

/// Wrapper types of the prelude, written without a path.
pub(super) const PRELUDE_WRAPPERS: &[&str] = &["Option", "Result", "Box", "Vec"];

/// Whether `rule` matches the (alias-expanded) path `segs`.
pub(super) fn matches(rule: &PathRule, segs: &[String]) -> bool {
    let Some(first) = segs.first() else {
        return false;
    };
    if rule.unless_root.contains(&first.as_str()) {
        return false;
    }
    match rule.pat {
        Pat::Root(name) => first == name,
        Pat::Seq(want) => segs
            .windows(want.len())
            .any(|w| w.iter().zip(want).all(|(a, b)| a == b)),
    }
}

/// The method of toolgate's commit store (`permit.commit(..)`), which [`ANY_RECEIVER_METHODS`]
/// lists; it is dropped when the receiver's declared type is known and comes from another crate
/// (`tx.commit()` on an `sqlx::Transaction`).
pub(super) const OWN_COMMIT: &str = "commit";

/// Method calls that mean a capability whatever the receiver's type, because the scanner has no
/// types: these names are specific enough (or, for `.commit(`, conservative by design).
pub(super) const ANY_RECEIVER_METHODS: &[(&str, &str)] = &[
    ("commit", FS_WRITE),
    ("read_dir", FS_READ),
    ("read_link", FS_READ),
    ("canonicalize", FS_READ),
    ("symlink_metadata", FS_READ),
    ("try_exists", FS_READ),
    ("is_file", FS_READ),
    ("is_dir", FS_READ),
    ("exists", FS_READ),
];

/// Method calls that mean a capability only when the receiver's name contains the given word:
/// `self.notes.write(..)` publishes a note, `self.notes.list()` reads them, `self.audit.append(..)`
/// writes the audit log, but `.list()` or `.append()` on anything else is ordinary collection code.
pub(super) const NAMED_RECEIVER_METHODS: &[(&str, &str, &str)] = &[
    ("write", "notes", FS_WRITE),
    ("list", "notes", FS_READ),
    ("append", "audit", FS_WRITE),
];

/// Builder methods that turn an `OpenOptions` in the same function into a writer.
pub(super) const OPEN_OPTIONS_WRITE_METHODS: &[&str] =
    &["write", "append", "create", "create_new", "truncate"];

/// Last path segments that build strings out of numbers; an integer array in a function that
/// uses one of them is decoded as character codes.
pub(super) const STRING_BUILDERS: &[&str] = &[
    "from_utf8",
    "from_utf8_lossy",
    "from_utf8_unchecked",
    "from_utf16",
    "from_utf16_lossy",
    "from_u32",
    "from_u32_unchecked",
    "from_digit",
];

/// Substrings of decoded hidden text (base64, escapes, character codes) and the family they
/// reveal. Matched case-insensitively. Plain, visible literals are not matched: the capability
/// that uses them (`Command::new`, an HTTP client) is found by the path table, and matching
/// prose would flag every error message that mentions a URL.
pub(super) const STRING_PATTERNS: &[(&str, &str)] = &[
    ("/bin/sh", SUBPROCESS),
    ("sh -c", SUBPROCESS),
    ("bash", SUBPROCESS),
    ("rm -rf", SUBPROCESS),
    ("curl", SUBPROCESS),
    ("wget", SUBPROCESS),
    ("powershell", SUBPROCESS),
    ("cmd.exe", SUBPROCESS),
    ("http://", NETWORK),
    ("https://", NETWORK),
];
