//! The kill switch: one file, `<ledger_dir>/halt.json`, whose existence halts every tool call.
//!
//! The file holds `{"by":String,"reason":String,"since_ns":integer}` (keys sorted, no whitespace;
//! see `docs/checks.md`). [`KillSwitch::status`] reads it afresh on every call, so a halt written by
//! another process (the operator's `toolgate-server halt`) takes effect on the next call of every
//! server sharing the ledger directory. Reading fails closed: a halt file that exists but cannot
//! be read or parsed halts, with a reason that says how to repair it.

use std::fs::{self, File};
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::GuardError;
use std::sync::Arc;

use toolgate_storage::{FsStorage, Storage, Symlinks};

/// Name of the halt file inside the ledger directory.
pub const HALT_FILE_NAME: &str = "halt.json";
/// Longest accepted halt reason, in characters (Unicode scalar values).
pub const MAX_REASON_CHARS: usize = 1000;
/// Longest accepted `by`, in characters.
pub const MAX_BY_CHARS: usize = 256;
/// A halt file larger than this is treated as invalid (and therefore halts). A valid one is at most
/// about 5 KiB (1000 characters of up to 4 bytes each, plus `by`).
const MAX_HALT_FILE_BYTES: u64 = 64 * 1024;
/// `by` of the [`Halt`] reported for a halt file that cannot be read or parsed.
pub const UNREADABLE_HALT_BY: &str = "toolgate";

/// A halt in force: why, since when, and who ordered it.
///
/// Fields are declared in key order so that serializing gives the sorted, canonical key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Halt {
    /// Who halted (an operator name, a host, a tool), as given to [`KillSwitch::halt`].
    pub by: String,
    /// Why; shown to callers whose calls are refused.
    pub reason: String,
    /// When, in nanoseconds since the Unix epoch (a JSON integer, written exactly).
    pub since_ns: u64,
}

impl Halt {
    /// [`Halt::since_ns`] as a `SystemTime`.
    pub fn since(&self) -> SystemTime {
        // Every u64 of nanoseconds (up to the year 2554) fits a SystemTime on 64-bit POSIX
        // platforms; the fallback only exists so that no file content can cause a panic.
        UNIX_EPOCH
            .checked_add(Duration::from_nanos(self.since_ns))
            .unwrap_or(UNIX_EPOCH)
    }

