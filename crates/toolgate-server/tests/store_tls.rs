//! `--store` over TLS: real `toolgate-server` processes against real PostgreSQL clusters started
//! with `ssl=on` and a server certificate from a CA this test makes at run time. The clusters
//! accept TCP connections over TLS only, so a server that went without TLS is refused, not served.
//!
//! What a refusal must look like (an attacker in the middle, a misissued certificate): the server
//! exits non-zero before reading a message, with one line naming `sslmode` and the CA or the host,
//! never the password; the database has no toolgate table and the ledger no audit log afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Server, TestEnv, note_status, output_text};
use toolgate_pgtest::{PASSWORD, PgCluster, ServerCert, TestCa};

/// A TLS cluster serving `cert`, with the CAs' certificates written beside it.
struct Tls {
    cluster: PgCluster,
    env: TestEnv,
}

impl Tls {
    fn start(cert: &ServerCert) -> Tls {
        Tls {
            cluster: PgCluster::start_tls(cert).unwrap(),
            env: TestEnv::new(),
        }
    }

    /// Writes `ca`'s certificate as `name` and returns its path.
    fn root(&self, name: &str, ca: &TestCa) -> String {
        let path = self.env.path(name);
        std::fs::write(&path, ca.cert_pem()).unwrap();
        path.display().to_string()
    }

    /// A fresh database, as `(its name, its URL with host `host` and the query `params`)`.
    fn database(&self, host: &str, params: &str) -> (String, String) {
        let url = self.cluster.create_database("tls").unwrap();
        let name = url.rsplit('/').next().unwrap().to_owned();
        let url = url.replace("@127.0.0.1:", &format!("@{host}:"));
        let url = if params.is_empty() {
            url
        } else {
            format!("{url}?{params}")
        };
        (name, url)
    }

    /// Starts the server on `url`, writes a note and stops it: the store works over TLS.
    fn assert_serves(&self, url: &str) {
        let stderr = self.env.path(&format!("serve-{}.stderr", rand_suffix()));
        let mut server = Server::spawn(self.env.store_command(url), &stderr);
        server.discover();
        let reply = server.write_note(&format!("tls-note-{}", rand_suffix()), "over TLS");
        assert_eq!(note_status(&reply), "committed", "{reply}");
        assert!(server.close().success(), "{}", server.stderr());
    }

    /// Starts the server on `url` and asserts that it refuses to start with one line holding
    /// every one of `expected`, and that nothing reached database `db` or the ledger.
    fn assert_refused(&self, db: &str, url: &str, expected: &[&str]) {
        let output = common::run_to_end(self.env.store_command(url));
        let text = output_text(&output);
        assert!(!output.status.success(), "{url} was served: {text}");
        assert!(output.stdout.is_empty(), "{text}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr}");
        for part in expected {
            assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
        }
        assert!(
            !stderr.contains(PASSWORD),
            "the password is shown: {stderr}"
        );
        let tables = self
            .cluster
            .psql(
                db,
                "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
            )
            .unwrap();
        assert_eq!(tables, "0", "tables were created in {db}");
        assert!(!self.env.audit_path().exists(), "an audit log was written");
    }
}

