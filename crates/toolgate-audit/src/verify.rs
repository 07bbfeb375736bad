//! The verifier: walks a log (rotated segments, then the active file) line by line and reports the
//! first place where the chain, the sequence numbers or a signed checkpoint disagree.

use std::collections::HashSet;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use toolgate_canon::{HmacKey, Sha256Digest};
use toolgate_storage::Symlinks;

use crate::AuditError;
use crate::checkpoint::Checkpoint;
use crate::record::{MAX_LINE_BYTES, SeqField, check_line, peek_seq};
use crate::segments::{chain_files, checkpoints_path};

/// The result of verifying a log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// How many records were verified good before the problem (all of them when there is none).
    pub records: u64,
    /// The `sha256` of the last good record (`"0" * 64` when there is none).
    pub head: Sha256Digest,
    /// The first problem found, if any. A bad checkpoint line comes first, then the first bad
    /// line of the log, then a checkpoint missing from the checkpoint file or the mirror.
    pub problem: Option<Problem>,
    /// Distinct checkpoints (of the checkpoint file and the mirror together) whose signature
    /// verified and whose `(count, head)` the log was checked against.
    pub checkpoints_verified: u64,
    /// Checkpoint lines present but not checked because no key was given: without the key,
    /// truncation after a line boundary and a re-chained replacement are not detectable.
    pub checkpoints_unchecked: u64,
    /// With a key, when the log itself verified: how many records follow the newest verified
    /// checkpoint (all of them when there is none). No signature covers them, so cutting them off
    /// is not detectable. `None` without a key or when the log is broken.
    pub records_after_checkpoint: Option<u64>,
    /// With [`VerifyOptions::checkpoint_mirror`]: the first checkpoint present in one of the two
    /// files and missing from the other ([`ProblemKind::CheckpointMissing`]). It is also
    /// [`problem`](Self::problem) when nothing else is wrong; kept here so that it is reported
    /// next to a log problem too.
    pub checkpoint_mismatch: Option<Problem>,
    /// Conditions that do not break the log but limit what verification proved.
    pub warnings: Vec<Warning>,
}

impl VerifyReport {
    /// The report as one JSON object, the form every `audit verify --format json` prints:
    /// `status` (`intact` or `broken`), `records`, `head`, the checkpoint counts,
    /// `records_after_checkpoint`, `problem` and `checkpoint_mismatch` (null or a problem
    /// object), and `warnings`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "status": if self.problem.is_none() { "intact" } else { "broken" },
            "records": self.records,
            "head": self.head.to_hex(),
            "checkpoints_verified": self.checkpoints_verified,
            "checkpoints_unchecked": self.checkpoints_unchecked,
            "records_after_checkpoint": self.records_after_checkpoint,
            "problem": self.problem.as_ref().map(Problem::to_json),
            "checkpoint_mismatch": self.checkpoint_mismatch.as_ref().map(Problem::to_json),
            "warnings": self.warnings.iter()
                .map(|w| serde_json::json!({"kind": w.kind.as_str(), "detail": w.detail}))
                .collect::<Vec<_>>(),
        })
    }

    /// Whether the whole log verified without a problem.
    pub fn is_intact(&self) -> bool {
        self.problem.is_none()
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            None => write!(f, "intact: {} records, head {}", self.records, self.head)?,
            Some(problem) => write!(
                f,
                "{problem} ({} records verified before it, head {})",
                self.records, self.head
            )?,
        }
        if let Some(mismatch) = &self.checkpoint_mismatch
            && self.problem.as_ref() != Some(mismatch)
        {
            write!(f, "; also {mismatch}")?;
        }
        if self.checkpoints_verified > 0 {
            write!(f, "; {} checkpoints verified", self.checkpoints_verified)?;
            if let Some(after) = self.records_after_checkpoint
                && after > 0
            {
                write!(
                    f,
                    "; {after} records after the newest checkpoint (not covered by any signature)"
                )?;
            }
        }
        if self.checkpoints_unchecked > 0 {
            write!(
                f,
                "; {} checkpoints NOT checked (no key given: truncation and re-chained replacement are not detected)",
                self.checkpoints_unchecked
            )?;
        }
        for warning in &self.warnings {
            write!(f, "; WARNING: {}", warning.detail)?;
        }
        Ok(())
    }
}

/// Something verification could not vouch for although nothing is broken; it does not change
/// the exit status of `audit verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Warning {
    /// What kind of limitation.
    pub kind: WarningKind,
    /// A human-readable explanation naming the files and what to check.
    pub detail: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.detail)
    }
}

