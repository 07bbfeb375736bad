//! The operational signal of an audit log (`toolgate-server audit stats`, or any server's own). Counts per tool x decision x outcome,
//! and the committed / replay / deny / failure ratios: a rise in replays points to retries,
//! crashes or timeouts; a rise in denials to a bad prompt, a stale catalog or an improper attempt.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

/// Counts over the tool-call records of one log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LogStats {
    /// (tool, decision, outcome) -> records.
    pub counts: BTreeMap<(String, String, String), u64>,
    /// All tool-call records.
    pub calls: u64,
    /// Allowed calls that committed an effect.
    pub committed: u64,
    /// Allowed calls answered by replaying an earlier effect.
    pub replay: u64,
    /// Denied calls (hidden tools, unknown tools, refused arguments).
    pub deny: u64,
    /// Allowed calls that failed (see [`crate::Outcome::is_failure`]).
    pub failure: u64,
    /// Records that are not tool calls (repairs).
    pub other_records: u64,
}

impl LogStats {
    /// Counts the records of the log at `log_path` (rotated segments included).
    pub fn of_log(log_path: &Path) -> Result<Self, crate::AuditError> {
        let mut stats = LogStats::default();
        for record in crate::read_records(log_path)? {
            stats.add(&record?);
        }
        Ok(stats)
    }

    /// Counts the records of `sink`'s chain as it exports them (a database's chain, for
    /// `audit stats --store`), one line at a time: the chain is never held in memory whole.
    pub fn of_sink(sink: &dyn crate::AuditSink) -> Result<Self, crate::AuditError> {
        let mut lines = StatsLines {
            stats: LogStats::default(),
            line: Vec::new(),
        };
        sink.export(&mut lines)?;
        // Export ends every record with `\n`; a last line without one is counted all the same.
        lines.count_line();
        Ok(lines.stats)
    }

    fn add(&mut self, record: &Value) {
        let text = |key: &str| record[key].as_str().unwrap_or("?").to_owned();
        if record["method"] != "tools/call" {
            self.other_records += 1;
            return;
        }
        let (name, decision, outcome) = (text("name"), text("decision"), text("outcome"));
        self.calls += 1;
        match (decision.as_str(), outcome.as_str()) {
            ("deny", _) => self.deny += 1,
            (_, "committed") => self.committed += 1,
            (_, "replay") => self.replay += 1,
            (_, o) if crate::Outcome::parse(o).is_some_and(|o| o.is_failure()) => {
                self.failure += 1;
            }
            _ => {}
        }
        *self.counts.entry((name, decision, outcome)).or_default() += 1;
    }

    fn ratio(&self, n: u64) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            // Record counts stay far below 2^52, so the conversion is exact.
            n as f64 / self.calls as f64
        }
    }

    /// A table for people.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<24} {:<8} {:<18} {:>8}",
            "tool", "decision", "outcome", "records"
        );
        for ((tool, decision, outcome), n) in &self.counts {
            let _ = writeln!(out, "{tool:<24} {decision:<8} {outcome:<18} {n:>8}");
        }
        let _ = writeln!(out, "tool calls: {}", self.calls);
        for (label, n) in [
            ("committed", self.committed),
            ("replay", self.replay),
            ("deny", self.deny),
            ("failure", self.failure),
        ] {
            let _ = writeln!(out, "{label:<10} {n:>8}  {:>6.1}%", 100.0 * self.ratio(n));
        }
        for (tool, counters) in self.idempotency() {
            let list: Vec<String> = counters.iter().map(|(k, n)| format!("{k}={n}")).collect();
            let _ = writeln!(out, "exactly-once {tool}: {}", list.join(" "));
        }
        if self.other_records > 0 {
            let _ = writeln!(out, "other records (repairs): {}", self.other_records);
        }
        out
    }

    /// Exactly-once counters per tool (committed, replayed, conflict, in_progress,
    /// indeterminate, failed), from the outcomes of allowed calls.
    pub fn idempotency(&self) -> BTreeMap<String, BTreeMap<&'static str, u64>> {
        let mut out: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
        for ((tool, decision, outcome), n) in &self.counts {
            let counter = match outcome.as_str() {
                "committed" => "committed",
                "replay" => "replayed",
                "conflict" => "conflict",
                "in_progress" => "in_progress",
                "indeterminate" => "indeterminate",
                "failed" => "failed",
                _ => continue,
            };
            if decision != "allow" {
                continue;
            }
            *out.entry(tool.clone())
                .or_default()
                .entry(counter)
                .or_default() += n;
        }
        out
    }

    /// One JSON object for machines.
    pub fn render_json(&self) -> String {
        let counts: Vec<Value> = self
            .counts
            .iter()
            .map(|((tool, decision, outcome), n)| {
                json!({"tool": tool, "decision": decision, "outcome": outcome, "records": n})
            })
            .collect();
        json!({
            "calls": self.calls,
            "counts": counts,
            "totals": {"committed": self.committed, "replay": self.replay, "deny": self.deny, "failure": self.failure},
            "ratios": {
                "committed": self.ratio(self.committed),
                "replay": self.ratio(self.replay),
                "deny": self.ratio(self.deny),
                "failure": self.ratio(self.failure),
            },
            "other_records": self.other_records,
            "idempotency": self.idempotency(),
        })
        .to_string()
    }
}

