//! Agent heartbeats without Postgres on their path.
//!
//! A heartbeat is answered from Redis alone: the credential is checked against
//! the exit record the projector keeps there, liveness and the agent's drain
//! announcement are written by one script, and the reply lists the live
//! superproxies. Postgres only learns about heartbeats afterwards: the
//! [`HeartbeatBook`] keeps the latest beat of every exit and writes, in one
//! statement every `heartbeat_persist_ms`, only what changed: a drain flag or
//! tunnel count that differs from what Postgres holds, or a
//! `last_heartbeat_at` older than `heartbeat_record_secs`. A database outage
//! (or a slow database) never delays a beat and never empties the pool, and a
//! steady fleet of 100,000 exits costs Postgres about 1,100–1,700 row updates
//! a second (every exit about once a minute; 1,111/s measured by fleet-sim) instead of 20,000 single-row updates. Postgres is asked only when Redis
//! has no record of the exit (a Redis that restarted empty, before the
//! projector repopulated it).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use uuid::Uuid;

/// What [`HeartbeatBook::pace`] remembers of an exit's last admitted beat.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    at: std::time::Instant,
    draining: bool,
    /// When its drain flag last flipped.
    flipped_at: Option<std::time::Instant>,
}

/// A drain flip is let through at once (an agent announces its drain in an
/// immediate beat) unless the previous flip was more recent than this.
const FLIP_GAP: Duration = Duration::from_secs(1);

/// How often an unchanged admin address is written again (repairs a Redis
/// that lost it, and keeps its entry younger than the projector's pruning
/// horizon, `AGENT_ADMIN_KEPT`).
pub(crate) const ADMIN_ADDRS_REFRESH: Duration = Duration::from_secs(3600);

/// What an exit's admin addresses came to: those protected fleet-wide and
/// those ignored as unverified.
type AdminClaims = (Vec<std::net::SocketAddr>, Vec<std::net::SocketAddr>);

/// The latest heartbeat of one exit, not yet in Postgres.
#[derive(Debug, Clone, Copy)]
struct Beat {
    at: DateTime<Utc>,
    draining: bool,
    active_tunnels: u64,
}

pub struct HeartbeatBook {
    /// What each exit's admin addresses last came to, and when it was last
    /// written to Redis (rewritten every [`ADMIN_ADDRS_REFRESH`] so their
    /// entries outlive the pruning horizon).
    admin_addrs: Mutex<HashMap<Uuid, (AdminClaims, std::time::Instant)>>,
    /// Each exit's last beat let through [`Self::pace`].
    admitted: Mutex<HashMap<Uuid, Admitted>>,
    unsaved: Mutex<HashMap<Uuid, Beat>>,
    /// What Postgres holds for each exit, as last written by us.
    persisted: Mutex<HashMap<Uuid, Beat>>,
    /// A beat that changes nothing is still written this long after the last.
    record_every: Duration,
}

impl Default for HeartbeatBook {
    fn default() -> Self {
        Self::new(Duration::from_secs(60))
    }
}

impl HeartbeatBook {
    pub fn new(record_every: Duration) -> Self {
        Self {
            admin_addrs: Mutex::new(HashMap::new()),
            admitted: Mutex::new(HashMap::new()),
            unsaved: Mutex::new(HashMap::new()),
            persisted: Mutex::new(HashMap::new()),
            record_every,
        }
    }

    /// True when `beat` tells Postgres something it does not know yet.
    fn is_news(&self, persisted: Option<&Beat>, beat: &Beat) -> bool {
        match persisted {
            None => true,
            Some(p) => {
                p.draining != beat.draining
                    || p.active_tunnels != beat.active_tunnels
                    || (beat.at - p.at).to_std().unwrap_or(Duration::ZERO) >= self.record_every
            }
        }
    }