/// The kinds of [`Warning`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WarningKind {
    /// A key was given, but neither the checkpoint file nor the mirror holds a checkpoint line:
    /// nothing is signed, so the key adds nothing to the chain check.
    NoCheckpoints,
}

impl WarningKind {
    /// The stable name used in reports and scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::NoCheckpoints => "no_checkpoints",
        }
    }
}

/// Where and how the log breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The 1-based line number, in the file named by `segment` (a rotated segment), by
    /// `checkpoint_file` (for [`ProblemKind::BadCheckpointSignature`] and
    /// [`ProblemKind::CheckpointMissing`]), or else in the active file.
    pub line: u64,
    /// The kind of damage.
    pub kind: ProblemKind,
    /// A human-readable explanation (the text after the kind in [`fmt::Display`]).
    pub detail: String,
    /// The `seq` the record at `line` should have (the number of records before it plus one);
    /// `None` for checkpoint-file problems.
    pub seq: Option<u64>,
    /// The rotated segment holding `line`; `None` when it is in the active file.
    pub segment: Option<PathBuf>,
    /// The checkpoint file (or mirror) holding `line`, for
    /// [`ProblemKind::BadCheckpointSignature`] and [`ProblemKind::CheckpointMissing`].
    pub checkpoint_file: Option<PathBuf>,
}

impl Problem {
    /// The problem as a JSON object: `line`, `seq`, `reason` (its kind), `detail`, `segment` and
    /// `checkpoint_file` (null when not about one).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "line": self.line,
            "seq": self.seq,
            "reason": self.kind.as_str(),
            "detail": self.detail,
            "segment": self.segment.as_ref().map(|s| s.display().to_string()),
            "checkpoint_file": self.checkpoint_file.as_ref().map(|s| s.display().to_string()),
        })
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(segment) = &self.segment {
            write!(f, "segment {} ", segment.display())?;
        }
        if let Some(file) = &self.checkpoint_file {
            write!(f, "checkpoint file {} ", file.display())?;
        }
        write!(
            f,
            "line {}: {}: {}",
            self.line,
            self.kind.as_str(),
            self.detail
        )
    }
}

/// The kinds of damage the verifier recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The `sha256` field does not match the hash recomputed from the record (a field was edited),
    /// or the chain head after a checkpointed record differs from the signed one (the records up
    /// to it were replaced or re-chained).
    Modified,
    /// `prev_sha256` does not match the previous record's `sha256`: a record was edited and its
    /// hashes recomputed, or a foreign line inserted.
    LinkBroken,
    /// A record's `seq` jumps forward and the missing numbers appear nowhere later: records were
    /// deleted.
    SeqGap,
    /// A record's `seq` is lower than or equal to its predecessor's, or jumps forward while the
    /// missing numbers appear later: records were moved or duplicated.
    Reordered,
    /// The line is not byte-identical to the canonical JSON of its content (whitespace, key order,
    /// escapes, floats).
    NotCanonical,
    /// Not a JSON object; `prev_sha256`/`sha256` missing or not 64 lowercase hex characters; a
    /// `seq` that is not a positive integer or missing after numbered records; an over-long line.
    Malformed,
    /// The file's last bytes are not terminated by `\n`: a write was interrupted.
    TornTail,
    /// The log holds fewer records than a signed checkpoint counted: it was cut.
    TruncatedBeforeCheckpoint,
    /// A checkpoint line is malformed or its MAC does not verify under the given key.
    BadCheckpointSignature,
    /// A checkpoint is in the checkpoint file but not in the mirror, or the other way round: one
    /// of them was deleted, rolled back or rewritten, or the mirror fell behind (a crash or a
    /// failed write between the two appends). `line` and `checkpoint_file` name the checkpoint's
    /// place in the file that has it.
    CheckpointMissing,
    /// The chain holds fewer records than its store's head names, or its last record is not the
    /// head's: records were cut off the end or replaced ([`verify_sink`]).
    HeadMismatch,
}

impl ProblemKind {
    /// The stable name used in reports and scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Modified => "modified",
            ProblemKind::LinkBroken => "link_broken",
            ProblemKind::SeqGap => "seq_gap",
            ProblemKind::Reordered => "reordered",
            ProblemKind::NotCanonical => "not_canonical",
            ProblemKind::Malformed => "malformed",
            ProblemKind::TornTail => "torn_tail",
            ProblemKind::TruncatedBeforeCheckpoint => "truncated_before_checkpoint",
            ProblemKind::BadCheckpointSignature => "bad_checkpoint_signature",
            ProblemKind::CheckpointMissing => "checkpoint_missing",
            ProblemKind::HeadMismatch => "head_mismatch",
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to verify: the log (its segments are found beside it) and, optionally, checkpoints.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    log_path: PathBuf,
    key: Option<HmacKey>,
    checkpoints_path: Option<PathBuf>,
    mirror: Option<PathBuf>,
}