    /// The exact bytes written to `halt.json`: keys sorted, no whitespace, no trailing newline.
    ///
    /// This is the RFC 8785 form except for `since_ns`: RFC 8785 writes numbers as IEEE doubles,
    /// which would round today's nanosecond timestamps (above 2^53) to a multiple of 256, so the
    /// integer is written exactly instead. For `since_ns <= 2^53` the bytes are exactly RFC 8785.
    pub fn to_file_bytes(&self) -> Vec<u8> {
        // serde_json writes struct fields in declaration order (already sorted), escapes strings
        // as RFC 8785 does for the characters a valid reason can hold, and writes u64 exactly.
        // Serializing three plain fields to a Vec cannot fail; the fallback is never taken.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Whether tool calls may proceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// No halt file: calls proceed.
    Running,
    /// A halt is in force (or the halt file is unreadable, which counts as a halt).
    Halted(Halt),
}

impl Status {
    /// Whether calls must be refused.
    pub fn is_halted(&self) -> bool {
        matches!(self, Status::Halted(_))
    }
}

/// Where the halts of a kill switch are kept: the ledger directory's files ([`FileHalts`]), the
/// process's memory ([`MemoryHalts`]), or a database every replica shares
/// (`toolgate_postgres::PgHalts`). A store keeps one halt for everyone (`tenant: None`) and one per
/// tenant. `crates/toolgate-postgres/tests/halt_conformance.rs` runs the same cases against every store.
///
/// What every store guarantees:
/// - `status` reads afresh: a halt put through another handle of the same store (another
///   process on the same ledger, another replica on the same database) shows on the next read;
/// - `status` fails closed: when the store cannot tell, it answers a halt whose reason says why
///   and how to recover (naming `resume_command` when given), never "running";
/// - `put` is durable when it returns and replaces the halt in force, which it returns; `take`
///   lifts it durably and returns exactly the halt it lifted (`None` when running).
pub trait HaltStore: Send + Sync + std::fmt::Debug {
    /// The halt in force for `tenant` (or everyone), read afresh; fail closed.
    fn status(&self, tenant: Option<&str>, resume_command: Option<&str>) -> Status;
    /// Puts `halt` in force for `tenant` (or everyone), durably; returns the halt it replaced
    /// (an unreadable one as [`HaltStore::status`] reports it).
    fn put(
        &self,
        tenant: Option<&str>,
        halt: &Halt,
        resume_command: Option<&str>,
    ) -> Result<Option<Halt>, GuardError>;
    /// Lifts the halt of `tenant` (or everyone), durably; returns the halt lifted.
    fn take(
        &self,
        tenant: Option<&str>,
        resume_command: Option<&str>,
    ) -> Result<Option<Halt>, GuardError>;
}

/// A kill switch: the halt of everyone, or of one tenant ([`KillSwitch::for_tenant`]), in a
/// [`HaltStore`]. Holds no state besides where it lives: every method reads or writes the store,
/// so several processes sharing it see each other's halts.
#[derive(Debug, Clone)]
pub struct KillSwitch {
    store: Arc<dyn HaltStore>,
    /// The tenant this switch stops, or `None` for the switch that stops everyone.
    tenant: Option<String>,
    resume_command: Option<String>,
}

impl KillSwitch {
    /// The kill switch whose file is `<ledger_dir>/halt.json`. Touches nothing on disk.
    pub fn new(ledger_dir: impl Into<PathBuf>) -> Self {
        KillSwitch::with_store(Arc::new(FileHalts::new(ledger_dir)))
    }

    /// The kill switch of `ledger_dir` writing (halt, resume) through `storage`: tests count or
    /// fail its steps.
    pub fn on_storage(ledger_dir: impl Into<PathBuf>, storage: Arc<dyn Storage>) -> Self {
        KillSwitch::with_store(Arc::new(FileHalts::new(ledger_dir).with_storage(storage)))
    }

    /// A kill switch of this process alone, in memory: for tests and single-process embeddings
    /// whose halt need not survive a restart.
    pub fn in_memory() -> Self {
        KillSwitch::with_store(Arc::new(MemoryHalts::default()))
    }

    /// The kill switch kept in `store`.
    pub fn with_store(store: Arc<dyn HaltStore>) -> Self {
        KillSwitch {
            store,
            tenant: None,
            resume_command: None,
        }
    }

    /// The switch of one tenant in the same store: it stops the calls of that tenant's
    /// principals only (their credentials name the tenant), while the switch of
    /// [`KillSwitch::new`] stops everyone's. In a ledger, its file is
    /// `<ledger_dir>/halt.tenant.<tenant>.json` (the name has no separator, so no tenant name can
    /// leave the directory); in the database, a row of `toolgate_tenant_halt`. The tenant must be
    /// a valid principal name.
    pub fn for_tenant(&self, tenant: &str) -> Result<KillSwitch, GuardError> {
        if !toolgate_canon::names::is_principal_name(tenant) {
            return Err(GuardError::InvalidTenant {
                name: tenant.to_owned(),
            });
        }
        let mut switch = self.clone();
        switch.tenant = Some(tenant.to_owned());
        Ok(switch)
    }

    /// The tenant this switch stops (`None`: everyone).
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The operator command that lifts a halt on this server (e.g. `myserver resume`), named in
    /// the reason of an unreadable halt. Without it the reason names no command.
    pub fn resume_command(mut self, command: impl Into<String>) -> Self {
        self.resume_command = Some(command.into());
        self
    }

    /// Whether [`KillSwitch::resume_command`] named the command.
    pub fn has_resume_command(&self) -> bool {
        self.resume_command.is_some()
    }

