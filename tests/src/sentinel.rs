//! A Redis master, one replica and three sentinels of a test's own, on free
//! loopback ports: the shape an operator runs for highly available Redis
//! without Cluster. The test kills the master and watches the sentinels
//! promote the replica.

use crate::process::{eventually, free_port};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The name the sentinels know the master by.
pub const MASTER_NAME: &str = "proxynet";

pub struct SentinelGroup {
    pub master_port: u16,
    pub replica_port: u16,
    pub sentinel_ports: Vec<u16>,
    master: Option<Child>,
    others: Vec<Child>,
    _dir: tempfile::TempDir,
}

fn redis_server(args: &[String]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs")
}

async fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = tokio::time::timeout(
        Duration::from_secs(1),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    tokio::time::timeout(Duration::from_secs(1), cmd.query_async(&mut conn))
        .await
        .ok()?
        .ok()
}

impl SentinelGroup {
    /// Starts the master, the replica (waiting until it is in sync) and
    /// three sentinels with a quorum of two, failing a master over one second
    /// after it stops answering; returns once every sentinel knows the
    /// replica and its two peers, so a failover can be agreed at once.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let master_port = free_port();
        let replica_port = free_port();
        let node = |port: u16| -> Vec<String> {
            [
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &dir.path().display().to_string(),
                "--dbfilename",
                &format!("dump-{port}.rdb"),
            ]
            .map(str::to_owned)
            .to_vec()
        };
        let master = redis_server(&node(master_port));
        let mut replica_args = node(replica_port);
        replica_args.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master_port.to_string(),
        ]);
        let mut others = vec![redis_server(&replica_args)];
        eventually(
            "the replica to be in sync",
            Duration::from_secs(15),
            || async {
                let info: String =
                    query(replica_port, redis::cmd("INFO").arg("replication")).await?;
                info.contains("master_link_status:up").then_some(())
            },
        )
        .await;

        let mut sentinel_ports = Vec::new();
        for index in 0..3 {
            let port = free_port();
            let conf = dir.path().join(format!("sentinel-{index}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "bind 127.0.0.1\nport {port}\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 10000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.path().display()
                ),
            )
            .unwrap();
            others.push(redis_server(&[
                conf.display().to_string(),
                "--sentinel".to_owned(),
            ]));
            sentinel_ports.push(port);
        }
        // A sentinel learns the replica from the master's INFO (every 10 s)
        // and its peers from their hellos (every 2 s): under a full suite's
        // load that took more than 20 s once. A readiness wait, not a timing.
        for &port in &sentinel_ports {
            eventually(
                "every sentinel to know the replica and its two peers",
                Duration::from_secs(60),
                || async {
                    let replicas: Vec<redis::Value> = query(
                        port,
                        redis::cmd("SENTINEL").arg("replicas").arg(MASTER_NAME),
                    )
                    .await?;
                    let peers: Vec<redis::Value> = query(
                        port,
                        redis::cmd("SENTINEL").arg("sentinels").arg(MASTER_NAME),
                    )
                    .await?;
                    (replicas.len() == 1 && peers.len() == 2).then_some(())
                },
            )
            .await;
        }
        Self {
            master_port,
            replica_port,
            sentinel_ports,
            master: Some(master),
            others,
            _dir: dir,
        }
    }

    /// The sentinels as `--redis-url` takes them under `--redis-sentinel`.
    pub fn urls(&self) -> String {
        self.sentinel_ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The port of the node the first answering sentinel calls master.
    pub async fn current_master_port(&self) -> Option<u16> {
        for &port in &self.sentinel_ports {
            let named: Option<(String, u16)> = query(
                port,
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(MASTER_NAME),
            )
            .await;
            if let Some((_, master)) = named {
                return Some(master);
            }
        }
        None
    }

    /// Kills the master outright (SIGKILL: no goodbye to its replica).
    pub fn kill_master(&mut self) {
        if let Some(mut master) = self.master.take() {
            let _ = master.kill();
            let _ = master.wait();
        }
    }

    /// Waits until the sentinels have promoted the replica and it takes
    /// writes.
    pub async fn wait_for_failover(&self, within: Duration) {
        eventually("the sentinels to promote the replica", within, || async {
            (self.current_master_port().await? == self.replica_port).then_some(())?;
            let role: Vec<redis::Value> = query(self.replica_port, &redis::cmd("ROLE")).await?;
            let first: String = redis::from_redis_value(role.first()?.clone()).ok()?;
            (first == "master").then_some(())
        })
        .await;
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        self.kill_master();
        for child in &mut self.others {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
