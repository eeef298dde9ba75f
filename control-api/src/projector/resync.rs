//! The full re-projection: every user and exit rewritten from Postgres,
//! stale keys removed, quota counters rebuilt, and the loop that runs it
//! on a period and at once when Redis lost the projection.

use super::*;
use proxynet_common::tasks::Stop;

impl Projector {
    /// Full re-projection of users and exits; removes user keys that no longer
    /// correspond to a live user.
    pub async fn resync(&self) -> Result<(), ProjectionError> {
        let users: Vec<UserRow> = sqlx::query_as(&format!(
            "SELECT {USER_COLUMNS} FROM {USERS_FROM} WHERE u.deleted_at IS NULL"
        ))
        .fetch_all(&self.db)
        .await?;
        let mut redis = self.redis.clone();
        // One pipeline per bucket (one hash slot each), several in flight.
        let mut by_bucket: HashMap<u8, Vec<&UserRow>> = HashMap::new();
        for row in &users {
            by_bucket
                .entry(user_bucket(&row.username))
                .or_default()
                .push(row);
        }
        let mut puts = Vec::new();
        for rows in by_bucket.values() {
            for chunk in rows.chunks(500) {
                let mut group = Vec::with_capacity(chunk.len());
                for row in chunk {
                    let json = serde_json::to_string(&user_record(row))?;
                    group.push(self.put_user(&row.username, &json, row.version, None));
                }
                puts.push(group);
            }
        }
        redis.exec_groups(puts).await?;
        // Keys of users this snapshot does not have: deleted while Redis was
        // away, or created after the snapshot. Each is re-checked on its own,
        // guarded by the version the key holds now. The bucket indexes list
        // every key (SCAN would see one node of a cluster only).
        let wanted: HashSet<&str> = users.iter().map(|u| u.username.as_str()).collect();
        let indexed: Vec<Vec<String>> = redis
            .query_batch(
                (0..USER_BUCKETS)
                    .map(|bucket| {
                        let mut cmd = redis::cmd("SMEMBERS");
                        cmd.arg(self.keys.users_in_bucket(bucket as u8));
                        cmd
                    })
                    .collect(),
            )
            .await?;
        let stale: Vec<String> = indexed
            .into_iter()
            .flatten()
            .filter(|name| !wanted.contains(name.as_str()))
            .collect();
        for username in stale {
            let key = self.keys.user(&username);
            let held: Option<String> = redis.get(&key).await?;
            if held.is_none() {
                // An expired tombstone (or a key lost with its node): only
                // the index entry is left to drop. Bound 0: a key written for
                // the name meanwhile (a user created again) is kept.
                let _: i64 = redis::Script::new(DEL_USER_SCRIPT)
                    .key(&key)
                    .key(self.keys.users_in_bucket(user_bucket(&username)))
                    .arg(0)
                    .arg(&username)
                    .invoke_async(&mut redis)
                    .await?;
                continue;
            }
            let version = held
                .as_deref()
                .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
                .and_then(|v| v["version"].as_i64());
            if held
                .as_deref()
                .and_then(|j| serde_json::from_str::<Tombstone>(j).ok())
                .is_some_and(|t| t.deleted)
            {
                continue; // a tombstone expires on its own
            }
            self.project_user(&username, Some(version.unwrap_or(0)))
                .await?;
        }

        self.rebuild_quota_counters(&users).await?;
        self.try_allowlist().await?;
        self.try_operator_policy().await?;

        let exits: Vec<ExitRow> = sqlx::query_as(EXIT_SELECT).fetch_all(&self.db).await?;
        // Unchanged records are not rewritten and make no change entry, so a
        // resync of 100,000 unchanged exits costs the superproxies nothing.
        let put = redis::Script::new(PUT_EXIT_SCRIPT);
        let _: Result<String, _> = put.prepare_invoke().load_async(&mut redis).await;
        for chunk in exits.chunks(500) {
            let mut pipe = redis::pipe();
            for row in chunk {
                pipe.cmd("EVALSHA")
                    .arg(put.get_hash())
                    .arg(2)
                    .arg(self.keys.exit(row.id))
                    .arg(self.keys.exit_changes())
                    .arg(serde_json::to_string(&row.to_record(self.strict_egress))?)
                    .arg(row.version)
                    .arg(row.id.to_string())
                    .arg(EXIT_CHANGES_KEPT)
                    .ignore();
            }
            let _: () = pipe.query_async(&mut redis).await?;
        }
        Ok(())
    }