    /// Whether calls may proceed, read fresh from the store.
    ///
    /// In a ledger, when running this costs one failed `open` (no parse, no allocation beyond the
    /// error). It fails closed: only "the file does not exist" means [`Status::Running`]. Any
    /// other failure to open, read or parse the file (permissions, a directory in its place,
    /// garbage, unknown keys, an invalid reason) yields [`Status::Halted`] with `by` set to
    /// [`UNREADABLE_HALT_BY`], `since_ns` the file's mtime (0 if unknown), and the reason
    /// ``the halt file <path> is unreadable or invalid (<cause>); fix or remove it with
    /// `<resume command>` `` (see [`KillSwitch::resume_command`]).
    pub fn status(&self) -> Status {
        self.store
            .status(self.tenant.as_deref(), self.resume_command.as_deref())
    }

    /// Halts, replacing any halt in force; returns the new halt. See [`KillSwitch::halt_at`].
    pub fn halt(&self, reason: &str, by: &str) -> Result<Halt, GuardError> {
        self.halt_at(reason, by, SystemTime::now())
            .map(|(halt, _previous)| halt)
    }

    /// Halts as of `now`, durably, and returns the new halt together with the one it replaced.
    ///
    /// `reason` must be non-empty, at most [`MAX_REASON_CHARS`] characters and free of control
    /// characters; `by` at most [`MAX_BY_CHARS`] characters without control characters; an
    /// invalid one is refused before the store is touched. In a ledger, the directory (and its
    /// parents) are created if missing, and the file is written to a temporary file in the same
    /// directory (`create_new`), fsynced, renamed over `halt.json`, and the directory is fsynced,
    /// so a reader sees either the old file or the new one, never a partial one, and the halt
    /// survives a power loss once this returns `Ok`. The previous halt is read just before the
    /// rename; a halt written concurrently by another process in between is replaced without
    /// being reported (the last writer wins).
    pub fn halt_at(
        &self,
        reason: &str,
        by: &str,
        now: SystemTime,
    ) -> Result<(Halt, Option<Halt>), GuardError> {
        check_text(reason, MAX_REASON_CHARS, true)
            .map_err(|problem| GuardError::InvalidReason { problem })?;
        check_text(by, MAX_BY_CHARS, false).map_err(|problem| GuardError::InvalidBy { problem })?;
        let halt = Halt {
            by: by.to_owned(),
            reason: reason.to_owned(),
            since_ns: nanos_since_epoch(now),
        };
        let previous = self.store.put(
            self.tenant.as_deref(),
            &halt,
            self.resume_command.as_deref(),
        )?;
        Ok((halt, previous))
    }

    /// Lifts the halt, durably, and returns the halt that was in force (`None` if running).
    ///
    /// In a ledger, the file is first renamed to a private temporary name (so exactly the halt
    /// that this call lifted is reported, even if another process halts concurrently), read,
    /// removed, and the directory is fsynced. An unreadable halt file is lifted too and reported
    /// as the fail-closed [`Halt`] that [`KillSwitch::status`] returned for it. If the directory
    /// fsync fails the error says so; the halt is lifted in memory but may reappear after a power
    /// loss, and retrying `resume` fsyncs again.
    pub fn resume(&self) -> Result<Option<Halt>, GuardError> {
        self.store
            .take(self.tenant.as_deref(), self.resume_command.as_deref())
    }
}

/// The halts of one ledger directory: `halt.json` for everyone, `halt.tenant.<tenant>.json` per
/// tenant, written through the storage floor (the shared durable-write mechanism).
#[derive(Debug, Clone)]
pub struct FileHalts {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
}

impl FileHalts {
    /// The halts of `ledger_dir`. Touches nothing on disk.
    pub fn new(ledger_dir: impl Into<PathBuf>) -> Self {
        FileHalts {
            dir: ledger_dir.into(),
            storage: Arc::new(FsStorage),
        }
    }

    /// The same halts written through `storage`.
    pub fn with_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// The halt file of `tenant` (or of everyone).
    pub fn path(&self, tenant: Option<&str>) -> PathBuf {
        self.dir.join(file_name(tenant))
    }

