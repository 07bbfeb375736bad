//! A real PostgreSQL cluster for tests and benchmarks, started from the machine's own binaries.
//!
//! [`PgCluster::start`] runs `initdb` into a fresh temporary directory and starts the server on a
//! free loopback port (and a Unix socket in that directory), with `fsync` and
//! `synchronous_commit` on, as a deployment would. Dropping the cluster stops it and removes the
//! directory. [`PgCluster::shared`] is one cluster per test process, for suites that only need a
//! fresh database per case ([`PgCluster::create_database`]); a small reaper process stops it when
//! the test process ends, however it ends (a failed test, SIGKILL), so no cluster outlives a run.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (CI does), the server runs as
//! the `postgres` system user (`runuser -u postgres --`), which owns the temporary directory.
//!
//! The binaries are found through `TOOLGATE_PG_BIN` (a directory holding `initdb`, `pg_ctl` and
//! `psql`), then `PATH`, then the newest `/usr/lib/postgresql/*/bin` (Debian's layout). Without
//! them every call returns [`PgTestError::Binaries`], which names the fix: a test needing a
//! database fails, it is never skipped.
//!
//! Connections over TCP authenticate with a password (SCRAM, [`PASSWORD`], in every URL the
//! cluster hands out), so a wrong one is refused as in a deployment; the harness's own `psql`
//! uses the Unix socket in the cluster's directory.
//!
//! TLS: [`PgCluster::start_tls`] starts a cluster with `ssl=on` and a server certificate issued by
//! a [`TestCa`], a certificate authority made at run time (rcgen; no key is ever committed). Its
//! TCP connections must then use TLS (`hostssl` lines only in `pg_hba.conf`), so a client that
//! silently went without TLS is refused rather than served.
//!
//! ```no_run
//! let cluster = toolgate_pgtest::PgCluster::shared().unwrap();
//! let url = cluster.create_database("effects").unwrap();
//! assert!(url.starts_with("postgres://postgres:"));
//! ```

#![forbid(unsafe_code)]

use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// Why a cluster could not be started or driven.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PgTestError {
    /// The PostgreSQL server binaries are not on this machine.
    #[error(
        "PostgreSQL's binaries (initdb, pg_ctl, psql) were not found in $TOOLGATE_PG_BIN, on PATH or under /usr/lib/postgresql/*/bin; install PostgreSQL 15 or later (apt-get install postgresql) or point TOOLGATE_PG_BIN at its bin directory"
    )]
    Binaries,
    /// A command of the cluster's life cycle failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// The step (`initdb`, `pg_ctl start`, `psql ...`).
        what: String,
        /// Its exit status and output, or why it could not run.
        detail: String,
    },
    /// A test certificate could not be made.
    #[error("making a test certificate failed: {detail}")]
    Certificate {
        /// rcgen's message.
        detail: String,
    },
    /// The temporary directory could not be prepared.
    #[error("preparing the cluster's directory {path}: {detail}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The cause.
        detail: String,
    },
}

/// A running PostgreSQL cluster in a temporary directory; stopped and removed on drop.
#[derive(Debug)]
pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Run the server's commands as the `postgres` user (this process is root).
    as_postgres: bool,
    port: u16,
    /// The reaper of the shared cluster: it stops the server when this pipe closes.
    reaper: Mutex<Option<(Child, ChildStdin)>>,
    /// The server runs with `ssl=on` and the certificate in its directory.
    tls: bool,
}

/// A certificate authority made at run time, for TLS tests: it issues server certificates for
/// the names asked for.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A server certificate and its private key, PEM-encoded ([`TestCa::issue`]).
#[derive(Clone)]
pub struct ServerCert {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl std::fmt::Debug for ServerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCert").finish_non_exhaustive()
    }
}

fn certificate_error(e: rcgen::Error) -> PgTestError {
    PgTestError::Certificate {
        detail: e.to_string(),
    }
}

impl TestCa {
    /// A new CA (a self-signed certificate with a fresh key) named `name`.
    pub fn new(name: &str) -> Result<TestCa, PgTestError> {
        let key = rcgen::KeyPair::generate().map_err(certificate_error)?;
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).map_err(certificate_error)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let pem = params.self_signed(&key).map_err(certificate_error)?.pem();
        Ok(TestCa {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        })
    }

    /// The CA's certificate (what a client's `sslrootcert` names).
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed by this CA.
    pub fn issue(&self, names: &[&str]) -> Result<ServerCert, PgTestError> {
        let key = rcgen::KeyPair::generate().map_err(certificate_error)?;
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .map_err(certificate_error)?;
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().copied().unwrap_or("server"),
        );
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(certificate_error)?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The password of the `postgres` user over TCP.
pub const PASSWORD: &str = "toolgate-test-password";

