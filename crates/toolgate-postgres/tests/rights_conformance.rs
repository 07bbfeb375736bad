//! The behaviours every rights store (`RightsStore`) must have, run against a rights file, this
//! process's memory and a real PostgreSQL database, each through two handles (another process on
//! the same file, a clone, another replica): rights set through one handle are in force on the
//! other's next call, a revocation included; an invalid document changes nothing; the document
//! in force reads back byte for byte. Clearing ("none set": only the policy decides) is for
//! memory and the database; a file refuses it (a missing file refuses every call). What only
//! the file does (its caching and freshness rule, its strict reading) is tested beside it; the
//! database's own failures (its row deleted, the server down) are the last case.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use toolgate_canon::Sha256Digest;
use toolgate_postgres::{PgRights, PgStore};
use toolgate_state::{GuardError, RightsFile};

/// A store, a second handle on it, and whether it can hold "none set".
struct Subject {
    name: &'static str,
    rights: RightsFile,
    other: RightsFile,
    clears: bool,
    _dir: Option<tempfile::TempDir>,
}

fn subjects(database: &str) -> Vec<Subject> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rights.json");
    let memory = RightsFile::in_memory();
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database(database)
        .unwrap();
    let connect = || {
        RightsFile::with_store(Arc::new(
            PgRights::open(PgStore::connect(&url).unwrap()).unwrap(),
        ))
    };
    vec![
        Subject {
            name: "file",
            rights: RightsFile::new(&path),
            other: RightsFile::new(&path),
            clears: false,
            _dir: Some(dir),
        },
        Subject {
            name: "memory",
            rights: memory.clone(),
            other: memory,
            clears: true,
            _dir: None,
        },
        Subject {
            name: "postgres",
            rights: connect(),
            other: connect(),
            clears: true,
            _dir: None,
        },
    ]
}

const ALICE_WRITES: &str =
    r#"{"version":1,"principals":{"alice":{"tools":["write_note"]},"bob":{"tools":["*"]}}}"#;
const ALICE_READS: &str = r#"{"version":1,"principals":{"alice":{"tools":["read_ledger"]}}}"#;

#[test]
fn rights_set_through_one_handle_are_in_force_on_the_others_next_call() {
    for subject in subjects("rights_set") {
        let name = subject.name;
        let digest = subject.rights.set(Some(ALICE_WRITES.as_bytes())).unwrap();
        assert_eq!(
            digest,
            Some(Sha256Digest::of(ALICE_WRITES.as_bytes())),
            "{name}"
        );
        let alice = subject.other.rights("alice").unwrap();
        assert!(
            alice.allows("write_note") && !alice.allows("rm_rf"),
            "{name}"
        );
        assert_eq!(alice.file_digest(), digest.unwrap(), "{name}");
        assert!(subject.other.rights("bob").unwrap().allows_all(), "{name}");
        assert!(subject.other.rights("carol").unwrap().is_empty(), "{name}");
        assert_eq!(subject.other.digest().unwrap(), digest.unwrap(), "{name}");
        assert_eq!(
            subject.other.document().unwrap(),
            Some(ALICE_WRITES.as_bytes().to_vec()),
            "{name}: the document reads back byte for byte"
        );
    }
}

#[test]
fn a_revocation_applies_to_every_handles_next_call() {
    for subject in subjects("rights_revoke") {
        let name = subject.name;
        subject.rights.set(Some(ALICE_WRITES.as_bytes())).unwrap();
        assert!(
            subject.other.rights("alice").unwrap().allows("write_note"),
            "{name}"
        );
        subject.other.set(Some(ALICE_READS.as_bytes())).unwrap();
        for handle in [&subject.rights, &subject.other] {
            let alice = handle.rights("alice").unwrap();
            assert!(
                !alice.allows("write_note") && alice.allows("read_ledger"),
                "{name}"
            );
            assert!(
                handle.rights("bob").unwrap().is_empty(),
                "{name}: bob lost `*`"
            );
        }
    }
}

#[test]
fn an_invalid_document_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let invalid_file = dir.path().join("invalid.json");
    std::fs::write(
        &invalid_file,
        r#"{"version":1,"principals":{"alice":{"tool":[]}}}"#,
    )
    .unwrap();
    for subject in subjects("rights_invalid") {
        let name = subject.name;
        subject.rights.set(Some(ALICE_WRITES.as_bytes())).unwrap();
        let error = subject.rights.set(Some(b"{\"version\":2}")).unwrap_err();
        assert!(
            matches!(&error, GuardError::RightsDocumentInvalid { problem } if problem.contains("version")),
            "{name}: {error}"
        );
        let error = subject
            .rights
            .set_from_file(Some(&invalid_file))
            .unwrap_err();
        assert!(
            matches!(&error, GuardError::RightsInvalid { path, .. } if *path == invalid_file),
            "{name}: the error names the file: {error}"
        );
        assert!(
            subject.other.rights("alice").unwrap().allows("write_note"),
            "{name}"
        );
        assert_eq!(
            subject.other.document().unwrap(),
            Some(ALICE_WRITES.as_bytes().to_vec()),
            "{name}"
        );
    }
}

#[test]
fn clearing_leaves_the_policy_alone_to_decide_where_a_store_can_hold_none() {
    for subject in subjects("rights_clear") {
        let name = subject.name;
        subject.rights.set(Some(ALICE_WRITES.as_bytes())).unwrap();
        let cleared = subject.rights.set(None);
        if subject.clears {
            assert_eq!(cleared.unwrap(), None, "{name}");
            assert!(subject.other.rights("zed").unwrap().allows_all(), "{name}");
            assert_eq!(subject.other.document().unwrap(), None, "{name}");
        } else {
            let error = cleared.unwrap_err().to_string();
            assert!(error.contains("cannot be cleared"), "{name}: {error}");
            assert!(
                subject.other.rights("alice").unwrap().allows("write_note"),
                "{name}"
            );
            assert!(subject.other.rights("zed").unwrap().is_empty(), "{name}");
        }
    }
}

/// Rights in a database: none set grants everything the policy allows; the row deleted by hand
/// refuses every call naming the fix, until rights are set again; a database that is down
/// refuses, naming PostgreSQL and not the password.
#[test]
fn database_rights_fail_closed_when_the_row_or_the_server_is_gone() {
    let cluster = toolgate_pgtest::PgCluster::start().unwrap();
    let url = cluster.create_database("rights").unwrap();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let connect = || {
        RightsFile::with_store(Arc::new(
            PgRights::open(PgStore::connect(&url).unwrap()).unwrap(),
        ))
    };
    let (a, b) = (connect(), connect());
    assert!(a.rights("alice").unwrap().allows_all(), "none set");
    assert_eq!(a.document().unwrap(), None);

    cluster.psql(&db, "DELETE FROM toolgate_rights").unwrap();
    let error = a.rights("alice").unwrap_err();
    assert!(matches!(error, GuardError::Backend(_)), "{error}");
    assert!(error.to_string().contains("rights set"), "{error}");
    b.set(Some(ALICE_WRITES.as_bytes())).unwrap();
    assert!(a.rights("alice").unwrap().allows("write_note"));

    cluster.stop_immediate().unwrap();
    let error = b.rights("alice").unwrap_err().to_string();
    assert!(error.contains("PostgreSQL"), "{error}");
    assert!(!error.contains(toolgate_pgtest::PASSWORD), "{error}");
}
