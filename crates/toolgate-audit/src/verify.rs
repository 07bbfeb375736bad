//! The verifier: walks a log (rotated segments, then the active file) line by line and reports the
//! first place where the chain, the sequence numbers or a signed checkpoint disagree.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use toolgate_canon::{HmacKey, Sha256Digest};

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
    /// The first problem found, if any.
    pub problem: Option<Problem>,
    /// Checkpoints whose signature verified and whose `(count, head)` the log was checked against.
    pub checkpoints_verified: u64,
    /// Checkpoint lines present but not checked because no key was given: without the key,
    /// truncation after a line boundary and a re-chained replacement are not detectable.
    pub checkpoints_unchecked: u64,
}

impl VerifyReport {
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
        if self.checkpoints_verified > 0 {
            write!(f, "; {} checkpoints verified", self.checkpoints_verified)?;
        }
        if self.checkpoints_unchecked > 0 {
            write!(
                f,
                "; {} checkpoints NOT checked (no key given: truncation and re-chained replacement are not detected)",
                self.checkpoints_unchecked
            )?;
        }
        Ok(())
    }
}

/// Where and how the log breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The 1-based line number, in the file named by `segment` (a rotated segment), by
    /// `checkpoint_file` (for [`ProblemKind::BadCheckpointSignature`]), or else in the active file.
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
    /// The checkpoint file holding `line`, for [`ProblemKind::BadCheckpointSignature`].
    pub checkpoint_file: Option<PathBuf>,
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
}

impl VerifyOptions {
    /// Verify the log whose active file is `log_path` (conventionally `LEDGER_DIR/audit.jsonl`).
    pub fn new(log_path: impl Into<PathBuf>) -> Self {
        VerifyOptions {
            log_path: log_path.into(),
            key: None,
            checkpoints_path: None,
        }
    }

    /// Check the checkpoints with `key`. Without a key they are counted but not trusted.
    pub fn checkpoint_key(mut self, key: HmacKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Read checkpoints from `path` (for instance the mirror) instead of
    /// `<log dir>/<stem>.checkpoints.jsonl`.
    pub fn checkpoints_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.checkpoints_path = Some(path.into());
        self
    }

    fn checkpoints_file(&self) -> PathBuf {
        self.checkpoints_path
            .clone()
            .unwrap_or_else(|| checkpoints_path(&self.log_path))
    }
}

/// Verifies the log named by `options`: every rotated segment in order, then the active file, then
/// (with a key) every checkpoint. `Err` only when a file cannot be read; damage is in the report.
///
/// A missing checkpoint file counts as no checkpoints: its deletion is detectable only by
/// verifying against the mirror (see docs/audit-format.md).
pub fn verify(options: &VerifyOptions) -> Result<VerifyReport, AuditError> {
    let cp_path = options.checkpoints_file();
    let (checkpoints, bad_checkpoint, unchecked) = match &options.key {
        Some(key) => {
            let (good, bad) = load_checkpoints(&cp_path, key)?;
            (good, bad, 0)
        }
        None => (Vec::new(), None, count_checkpoint_lines(&cp_path)?),
    };
    let verified = u64::try_from(checkpoints.len()).unwrap_or(u64::MAX);
    let mut walker = Walker::new(checkpoints);
    for file in chain_files(&options.log_path)? {
        let segment = (file != options.log_path).then(|| file.clone());
        let reader = File::open(&file).map_err(|source| AuditError::Io {
            action: "open for verification",
            path: file.clone(),
            source,
        })?;
        if !walker
            .walk(reader, segment)
            .map_err(|e| in_file(e, &file))?
        {
            break;
        }
    }
    let mut report = walker.finish();
    report.checkpoints_unchecked = unchecked;
    if let Some(problem) = bad_checkpoint {
        // Forged or damaged anchors are reported before anything else: the log checks above used
        // only the checkpoints that verified.
        report.problem = Some(problem);
    } else {
        report.checkpoints_verified = verified;
    }
    Ok(report)
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
    let file = File::open(path).map_err(|source| AuditError::Io {
        action: "open for verification",
        path: path.to_path_buf(),
        source,
    })?;
    verify_reader(file).map_err(|e| in_file(e, path))
}