/// Every database name handed out by this process is new: `PREFIX_PID_N`.
static DATABASES: AtomicU32 = AtomicU32::new(0);

impl PgCluster {
    /// Initializes and starts a new cluster of its own.
    pub fn start() -> Result<Self, PgTestError> {
        Self::start_with(None)
    }

    /// Initializes and starts a new cluster of its own with `ssl=on`, serving `cert`; its TCP
    /// connections must use TLS (unencrypted ones are refused by `pg_hba.conf`).
    pub fn start_tls(cert: &ServerCert) -> Result<Self, PgTestError> {
        Self::start_with(Some(cert))
    }

    fn start_with(tls: Option<&ServerCert>) -> Result<Self, PgTestError> {
        let bin = locate()?;
        let as_postgres = std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false);
        let dir = tempfile::Builder::new()
            .prefix("toolgate-pg-")
            .tempdir()
            .map_err(|e| PgTestError::Directory {
                path: std::env::temp_dir(),
                detail: e.to_string(),
            })?;
        if as_postgres {
            let status = Command::new("chown")
                .arg("postgres:")
                .arg(dir.path())
                .status();
            if !matches!(status, Ok(s) if s.success()) {
                return Err(PgTestError::Directory {
                    path: dir.path().to_owned(),
                    detail: format!(
                        "chown to the postgres user failed ({status:?}); PostgreSQL refuses to run as root and needs a `postgres` system user"
                    ),
                });
            }
        }
        let mut cluster = PgCluster {
            dir,
            bin,
            as_postgres,
            port: 0,
            reaper: Mutex::new(None),
            tls: tls.is_some(),
        };
        let data = cluster.data_dir();
        let pwfile = cluster.dir.path().join("pwfile");
        std::fs::write(&pwfile, PASSWORD).map_err(|e| PgTestError::Directory {
            path: pwfile.clone(),
            detail: e.to_string(),
        })?;
        cluster.run(
            "initdb",
            cluster
                .server_command("initdb")
                .arg("-D")
                .arg(&data)
                .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
                .arg(format!("--pwfile={}", pwfile.display()))
                .args(["-U", "postgres", "--no-sync"]),
        )?;
        if let Some(cert) = tls {
            cluster.install_certificate(cert)?;
        }
        // A free port can be taken between asking and binding: try a few.
        let mut last = None;
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.start_server() {
                Ok(()) => return Ok(cluster),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(PgTestError::Binaries))
    }

    /// The cluster this test process shares, started on first use.
    pub fn shared() -> Result<&'static PgCluster, PgTestError> {
        static SHARED: OnceLock<Result<PgCluster, PgTestError>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let cluster = PgCluster::start()?;
                cluster.arm_reaper()?;
                Ok(cluster)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory that holds the cluster (its data directory, log and Unix socket).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The connection URL of database `db` (user `postgres` with [`PASSWORD`], loopback).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/{db}",
            self.port
        )
    }

    /// Creates a new, empty database named after `prefix` (made unique in this process) and
    /// returns its URL.
    pub fn create_database(&self, prefix: &str) -> Result<String, PgTestError> {
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}_{}_{n}", std::process::id());
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""))?;
        Ok(self.url(&name))
    }

    /// Runs SQL in database `db` with psql (stopping at the first error) and returns what it
    /// printed: unaligned rows, no headers.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, PgTestError> {
        let output = self.run(
            &format!("psql {sql:?}"),
            Command::new(self.bin.join("psql"))
                .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
                .arg("-h")
                .arg(self.dir.path())
                .args(["-U", "postgres", "-p"])
                .arg(self.port.to_string())
                .args(["-d", db, "-c", sql]),
        )?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Crashes the server: `pg_ctl stop -m immediate` (no checkpoint, no clean shutdown; the
    /// next start runs crash recovery). Connections break at once.
    pub fn stop_immediate(&self) -> Result<(), PgTestError> {
        self.pg_ctl(&["stop", "-m", "immediate", "-w"]).map(drop)
    }

    /// Starts the server again after [`PgCluster::stop_immediate`], on the same port.
    pub fn start_again(&self) -> Result<(), PgTestError> {
        self.start_server()
    }

    /// Ends every session connected to database `db` (what a dropped connection looks like to
    /// its client), returning how many there were.
    pub fn terminate_backends(&self, db: &str) -> Result<usize, PgTestError> {
        let out = self.psql(
            "postgres",
            &format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
                db.replace('\'', "''")
            ),
        )?;
        Ok(out.parse().unwrap_or(0))
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Writes `cert` where the server reads it (the key readable by its owner only, as the
    /// server demands) and makes `pg_hba.conf` accept TCP connections over TLS only.
    fn install_certificate(&self, cert: &ServerCert) -> Result<(), PgTestError> {
        use std::os::unix::fs::PermissionsExt as _;
        let write = |name: &str, text: &str| {
            let path = self.dir.path().join(name);
            std::fs::write(&path, text)
                .and_then(|()| {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                })
                .map_err(|e| PgTestError::Directory {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            Ok::<_, PgTestError>(path)
        };
        let files = [
            write("server.crt", &cert.cert_pem)?,
            write("server.key", &cert.key_pem)?,
        ];
        if self.as_postgres {
            self.run(
                "chown of the server's certificate",
                Command::new("chown").arg("postgres:").args(&files),
            )?;
        }
        let hba = self.data_dir().join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba).map_err(|e| PgTestError::Directory {
            path: hba.clone(),
            detail: e.to_string(),
        })?;
        let text: String = text
            .lines()
            .map(|line| match line.strip_prefix("host ") {
                Some(rest) => format!("hostssl {rest}\n"),
                None => format!("{line}\n"),
            })
            .collect();
        std::fs::write(&hba, text).map_err(|e| PgTestError::Directory {
            path: hba,
            detail: e.to_string(),
        })
    }

    fn start_server(&self) -> Result<(), PgTestError> {
        let mut options = format!(
            "-k {} -p {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on -c max_connections=400",
            self.dir.path().display(),
            self.port
        );
        if self.tls {
            let dir = self.dir.path().display();
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key"
            ));
        }
        let log = self.dir.path().join("log");
        let log = log.to_string_lossy();
        self.pg_ctl(&["start", "-w", "-t", "120", "-l", &log, "-o", &options])
            .map(drop)
            .map_err(|e| match e {
                PgTestError::Command { what, detail } => PgTestError::Command {
                    what,
                    detail: format!("{detail}\nserver log:\n{}", self.log()),
                },
                other => other,
            })
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output, PgTestError> {
        let data = self.data_dir();
        self.run(
            &format!("pg_ctl {}", args[0]),
            self.server_command("pg_ctl")
                .arg("-D")
                .arg(&data)
                .args(args),
        )
    }

    /// A command of the server's binaries, as the `postgres` user when this process is root.
    fn server_command(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    fn run(&self, what: &str, command: &mut Command) -> Result<Output, PgTestError> {
        let output = command
            .stdin(Stdio::null())
            .output()
            .map_err(|e| PgTestError::Command {
                what: what.to_owned(),
                detail: e.to_string(),
            })?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(PgTestError::Command {
                what: what.to_owned(),
                detail: format!(
                    "{}: {}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim(),
                    String::from_utf8_lossy(&output.stdout).trim()
                ),
            })
        }
    }

    /// Starts a process that waits for its stdin to close (this process ended: the pipe's only
    /// writer is here) and then stops the server and removes the directory.
    fn arm_reaper(&self) -> Result<(), PgTestError> {
        let mut stop = self.server_command("pg_ctl");
        stop.arg("-D")
            .arg(self.data_dir())
            .args(["stop", "-m", "immediate", "-w"]);
        let script = format!(
            "cat >/dev/null; {} >/dev/null 2>&1; rm -rf '{}'",
            shell_line(&stop),
            self.dir.path().display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| PgTestError::Command {
                what: "the shared cluster's reaper".to_owned(),
                detail: e.to_string(),
            })?;
        let Some(mut stdin) = child.stdin.take() else {
            return Err(PgTestError::Command {
                what: "the shared cluster's reaper".to_owned(),
                detail: "no stdin pipe".to_owned(),
            });
        };
        let _ = stdin.flush();
        *self.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some((child, stdin));
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
    }
}

/// `command` as one line of sh (its arguments single-quoted).
fn shell_line(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy().replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn free_port() -> Result<u16, PgTestError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| PgTestError::Command {
            what: "finding a free loopback port".to_owned(),
            detail: e.to_string(),
        })
}