/// A suffix no other note or file of this process has.
fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn verify_full_with_the_right_ca_serves_and_a_wrong_ca_is_refused() {
    let ca = TestCa::new("toolgate test CA").unwrap();
    let other = TestCa::new("some other CA").unwrap();
    let tls = Tls::start(&ca.issue(&["127.0.0.1", "db.example"]).unwrap());
    let right = tls.root("ca.pem", &ca);
    let wrong = tls.root("other-ca.pem", &other);

    let (_, url) = tls.database(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={right}"),
    );
    tls.assert_serves(&url);
    // A host that is not loopback gets verify-full without asking (hostaddr keeps the test on
    // loopback while the name checked is db.example).
    let (_, url) = tls.database(
        "db.example",
        &format!("hostaddr=127.0.0.1&sslrootcert={right}"),
    );
    tls.assert_serves(&url);

    for params in [
        format!("sslmode=verify-full&sslrootcert={wrong}"),
        format!("sslmode=verify-ca&sslrootcert={wrong}"),
        format!("sslmode=require&sslrootcert={wrong}"),
    ] {
        let (db, url) = tls.database("127.0.0.1", &params);
        let mode = params.split('&').next().unwrap();
        tls.assert_refused(&db, &url, &[mode, "not signed by a CA", &wrong]);
    }
    let (db, url) = tls.database(
        "db.example",
        &format!("hostaddr=127.0.0.1&sslrootcert={wrong}"),
    );
    tls.assert_refused(
        &db,
        &url,
        &["sslmode=verify-full", "not signed by a CA", &wrong],
    );
    // No sslrootcert: the operating system's roots, which do not hold the test CA.
    let (db, url) = tls.database("db.example", "hostaddr=127.0.0.1");
    tls.assert_refused(
        &db,
        &url,
        &[
            "sslmode=verify-full",
            "the operating system's root certificates",
        ],
    );

    // require without sslrootcert encrypts but does not authenticate: any certificate passes.
    let (_, url) = tls.database("127.0.0.1", "sslmode=require");
    tls.assert_serves(&url);
    // A loopback host without sslmode or sslrootcert stays unencrypted, which this cluster
    // refuses (its pg_hba.conf has hostssl lines only).
    let (_, url) = tls.database("127.0.0.1", "");
    let output = common::run_to_end(tls.env.store_command(&url));
    assert!(!output.status.success(), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("no encryption"),
        "{}",
        output_text(&output)
    );
    assert!(!output_text(&output).contains(PASSWORD));
}

#[test]
fn a_certificate_for_another_host_is_refused_under_verify_full_only() {
    let ca = TestCa::new("toolgate test CA").unwrap();
    let tls = Tls::start(&ca.issue(&["db.example"]).unwrap());
    let root = tls.root("ca.pem", &ca);

    for host in ["127.0.0.1", "localhost"] {
        let (db, url) = tls.database(host, &format!("sslmode=verify-full&sslrootcert={root}"));
        tls.assert_refused(
            &db,
            &url,
            &[
                "sslmode=verify-full",
                &format!("not issued for the host {host}"),
            ],
        );
    }
    // The default off loopback is verify-full: a name the certificate does not hold is refused.
    let (db, url) = tls.database(
        "other.example",
        &format!("hostaddr=127.0.0.1&sslrootcert={root}"),
    );
    tls.assert_refused(
        &db,
        &url,
        &[
            "sslmode=verify-full",
            "not issued for the host other.example",
        ],
    );
    // verify-ca checks the chain, not the name.
    let (_, url) = tls.database(
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={root}"),
    );
    tls.assert_serves(&url);
}

#[test]
fn a_server_without_tls_is_refused_when_tls_is_asked_for() {
    let cluster = PgCluster::shared().unwrap();
    let env = TestEnv::new();
    let url = cluster.create_database("notls").unwrap();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let output = common::run_to_end(env.store_command(&format!("{url}?sslmode=require")));
    let text = output_text(&output);
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("sslmode=require"), "{text}");
    assert!(text.contains("does not offer TLS"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
    let tables = cluster
        .psql(
            &db,
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public'",
        )
        .unwrap();
    assert_eq!(tables, "0");
}

#[test]
fn weak_or_contradictory_tls_options_stop_the_server_naming_the_option() {
    let cluster = PgCluster::shared().unwrap();
    let env = TestEnv::new();
    let url = cluster.create_database("tlsopts").unwrap();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let missing = env.path("no-such-ca.pem").display().to_string();
    for (params, expected) in [
        (
            "sslmode=prefer",
            "sslmode=prefer falls back to an unencrypted connection",
        ),
        (
            "sslmode=allow",
            "sslmode=allow falls back to an unencrypted connection",
        ),
        ("sslmode=verify_full", "sslmode must be one of"),
        (
            &*format!("sslmode=verify-full&sslrootcert={missing}"),
            &*format!("sslrootcert={missing}"),
        ),
        (
            &*format!("sslmode=disable&sslrootcert={missing}"),
            "sslmode=disable turns TLS off",
        ),
    ] {
        let output = common::run_to_end(env.store_command(&format!("{url}?{params}")));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{params}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(expected), "{params}: {stderr}");
        assert!(!stderr.contains(PASSWORD), "{stderr}");
    }
    let tables = cluster
        .psql(
            &db,
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public'",
        )
        .unwrap();
    assert_eq!(tables, "0");
    assert!(!env.audit_path().exists());
}
