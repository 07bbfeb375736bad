//! The verifier: walks a log line by line and reports the first place where the chain breaks.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use toolgate_canon::Sha256Digest;

use crate::AuditError;
use crate::record::{MAX_LINE_BYTES, check_line};

/// The result of verifying a log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// How many lines were verified good before the problem (all lines when there is none).
    pub records: u64,
    /// The `sha256` of the last good line (`"0" * 64` when there is none).
    pub head: Sha256Digest,
    /// The first problem found, if any.
    pub problem: Option<Problem>,
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
            None => write!(f, "intact: {} records, head {}", self.records, self.head),
            Some(problem) => write!(
                f,
                "{problem} ({} records verified before it, head {})",
                self.records, self.head
            ),
        }
    }
}

/// Where and how the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The 1-based line number.
    pub line: u64,
    /// The kind of damage.
    pub kind: ProblemKind,
    /// A human-readable explanation (the text after the kind in [`fmt::Display`]).
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
    /// The `sha256` field does not match the hash recomputed from the record: a field was edited.
    Modified,
    /// `prev_sha256` does not match the previous line's `sha256`: a line was deleted, inserted or
    /// moved.
    LinkBroken,
    /// The line is not byte-identical to the canonical JSON of its content (whitespace, key order,
    /// escapes, floats).
    NotCanonical,
    /// Not a JSON object, or `prev_sha256`/`sha256` missing or not 64 lowercase hex characters.
    Malformed,
    /// The file's last bytes are not terminated by `\n`: a write was interrupted.
    TornTail,
}

impl ProblemKind {
    /// The stable name used in reports and scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Modified => "modified",
            ProblemKind::LinkBroken => "link_broken",
            ProblemKind::NotCanonical => "not_canonical",
            ProblemKind::Malformed => "malformed",
            ProblemKind::TornTail => "torn_tail",
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Verifies the log at `path`. `Err` only when the file cannot be read; damage is in the report.
pub fn verify_file(path: &Path) -> Result<VerifyReport, AuditError> {
    let file = File::open(path).map_err(|source| AuditError::Io {
        action: "open for verification",
        path: path.to_path_buf(),
        source,
    })?;
    verify_reader(file).map_err(|e| match e {
        AuditError::Read { source } => AuditError::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        },
        other => other,
    })
}

/// Verifies a log read from `reader`. `Err` only when reading fails; damage is in the report.
///
/// Memory use is bounded by [`MAX_LINE_BYTES`]: a longer line is reported as malformed rather than
/// buffered.
pub fn verify_reader<R: Read>(reader: R) -> Result<VerifyReport, AuditError> {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    let mut records = 0u64;
    let mut head = Sha256Digest::ZERO;
    let limit = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX);
    let report = |records, head, line, kind, detail: String| VerifyReport {
        records,
        head,
        problem: Some(Problem { line, kind, detail }),
    };
    loop {
        buf.clear();
        let read = (&mut reader)
            .take(limit.saturating_add(1))
            .read_until(b'\n', &mut buf)
            .map_err(|source| AuditError::Read { source })?;
        if read == 0 {
            return Ok(VerifyReport {
                records,
                head,
                problem: None,
            });
        }
        line_no += 1;
        if buf.last() != Some(&b'\n') {
            // take() stopped us either at the limit or at the end of the input.
            if buf.len() > MAX_LINE_BYTES {
                let detail = format!("line is longer than {MAX_LINE_BYTES} bytes");
                return Ok(report(
                    records,
                    head,
                    line_no,
                    ProblemKind::Malformed,
                    detail,
                ));
            }
            let detail = format!(
                "the file ends with {} bytes not terminated by a newline (an interrupted write)",
                buf.len()
            );
            return Ok(report(
                records,
                head,
                line_no,
                ProblemKind::TornTail,
                detail,
            ));
        }
        buf.pop();
        let link = match check_line(&buf) {
            Ok(link) => link,
            Err(fault) => return Ok(report(records, head, line_no, fault.kind, fault.detail)),
        };
        if link.prev != head {
            let detail = if line_no == 1 {
                "prev_sha256 of the first line is not 64 zeros".to_owned()
            } else {
                format!(
                    "prev_sha256 does not match the sha256 of line {}",
                    line_no - 1
                )
            };
            return Ok(report(
                records,
                head,
                line_no,
                ProblemKind::LinkBroken,
                detail,
            ));
        }
        head = link.sha256;
        records += 1;
    }
}