/// Verifies a log read from `reader`, without segments or checkpoints. `Err` only when reading
/// fails; damage is in the report.
///
/// Memory use is bounded by [`MAX_LINE_BYTES`]: a longer line is reported as malformed rather than
/// buffered.
pub fn verify_reader<R: Read>(reader: R) -> Result<VerifyReport, AuditError> {
    let mut walker = Walker::new(Vec::new());
    walker.walk(reader, None)?;
    Ok(walker.finish())
}

/// A verified checkpoint and its line in the checkpoint file.
type Numbered = (u64, Checkpoint);

/// Parses the checkpoint file and checks every MAC. Returns the good checkpoints sorted by count
/// and the first bad line as a problem. An unterminated last line (a checkpoint write interrupted
/// by a crash, never acknowledged) is ignored.
fn load_checkpoints(
    path: &Path,
    key: &HmacKey,
) -> Result<(Vec<Numbered>, Option<Problem>), AuditError> {
    let mut good = Vec::new();
    let mut bad = None;
    for_each_checkpoint_line(path, |line_no, line| {
        let fault = match Checkpoint::parse(line) {
            Err(detail) => Some(format!("not a checkpoint line: {detail}")),
            Ok(cp) if cp.key_id != key.key_id() => Some(format!(
                "signed with key id {} but the given key has id {}; verify with the key the writer used",
                cp.key_id,
                key.key_id()
            )),
            Ok(cp) if !cp.verify(key) => Some(format!(
                "the MAC of the checkpoint for {} records does not verify: the line was edited or forged",
                cp.count
            )),
            Ok(cp) => {
                good.push((line_no, cp));
                None
            }
        };
        if let (Some(detail), None) = (fault, &bad) {
            bad = Some(Problem {
                line: line_no,
                kind: ProblemKind::BadCheckpointSignature,
                detail,
                seq: None,
                segment: None,
                checkpoint_file: Some(path.to_path_buf()),
            });
        }
    })?;
    good.sort_by_key(|(_, cp)| cp.count);
    Ok((good, bad))
}

fn count_checkpoint_lines(path: &Path) -> Result<u64, AuditError> {
    let mut count = 0;
    for_each_checkpoint_line(path, |_, _| count += 1)?;
    Ok(count)
}

/// Calls `f(line number, line)` for every complete line of the checkpoint file; nothing when the
/// file does not exist.
fn for_each_checkpoint_line(path: &Path, mut f: impl FnMut(u64, &[u8])) -> Result<(), AuditError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(AuditError::Io {
                action: "open the checkpoint file",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let read = (&mut reader)
            .take(u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX))
            .read_until(b'\n', &mut buf)
            .map_err(|source| AuditError::Io {
                action: "read the checkpoint file",
                path: path.to_path_buf(),
                source,
            })?;
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
    /// Verified checkpoints sorted by count, with their line in the checkpoint file.
    checkpoints: Vec<Numbered>,
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
    fn new(checkpoints: Vec<Numbered>) -> Self {
        Walker {
            checkpoints,
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
        self.checkpoints.last().map_or(0, |(_, cp)| cp.count)
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
                            "the file ends with {} bytes not terminated by a newline after {} records, but a signed checkpoint counts {} records",
                            buf.len(),
                            self.records,
                            self.promised()
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
        while let Some((cp_line, cp)) = self.checkpoints.get(self.next_checkpoint) {
            if cp.count > self.records {
                return true;
            }
            self.next_checkpoint += 1;
            if cp.count == self.records && cp.head != self.head {
                let detail = format!(
                    "the chain head after record {} is {} but checkpoint line {cp_line} signed {}: the records up to here were replaced or re-chained",
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
                    "the log ends after {} records but a signed checkpoint counts {}: records were cut from the end",
                    self.records,
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
        }
    }
}