impl VerifyOptions {
    /// Verify the log whose active file is `log_path` (conventionally `LEDGER_DIR/audit.jsonl`).
    pub fn new(log_path: impl Into<PathBuf>) -> Self {
        VerifyOptions {
            log_path: log_path.into(),
            key: None,
            checkpoints_path: None,
            mirror: None,
        }
    }

    /// Check the checkpoints with `key`. Without a key they are counted but not trusted.
    pub fn checkpoint_key(mut self, key: HmacKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Read checkpoints from `path` instead of `<log dir>/<stem>.checkpoints.jsonl`.
    pub fn checkpoints_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.checkpoints_path = Some(path.into());
        self
    }

    /// Also read the mirror at `path` (the file the writer was given as
    /// [`AuditConfig::checkpoint_mirror`](crate::AuditConfig::checkpoint_mirror)) and compare it
    /// with the checkpoint file:
    ///
    /// - with a key, every line of both files must verify, and the log is checked against the
    ///   checkpoints of both, so a cut is caught against the newest checkpoint in either file;
    /// - with or without a key, a checkpoint in one file and not in the other is a
    ///   [`ProblemKind::CheckpointMissing`] (a mirror that does not exist has no checkpoints).
    pub fn checkpoint_mirror(mut self, path: impl Into<PathBuf>) -> Self {
        self.mirror = Some(path.into());
        self
    }

    fn checkpoints_file(&self) -> PathBuf {
        self.checkpoints_path
            .clone()
            .unwrap_or_else(|| checkpoints_path(&self.log_path))
    }
}

/// Verifies the log named by `options`: every rotated segment in order, then the active file, then
/// (with a key) every checkpoint, and with a mirror the agreement of the two checkpoint files.
/// `Err` only when a file cannot be read; damage is in the report.
///
/// A missing checkpoint file counts as no checkpoints: its deletion is detectable only by
/// verifying against the mirror (see docs/audit-format.md).
pub fn verify(options: &VerifyOptions) -> Result<VerifyReport, AuditError> {
    let key = options.key.as_ref();
    let primary = CheckpointFile::load(options.checkpoints_file(), key)?;
    let mirror = match &options.mirror {
        Some(path) => Some(CheckpointFile::load(path.clone(), key)?),
        None => None,
    };
    let mismatch = mirror.as_ref().and_then(|m| compare(&primary, m));
    let bad_checkpoint = primary
        .bad
        .clone()
        .or_else(|| mirror.as_ref().and_then(|m| m.bad.clone()));
    // The log is checked against the verified checkpoints of both files; one in both counts once.
    let mut anchors: Vec<Anchor> = Vec::new();
    if key.is_some() {
        anchors.extend(primary.good.iter().map(|(line, cp)| Anchor {
            line: *line,
            checkpoint: cp.clone(),
            mirror_only: false,
        }));
        if let Some(m) = &mirror {
            let known: HashSet<&Checkpoint> = primary.good.iter().map(|(_, cp)| cp).collect();
            anchors.extend(m.good.iter().filter(|(_, cp)| !known.contains(cp)).map(
                |(line, cp)| Anchor {
                    line: *line,
                    checkpoint: cp.clone(),
                    mirror_only: true,
                },
            ));
        }
        anchors.sort_by_key(|a| a.checkpoint.count);
    }
    let verified = u64::try_from(anchors.len()).unwrap_or(u64::MAX);
    let newest = anchors.last().map(|a| a.checkpoint.count);
    let mut walker = Walker::new(anchors, options.mirror.clone());
    for file in chain_files(&options.log_path)? {
        let segment = (file != options.log_path).then(|| file.clone());
        let reader =
            toolgate_storage::open_regular_read(&file, Symlinks::Refuse).map_err(|source| {
                AuditError::Io {
                    action: "open for verification",
                    path: file.clone(),
                    source,
                }
            })?;
        if !walker
            .walk(reader, segment)
            .map_err(|e| in_file(e, &file))?
        {
            break;
        }
    }
    let mut report = walker.finish();
    if key.is_some() {
        if report.problem.is_none() {
            report.records_after_checkpoint =
                Some(report.records.saturating_sub(newest.unwrap_or(0)));
        }
        if primary.lines == 0 && mirror.as_ref().is_none_or(|m| m.lines == 0) {
            report
                .warnings
                .push(no_checkpoints(&primary, mirror.as_ref(), report.records));
        }
    } else {
        // Without a key, a line of the mirror that is also in the checkpoint file counts once.
        let in_both = mirror.as_ref().map_or(0, |m| {
            let known: HashSet<&Checkpoint> = primary.good.iter().map(|(_, cp)| cp).collect();
            let shared = m.good.iter().filter(|(_, cp)| known.contains(cp)).count();
            u64::try_from(shared).unwrap_or(u64::MAX)
        });
        report.checkpoints_unchecked =
            (primary.lines + mirror.as_ref().map_or(0, |m| m.lines)).saturating_sub(in_both);
    }
    report.checkpoint_mismatch = mismatch.clone();
    if let Some(problem) = bad_checkpoint {
        // Forged or damaged anchors are reported before anything else: the log checks above used
        // only the checkpoints that verified.
        report.problem = Some(problem);
    } else {
        if key.is_some() {
            report.checkpoints_verified = verified;
        }
        if report.problem.is_none() {
            report.problem = mismatch;
        }
    }
    Ok(report)
}

