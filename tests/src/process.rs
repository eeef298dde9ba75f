//! Starting the real binaries and waiting for their ready lines.

use serde::de::DeserializeOwned;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a binary may take to print its ready line.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The directory cargo put the workspace binaries in (next to this test binary).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} not built: build the workspace binaries first (cargo build --workspace --bins, which scripts/test does)",
        path.display()
    );
    path
}

/// A running child process, killed when dropped. Its stderr goes to the test's
/// own stderr so failures show the binary's log.
pub struct Proc {
    pub name: String,
    pub child: Child,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(-1)
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends a signal (e.g. `libc::SIGSTOP`, `libc::SIGCONT`, `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) {
        let pid = self.pid();
        if pid > 0 {
            // SAFETY-free: libc::kill only sends a signal to our own child.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    pub async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit within {within:?}", self.name))
            .expect("wait")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Starts `name` with `args`/`envs` and waits for its `PROXYNET_READY` line.
pub async fn spawn_ready<T: DeserializeOwned>(
    name: &str,
    args: &[String],
    envs: &[(&str, String)],
) -> (Proc, T) {
    spawn_ready_logged(name, args, envs, None).await
}

/// [`spawn_ready`], writing the binary's log to `log` (appending) when given.
pub async fn spawn_ready_logged<T: DeserializeOwned>(
    name: &str,
    args: &[String],
    envs: &[(&str, String)],
    log: Option<&std::path::Path>,
) -> (Proc, T) {
    spawn_ready_via(&[], name, args, envs, log).await
}

/// [`spawn_ready_logged`], started through `wrapper` (a program and its
/// arguments that run the binary, e.g. `ip netns exec NAME`; empty: none).
/// The wrapper must exec the binary, so the child is the binary itself.
pub async fn spawn_ready_via<T: DeserializeOwned>(
    wrapper: &[String],
    name: &str,
    args: &[String],
    envs: &[(&str, String)],
    log: Option<&std::path::Path>,
) -> (Proc, T) {
    let stderr = match log {
        Some(path) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("open the log file"),
        ),
        None => Stdio::inherit(),
    };
    let mut cmd = match wrapper.split_first() {
        Some((program, wrapper_args)) => {
            let mut cmd = Command::new(program);
            cmd.args(wrapper_args).arg(bin(name));
            cmd
        }
        None => Command::new(bin(name)),
    };
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env(
            "RUST_LOG",
            std::env::var("PROXYNET_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let stdout = child.stdout.take().expect("stdout piped");
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(READY_TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(v) = proxynet_common::ready::parse::<T>(&line) {
                return Some(v);
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| panic!("{name} printed no ready line within {READY_TIMEOUT:?}"))
    .unwrap_or_else(|| panic!("{name} exited before it was ready"));
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (
        Proc {
            name: name.to_owned(),
            child,
        },
        ready,
    )
}

/// Runs `name` to completion, for start-up failures: (exit status, stderr).
pub async fn run_to_exit(
    name: &str,
    args: &[String],
    envs: &[(&str, String)],
    within: Duration,
) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(bin(name));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(within, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{name} did not exit within {within:?}"))
        .expect("run");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `within`.
/// For waiting on a condition another process makes true; never a fixed sleep.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A process's log file as plain text: terminal colour sequences
/// (`ESC [ … m`, which the text format writes around field names) removed,
/// so `field=value` can be searched. Empty while the file does not exist.
pub fn read_log(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A port free on loopback now (the kernel's pick; a server started on it
/// right after gets it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether the suite runs as root (then servers that refuse root run as
/// their own users).
pub fn is_root() -> bool {
    // Only reads the real user id.
    #[allow(unsafe_code)]
    unsafe {
        libc::getuid() == 0
    }
}
