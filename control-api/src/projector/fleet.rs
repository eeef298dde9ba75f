//! Reading the fleet back for the health views: every exit's row, the
//! superproxies' summed totals and the health they publish per exit.

use super::*;

impl Projector {
    /// Every exit with its source and consent verdict (the same rows the
    /// projection writes), for the fleet view.
    pub async fn exit_rows(&self) -> Result<Vec<ExitRow>, ProjectionError> {
        Ok(sqlx::query_as(EXIT_SELECT).fetch_all(&self.db).await?)
    }

    /// Dedicated addresses (and prefixes) held now, per account, the
    /// `limit` accounts holding most first (ties by id, so the cut is stable
    /// from one sample to the next).
    pub async fn dedicated_holdings(
        &self,
        limit: usize,
    ) -> Result<Vec<(Uuid, i64)>, ProjectionError> {
        Ok(sqlx::query_as(
            "SELECT account_id, count(*) FROM dedicated_ips WHERE released_at IS NULL
              GROUP BY account_id ORDER BY count(*) DESC, account_id LIMIT $1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.db)
        .await?)
    }

    /// The summed running totals of every live superproxy.
    pub async fn superproxy_stats(
        &self,
    ) -> Result<proxynet_store::SuperproxyStats, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis::Script::new(LIVE_MEMBERS_SCRIPT)
            .key(self.keys.superproxies_live())
            .invoke_async(&mut redis)
            .await?;
        let mut total = proxynet_store::SuperproxyStats::default();
        let keys: Vec<String> = ids
            .iter()
            .filter_map(|s| s.parse::<Uuid>().ok())
            .map(|id| self.keys.stats(id))
            .collect();
        if keys.is_empty() {
            return Ok(total);
        }
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut redis)
            .await?;
        for one in values
            .into_iter()
            .flatten()
            .filter_map(|j| serde_json::from_str::<proxynet_store::SuperproxyStats>(&j).ok())
        {
            total.tunnels_opened += one.tunnels_opened;
            total.bytes_up += one.bytes_up;
            total.bytes_down += one.bytes_down;
            for (k, v) in one.tunnels_failed {
                *total.tunnels_failed.entry(k).or_insert(0) += v;
            }
        }
        Ok(total)
    }

    /// How every superproxy currently sees `exits` (their published health
    /// observations), in the order given.
    pub async fn fleet_health(&self, exits: &[Uuid]) -> Result<Vec<FleetHealth>, ProjectionError> {
        if exits.is_empty() {
            return Ok(Vec::new());
        }
        let reports: Vec<HashMap<String, String>> = self
            .redis
            .query_batch(
                exits
                    .iter()
                    .map(|id| {
                        let mut cmd = redis::cmd("HGETALL");
                        cmd.arg(self.keys.health(*id));
                        cmd
                    })
                    .collect(),
            )
            .await?;
        Ok(reports
            .into_iter()
            .map(|by_superproxy| {
                let views: Vec<serde_json::Value> = by_superproxy
                    .values()
                    .filter_map(|v| serde_json::from_str(v).ok())
                    .collect();
                let reporting = views.len();
                let available = views.iter().filter(|v| v["available"] == true).count();
                let mean = |field: &str| {
                    (reporting > 0).then(|| {
                        views.iter().filter_map(|v| v[field].as_f64()).sum::<f64>()
                            / reporting as f64
                    })
                };
                let sum = |field: &str| views.iter().filter_map(|v| v[field].as_u64()).sum();
                FleetHealth {
                    superproxies_reporting: reporting,
                    superproxies_seeing_it_available: available,
                    superproxies_ejecting_it: views.iter().filter(|v| v["ejected"] == true).count(),
                    score: mean("score"),
                    success: mean("success_ewma"),
                    probe_rtt_ms: mean("probe_rtt_ms").filter(|v| *v > 0.0),
                    in_flight: sum("in_flight"),
                    ejections: sum("ejections"),
                    tunnels: sum("tunnels"),
                    bytes_up: sum("bytes_up"),
                    bytes_down: sum("bytes_down"),
                }
            })
            .collect())
    }
}

/// An exit's health as the superproxy fleet reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetHealth {
    pub superproxies_reporting: usize,
    pub superproxies_seeing_it_available: usize,
    /// Superproxies that currently eject it (passive faults).
    pub superproxies_ejecting_it: usize,
    /// Mean of the reporting superproxies' scores.
    pub score: Option<f64>,
    /// Mean connect success rate (EWMA) over the reporting superproxies.
    pub success: Option<f64>,
    /// Mean active-probe round trip, ms.
    pub probe_rtt_ms: Option<f64>,
    /// Tunnels open through the exit, summed over superproxies.
    pub in_flight: u64,
    /// Ejections so far, summed over superproxies.
    pub ejections: u64,
    /// Tunnels opened and bytes moved through it, summed over superproxies
    /// (totals since each superproxy linked it).
    pub tunnels: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}