/// The warning for a verification with a key that found no checkpoint line anywhere.
fn no_checkpoints(
    primary: &CheckpointFile,
    mirror: Option<&CheckpointFile>,
    records: u64,
) -> Warning {
    let files = match mirror {
        Some(m) => format!("{} nor in the mirror {}", primary.describe(), m.describe()),
        None => primary.describe(),
    };
    Warning {
        kind: WarningKind::NoCheckpoints,
        detail: format!(
            "a key was given but no checkpoint was found in {files}: none of the {records} records is covered by a signature, so truncation and re-chained replacement are not detected; check that the server writing the log signs checkpoints with this key (it then writes one every N records, as it is configured, and at clean shutdown), and that the checkpoint file was not deleted"
        ),
    }
}

/// The checkpoints of one file. With a key, `good` holds the lines that verified; without one,
/// the lines that parse (unverified, used only to compare the file with its mirror).
struct CheckpointFile {
    path: PathBuf,
    exists: bool,
    /// Complete lines in the file.
    lines: u64,
    good: Vec<(u64, Checkpoint)>,
    /// With a key, the first line that does not verify.
    bad: Option<Problem>,
}

impl CheckpointFile {
    /// Reads the file at `path` (no file: no checkpoints). An unterminated last line (a checkpoint
    /// write interrupted by a crash, never acknowledged) is ignored.
    fn load(path: PathBuf, key: Option<&HmacKey>) -> Result<Self, AuditError> {
        let mut file = CheckpointFile {
            path,
            exists: false,
            lines: 0,
            good: Vec::new(),
            bad: None,
        };
        let path = file.path.clone();
        file.exists = for_each_checkpoint_line(&path, |line_no, line| {
            file.judge(key, line_no, line);
        })?;
        Ok(file)
    }

    /// The checkpoints a sink exported (`label` names where they are kept, in reports).
    fn of_lines(label: PathBuf, bytes: &[u8], key: Option<&HmacKey>) -> Self {
        let mut file = CheckpointFile {
            path: label,
            exists: true,
            lines: 0,
            good: Vec::new(),
            bad: None,
        };
        // Reading from memory cannot fail.
        let _ = checkpoint_lines(bytes, |line_no, line| file.judge(key, line_no, line));
        file
    }

    /// Takes one line into `good`, or (with a key) the first failure into `bad`.
    fn judge(&mut self, key: Option<&HmacKey>, line_no: u64, line: &[u8]) {
        self.lines += 1;
        let fault = match (Checkpoint::parse(line), key) {
            (Err(detail), Some(_)) => Some(format!("not a checkpoint line: {detail}")),
            (Err(_), None) => None,
            (Ok(cp), None) => {
                self.good.push((line_no, cp));
                None
            }
            (Ok(cp), Some(key)) if cp.key_id != key.key_id() => Some(format!(
                "signed with key id {} but the given key has id {}; verify with the key the writer used",
                cp.key_id,
                key.key_id()
            )),
            (Ok(cp), Some(key)) if !cp.verify(key) => Some(format!(
                "the MAC of the checkpoint for {} records does not verify: the line was edited or forged",
                cp.count
            )),
            (Ok(cp), Some(_)) => {
                self.good.push((line_no, cp));
                None
            }
        };
        if let (Some(detail), None) = (fault, &self.bad) {
            self.bad = Some(Problem {
                line: line_no,
                kind: ProblemKind::BadCheckpointSignature,
                detail,
                seq: None,
                segment: None,
                checkpoint_file: Some(self.path.clone()),
            });
        }
    }