/// The directory holding `initdb`, `pg_ctl` and `psql`.
fn locate() -> Result<PathBuf, PgTestError> {
    bin_dirs()
        .into_iter()
        .find(|dir| {
            ["initdb", "pg_ctl", "psql"]
                .iter()
                .all(|b| dir.join(b).is_file())
        })
        .ok_or(PgTestError::Binaries)
}

/// Where PostgreSQL's programs are looked for, in order: `$TOOLGATE_PG_BIN` alone when it is
/// set, else `PATH`, then `/usr/lib/postgresql/*/bin`, newest version first.
fn bin_dirs() -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("TOOLGATE_PG_BIN") {
        return vec![PathBuf::from(dir)];
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    versions.sort_by(|a, b| b.cmp(a));
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(versions.into_iter().map(|(_, dir)| dir))
        .collect()
}

/// A PostgreSQL program (`pgbench`, ...) from the places the cluster's own binaries are looked
/// for (`$TOOLGATE_PG_BIN`, `PATH`, `/usr/lib/postgresql/*/bin`), if it is installed.
pub fn program(name: &str) -> Option<PathBuf> {
    bin_dirs()
        .into_iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_cluster_starts_serves_crashes_and_recovers() {
        let cluster = PgCluster::start().unwrap();
        let url = cluster.create_database("probe").unwrap();
        let db = url.rsplit('/').next().unwrap();
        cluster
            .psql(db, "CREATE TABLE t (x int); INSERT INTO t VALUES (7)")
            .unwrap();
        cluster.stop_immediate().unwrap();
        assert!(cluster.psql(db, "SELECT 1").is_err());
        cluster.start_again().unwrap();
        assert_eq!(cluster.psql(db, "SELECT x FROM t").unwrap(), "7");
        assert_eq!(cluster.psql(db, "SHOW fsync").unwrap(), "on");
        assert_eq!(cluster.terminate_backends(db).unwrap(), 0);
    }

    #[test]
    fn database_names_never_repeat() {
        let cluster = PgCluster::shared().unwrap();
        let a = cluster.create_database("same").unwrap();
        let b = cluster.create_database("same").unwrap();
        assert_ne!(a, b);
    }
}
#[cfg(test)]
mod auth {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn tcp_connections_need_the_password() {
        let cluster = super::PgCluster::start().unwrap();
        for (pw, ok) in [("wrong-secret", false), (super::PASSWORD, true)] {
            let out = std::process::Command::new(cluster.bin.join("psql"))
                .env("PGPASSWORD", pw)
                .args(["-X", "-h", "127.0.0.1", "-U", "postgres", "-p"])
                .arg(cluster.port.to_string())
                .args(["-d", "postgres", "-c", "select 1"])
                .output()
                .unwrap();
            assert_eq!(out.status.success(), ok, "{pw}: {:?}", out.stderr);
        }
    }
}

#[cfg(test)]
mod tls {
    #![allow(clippy::unwrap_used)]

    /// psql (libpq) against a cluster of [`super::PgCluster::start_tls`]: verified TLS with the
    /// test CA is served, an unencrypted TCP connection is refused.
    #[test]
    fn a_tls_cluster_serves_verified_tls_only() {
        let ca = super::TestCa::new("toolgate test CA").unwrap();
        let cert = ca.issue(&["127.0.0.1"]).unwrap();
        let cluster = super::PgCluster::start_tls(&cert).unwrap();
        let root = cluster.dir().join("client-ca.pem");
        std::fs::write(&root, ca.cert_pem()).unwrap();
        for (mode, ok) in [("verify-full", true), ("disable", false)] {
            let out = std::process::Command::new(cluster.bin.join("psql"))
                .env("PGPASSWORD", super::PASSWORD)
                .arg("-X")
                .arg(format!(
                    "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode={mode} sslrootcert={}",
                    cluster.port,
                    root.display()
                ))
                .args(["-c", "select 1"])
                .output()
                .unwrap();
            assert_eq!(
                out.status.success(),
                ok,
                "{mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert_eq!(cluster.psql("postgres", "SHOW ssl").unwrap(), "on");
    }
}
