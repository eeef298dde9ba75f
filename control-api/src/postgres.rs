//! The connection to Postgres: one server, or a primary and its standbys
//! named together in `--database-url` the way libpq names them
//! (`postgres://user:pass@db1:5432,db2:5432/proxynet`).
//!
//! sqlx connects to one host. With several, this module picks the one that
//! takes writes (`pg_is_in_recovery()` false) and keeps watching: when it
//! stops answering, or turns out to be a standby, the pool is pointed at
//! whichever host now takes writes — the standby an operator (or Patroni,
//! repmgr, a script) promoted — and connections opened before the switch
//! are discarded as they come back to the pool. While no host takes writes
//! but a standby answers, the pool reads from the standby: the API keeps
//! serving reads, a write is answered 503, and usage simply waits in the
//! Redis stream (the ledger records each batch once, whenever it lands).
//! Migrations run only at start, so a control-api must start against a
//! primary.

use proxynet_common::tasks::Stop;
use proxynet_store::{redact_url, StoreUnavailable};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the current host is asked whether it still takes writes.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// One probe (connect and ask) of one host.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Every this many checks all hosts are probed, not only the current one.
const SURVEY_EVERY: u64 = 5;

/// The pool, and with several hosts the watch that moves it.
pub(crate) struct Postgres {
    pub pool: PgPool,
    pub failover: Option<Failover>,
}

/// One of the hosts of a multi-host URL.
struct Host {
    options: PgConnectOptions,
    /// `host:port`, for logs.
    label: String,
}

/// Splits libpq's multi-host form into one URL per host (the same user,
/// password, database and parameters), in the order given. A URL with one
/// host comes back as it is. `target_session_attrs` is dropped: finding the
/// host that takes writes is what this module does.
pub(crate) fn split_hosts(url: &str) -> Result<Vec<String>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{} is not a postgres:// URL", redact_url(url)))?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    if !hostlist.contains(',') {
        return Ok(vec![url.to_owned()]);
    }
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let query: Vec<&str> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|kv| !kv.is_empty() && !kv.starts_with("target_session_attrs="))
        .collect();
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    };
    hostlist
        .split(',')
        .map(|host| {
            if host.trim().is_empty() {
                Err(format!(
                    "{}: an empty host in the host list",
                    redact_url(url)
                ))
            } else {
                Ok(format!("{scheme}://{userinfo}{}{path}{query}", host.trim()))
            }
        })
        .collect()
}

impl Postgres {
    pub(crate) async fn connect(url: &str) -> Result<Self, StoreUnavailable> {
        let unavailable = |detail: String| StoreUnavailable {
            what: "Postgres",
            detail,
        };
        let urls = split_hosts(url).map_err(unavailable)?;
        let mut hosts = Vec::with_capacity(urls.len());
        for one in &urls {
            let options = PgConnectOptions::from_str(one)
                .map_err(|e| unavailable(format!("invalid URL {}: {e}", redact_url(one))))?;
            let label = format!("{}:{}", options.get_host(), options.get_port());
            hosts.push(Host { options, label });
        }
        let options = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5));
        if hosts.len() == 1 {
            let pool = options
                .connect_with(hosts[0].options.clone())
                .await
                .map_err(|e| unavailable(format!("cannot connect to {}: {e}", redact_url(url))))?;
            return Ok(Self {
                pool,
                failover: None,
            });
        }
        let (index, writable) = choose(&hosts, None).await.map_err(unavailable)?;
        if !writable {
            tracing::warn!(host = %hosts[index].label, "no Postgres host takes writes: serving reads from a standby");
        }
        let switched = Arc::new(SwitchClock::new());
        let clock = switched.clone();
        let pool = options
            // A connection opened before the last switch leads to the old
            // host: dropped instead of handed out.
            .before_acquire(move |_conn, meta| {
                let fresh = meta.age < clock.since_switch();
                Box::pin(async move { Ok(fresh) })
            })
            .connect_with(hosts[index].options.clone())
            .await
            .map_err(|e| unavailable(format!("cannot connect to {}: {e}", hosts[index].label)))?;
        Ok(Self {
            failover: Some(Failover {
                pool: pool.clone(),
                hosts: Arc::new(hosts),
                current: AtomicUsize::new(index),
                writable: AtomicBool::new(writable),
                switched,
                checks: AtomicU64::new(1),
            }),
            pool,
        })
    }
}

/// When the pool last moved to another host.
struct SwitchClock {
    epoch: Instant,
    /// Milliseconds after `epoch`; `u64::MAX` before any switch.
    at_ms: AtomicU64,
}

impl SwitchClock {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            at_ms: AtomicU64::new(u64::MAX),
        }
    }

    fn record(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.at_ms.store(now, Ordering::Relaxed);
    }

    /// How long ago the last switch was (forever, before the first).
    fn since_switch(&self) -> Duration {
        match self.at_ms.load(Ordering::Relaxed) {
            u64::MAX => Duration::MAX,
            at => self
                .epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(at)),
        }
    }
}

/// What a probe learns of a host.
#[derive(Clone, Copy)]
struct Answer {
    writable: bool,
    /// The timeline of its last checkpoint: a promoted standby starts a new,
    /// higher one, so of two hosts that both take writes (an old primary
    /// back unfenced) the higher timeline is the one the failover chose.
    timeline: i64,
}