    /// The file's path, and that it does not exist when so.
    fn describe(&self) -> String {
        if self.exists {
            self.path.display().to_string()
        } else {
            format!("{} (which does not exist)", self.path.display())
        }
    }
}

/// The first checkpoint that is in one of the two files and not in the other. One that the
/// checkpoint file lacks is reported first: the mirror exists to catch a checkpoint file that
/// was deleted or rolled back.
fn compare(primary: &CheckpointFile, mirror: &CheckpointFile) -> Option<Problem> {
    let missing_from = |has: &CheckpointFile,
                        lacks: &CheckpointFile,
                        what_has: &str,
                        what_lacks: &str,
                        why: &str| {
        let present: HashSet<&Checkpoint> = lacks.good.iter().map(|(_, cp)| cp).collect();
        let absent: Vec<&(u64, Checkpoint)> = has
            .good
            .iter()
            .filter(|(_, cp)| !present.contains(cp))
            .collect();
        let (line, cp) = absent.first()?;
        Some(Problem {
            line: *line,
            kind: ProblemKind::CheckpointMissing,
            detail: format!(
                "the checkpoint for {} records is missing from {what_lacks} {}; {} of the {} checkpoints in {what_has} are missing from it: {why}",
                cp.count,
                lacks.describe(),
                absent.len(),
                has.good.len(),
            ),
            seq: None,
            segment: None,
            checkpoint_file: Some(has.path.clone()),
        })
    };
    missing_from(
        mirror,
        primary,
        "the mirror",
        "the checkpoint file",
        "the checkpoint file was deleted, rolled back or rewritten; restore it from the mirror and find out who changed it",
    )
    .or_else(|| {
        missing_from(
            primary,
            mirror,
            "the checkpoint file",
            "the mirror",
            "the mirror fell behind (a crash or a failed write between the two appends, or a writer run without its checkpoint mirror) or was rolled back or rewritten; if nothing else is wrong, append the missing lines to the mirror",
        )
    })
}

fn in_file(e: AuditError, path: &Path) -> AuditError {
    match e {
        AuditError::Read { source } => AuditError::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        },
        other => other,
    }
}

/// Verifies the single file at `path` without segments or checkpoints. `Err` only when the file
/// cannot be read; damage is in the report.
pub fn verify_file(path: &Path) -> Result<VerifyReport, AuditError> {
    let file = toolgate_storage::open_regular_read(path, Symlinks::Follow).map_err(|source| {
        AuditError::Io {
            action: "open for verification",
            path: path.to_path_buf(),
            source,
        }
    })?;
    verify_reader(file).map_err(|e| in_file(e, path))
}

/// Verifies the chain a sink stores, in place: its export is streamed through the verifier (memory
/// stays bounded by [`MAX_LINE_BYTES`]), and the chain must reach the head the sink reported
/// before the export began, so records cut off the end of a database table, which leave a
/// well-formed shorter chain, are reported ([`ProblemKind::HeadMismatch`]). Records appended while
/// it runs are verified too. See [`verify_sink_with`] to check signed checkpoints as well.
pub fn verify_sink(sink: &dyn crate::AuditSink) -> Result<VerifyReport, AuditError> {
    verify_sink_with(sink, None)
}

