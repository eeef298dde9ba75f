//! Partner gateways for upstream exits, none written by us: Squid with
//! basic auth (its auth helper a small script that accepts the partner's
//! password under any username, so the templated usernames pass, and logs
//! each username it is asked about) and microsocks with one user.

use crate::process::{eventually, free_port, is_root};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

async fn answers(port: u16) {
    eventually(
        "the partner gateway to listen",
        Duration::from_secs(20),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
}

/// A Squid on a free loopback port asking for basic auth.
pub struct SquidPartner {
    pub port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

const AUTH_HELPER: &str = r#"import sys, urllib.parse
password = sys.argv[1]
log = open(sys.argv[2], "a", buffering=1)
for line in sys.stdin:
    user, _, given = line.rstrip("\n").partition(" ")
    user, given = urllib.parse.unquote(user), urllib.parse.unquote(given)
    log.write(user + "\n")
    sys.stdout.write("OK\n" if given == password else "ERR\n")
    sys.stdout.flush()
"#;

impl SquidPartner {
    /// `password`: what the partner account's password is.
    pub async fn start(password: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("proxynet-squid")
            .tempdir_in("/tmp")
            .unwrap();
        let port = free_port();
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(dir.path().join("auth.py"), AUTH_HELPER).unwrap();
        std::fs::write(dir.path().join("users.log"), "").unwrap();
        std::fs::write(dir.path().join("access.log"), "").unwrap();
        std::fs::write(
            dir.path().join("squid.conf"),
            format!(
                "http_port 127.0.0.1:{port}\n\
                 pid_filename {pid}\n\
                 cache_log {cache_log}\n\
                 access_log stdio:{access_log} squid\n\
                 coredump_dir {dir}\n\
                 cache deny all\n\
                 cache_mem 8 MB\n\
                 shutdown_lifetime 0 seconds\n\
                 auth_param basic program /usr/bin/python3 {helper} {password} {users}\n\
                 auth_param basic children 2\n\
                 auth_param basic credentialsttl 1 second\n\
                 acl partner_users proxy_auth REQUIRED\n\
                 http_access allow partner_users\n\
                 http_access deny all\n",
                pid = path("squid.pid"),
                cache_log = path("cache.log"),
                access_log = path("access.log"),
                dir = dir.path().display(),
                helper = path("auth.py"),
                users = path("users.log"),
            ),
        )
        .unwrap();
        if is_root() {
            // Squid drops to the `proxy` user: it must write its logs here.
            let status = Command::new("chown")
                .args(["-R", "proxy:", &dir.path().display().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        }
        let child = Command::new("squid")
            .args(["-N", "-f", &path("squid.conf")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("squid runs (scripts/test installs it)");
        answers(port).await;
        Self { port, child, dir }
    }

    /// Squid's access log: one line per request, the authenticated
    /// username in the eighth field.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    /// The usernames of the access log's lines, in order.
    pub fn usernames(&self) -> Vec<String> {
        // Connections that never sent a request (the readiness check) are
        // logged too, as `error:transaction-end-before-headers`.
        self.access_log()
            .lines()
            .filter(|line| !line.contains("transaction-end-before-headers"))
            .filter_map(|line| line.split_whitespace().nth(7).map(str::to_owned))
            .collect()
    }

    /// The usernames once the access log holds at least `count` requests:
    /// Squid writes a tunnel's line when it ends, a moment after the client
    /// saw it close.
    pub async fn usernames_at_least(&self, count: usize) -> Vec<String> {
        eventually(
            &format!("{count} requests in Squid's access log"),
            Duration::from_secs(10),
            || async {
                let names = self.usernames();
                (names.len() >= count).then_some(names)
            },
        )
        .await
    }

    /// Every username the auth helper was asked about.
    pub fn helper_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("users.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SquidPartner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A microsocks SOCKS5 server with one user.
pub struct SocksPartner {
    pub port: u16,
    child: Child,
}

impl SocksPartner {
    pub async fn start(user: &str, password: &str) -> Self {
        let port = free_port();
        let child = Command::new("microsocks")
            .args([
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-u",
                user,
                "-P",
                password,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("microsocks runs (scripts/test installs it)");
        answers(port).await;
        Self { port, child }
    }
}

impl Drop for SocksPartner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A password file as an upstream exit reads it (0600).
pub fn password_file(dir: &Path, name: &str, password: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("{password}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}
