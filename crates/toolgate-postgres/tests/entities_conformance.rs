//! The behaviours every Cedar entities store (`EntitiesStore`) must have, run against an entities
//! file, this process's memory and a real PostgreSQL database, each through two handles (another
//! process on the same file, a clone, another replica): entities set through one handle are in
//! force on the other's next load, a role taken away included; an invalid document changes
//! nothing; the document in force reads back byte for byte. Clearing ("none set": no principal
//! gets anything from it) is for memory and the database; a file refuses it. The database's own
//! failures (its row deleted, an invalid document written by hand, the server down) are the last
//! case: each refuses, naming the fix.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use toolgate_canon::Sha256Digest;
use toolgate_postgres::{PgEntities, PgStore};
use toolgate_state::{EntitiesFile, GuardError};

/// A store, a second handle on it, and whether it can hold "none set".
struct Subject {
    name: &'static str,
    entities: EntitiesFile,
    other: EntitiesFile,
    clears: bool,
    _dir: Option<tempfile::TempDir>,
}

fn connect(url: &str) -> EntitiesFile {
    EntitiesFile::with_store(Arc::new(
        PgEntities::open(PgStore::connect(url).unwrap()).unwrap(),
    ))
}

fn subjects(database: &str) -> Vec<Subject> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("entities.json");
    let memory = EntitiesFile::in_memory();
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database(database)
        .unwrap();
    vec![
        Subject {
            name: "file",
            entities: EntitiesFile::new(&path),
            other: EntitiesFile::new(&path),
            clears: false,
            _dir: Some(dir),
        },
        Subject {
            name: "memory",
            entities: memory.clone(),
            other: memory,
            clears: true,
            _dir: None,
        },
        Subject {
            name: "postgres",
            entities: connect(&url),
            other: connect(&url),
            clears: true,
            _dir: None,
        },
    ]
}

const ALICE_ADMIN: &str = r#"{"version":1,"principals":{"alice":{"roles":["admin","staff"],"attributes":{"dept":"sales"}},"acme/bob":{"roles":["staff"]}}}"#;
const ALICE_STAFF: &str = r#"{"version":1,"principals":{"alice":{"roles":["staff"]}}}"#;