/// [`verify_sink`], and with `key` the chain is also checked against the signed checkpoints the
/// sink keeps ([`crate::AuditSink::export_checkpoints`]), as [`verify`] checks a file log against
/// its checkpoint file: a forged or edited checkpoint, a chain that disowns one (re-chained) or
/// ends before one (cut, with the head row moved back too) is the problem; the report says how
/// many records follow the newest checkpoint, and warns when there is none.
pub fn verify_sink_with(
    sink: &dyn crate::AuditSink,
    key: Option<&HmacKey>,
) -> Result<VerifyReport, AuditError> {
    let head = sink.head()?;
    let checkpoints = match key {
        Some(key) => {
            let mut lines = Vec::new();
            sink.export_checkpoints(&mut lines)?;
            Some(CheckpointFile::of_lines(
                PathBuf::from("the store's checkpoints"),
                &lines,
                Some(key),
            ))
        }
        None => None,
    };
    let mut anchors: Vec<Anchor> = checkpoints.as_ref().map_or_else(Vec::new, |cps| {
        cps.good
            .iter()
            .map(|(line, cp)| Anchor {
                line: *line,
                checkpoint: cp.clone(),
                mirror_only: false,
            })
            .collect()
    });
    anchors.sort_by_key(|a| a.checkpoint.count);
    let verified = u64::try_from(anchors.len()).unwrap_or(u64::MAX);
    let newest = anchors.last().map_or(0, |a| a.checkpoint.count);
    let (reader, mut writer) = std::io::pipe().map_err(|source| AuditError::Export { source })?;
    let mut report = std::thread::scope(|scope| {
        let export = scope.spawn(move || {
            let exported = sink.export(&mut writer);
            drop(writer);
            exported
        });
        let mut walker = Walker::new(anchors, None);
        let walked = walker.walk(reader, None);
        let exported = export.join().unwrap_or_else(|_| {
            Err(AuditError::Export {
                source: std::io::Error::other("the export thread panicked"),
            })
        });
        exported.and(walked).map(|_| walker.finish())
    })?;
    let reached =
        report.records > head.seq || (report.records == head.seq && report.head == head.sha256);
    if report.problem.is_none() && !reached {
        report.problem = Some(Problem {
            line: report.records,
            kind: ProblemKind::HeadMismatch,
            detail: format!(
                "the chain ends at seq {} with sha256 {}, but its store's head is seq {} with sha256 {}: records were removed from the end or replaced",
                report.records, report.head, head.seq, head.sha256
            ),
            seq: Some(report.records + 1),
            segment: None,
            checkpoint_file: None,
        });
    }
    if let Some(cps) = checkpoints {
        if report.problem.is_none() {
            report.records_after_checkpoint = Some(report.records.saturating_sub(newest));
        }
        if cps.lines == 0 {
            report
                .warnings
                .push(no_checkpoints(&cps, None, report.records));
        }
        match cps.bad {
            // Forged or damaged anchors come first: the chain was checked against the good ones.
            Some(problem) => report.problem = Some(problem),
            None => report.checkpoints_verified = verified,
        }
    }
    Ok(report)
}

/// Verifies a log read from `reader`, without segments or checkpoints. `Err` only when reading
/// fails; damage is in the report.
///
/// Memory use is bounded by [`MAX_LINE_BYTES`]: a longer line is reported as malformed rather than
/// buffered.
pub fn verify_reader<R: Read>(reader: R) -> Result<VerifyReport, AuditError> {
    let mut walker = Walker::new(Vec::new(), None);
    walker.walk(reader, None)?;
    Ok(walker.finish())
}

/// A verified checkpoint the log is checked against, with its line in the checkpoint file (or,
/// when only the mirror has it, in the mirror).
struct Anchor {
    line: u64,
    checkpoint: Checkpoint,
    mirror_only: bool,
}