    /// Lets an authenticated exit's beat through unless its previous one was
    /// less than `min_gap` ago; else how long to wait. A beat that flips the
    /// drain flag passes at once unless the last flip was within a second.
    /// A beat can write the exit change stream (a flip) that every superproxy
    /// reads, so one agent beating or flipping in a loop must not flood it
    /// and push every reader out of its place. Bounded by the number of
    /// enrolled exits.
    pub fn pace(&self, exit: Uuid, draining: bool, min_gap: Duration) -> Result<(), Duration> {
        let now = std::time::Instant::now();
        let Ok(mut admitted) = self.admitted.lock() else {
            return Ok(());
        };
        let mut flipped_at = None;
        if let Some(last) = admitted.get(&exit) {
            let flips = last.draining != draining;
            let flip_allowed = flips
                && last
                    .flipped_at
                    .is_none_or(|t| now.duration_since(t) >= FLIP_GAP);
            let since = now.duration_since(last.at);
            if since < min_gap && !flip_allowed {
                return Err(min_gap - since);
            }
            flipped_at = if flips { Some(now) } else { last.flipped_at };
        }
        admitted.insert(
            exit,
            Admitted {
                at: now,
                draining,
                flipped_at,
            },
        );
        Ok(())
    }

    /// Whether an exit's admin listener, `protected` fleet-wide and
    /// `unverified` (ignored), must be written to Redis now: new or changed
    /// for this exit (a claim newly verified included), or last written
    /// long ago. Bounded by the number of enrolled exits.
    pub fn admin_addrs_due(
        &self,
        exit: Uuid,
        protected: &[std::net::SocketAddr],
        unverified: &[std::net::SocketAddr],
    ) -> bool {
        let Ok(mut known) = self.admin_addrs.lock() else {
            return true;
        };
        let now = std::time::Instant::now();
        match known.get(&exit) {
            Some(((last, ignored), at))
                if last == protected
                    && ignored == unverified
                    && now.duration_since(*at) < ADMIN_ADDRS_REFRESH =>
            {
                false
            }
            _ => {
                known.insert(exit, ((protected.to_vec(), unverified.to_vec()), now));
                true
            }
        }
    }

    /// Forgets what [`Self::admin_addrs_due`] recorded (the write failed).
    pub fn forget_admin_addrs(&self, exit: Uuid) {
        if let Ok(mut known) = self.admin_addrs.lock() {
            known.remove(&exit);
        }
    }

    /// Records a beat for the next batch (replacing an older unsaved one).
    pub fn beat(&self, exit: Uuid, draining: bool, active_tunnels: u64) {
        metrics::counter!("proxynet_heartbeats_total").increment(1);
        if let Ok(mut unsaved) = self.unsaved.lock() {
            unsaved.insert(
                exit,
                Beat {
                    at: Utc::now(),
                    draining,
                    active_tunnels,
                },
            );
        }
    }

    /// Writes every unsaved beat in one statement; on failure they are kept
    /// (newer beats that arrived meanwhile win) for the next round.
    pub async fn persist(&self, db: &PgPool) -> Result<usize, sqlx::Error> {
        let taken: HashMap<Uuid, Beat> = match self.unsaved.lock() {
            Ok(mut unsaved) => std::mem::take(&mut *unsaved),
            Err(_) => return Ok(0),
        };
        let batch: HashMap<Uuid, Beat> = match self.persisted.lock() {
            Ok(persisted) => taken
                .into_iter()
                .filter(|(id, beat)| self.is_news(persisted.get(id), beat))
                .collect(),
            Err(_) => taken,
        };
        if batch.is_empty() {
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(batch.len());
        let mut ats = Vec::with_capacity(batch.len());
        let mut draining = Vec::with_capacity(batch.len());
        let mut active = Vec::with_capacity(batch.len());
        for (id, beat) in &batch {
            ids.push(*id);
            ats.push(beat.at);
            draining.push(beat.draining);
            active.push(i64::try_from(beat.active_tunnels).unwrap_or(i64::MAX));
        }
        let written = sqlx::query(
            "UPDATE exits e SET last_heartbeat_at = GREATEST(e.last_heartbeat_at, b.at),
                                draining = b.draining,
                                active_tunnels = b.active
               FROM unnest($1::uuid[], $2::timestamptz[], $3::bool[], $4::bigint[]) AS b(id, at, draining, active)
              WHERE e.id = b.id",
        )
        .bind(&ids)
        .bind(&ats)
        .bind(&draining)
        .bind(&active)
        .execute(db)
        .await;
        match written {
            Ok(done) => {
                if let Ok(mut persisted) = self.persisted.lock() {
                    persisted.extend(batch);
                }
                Ok(done.rows_affected() as usize)
            }
            Err(e) => {
                if let Ok(mut unsaved) = self.unsaved.lock() {
                    for (id, beat) in batch {
                        unsaved.entry(id).or_insert(beat);
                    }
                }
                Err(e)
            }
        }
    }

    /// Persists on an interval until `stop`.
    pub async fn run(
        self: std::sync::Arc<Self>,
        db: PgPool,
        every: Duration,
        stop: proxynet_common::tasks::Stop,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            let result = self.persist(&db).await;
            let unsaved = self.unsaved.lock().map(|u| u.len()).unwrap_or(0);
            metrics::gauge!("proxynet_heartbeats_unpersisted").set(unsaved as f64);
            match result {
                Ok(n) if n > 0 => tracing::debug!(exits = n, "heartbeats persisted"),
                Ok(_) => {}
                Err(e) => {
                    metrics::counter!("proxynet_store_errors_total", "store" => "postgres", "op" => "heartbeat_persist").increment(1);
                    tracing::warn!(error = %e, "persisting heartbeats failed; keeping them for the next round")
                }
            }
        }
    }
}

