//! A fresh database and Redis prefix per test.

use proxynet_store::redis_target::{RedisConnection, RedisTarget};
use proxynet_store::Keys;
use sqlx::Connection;
use std::sync::Arc;
use uuid::Uuid;

#[derive(Clone)]
pub struct TestStores {
    /// URL of this test's own database.
    pub database_url: String,
    /// One Redis URL, or with `redis_cluster` the cluster's seed nodes.
    pub redis_url: String,
    /// The suite runs against a Redis Cluster (`PROXYNET_TEST_REDIS_CLUSTER`).
    pub redis_cluster: bool,
    /// `redis_url` lists sentinels watching the master of this name.
    pub redis_sentinel_master: Option<String>,
    /// Key prefix unique to this test.
    pub redis_prefix: String,
    /// Drops the database when the last copy of these stores goes.
    _dropper: Arc<DropDatabase>,
}

/// Removes a test's database when the test is done with it. Some 500 tests
/// each leave a database of about 10 MB otherwise, and the suite's disk use
/// (with the build's) is what a CI machine runs out of first.
struct DropDatabase {
    server_url: String,
    name: String,
}

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let server_url = std::mem::take(&mut self.server_url);
        let name = std::mem::take(&mut self.name);
        // Drop runs inside the test's runtime, which cannot be blocked on
        // from within: a thread of its own with a runtime of its own.
        // `WITH (FORCE)` ends the connections of binaries still running.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut admin = sqlx::PgConnection::connect(&server_url).await.ok()?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .ok()
            })
        });
        // A database left behind costs only disk: nothing to report.
        let _ = dropped.join();
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the suite with scripts/test, which starts Postgres and Redis"
        )
    })
}

impl TestStores {
    pub async fn create() -> Self {
        let server_url = env("PROXYNET_TEST_DATABASE_URL");
        let redis_url = env("PROXYNET_TEST_REDIS_URL");
        let name = format!("t_{}", Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&server_url)
            .await
            .expect("connect to the test Postgres server");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        let database_url = replace_db_name(&server_url, &name);
        Self {
            database_url,
            redis_url,
            redis_cluster: std::env::var("PROXYNET_TEST_REDIS_CLUSTER").is_ok_and(|v| v == "true"),
            redis_sentinel_master: None,
            redis_prefix: format!("{name}:"),
            _dropper: Arc::new(DropDatabase { server_url, name }),
        }
    }

    /// This test's key layout.
    pub fn keys(&self) -> Keys {
        Keys::new(self.redis_prefix.clone())
    }

    /// A connection to this test's Redis (or cluster), as the binaries make it.
    pub async fn redis(&self) -> RedisConnection {
        match &self.redis_sentinel_master {
            Some(master) => RedisTarget::sentinel(&self.redis_url, master, None),
            None => RedisTarget::new(&self.redis_url, self.redis_cluster),
        }
        .expect("test Redis URL")
        .connect()
        .await
        .expect("connect to the test Redis")
    }

    /// The environment that points a binary at this test's Redis.
    pub fn redis_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("PROXYNET_REDIS_URL", self.redis_url.clone()),
            ("PROXYNET_REDIS_CLUSTER", self.redis_cluster.to_string()),
            ("PROXYNET_REDIS_PREFIX", self.redis_prefix.clone()),
        ];
        if let Some(master) = &self.redis_sentinel_master {
            env.push(("PROXYNET_REDIS_SENTINEL", "true".to_owned()));
            env.push(("PROXYNET_REDIS_SENTINEL_MASTER", master.clone()));
        }
        env
    }
}

/// `postgres://u:p@h:port/olddb?x` → `postgres://u:p@h:port/newdb?x`
fn replace_db_name(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..].find('/').map(|i| i + scheme_end);
    let host_part = match path_start {
        Some(i) => &base[..i],
        None => base,
    };
    format!("{host_part}/{db}{query}")
}

/// A Redis server of this test's own, so the test can stop and restart it
/// without disturbing other tests.
pub struct OwnRedis {
    pub port: u16,
    child: Option<std::process::Child>,
}

impl OwnRedis {
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut redis = Self { port, child: None };
        redis.restart().await;
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's process id (to freeze it with SIGSTOP).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(-1, |c| c.id() as i32)
    }

    /// Sends `signal` to the server (e.g. `libc::SIGSTOP`, `libc::SIGCONT`).
    pub fn signal(&self, signal: i32) {
        let pid = self.pid();
        if pid > 0 {
            // Only ever our own child.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// Starts (again) on the same port, empty, and waits until it answers.
    pub async fn restart(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs");
        self.child = Some(child);
        crate::process::eventually(
            "redis to answer",
            std::time::Duration::from_secs(10),
            || async {
                let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .ok()?;
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                s.write_all(b"PING\r\n").await.ok()?;
                let mut b = [0u8; 7];
                s.read_exact(&mut b).await.ok()?;
                (&b == b"+PONG\r\n").then_some(())
            },
        )
        .await;
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn db_name_replacement() {
        assert_eq!(
            super::replace_db_name("postgres://u:p@127.0.0.1:5/postgres?sslmode=disable", "x"),
            "postgres://u:p@127.0.0.1:5/x?sslmode=disable"
        );
        assert_eq!(
            super::replace_db_name("postgres://h:5", "x"),
            "postgres://h:5/x"
        );
    }
}