/// Calls `f(line number, line)` for every complete line of the checkpoint file; nothing when the
/// file does not exist. Returns whether it exists.
pub(crate) fn for_each_checkpoint_line(
    path: &Path,
    f: impl FnMut(u64, &[u8]),
) -> Result<bool, AuditError> {
    // Read-only, so a link (a mirror on another volume) is followed; never a FIFO or device.
    let file = match toolgate_storage::open_regular_read(path, Symlinks::Follow) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(AuditError::Io {
                action: "open the checkpoint file",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    checkpoint_lines(BufReader::new(file), f).map_err(|source| AuditError::Io {
        action: "read the checkpoint file",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(true)
}

/// Calls `f(line number, line)` for every complete line `reader` gives (an unterminated last
/// line, a checkpoint write cut by a crash, is not one).
fn checkpoint_lines(
    mut reader: impl BufRead,
    mut f: impl FnMut(u64, &[u8]),
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let read = (&mut reader)
            .take(u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX))
            .read_until(b'\n', &mut buf)?;
        if read == 0 || buf.last() != Some(&b'\n') {
            return Ok(());
        }
        line_no += 1;
        buf.pop();
        f(line_no, &buf);
    }
}

/// A forward `seq` jump seen at some line, waiting to learn whether the missing records appear
/// later (reordered) or nowhere (deleted).
struct PendingGap {
    problem: Problem,
    missing: std::ops::Range<u64>,
}

/// The streaming state of a verification across files.
struct Walker {
    /// Verified checkpoints sorted by count, with their line in the checkpoint file or mirror.
    checkpoints: Vec<Anchor>,
    /// The mirror, to name it when a checkpoint only it holds disowns the log.
    mirror: Option<PathBuf>,
    next_checkpoint: usize,
    records: u64,
    head: Sha256Digest,
    /// The head before the last good record, so that a record that a checkpoint disowns can be
    /// taken back out of the good count.
    prev_head: Sha256Digest,
    /// Whether a record with `seq` has been seen: records without it are accepted only before
    /// (a log written before `seq` existed, continued by a newer writer).
    numbered: bool,
    problem: Option<Problem>,
    gap: Option<PendingGap>,
    /// Good lines of the file being walked, and which file it is, so that a truncation found at
    /// the end is reported at a line of the right file.
    file_lines: u64,
    file_segment: Option<PathBuf>,
}

impl Walker {
    fn new(checkpoints: Vec<Anchor>, mirror: Option<PathBuf>) -> Self {
        Walker {
            checkpoints,
            mirror,
            next_checkpoint: 0,
            records: 0,
            head: Sha256Digest::ZERO,
            prev_head: Sha256Digest::ZERO,
            numbered: false,
            problem: None,
            gap: None,
            file_lines: 0,
            file_segment: None,
        }
    }

    /// The most records any verified checkpoint vouches for.
    fn promised(&self) -> u64 {
        self.checkpoints.last().map_or(0, |a| a.checkpoint.count)
    }

    /// Where the newest checkpoint is, when only the mirror holds it (empty otherwise, which keeps
    /// the reports of a log without a mirror as they were).
    fn promised_by(&self) -> String {
        match (self.checkpoints.last(), &self.mirror) {
            (Some(a), Some(mirror)) if a.mirror_only => {
                format!(" (line {} of the mirror {})", a.line, mirror.display())
            }
            _ => String::new(),
        }
    }

    /// Walks one file. Returns whether the walk should continue with the next file.
    fn walk<R: Read>(&mut self, reader: R, segment: Option<PathBuf>) -> Result<bool, AuditError> {
        // A checkpoint of zero records pins the empty prefix.
        if self.records == 0 && self.problem.is_none() && !self.check_checkpoints(0, &segment) {
            return Ok(false);
        }
        self.file_lines = 0;
        self.file_segment.clone_from(&segment);
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        let mut line_no = 0u64;
        let limit = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX);
        loop {
            buf.clear();
            let read = (&mut reader)
                .take(limit.saturating_add(1))
                .read_until(b'\n', &mut buf)
                .map_err(|source| AuditError::Read { source })?;
            if read == 0 {
                return Ok(true);
            }
            line_no += 1;
            if self.gap.is_some() {
                // Looking ahead for the missing numbers only; the rest of the line is not judged.
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                }
                self.look_ahead(&buf);
                if self.gap.is_none() {
                    return Ok(false);
                }
                continue;
            }
            let problem = |kind, detail: String, records: u64| Problem {
                line: line_no,
                kind,
                detail,
                seq: Some(records + 1),
                segment: segment.clone(),
                checkpoint_file: None,
            };
            if buf.last() != Some(&b'\n') {
                // take() stopped us either at the limit or at the end of the input.
                let p = if buf.len() > MAX_LINE_BYTES {
                    problem(
                        ProblemKind::Malformed,
                        format!("line is longer than {MAX_LINE_BYTES} bytes"),
                        self.records,
                    )
                } else if self.promised() > self.records {
                    problem(
                        ProblemKind::TruncatedBeforeCheckpoint,
                        format!(
                            "the file ends with {} bytes not terminated by a newline after {} records, but a signed checkpoint counts {} records{}",
                            buf.len(),
                            self.records,
                            self.promised(),
                            self.promised_by()
                        ),
                        self.records,
                    )
                } else {
                    problem(
                        ProblemKind::TornTail,
                        format!(
                            "the file ends with {} bytes not terminated by a newline (an interrupted write)",
                            buf.len()
                        ),
                        self.records,
                    )
                };
                self.problem = Some(p);
                return Ok(false);
            }
            buf.pop();
            let link = match check_line(&buf) {
                Ok(link) => link,
                Err(fault) => {
                    self.problem = Some(problem(fault.kind, fault.detail, self.records));
                    return Ok(false);
                }
            };
            let expected = self.records + 1;
            match link.seq {
                SeqField::Absent if !self.numbered => {}
                SeqField::Absent => {
                    self.problem = Some(problem(
                        ProblemKind::Malformed,
                        "seq is missing although earlier records are numbered".into(),
                        self.records,
                    ));
                    return Ok(false);
                }
                SeqField::Invalid => {
                    self.problem = Some(problem(
                        ProblemKind::Malformed,
                        "seq is not a positive integer".into(),
                        self.records,
                    ));
                    return Ok(false);
                }
                SeqField::Valid(seq) if seq == expected => self.numbered = true,
                SeqField::Valid(seq) if seq > expected => {
                    // Deleted or moved? Only the rest of the log can tell: keep reading seqs.
                    self.gap = Some(PendingGap {
                        problem: problem(
                            ProblemKind::SeqGap,
                            format!(
                                "seq {seq} follows seq {}: records {expected}..={} are missing",
                                expected - 1,
                                seq - 1
                            ),
                            self.records,
                        ),
                        missing: expected..seq,
                    });
                    continue;
                }
                SeqField::Valid(seq) => {
                    self.problem = Some(problem(
                        ProblemKind::Reordered,
                        format!(
                            "seq {seq} after seq {}: records were moved or duplicated",
                            expected - 1
                        ),
                        self.records,
                    ));
                    return Ok(false);
                }
            }
            if link.prev != self.head {
                let detail = if expected == 1 {
                    "prev_sha256 of the first record is not 64 zeros".to_owned()
                } else if line_no == 1 {
                    "prev_sha256 does not match the sha256 of the last record of the previous file"
                        .to_owned()
                } else {
                    format!(
                        "prev_sha256 does not match the sha256 of line {}",
                        line_no - 1
                    )
                };
                self.problem = Some(problem(ProblemKind::LinkBroken, detail, self.records));
                return Ok(false);
            }
            self.prev_head = self.head;
            self.head = link.sha256;
            self.records += 1;
            self.file_lines = line_no;
            if !self.check_checkpoints(line_no, &segment) {
                return Ok(false);
            }
        }
    }

    /// Compares the head with every verified checkpoint whose `count` is the number of records so
    /// far; returns false (and records the problem) on a mismatch.
    fn check_checkpoints(&mut self, line_no: u64, segment: &Option<PathBuf>) -> bool {
        while let Some(anchor) = self.checkpoints.get(self.next_checkpoint) {
            let cp = &anchor.checkpoint;
            if cp.count > self.records {
                return true;
            }
            self.next_checkpoint += 1;
            if cp.count == self.records && cp.head != self.head {
                let signer = match (&self.mirror, anchor.mirror_only) {
                    (Some(mirror), true) => {
                        format!("line {} of the mirror {}", anchor.line, mirror.display())
                    }
                    _ => format!("checkpoint line {}", anchor.line),
                };
                let detail = format!(
                    "the chain head after record {} is {} but {signer} signed {}: the records up to here were replaced or re-chained",
                    cp.count, self.head, cp.head
                );
                self.problem = Some(Problem {
                    line: line_no.max(1),
                    kind: ProblemKind::Modified,
                    detail,
                    seq: Some(cp.count.max(1)),
                    segment: segment.clone(),
                    checkpoint_file: None,
                });
                // The record passed its own checks, but the checkpoint says the prefix ending in
                // it is not the one that was signed: it is not counted as good.
                self.records = self.records.saturating_sub(1);
                self.head = self.prev_head;
                return false;
            }
        }
        true
    }

    fn look_ahead(&mut self, line: &[u8]) {
        let Some(gap) = &self.gap else { return };
        if let Some(seq) = peek_seq(line)
            && gap.missing.contains(&seq)
        {
            let mut problem = gap.problem.clone();
            problem.kind = ProblemKind::Reordered;
            problem.detail = format!(
                "{}; seq {seq} appears later, so records were moved",
                problem.detail.split(':').next().unwrap_or_default()
            );
            self.problem = Some(problem);
            self.gap = None;
        }
    }

    fn finish(mut self) -> VerifyReport {
        if let Some(gap) = self.gap.take() {
            self.problem = Some(gap.problem);
        }
        if self.problem.is_none() && self.promised() > self.records {
            self.problem = Some(Problem {
                line: self.file_lines + 1,
                kind: ProblemKind::TruncatedBeforeCheckpoint,
                detail: format!(
                    "the log ends after {} records but a signed checkpoint{} counts {}: records were cut from the end",
                    self.records,
                    self.promised_by(),
                    self.promised()
                ),
                seq: Some(self.records + 1),
                segment: self.file_segment.take(),
                checkpoint_file: None,
            });
        }
        VerifyReport {
            records: self.records,
            head: self.head,
            problem: self.problem,
            checkpoints_verified: 0,
            checkpoints_unchecked: 0,
            records_after_checkpoint: None,
            checkpoint_mismatch: None,
            warnings: Vec::new(),
        }
    }
}