/// Whether `host` answers, and if so whether it takes writes.
async fn probe(host: &Host) -> Result<Answer, String> {
    let asking = async {
        let mut conn = PgConnection::connect_with(&host.options).await?;
        let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await?;
        // Reading the control file may be refused to a least-privilege role:
        // then the timeline is unknown (0), and URL order decides.
        let timeline: i64 =
            sqlx::query_scalar("SELECT timeline_id::bigint FROM pg_control_checkpoint()")
                .fetch_one(&mut conn)
                .await
                .unwrap_or(0);
        let _ = conn.close().await;
        Ok::<_, sqlx::Error>(Answer {
            writable: !in_recovery,
            timeline,
        })
    };
    match tokio::time::timeout(PROBE_TIMEOUT, asking).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 2 s".into()),
    }
}

/// The host that takes writes (of several, the one on the highest
/// timeline, with a loud warning: two primaries mean the old one was not
/// fenced); failing that the first that answers (a standby, read-only),
/// preferring `current` among standbys so the pool does not wander. Every
/// host's failure when none answers.
async fn choose(hosts: &[Host], current: Option<usize>) -> Result<(usize, bool), String> {
    let answers = futures_util::future::join_all(hosts.iter().map(probe)).await;
    let primaries: Vec<(usize, i64)> = answers
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            a.as_ref()
                .ok()
                .filter(|a| a.writable)
                .map(|a| (i, a.timeline))
        })
        .collect();
    if primaries.len() > 1 {
        tracing::error!(
            hosts = %primaries.iter().map(|(i, t)| format!("{} (timeline {t})", hosts[*i].label)).collect::<Vec<_>>().join(", "),
            "more than one Postgres host takes writes: the old primary was not fenced; using the highest timeline"
        );
    }
    if let Some((primary, _)) = primaries
        .iter()
        .max_by_key(|(i, t)| (*t, std::cmp::Reverse(*i)))
    {
        return Ok((*primary, true));
    }
    let standby = current
        .filter(|&c| answers.get(c).is_some_and(Result::is_ok))
        .or_else(|| answers.iter().position(Result::is_ok));
    if let Some(standby) = standby {
        return Ok((standby, false));
    }
    Err(hosts
        .iter()
        .zip(answers)
        .map(|(host, answer)| format!("{}: {}", host.label, answer.err().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("; "))
}

/// Keeps the pool on the host that takes writes.
pub(crate) struct Failover {
    pool: PgPool,
    hosts: Arc<Vec<Host>>,
    current: AtomicUsize,
    writable: AtomicBool,
    switched: Arc<SwitchClock>,
    checks: AtomicU64,
}

impl Failover {
    pub(crate) async fn run(self, stop: Stop) {
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.check().await;
        }
    }

    async fn check(&self) {
        let current = self.current.load(Ordering::Relaxed);
        // Every few checks, all hosts are asked even while the current one
        // takes writes: another host promoted meanwhile (the current one an
        // old primary that was never stopped) is found on its timeline.
        let survey = self
            .checks
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SURVEY_EVERY);
        let asked = tokio::time::timeout(
            PROBE_TIMEOUT,
            sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()").fetch_one(&self.pool),
        )
        .await;
        match asked {
            Ok(Ok(false)) => {
                if !self.writable.swap(true, Ordering::Relaxed) {
                    tracing::warn!(host = %self.hosts[current].label, "Postgres takes writes again (the standby was promoted)");
                }
                if !survey {
                    return;
                }
            }
            Ok(Ok(true)) => {
                if self.writable.swap(false, Ordering::Relaxed) {
                    tracing::warn!(host = %self.hosts[current].label, "the Postgres host in use is a standby now: writes are refused until a primary is found");
                }
            }
            Ok(Err(_)) | Err(_) => {}
        }
        match choose(&self.hosts, Some(current)).await {
            Ok((index, writable)) => {
                self.writable.store(writable, Ordering::Relaxed);
                if index != current {
                    tracing::warn!(
                        from = %self.hosts[current].label,
                        to = %self.hosts[index].label,
                        writable,
                        "moving the Postgres pool to another host"
                    );
                    // The switch time first: a connection to the old host
                    // that completes meanwhile is then older than the switch.
                    self.switched.record();
                    self.pool
                        .set_connect_options(self.hosts[index].options.clone());
                    self.current.store(index, Ordering::Relaxed);
                }
            }
            Err(all) => tracing::warn!(hosts = %all, "no Postgres host answers"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_stays_as_given_and_several_become_one_url_each() {
        let one = "postgres://u:p@db:5432/proxynet?sslmode=disable";
        assert_eq!(split_hosts(one).unwrap(), vec![one.to_owned()]);
        assert_eq!(
            split_hosts(
                "postgres://u:p%40x@db1:5432,db2:5433/proxynet?target_session_attrs=read-write&sslmode=disable"
            )
            .unwrap(),
            vec![
                "postgres://u:p%40x@db1:5432/proxynet?sslmode=disable".to_owned(),
                "postgres://u:p%40x@db2:5433/proxynet?sslmode=disable".to_owned(),
            ]
        );
        assert_eq!(
            split_hosts("postgresql://[::1]:5432,10.0.0.2/db").unwrap(),
            vec![
                "postgresql://[::1]:5432/db".to_owned(),
                "postgresql://10.0.0.2/db".to_owned()
            ]
        );
    }

    #[test]
    fn a_bad_host_list_is_refused_without_the_password() {
        let err = split_hosts("postgres://u:hunter2@db1,,db2/x").unwrap_err();
        assert!(err.contains("empty host"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn connections_older_than_the_last_switch_are_stale() {
        let clock = SwitchClock::new();
        assert_eq!(clock.since_switch(), Duration::MAX);
        clock.record();
        assert!(clock.since_switch() < Duration::from_secs(1));
    }
}