/// The `Write` end [`LogStats::of_sink`] gives an export: it counts each record as its line ends.
struct StatsLines {
    stats: LogStats,
    line: Vec<u8>,
}

impl StatsLines {
    fn count_line(&mut self) {
        if !self.line.is_empty() {
            // A line that is not JSON counts as a record of an unknown kind: the chain's
            // integrity is `audit verify`'s business, not the counts'.
            let record = serde_json::from_slice(&self.line).unwrap_or(Value::Null);
            self.stats.add(&record);
            self.line.clear();
        }
    }
}

impl std::io::Write for StatsLines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut rest = bytes;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&rest[..end]);
            self.count_line();
            rest = &rest[end + 1..];
        }
        self.line.extend_from_slice(rest);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_is_counted_as_its_export() {
        use crate::{AuditDecision, AuditEntry, AuditSink as _, MemoryAuditLog, Outcome};
        let sink = MemoryAuditLog::new();
        for (decision, outcome) in [
            (AuditDecision::Allow, Outcome::Committed),
            (AuditDecision::Allow, Outcome::Replay),
            (AuditDecision::Deny, Outcome::NotExecuted),
        ] {
            let digest = toolgate_canon::Sha256Digest::of(b"{}");
            sink.append(&AuditEntry::tool_call("r", "t", decision, outcome, digest))
                .unwrap();
        }
        let stats = LogStats::of_sink(&sink).unwrap();
        assert_eq!(
            (stats.calls, stats.committed, stats.replay, stats.deny),
            (3, 1, 1, 1)
        );
    }

    #[test]
    fn counts_and_ratios() {
        let mut stats = LogStats::default();
        for (name, decision, outcome) in [
            ("write_note", "allow", "committed"),
            ("write_note", "allow", "replay"),
            ("rm_rf", "deny", "not_executed"),
            ("write_note", "allow", "failed"),
        ] {
            stats.add(&json!({"method": "tools/call", "name": name, "decision": decision, "outcome": outcome}));
        }
        stats.add(&json!({"method": "audit/recover", "name": "audit"}));
        assert_eq!(
            (
                stats.calls,
                stats.committed,
                stats.replay,
                stats.deny,
                stats.failure
            ),
            (4, 1, 1, 1, 1)
        );
        assert_eq!(stats.other_records, 1);
        let exactly_once = stats.idempotency();
        assert_eq!(exactly_once["write_note"]["committed"], 1);
        assert_eq!(exactly_once["write_note"]["replayed"], 1);
        let machine: Value = serde_json::from_str(&stats.render_json()).unwrap();
        assert_eq!(machine["totals"]["committed"], 1);
        assert!(stats.render_text().contains("committed"));
    }
}