#[cfg(test)]
mod pacing_tests {
    use super::*;

    #[test]
    fn beats_closer_than_the_gap_are_refused_with_the_wait() {
        let book = HeartbeatBook::default();
        let exit = Uuid::new_v4();
        let other = Uuid::new_v4();
        let gap = Duration::from_secs(60);
        assert!(book.pace(exit, false, gap).is_ok());
        let wait = book.pace(exit, false, gap).unwrap_err();
        assert!(wait > Duration::from_secs(59) && wait <= gap);
        // An immediate drain announcement passes; flipping back at once does not.
        assert!(book.pace(exit, true, gap).is_ok());
        assert!(book.pace(exit, false, gap).is_err());
        // Another exit is not affected, and a zero gap admits everything.
        assert!(book.pace(other, false, gap).is_ok());
        assert!(book.pace(exit, false, Duration::ZERO).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(unix_secs: i64, draining: bool, active_tunnels: u64) -> Beat {
        Beat {
            at: DateTime::<Utc>::from_timestamp(unix_secs, 0).unwrap(),
            draining,
            active_tunnels,
        }
    }

    #[test]
    fn a_beat_is_news_only_when_it_changes_something_or_is_due() {
        let book = HeartbeatBook::new(Duration::from_secs(60));
        let saved = beat(1_000, false, 3);
        assert!(book.is_news(None, &saved));
        assert!(!book.is_news(Some(&saved), &beat(1_030, false, 3)));
        assert!(book.is_news(Some(&saved), &beat(1_030, true, 3)));
        assert!(book.is_news(Some(&saved), &beat(1_030, false, 4)));
        assert!(book.is_news(Some(&saved), &beat(1_060, false, 3)));
        // A beat older than what Postgres holds is no news by its age.
        assert!(!book.is_news(Some(&saved), &beat(900, false, 3)));
    }

    #[test]
    fn admin_addresses_are_written_when_new_changed_or_forgotten() {
        let book = HeartbeatBook::default();
        let exit = Uuid::new_v4();
        let first: [std::net::SocketAddr; 1] = ["127.0.0.1:9091".parse().unwrap()];
        let moved: [std::net::SocketAddr; 1] = ["127.0.0.1:9191".parse().unwrap()];
        assert!(book.admin_addrs_due(exit, &first, &[]));
        assert!(!book.admin_addrs_due(exit, &first, &[]));
        assert!(book.admin_addrs_due(exit, &moved, &[]));
        assert!(!book.admin_addrs_due(exit, &moved, &[]));
        // The same claims sorted otherwise (an egress verified meanwhile).
        assert!(book.admin_addrs_due(exit, &[], &moved));
        assert!(!book.admin_addrs_due(exit, &[], &moved));
        assert!(book.admin_addrs_due(exit, &moved, &[]));
        // The Redis write failed: the next beat writes again.
        book.forget_admin_addrs(exit);
        assert!(book.admin_addrs_due(exit, &moved, &[]));
        assert!(book.admin_addrs_due(Uuid::new_v4(), &moved, &[]));
    }

    #[test]
    fn a_newer_unsaved_beat_replaces_the_older_one() {
        let book = HeartbeatBook::default();
        let exit = Uuid::new_v4();
        book.beat(exit, false, 1);
        book.beat(exit, true, 7);
        book.beat(Uuid::new_v4(), false, 0);
        let unsaved = book.unsaved.lock().unwrap();
        assert_eq!(unsaved.len(), 2);
        let latest = unsaved[&exit];
        assert!(latest.draining);
        assert_eq!(latest.active_tunnels, 7);
    }
}
