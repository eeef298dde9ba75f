//! Reading the pool from Redis: once in full, then one delta script per
//! refresh returning only the exits that changed or expired since the cursor.

use super::*;

/// One exit as a delta reports it.
pub(super) struct Changed {
    pub(super) id: Uuid,
    pub(super) live: bool,
    pub(super) agent_draining: bool,
    pub(super) record: Option<ExitRecord>,
}

pub(super) enum Read {
    Full {
        now_ms: i64,
        cursor: String,
        live: HashSet<Uuid>,
        agent_draining: HashSet<Uuid>,
        records: HashMap<Uuid, Arc<ExitRecord>>,
        control_present: bool,
    },
    Delta {
        now_ms: i64,
        cursor: String,
        expired: Vec<Uuid>,
        changed: Vec<Changed>,
        control_present: bool,
    },
}

/// Why a refresh kept the last known pool.
pub(super) enum ReadError {
    Redis(redis::RedisError),
    /// Redis answers but lost the projection (restart, flush) and the
    /// control-api has not rebuilt it yet: an empty read would be a lie.
    NotProjected,
}

impl From<redis::RedisError> for ReadError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}

impl Pool {
    /// The whole pool: live and draining sets, then every live exit's record.
    /// Refused while Redis holds no complete projection (back from a restart,
    /// not yet re-projected): its exit records would be missing, and an empty
    /// read must not replace the last known pool.
    pub(super) async fn read_full(&self) -> Result<Read, ReadError> {
        let mut redis = self.redis.clone();
        let projected: bool = redis.exists(self.keys.exits_projected()).await?;
        if !projected {
            return Err(ReadError::NotProjected);
        }
        let (now_ms, cursor, ids, draining, control): (i64, String, Vec<String>, Vec<String>, i64) =
            redis::Script::new(LIVE_AND_DRAINING_SCRIPT)
                .key(self.keys.exits_live())
                .key(self.keys.exits_draining())
                .key(self.keys.exit_changes())
                .key(self.keys.control_plane_alive())
                .invoke_async(&mut redis)
                .await?;
        let live: HashSet<Uuid> = ids.iter().filter_map(|s| s.parse().ok()).collect();
        let agent_draining: HashSet<Uuid> =
            draining.iter().filter_map(|s| s.parse().ok()).collect();
        let mut records = HashMap::with_capacity(live.len());
        // Linked exits too, live or not: their provenance is judged (and
        // their tunnels cut on a block) whatever their heartbeats say.
        let ids: Vec<Uuid> = live
            .iter()
            .copied()
            .chain(
                self.registry
                    .snapshot()
                    .into_keys()
                    .filter(|id| !live.contains(id)),
            )
            .collect();
        // Every record shares the `{exits}` slot, so MGET works on a cluster too.
        for chunk in ids.chunks(1000) {
            let keys: Vec<String> = chunk.iter().map(|id| self.keys.exit(*id)).collect();
            let values: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(&mut redis)
                .await?;
            for json in values.into_iter().flatten() {
                if let Ok(record) = serde_json::from_str::<ExitRecord>(&json) {
                    records.insert(record.id, Arc::new(record));
                }
            }
        }
        Ok(Read::Full {
            now_ms,
            cursor,
            live,
            agent_draining,
            records,
            control_present: control == 1,
        })
    }

    /// What changed since `cursor`; `None` when the stream lost our place.
    /// (A delta needs no projection check: a Redis that lost the projection
    /// lost the change stream with it, and so our place.)
    pub(super) async fn read_delta(
        &self,
        cursor: &str,
        read_at_ms: i64,
    ) -> Result<Option<Read>, redis::RedisError> {
        let mut redis = self.redis.clone();
        type Reply = (i64, i64, String, Vec<String>, Vec<redis::Value>, i64);
        let (now_ms, complete, cursor, expired, flat, control): Reply =
            redis::Script::new(POOL_DELTA_SCRIPT)
                .key(self.keys.exits_live())
                .key(self.keys.exits_draining())
                .key(self.keys.exit_changes())
                .key(self.keys.control_plane_alive())
                .arg(read_at_ms)
                .arg(cursor)
                .arg(DELTA_BATCH)
                .arg(self.keys.exit_prefix())
                .invoke_async(&mut redis)
                .await?;
        if complete == 0 {
            return Ok(None);
        }
        let text = |v: &redis::Value| -> String {
            redis::from_redis_value_ref::<String>(v).unwrap_or_default()
        };
        let changed = flat
            .chunks_exact(4)
            .filter_map(|entry| {
                let id: Uuid = text(&entry[0]).parse().ok()?;
                let expiry: Option<i64> = text(&entry[1]).parse::<f64>().ok().map(|s| s as i64);
                let agent_draining =
                    redis::from_redis_value_ref::<i64>(&entry[2]).unwrap_or(0) == 1;
                let record = serde_json::from_str::<ExitRecord>(&text(&entry[3])).ok();
                Some(Changed {
                    id,
                    live: expiry.is_some_and(|e| e > now_ms),
                    agent_draining,
                    record,
                })
            })
            .collect();
        Ok(Some(Read::Delta {
            now_ms,
            cursor,
            expired: expired.iter().filter_map(|s| s.parse().ok()).collect(),
            changed,
            control_present: control == 1,
        }))
    }
}