    /// Runs [`Self::resync`] now, every `period`, and at once whenever Redis
    /// (or one cluster node) comes back empty — a restart without
    /// persistence, a flush: the projection markers written after each full
    /// resync ([`Keys::projection_markers`]) are counted every second, so
    /// users and exits reappear within a second of Redis returning.
    pub async fn run_resync_loop(self, period: Duration, stop: Stop) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_full: Option<std::time::Instant> = None;
        let markers = self.keys.projection_markers();
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            let mut redis = self.redis.clone();
            // One EXISTS over every marker (split per node on a cluster).
            let markers_present: Result<usize, _> = redis.exists(&markers).await;
            let due = last_full.is_none_or(|t| t.elapsed() >= period);
            match markers_present.map(|n| n == markers.len()) {
                Ok(true) if !due => continue,
                Ok(present) => {
                    if !present && last_full.is_some() {
                        tracing::warn!(
                            "redis lost the projection (restart or flush); re-projecting now"
                        );
                    }
                }
                Err(_) => continue, // Redis is down: nothing to write to yet.
            }
            match self.resync().await {
                Ok(()) => {
                    let pairs: Vec<(&String, &str)> = markers.iter().map(|m| (m, "1")).collect();
                    let _: Result<(), _> = redis.mset(&pairs).await;
                    tracing::debug!("redis projection resynced");
                    // After the markers: superproxies need not wait for a
                    // walk of the whole keyspace to stop running degraded.
                    if last_full.is_none() {
                        self.remove_legacy_user_keys().await;
                    }
                    last_full = Some(std::time::Instant::now());
                }
                Err(e) => tracing::warn!(error = %e, "redis projection resync failed; retrying"),
            }
        }
    }

    /// Releases before bucketed user keys wrote `user:{NAME}` and one
    /// `projection:complete` marker. Once the new layout is projected they are
    /// removed, so a superproxy of the old release still running cannot keep
    /// authenticating from records nobody updates any more (without them it
    /// falls back to its cache and reports the store degraded until it is
    /// upgraded). Those releases ran on a single Redis only, so SCAN sees
    /// every such key; on a cluster there is nothing to remove.
    async fn remove_legacy_user_keys(&self) {
        let RedisConnection::Single(conn) = &self.redis else {
            return;
        };
        let mut redis = conn.clone();
        // `user:{NAME}` ends in `}`; a bucketed key ends in its username,
        // which never holds a brace.
        let literal_prefix: String = self
            .keys
            .prefix()
            .chars()
            .flat_map(|c| {
                let glob = matches!(c, '*' | '?' | '[' | ']' | '\\');
                glob.then_some('\\').into_iter().chain([c])
            })
            .collect();
        let pattern = format!("{literal_prefix}user:{{*}}");
        let mut legacy: Vec<String> = Vec::new();
        let scan = redis::ScanOptions::default()
            .with_pattern(pattern)
            .with_count(1_000);
        if let Ok(mut keys) = redis.scan_options::<String>(scan).await {
            while let Some(Ok(key)) = keys.next_item().await {
                legacy.push(key);
            }
        }
        legacy.push(format!("{}projection:complete", self.keys.prefix()));
        for chunk in legacy.chunks(1_000) {
            let removed: Result<i64, _> = redis.del(chunk).await;
            if let Ok(n @ 1..) = removed {
                tracing::info!(removed = n, "removed user keys of the previous key layout");
            }
        }
    }

    /// Quota counters that Redis lost (restart, flush) are rebuilt from the
    /// ledger, never left at zero; live counters are not touched (`SET NX`).
    /// The accounts' totals too.
    async fn rebuild_quota_counters(&self, users: &[UserRow]) -> Result<(), ProjectionError> {
        let now = chrono::Utc::now().timestamp();
        let mut accounts_done = HashSet::new();
        for user in users
            .iter()
            .filter(|u| u.entitlements.0.limits.bandwidth_bytes.is_some())
        {
            if !accounts_done.insert(user.account_id) {
                continue;
            }
            let (window, start, end) = user.entitlements.0.limits.period().window(now);
            let key = self.keys.account_quota_used(user.account_id, &window);
            self.rebuild_counter(&key, LedgerScope::Account, user.account_id, start, end)
                .await?;
        }
        for user in users.iter().filter(|u| u.bandwidth_bytes.is_some()) {
            let period = QuotaPeriod::parse(&user.quota_period).unwrap_or_default();
            let (window, start, end) = period.window(now);
            let key = self.keys.quota_used(user.id, &window);
            self.rebuild_counter(&key, LedgerScope::User, user.id, start, end)
                .await?;
        }
        Ok(())
    }

    /// Sets `key`, if Redis lost it, to the bytes the ledger holds for `id`
    /// in `[start, end)`; it expires a week after the window.
    async fn rebuild_counter(
        &self,
        key: &str,
        scope: LedgerScope,
        id: Uuid,
        start: i64,
        end: i64,
    ) -> Result<(), ProjectionError> {
        let mut redis = self.redis.clone();
        let exists: bool = redis.exists(key).await?;
        if exists {
            return Ok(());
        }
        let sql = match scope {
            LedgerScope::Account => {
                "SELECT COALESCE(SUM(bytes_up + bytes_down), 0)::bigint FROM usage_ledger
                  WHERE account_id = $1 AND minute >= to_timestamp($2) AND minute < to_timestamp($3)"
            }
            LedgerScope::User => {
                "SELECT COALESCE(SUM(bytes_up + bytes_down), 0)::bigint FROM usage_ledger
                  WHERE user_id = $1 AND minute >= to_timestamp($2) AND minute < to_timestamp($3)"
            }
        };
        let (used,): (i64,) = sqlx::query_as(sql)
            .bind(id)
            .bind(start as f64)
            .bind(end as f64)
            .fetch_one(&self.db)
            .await?;
        let _: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(used)
            .arg("NX")
            .arg("EXAT")
            .arg(end + 7 * 86_400)
            .query_async(&mut redis)
            .await?;
        Ok(())
    }
}