    /// The fail-closed halt reported for an unreadable or invalid halt file.
    fn unreadable(&self, path: &Path, cause: &str, resume_command: Option<&str>) -> Halt {
        let since_ns = fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .map(nanos_since_epoch)
            .unwrap_or(0);
        Halt {
            by: UNREADABLE_HALT_BY.to_owned(),
            reason: match resume_command {
                Some(command) => format!(
                    "the halt file {} is unreadable or invalid ({cause}); fix or remove it with \
                     `{command}`",
                    path.display()
                ),
                None => format!(
                    "the halt file {} is unreadable or invalid ({cause}); fix it, or lift the halt \
                     with the server's resume command",
                    path.display()
                ),
            },
            since_ns,
        }
    }
}

impl HaltStore for FileHalts {
    fn status(&self, tenant: Option<&str>, resume_command: Option<&str>) -> Status {
        let path = self.path(tenant);
        match toolgate_storage::open_regular_read(&path, Symlinks::Refuse) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Status::Running,
            Err(e) => Status::Halted(self.unreadable(
                &path,
                &format!("cannot open it: {e}"),
                resume_command,
            )),
            Ok(file) => Status::Halted(
                read_halt(file)
                    .unwrap_or_else(|cause| self.unreadable(&path, &cause, resume_command)),
            ),
        }
    }

    fn put(
        &self,
        tenant: Option<&str>,
        halt: &Halt,
        resume_command: Option<&str>,
    ) -> Result<Option<Halt>, GuardError> {
        toolgate_storage::create_dir_durably(self.storage.as_ref(), &self.dir)?;
        let previous = match self.status(tenant, resume_command) {
            Status::Running => None,
            Status::Halted(previous) => Some(previous),
        };
        toolgate_storage::replace_file(
            self.storage.as_ref(),
            &self.dir,
            &file_name(tenant),
            &halt.to_file_bytes(),
        )?;
        Ok(previous)
    }

    fn take(
        &self,
        tenant: Option<&str>,
        resume_command: Option<&str>,
    ) -> Result<Option<Halt>, GuardError> {
        let path = self.path(tenant);
        let taken = toolgate_storage::temp_path(&self.dir, "halt.json.resume");
        match self.storage.rename(&path, &taken) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Running already (or the directory does not exist). Still fsync an existing
                // directory, so that retrying after a failed fsync makes the earlier removal durable.
                if self.dir.is_dir() {
                    toolgate_storage::fsync_dir(self.storage.as_ref(), &self.dir)?;
                }
                return Ok(None);
            }
            Err(e) => return Err(GuardError::io("move aside halt file", &path, e)),
        }
        let halt = toolgate_storage::open_regular_read(&taken, Symlinks::Refuse)
            .map_err(|e| format!("cannot open it: {e}"))
            .and_then(read_halt)
            .unwrap_or_else(|cause| self.unreadable(&path, &cause, resume_command));
        // Best effort: a leftover `.halt.json.resume.*.tmp` is never read, and is removed as an
        // orphan once this process is gone.
        let _ = self.storage.remove(&taken);
        toolgate_storage::fsync_dir(self.storage.as_ref(), &self.dir)?;
        Ok(Some(halt))
    }
}

/// The halts of this process, in memory (lost with it).
#[derive(Debug, Default)]
pub struct MemoryHalts {
    halts: std::sync::Mutex<std::collections::HashMap<Option<String>, Halt>>,
}

