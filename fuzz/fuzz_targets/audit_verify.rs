//! Audit log verification on arbitrary bytes. The input is a log, optionally followed by the
//! separator `\n--checkpoints--\n` and the content of its checkpoint file. Properties: the
//! verifiers never panic and never fail on readable input; the good prefix they report is itself
//! an intact log with the same head; an intact log's head is the `sha256` of its last line; the
//! file verifier agrees with the reader verifier when no key is given, and a key (checkpoints)
//! can only lower the count of good records; `read_records` terminates and yields at most one
//! item per line.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use toolgate_audit::{
    HmacKey, Sha256Digest, VerifyOptions, VerifyReport, read_records, verify, verify_reader,
};

const SEPARATOR: &[u8] = b"\n--checkpoints--\n";
const KEY: &[u8] = include_bytes!("../../fixtures/audit/TEST-ONLY-checkpoint.key");

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Memory-backed when available: the target writes two files per input.
        let shm = std::path::Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("toolgate-fuzz-audit");
        let dir = if shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        }
        .expect("a temporary directory");
        dir.keep()
    })
}

fn key() -> &'static HmacKey {
    static KEY_: OnceLock<HmacKey> = OnceLock::new();
    KEY_.get_or_init(|| HmacKey::from_file_bytes(KEY.to_vec()).expect("the test key loads"))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn check_report(log: &[u8], report: &VerifyReport) {
    let lines: Vec<&[u8]> = log.split_inclusive(|&b| b == b'\n').collect();
    let complete = lines.iter().filter(|l| l.ends_with(b"\n")).count() as u64;
    assert!(report.records <= complete, "more good records than lines");
    if let Some(problem) = &report.problem {
        assert!(problem.line >= 1, "problem at line 0");
    }
    // The good prefix verifies on its own, to the same head.
    let good = usize::try_from(report.records).expect("fits");
    let prefix: Vec<u8> = lines[..good].concat();
    let again = verify_reader(prefix.as_slice()).expect("reading a slice cannot fail");
    assert!(
        again.is_intact(),
        "the good prefix does not verify: {again}"
    );
    assert_eq!(again.records, report.records);
    assert_eq!(again.head, report.head);
    if report.records == 0 {
        assert_eq!(report.head, Sha256Digest::ZERO);
    } else {
        let last = lines[good - 1];
        let value: serde_json::Value =
            serde_json::from_slice(&last[..last.len() - 1]).expect("a good line is JSON");
        let stated = value["sha256"].as_str().expect("a good line has sha256");
        assert_eq!(stated, report.head.to_hex());
    }
}

fuzz_target!(|data: &[u8]| {
    let (log, checkpoints) = match find(data, SEPARATOR) {
        Some(at) => (&data[..=at], Some(&data[at + SEPARATOR.len()..])),
        None => (data, None),
    };
    let report = verify_reader(log).expect("reading a slice cannot fail");
    let _ = report.to_string();
    check_report(log, &report);

    let dir = dir();
    let log_path = dir.join("audit.jsonl");
    let cp_path = dir.join("audit.checkpoints.jsonl");
    std::fs::write(&log_path, log).expect("write the log");
    match checkpoints {
        Some(cps) => std::fs::write(&cp_path, cps).expect("write the checkpoints"),
        None => match std::fs::remove_file(&cp_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot remove the checkpoints: {e}"),
        },
    }
    let options = VerifyOptions::new(&log_path).checkpoints_path(&cp_path);
    let plain = verify(&options).expect("the files are readable");
    assert_eq!(plain.records, report.records);
    assert_eq!(plain.head, report.head);
    assert_eq!(
        plain.problem.as_ref().map(|p| (p.line, p.kind)),
        report.problem.as_ref().map(|p| (p.line, p.kind))
    );
    let keyed = verify(&options.checkpoint_key(key().clone())).expect("the files are readable");
    let _ = keyed.to_string();
    assert!(keyed.records <= plain.records);

    let lines = log.split(|&b| b == b'\n').count();
    let items = read_records(&log_path).expect("the log exists").count();
    assert!(items <= lines, "{items} records from {lines} lines");
});
