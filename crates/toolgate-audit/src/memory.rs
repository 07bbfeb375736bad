//! An in-memory chained log: the same records, chain and line format as the file log, kept in a
//! buffer instead of a file.

use std::sync::{Mutex, MutexGuard, PoisonError};

use toolgate_canon::Sha256Digest;

use crate::file::now_ns;
use crate::record::{MAX_LINE_BYTES, seal};
use crate::{AppendReceipt, AuditEntry, AuditError, AuditSink, ChainHead};

/// A hash-chained audit log held in memory: every `append` seals the record exactly as
/// [`crate::FileAuditLog`] does (RFC 8785 line, `seq`, `prev_sha256`, `sha256`) and keeps the line,
/// so [`MemoryAuditLog::bytes`] is a log that [`crate::verify_reader`] accepts.
///
/// **Not durable**: the records are lost with the process. It exists for tests, benchmarks and
/// embedders that ship the lines elsewhere themselves. It never blocks on I/O
/// ([`AuditSink::may_block`] is `false`), so async callers append from their own task.
#[derive(Debug, Default)]
pub struct MemoryAuditLog {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    seq: u64,
    head: Sha256Digest,
    bytes: Vec<u8>,
}

impl Default for State {
    fn default() -> Self {
        State {
            seq: 0,
            head: Sha256Digest::ZERO,
            bytes: Vec::new(),
        }
    }
}

impl MemoryAuditLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every line appended so far, each followed by `\n`.
    pub fn bytes(&self) -> Vec<u8> {
        self.state().bytes.clone()
    }

    /// How many records were appended.
    pub fn records(&self) -> u64 {
        self.state().seq
    }

    /// The `sha256` of the last record (all zeros when empty).
    pub fn head(&self) -> Sha256Digest {
        self.state().head
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every field is updated only after sealing succeeded, so a poisoned state is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl AuditSink for MemoryAuditLog {
    fn append(&self, entry: &AuditEntry) -> Result<AppendReceipt, AuditError> {
        let mut state = self.state();
        let ts = now_ns();
        let sealed = seal(entry, Vec::new(), ts, state.seq + 1, state.head);
        if sealed.line.len() > MAX_LINE_BYTES {
            return Err(AuditError::RecordTooLarge {
                len: sealed.line.len(),
                max: MAX_LINE_BYTES,
            });
        }
        state.seq += 1;
        state.head = sealed.sha256;
        state.bytes.extend_from_slice(&sealed.line);
        Ok(AppendReceipt {
            seq: state.seq,
            sha256: sealed.sha256,
            ts,
        })
    }

    fn may_block(&self) -> bool {
        false
    }

    fn head(&self) -> Result<ChainHead, AuditError> {
        let state = self.state();
        Ok(ChainHead {
            seq: state.seq,
            sha256: state.head,
        })
    }

    fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        let state = self.state();
        out.write_all(&state.bytes)
            .map_err(|source| AuditError::Export { source })?;
        Ok(state.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AuditDecision, verify_reader};

    #[test]
    fn memory_log_is_a_verifiable_chain() {
        let log = MemoryAuditLog::new();
        assert!(!log.may_block());
        let mut last = None;
        for i in 0..3 {
            let entry = AuditEntry::tool_call(
                format!("r-{i}"),
                "echo",
                AuditDecision::Allow,
                crate::Outcome::Committed,
                Sha256Digest::of(b"{}"),
            );
            let receipt = log.append(&entry).unwrap();
            assert_eq!(receipt.seq, i + 1);
            last = Some(receipt);
        }
        let report = verify_reader(log.bytes().as_slice()).unwrap();
        assert!(report.is_intact(), "{report}");
        assert_eq!(report.records, 3);
        assert_eq!(report.head, last.unwrap().sha256);
        assert_eq!(log.head(), report.head);
        assert_eq!(log.records(), 3);
        let too_big = AuditEntry::tool_call(
            "r",
            "echo",
            AuditDecision::Allow,
            crate::Outcome::Committed,
            Sha256Digest::ZERO,
        )
        .with_reason(crate::Reason::Note("x".repeat(MAX_LINE_BYTES)));
        // An oversized field is recorded as its digest and length: the decision is still audited.
        log.append(&too_big).unwrap();
        assert_eq!(log.records(), 4);
        let bytes = log.bytes();
        let last_line = bytes.split(|&b| b == b'\n').rev().nth(1).unwrap();
        assert!(last_line.len() < 1024, "{}", last_line.len());
        assert!(verify_reader(bytes.as_slice()).unwrap().is_intact());
    }
}