fn roles(entities: &EntitiesFile, principal: &str) -> Vec<String> {
    entities
        .load()
        .unwrap()
        .of(principal)
        .map(|entity| entity.roles.iter().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn entities_set_through_one_handle_are_in_force_on_the_others_next_load() {
    for subject in subjects("entities_set") {
        let name = subject.name;
        let digest = subject.entities.set(Some(ALICE_ADMIN.as_bytes())).unwrap();
        assert_eq!(
            digest,
            Some(Sha256Digest::of(ALICE_ADMIN.as_bytes())),
            "{name}"
        );
        assert_eq!(roles(&subject.other, "alice"), ["admin", "staff"], "{name}");
        let document = subject.other.load().unwrap();
        assert_eq!(
            document.of("alice").unwrap().attributes["dept"],
            "sales",
            "{name}"
        );
        assert_eq!(roles(&subject.other, "acme/bob"), ["staff"], "{name}");
        assert!(document.of("carol").is_none(), "{name}");
        assert_eq!(document.digest(), digest.unwrap(), "{name}");
        assert_eq!(
            subject.other.document().unwrap(),
            Some(ALICE_ADMIN.as_bytes().to_vec()),
            "{name}: the document reads back byte for byte"
        );
        // A role taken away through the other handle is gone on the first handle's next load.
        subject.other.set(Some(ALICE_STAFF.as_bytes())).unwrap();
        for handle in [&subject.entities, &subject.other] {
            assert_eq!(roles(handle, "alice"), ["staff"], "{name}");
            assert!(roles(handle, "acme/bob").is_empty(), "{name}");
        }
    }
}

#[test]
fn an_invalid_document_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let invalid_file = dir.path().join("invalid.json");
    std::fs::write(
        &invalid_file,
        r#"{"version":1,"principals":{"alice":{"groups":["admin"]}}}"#,
    )
    .unwrap();
    for subject in subjects("entities_invalid") {
        let name = subject.name;
        subject.entities.set(Some(ALICE_ADMIN.as_bytes())).unwrap();
        let error = subject
            .entities
            .set(Some(br#"{"version":2,"principals":{}}"#))
            .unwrap_err();
        assert!(
            matches!(&error, GuardError::EntitiesDocumentInvalid { problem } if problem.contains("version 2")),
            "{name}: {error}"
        );
        let error = subject
            .entities
            .set_from_file(Some(&invalid_file))
            .unwrap_err();
        assert!(
            matches!(&error, GuardError::EntitiesInvalid { path, problem } if *path == invalid_file && problem.contains("groups")),
            "{name}: the error names the file and the problem: {error}"
        );
        let missing = dir.path().join("missing.json");
        let error = subject.entities.set_from_file(Some(&missing)).unwrap_err();
        assert!(
            matches!(&error, GuardError::EntitiesUnreadable { path, .. } if *path == missing),
            "{name}: {error}"
        );
        assert_eq!(roles(&subject.other, "alice"), ["admin", "staff"], "{name}");
        assert_eq!(
            subject.other.document().unwrap(),
            Some(ALICE_ADMIN.as_bytes().to_vec()),
            "{name}"
        );
    }
}

#[test]
fn clearing_gives_no_principal_anything_where_a_store_can_hold_none() {
    for subject in subjects("entities_clear") {
        let name = subject.name;
        subject.entities.set(Some(ALICE_ADMIN.as_bytes())).unwrap();
        let cleared = subject.entities.set(None);
        if subject.clears {
            assert_eq!(cleared.unwrap(), None, "{name}");
            assert!(
                subject.other.load().unwrap().of("alice").is_none(),
                "{name}"
            );
            assert_eq!(subject.other.document().unwrap(), None, "{name}");
        } else {
            let error = cleared.unwrap_err().to_string();
            assert!(error.contains("cannot be cleared"), "{name}: {error}");
            assert_eq!(roles(&subject.other, "alice"), ["admin", "staff"], "{name}");
        }
    }
}

/// Entities in a database: none set gives nobody anything; the row deleted by hand or a
/// document made invalid by hand refuses, naming the fix, until a valid one is set again (and
/// no role of the older version survives meanwhile); a database that is down refuses, naming
/// PostgreSQL and not the password.
#[test]
fn database_entities_fail_closed_when_the_row_the_document_or_the_server_is_gone() {
    let cluster = toolgate_pgtest::PgCluster::start().unwrap();
    let url = cluster.create_database("entities").unwrap();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let (a, b) = (connect(&url), connect(&url));
    assert!(a.load().unwrap().of("alice").is_none(), "none set");
    assert_eq!(a.document().unwrap(), None);
    b.set(Some(ALICE_ADMIN.as_bytes())).unwrap();
    assert_eq!(roles(&a, "alice"), ["admin", "staff"]);

    cluster
        .psql(
            &db,
            "UPDATE toolgate_entities SET version = version + 1, document = '\\x7b'::bytea",
        )
        .unwrap();
    let error = a.load().unwrap_err();
    assert!(matches!(error, GuardError::Backend(_)), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("entities document in the database is invalid")
            && text.contains("entities set"),
        "{text}"
    );

    cluster.psql(&db, "DELETE FROM toolgate_entities").unwrap();
    let text = a.load().unwrap_err().to_string();
    assert!(
        text.contains("row is missing") && text.contains("entities set"),
        "{text}"
    );
    assert!(a.document().is_err());
    b.set(Some(ALICE_STAFF.as_bytes())).unwrap();
    assert_eq!(roles(&a, "alice"), ["staff"]);

    cluster.stop_immediate().unwrap();
    let error = b.load().unwrap_err().to_string();
    assert!(error.contains("PostgreSQL"), "{error}");
    assert!(!error.contains(toolgate_pgtest::PASSWORD), "{error}");
}
