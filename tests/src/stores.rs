//! A fresh database and Redis prefix per test.

use sqlx::Connection;
use uuid::Uuid;

pub struct TestStores {
    /// URL of this test's own database.
    pub database_url: String,
    pub redis_url: String,
    /// Key prefix unique to this test.
    pub redis_prefix: String,
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
            redis_prefix: format!("{name}:"),
        }
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