impl MemoryHalts {
    fn halts(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Option<String>, Halt>> {
        // A panic while holding the lock leaves a consistent map (every operation is one
        // insert or remove), so the poison is ignored.
        self.halts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl HaltStore for MemoryHalts {
    fn status(&self, tenant: Option<&str>, _: Option<&str>) -> Status {
        match self.halts().get(&tenant.map(str::to_owned)) {
            Some(halt) => Status::Halted(halt.clone()),
            None => Status::Running,
        }
    }

    fn put(
        &self,
        tenant: Option<&str>,
        halt: &Halt,
        _: Option<&str>,
    ) -> Result<Option<Halt>, GuardError> {
        Ok(self.halts().insert(tenant.map(str::to_owned), halt.clone()))
    }

    fn take(&self, tenant: Option<&str>, _: Option<&str>) -> Result<Option<Halt>, GuardError> {
        Ok(self.halts().remove(&tenant.map(str::to_owned)))
    }
}

/// The halt file of `tenant`, or of everyone.
fn file_name(tenant: Option<&str>) -> String {
    match tenant {
        Some(tenant) => tenant_file_name(tenant),
        None => HALT_FILE_NAME.to_owned(),
    }
}

/// The halt file of `tenant` (a valid principal name: no `/`, so the name stays in the directory).
fn tenant_file_name(tenant: &str) -> String {
    format!("halt.tenant.{tenant}.json")
}

/// Reads and validates a halt file, or says why it is not one.
fn read_halt(file: File) -> Result<Halt, String> {
    let mut bytes = Vec::new();
    file.take(MAX_HALT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_HALT_FILE_BYTES {
        return Err(format!("it is larger than {MAX_HALT_FILE_BYTES} bytes"));
    }
    let halt: Halt = serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "not a halt record: {e}; expected {{\"by\":string,\"reason\":string,\"since_ns\":integer}}"
        )
    })?;
    check_text(&halt.reason, MAX_REASON_CHARS, true).map_err(|p| format!("its reason: {p}"))?;
    check_text(&halt.by, MAX_BY_CHARS, false).map_err(|p| format!("its \"by\": {p}"))?;
    Ok(halt)
}

/// Checks length and absence of control characters; returns the problem without quoting `text`.
fn check_text(text: &str, max_chars: usize, required: bool) -> Result<(), String> {
    if required && text.is_empty() {
        return Err("it is empty".to_owned());
    }
    let chars = text.chars().count();
    if chars > max_chars {
        return Err(format!("it has {chars} characters, more than {max_chars}"));
    }
    if let Some(pos) = text.chars().position(char::is_control) {
        return Err(format!("it contains a control character at position {pos}"));
    }
    Ok(())
}

/// Nanoseconds since the epoch, 0 before it and saturating at `u64::MAX` (in the year 2554).
fn nanos_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(ns)
    }

    fn halted(status: Status) -> Halt {
        match status {
            Status::Halted(h) => h,
            Status::Running => panic!("expected Halted, got Running"),
        }
    }

    #[test]
    fn halt_and_resume_go_through_the_storage_and_fail_cleanly() {
        use toolgate_storage::{FaultyStorage, Op};
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
        let switch = KillSwitch::on_storage(dir.path(), storage.clone());
        switch.halt_at("maintenance", "ops", at(1)).unwrap();
        assert_eq!(
            storage.syncs(),
            2,
            "temporary file fdatasync + directory fsync"
        );
        for op in [Op::Write, Op::FsyncFile, Op::Rename] {
            storage.fail_nth(op, 1);
            assert!(switch.halt_at("other", "ops", at(2)).is_err(), "{op:?}");
            assert_eq!(halted(switch.status()).reason, "maintenance", "{op:?}");
        }
        storage.fail_nth(Op::Rename, 1);
        assert!(switch.resume().is_err());
        assert!(
            switch.status().is_halted(),
            "a failed resume leaves the halt"
        );
        assert_eq!(switch.resume().unwrap().unwrap().reason, "maintenance");
        assert_eq!(switch.status(), Status::Running);
    }

    #[test]
    fn missing_file_and_missing_dir_are_running() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(KillSwitch::new(dir.path()).status(), Status::Running);
        let absent = KillSwitch::new(dir.path().join("no/such/ledger"));
        assert_eq!(absent.status(), Status::Running);
        assert!(!absent.status().is_halted());
    }

    #[test]
    fn replacing_an_unreadable_halt_file_reports_it_as_status_does() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(HALT_FILE_NAME), b"garbage").unwrap();
        let ks = KillSwitch::new(dir.path()).resume_command("srv resume");
        let reported = halted(ks.status());
        let (_, previous) = ks.halt_at("fixed", "ops", at(7)).unwrap();
        assert_eq!(previous, Some(reported.clone()));
        assert!(reported.reason.contains("`srv resume`"), "{reported:?}");
    }

    #[test]
    fn no_tenant_name_can_leave_the_directory_or_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let switch = KillSwitch::new(dir.path());
        for bad in ["", "../x", "a/b", "a b"] {
            assert!(
                matches!(
                    switch.for_tenant(bad),
                    Err(GuardError::InvalidTenant { .. })
                ),
                "{bad}"
            );
        }
        let dots = switch.for_tenant("..").unwrap();
        assert_eq!(
            FileHalts::new(dir.path()).path(dots.tenant()),
            dir.path().join("halt.tenant....json")
        );
    }

    #[test]
    fn halt_then_status_then_resume() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        let halt = ks.halt("disk full", "alice").unwrap();
        assert_eq!(halt.reason, "disk full");
        assert_eq!(halt.by, "alice");
        assert!(halt.since_ns > 0);
        assert_eq!(ks.status(), Status::Halted(halt.clone()));
        assert_eq!(ks.resume().unwrap(), Some(halt));
        assert_eq!(ks.status(), Status::Running);
        assert_eq!(ks.resume().unwrap(), None);
        // Nothing but the (now absent) halt file was ever left in the directory.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_halt_by_another_instance_takes_effect_on_the_next_call() {
        let dir = tempfile::tempdir().unwrap();
        let gate = KillSwitch::new(dir.path());
        let operator = KillSwitch::new(dir.path());
        assert_eq!(gate.status(), Status::Running);
        operator.halt("incident 42", "ops").unwrap();
        assert_eq!(halted(gate.status()).reason, "incident 42");
        operator.resume().unwrap();
        assert_eq!(gate.status(), Status::Running);
    }

    #[test]
    fn halt_creates_missing_ledger_dir() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path().join("a/b/ledger"));
        ks.halt("stop", "ops").unwrap();
        assert!(dir.path().join("a/b/ledger").join(HALT_FILE_NAME).is_file());
        assert!(ks.status().is_halted());
    }

    #[test]
    fn halting_while_halted_replaces_and_reports_previous() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        let (first, prev) = ks.halt_at("first", "a", at(1_000)).unwrap();
        assert_eq!(prev, None);
        let (second, prev) = ks.halt_at("second", "b", at(2_000)).unwrap();
        assert_eq!(prev, Some(first));
        assert_eq!(halted(ks.status()), second);
    }

    #[test]
    fn file_format_is_sorted_compact_and_since_ns_round_trips_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        // Above 2^53: RFC 8785 would round this to ...456800.
        let ns = 1_776_000_000_123_456_789;
        ks.halt_at("maintenance \"window\" é", "ops", at(ns))
            .unwrap();
        let bytes = fs::read(dir.path().join(HALT_FILE_NAME)).unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            r#"{"by":"ops","reason":"maintenance \"window\" é","since_ns":1776000000123456789}"#
        );
        assert_eq!(halted(ks.status()).since_ns, ns);
        assert_eq!(halted(ks.status()).since(), at(ns));
        let max = Halt {
            by: String::new(),
            reason: "r".to_owned(),
            since_ns: u64::MAX,
        };
        let back: Halt = serde_json::from_slice(&max.to_file_bytes()).unwrap();
        assert_eq!(back, max);
    }

    #[test]
    fn small_since_ns_is_exactly_rfc8785() {
        let halt = Halt {
            by: "ops/β".to_owned(),
            reason: "x".to_owned(),
            since_ns: 1 << 53,
        };
        let value: serde_json::Value = serde_json::from_slice(&halt.to_file_bytes()).unwrap();
        assert_eq!(
            toolgate_canon::canonical_value(&value),
            halt.to_file_bytes()
        );
    }

    #[test]
    fn invalid_reasons_and_authors_are_rejected_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        for bad in ["", "line\nbreak", "tab\there", "\u{7f}"] {
            let err = ks.halt(bad, "ops").unwrap_err();
            assert!(matches!(err, GuardError::InvalidReason { .. }), "{err}");
            assert!(err.to_string().contains("at most 1000 characters"));
        }
        let long = "é".repeat(1001);
        assert!(matches!(
            ks.halt(&long, "ops"),
            Err(GuardError::InvalidReason { .. })
        ));
        assert!(ks.halt(&"é".repeat(1000), "ops").is_ok());
        ks.resume().unwrap();
        assert!(matches!(
            ks.halt("ok", "a\rb"),
            Err(GuardError::InvalidBy { .. })
        ));
        assert!(matches!(
            ks.halt("ok", &"b".repeat(257)),
            Err(GuardError::InvalidBy { .. })
        ));
        assert_eq!(ks.status(), Status::Running);
    }

    #[test]
    fn unreadable_or_invalid_halt_file_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        // Without a resume command the reason names none.
        std::fs::write(dir.path().join(HALT_FILE_NAME), b"garbage").unwrap();
        let reason = halted(KillSwitch::new(dir.path()).status()).reason;
        assert!(
            reason.ends_with("lift the halt with the server's resume command"),
            "{reason}"
        );
        let ks = KillSwitch::new(dir.path()).resume_command("toolgate-server resume");
        let cases: &[&[u8]] = &[
            b"",
            b"garbage",
            br#"{"by":"a","reason":"r"}"#,
            br#"{"by":"a","reason":"r","since_ns":1,"extra":1}"#,
            br#"{"by":"a","reason":"r","since_ns":-1}"#,
            br#"{"by":"a","reason":"r","since_ns":1.5}"#,
            br#"{"by":"a","reason":"","since_ns":1}"#,
            br#"{"by":"a","reason":"a\nb","since_ns":1}"#,
            &[0xff, 0xfe],
        ];
        for bytes in cases {
            fs::write(dir.path().join(HALT_FILE_NAME), bytes).unwrap();
            let halt = halted(ks.status());
            assert_eq!(halt.by, UNREADABLE_HALT_BY);
            assert!(
                halt.reason.starts_with(&format!(
                    "the halt file {} is unreadable or invalid (",
                    dir.path().join(HALT_FILE_NAME).display()
                )),
                "{}",
                halt.reason
            );
            assert!(
                halt.reason
                    .ends_with("); fix or remove it with `toolgate-server resume`"),
                "{}",
                halt.reason
            );
        }
        // A directory in its place halts too; resume moves it aside (it does not delete a
        // directory tree) and reports the fail-closed halt.
        fs::remove_file(dir.path().join(HALT_FILE_NAME)).unwrap();
        fs::create_dir(dir.path().join(HALT_FILE_NAME)).unwrap();
        assert!(ks.status().is_halted());
        assert!(matches!(ks.halt("x", "y"), Err(GuardError::Io { .. })));
        let lifted = ks.resume().unwrap().unwrap();
        assert_eq!(lifted.by, UNREADABLE_HALT_BY);
        assert_eq!(ks.status(), Status::Running);
    }

    #[test]
    fn oversized_halt_file_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        fs::write(dir.path().join(HALT_FILE_NAME), vec![b' '; 70_000]).unwrap();
        assert!(
            halted(ks.status())
                .reason
                .contains("larger than 65536 bytes")
        );
    }

    #[test]
    fn resume_lifts_an_invalid_halt_file_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let ks = KillSwitch::new(dir.path());
        fs::write(dir.path().join(HALT_FILE_NAME), b"{").unwrap();
        let lifted = ks.resume().unwrap().unwrap();
        assert_eq!(lifted.by, UNREADABLE_HALT_BY);
        assert!(lifted.reason.contains("unreadable or invalid"));
        assert_eq!(ks.status(), Status::Running);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[cfg(unix)]
    #[test]
    fn ledger_path_that_is_a_file_fails_closed() {
        // open() fails with ENOTDIR, not ENOENT: not "running".
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ledger");
        fs::write(&file, b"").unwrap();
        let ks = KillSwitch::new(&file);
        assert!(ks.status().is_halted());
        assert!(matches!(ks.halt("x", "y"), Err(GuardError::Io { .. })));
    }

    #[test]
    fn nanos_since_epoch_clamps() {
        assert_eq!(nanos_since_epoch(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(nanos_since_epoch(at(42)), 42);
    }
}
