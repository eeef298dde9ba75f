//! A Postgres primary and a streaming standby of a test's own, on free
//! loopback ports: the test stops the primary and promotes the standby, as
//! an operator (or Patroni, repmgr) does in a failover.

use crate::process::{eventually, free_port, is_root};
use sqlx::Connection;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct PostgresPair {
    pub primary_port: u16,
    pub standby_port: u16,
    password: String,
    bindir: PathBuf,
    dir: tempfile::TempDir,
}

fn bindir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            dirs.filter_map(Result::ok)
                .map(|d| d.path().join("bin"))
                .filter(|bin| bin.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
        .pop()
        .expect("PostgreSQL server binaries (scripts/test installs them)")
}

/// A Postgres tool, run as the postgres user when we are root (the server
/// refuses to run as root).
fn tool(program: &Path, env: &[(&str, &str)]) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "env"]);
        for (key, value) in env {
            c.arg(format!("{key}={value}"));
        }
        c.arg(program);
        c
    } else {
        let mut c = Command::new(program);
        c.envs(env.iter().copied());
        c
    }
}

fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) {
    let output = tool(program, env)
        .args(args)
        .output()
        .expect("run a Postgres tool");
    assert!(
        output.status.success(),
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl PostgresPair {
    /// initdb, start the primary, clone it with `pg_basebackup -R` and start
    /// the clone as a hot standby; returns once the standby streams.
    pub async fn start() -> Self {
        let bindir = bindir();
        let dir = tempfile::Builder::new()
            .prefix("proxynet-pgpair")
            .tempdir_in("/tmp")
            .unwrap();
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:", &dir.path().display().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        }
        let password = uuid::Uuid::new_v4().simple().to_string();
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, format!("{password}\n")).unwrap();
        if is_root() {
            Command::new("chown")
                .args(["postgres:", &pwfile.display().to_string()])
                .status()
                .unwrap();
        }
        let root = dir.path().to_owned();
        let path = |name: &str| root.join(name).display().to_string();
        run(
            &bindir.join("initdb"),
            &[
                "-D",
                &path("primary"),
                "-U",
                "proxynet",
                &format!("--pwfile={}", pwfile.display()),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
            ],
            &[],
        );
        let pair = Self {
            primary_port: free_port(),
            standby_port: free_port(),
            password,
            bindir,
            dir,
        };
        pair.pg_ctl_start("primary", pair.primary_port);
        run(
            &pair.bindir.join("pg_basebackup"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &pair.primary_port.to_string(),
                "-U",
                "proxynet",
                "-D",
                &path("standby"),
                "-R",
                "-X",
                "stream",
            ],
            &[("PGPASSWORD", &pair.password)],
        );
        pair.pg_ctl_start("standby", pair.standby_port);
        eventually("the standby to stream", Duration::from_secs(30), || async {
            let mut conn = sqlx::PgConnection::connect(&pair.url_of(pair.standby_port, "postgres"))
                .await
                .ok()?;
            let streaming: bool = sqlx::query_scalar(
                "SELECT pg_is_in_recovery() AND EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming')",
            )
            .fetch_one(&mut conn)
            .await
            .ok()?;
            streaming.then_some(())
        })
        .await;
        pair
    }

    fn pg_ctl_start(&self, node: &str, port: u16) {
        let data = self.dir.path().join(node);
        run(
            &self.bindir.join("pg_ctl"),
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &self
                    .dir
                    .path()
                    .join(format!("{node}.log"))
                    .display()
                    .to_string(),
                "-w",
                "-t",
                "60",
                "-o",
                &format!(
                    "-h 127.0.0.1 -p {port} -k {} -c fsync=off -c max_connections=100",
                    self.dir.path().display()
                ),
                "start",
            ],
            &[],
        );
    }

    fn url_of(&self, port: u16, database: &str) -> String {
        format!(
            "postgres://proxynet:{}@127.0.0.1:{port}/{database}",
            self.password
        )
    }

    /// The primary alone (for creating the test's database).
    pub fn primary_url(&self, database: &str) -> String {
        self.url_of(self.primary_port, database)
    }

    /// Both hosts in libpq's multi-host form, primary first.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://proxynet:{}@127.0.0.1:{},127.0.0.1:{}/{database}",
            self.password, self.primary_port, self.standby_port
        )
    }

    /// Creates `database` on the primary (the standby replays it).
    pub async fn create_database(&self, database: &str) {
        let mut conn = sqlx::PgConnection::connect(&self.primary_url("postgres"))
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&mut conn)
            .await
            .unwrap();
    }

    /// Stops the primary without a checkpoint (`-m immediate`: as if the
    /// machine went away).
    pub fn stop_primary(&self) {
        self.pg_ctl_stop("primary");
    }

    fn pg_ctl_stop(&self, node: &str) {
        let data = self.dir.path().join(node);
        if data.join("postmaster.pid").exists() {
            run(
                &self.bindir.join("pg_ctl"),
                &[
                    "-D",
                    &data.display().to_string(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                &[],
            );
        }
    }

    /// Promotes the standby to primary and waits until it takes writes.
    pub fn promote_standby(&self) {
        run(
            &self.bindir.join("pg_ctl"),
            &[
                "-D",
                &self.dir.path().join("standby").display().to_string(),
                "-w",
                "promote",
            ],
            &[],
        );
    }
}

impl Drop for PostgresPair {
    fn drop(&mut self) {
        for node in ["primary", "standby"] {
            let data = self.dir.path().join(node);
            if data.join("postmaster.pid").exists() {
                let _ = tool(&self.bindir.join("pg_ctl"), &[])
                    .args([
                        "-D",
                        &data.display().to_string(),
                        "-m",
                        "immediate",
                        "-w",
                        "stop",
                    ])
                    .output();
            }
        }
    }
}
