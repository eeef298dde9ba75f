//! The fleet view: every `observe_interval_secs` the control-api samples
//! every exit (its row, liveness, drain, provenance verdict, and what every
//! superproxy reports of its health) and every superproxy's totals, then
//!
//! - exports them as Prometheus series (`/metrics` on the admin listener):
//!   per exit, for at most `metrics_exit_limit` exits, so the series count is
//!   bounded however large the fleet (docs/observability.md), and fleet
//!   aggregates by state and source type; and the dedicated addresses each
//!   account holds, for the 1,000 accounts holding most;
//! - keeps the last hour of samples in memory for `/dashboard`, which thus
//!   works without Prometheus.
//!
//! One process samples for the whole fleet: the superproxies export no
//! per-exit series at all.

use chrono::{DateTime, Utc};
use metrics::{counter, gauge};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use uuid::Uuid;

use crate::projector::{FleetHealth, Projector};

/// An exit's state as the dashboard shows it, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitState {
    Disabled,
    Blocked,
    Down,
    Ejected,
    Draining,
    Live,
}

impl ExitState {
    pub fn as_str(self) -> &'static str {
        match self {
            ExitState::Disabled => "disabled",
            ExitState::Blocked => "blocked",
            ExitState::Down => "down",
            ExitState::Ejected => "ejected",
            ExitState::Draining => "draining",
            ExitState::Live => "live",
        }
    }

    pub const ALL: [ExitState; 6] = [
        ExitState::Disabled,
        ExitState::Blocked,
        ExitState::Down,
        ExitState::Ejected,
        ExitState::Draining,
        ExitState::Live,
    ];
}

/// One exit at one sample.
#[derive(Debug, Clone, Serialize)]
pub struct ExitNow {
    pub id: Uuid,
    pub name: String,
    pub source_type: String,
    pub channel: Option<String>,
    pub country: String,
    pub owner: String,
    pub egress_ips: Vec<String>,
    pub egress_prefixes: Vec<String>,
    /// The public addresses the reflector last saw its egress leave from.
    pub observed_egress: Vec<String>,
    /// `verified`, `behind_nat`, `unobserved` or `mismatch`.
    pub egress_verification: String,
    pub state: ExitState,
    /// Why, when blocked by provenance.
    pub blocked: Option<&'static str>,
    pub score: Option<f64>,
    pub probe_rtt_ms: Option<f64>,
    pub success: Option<f64>,
    pub in_flight: u64,
    /// Bytes per second, up + down, over the last interval.
    pub bytes_per_sec: f64,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub superproxies_reporting: usize,
}

/// A point of an exit's history.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ExitPoint {
    pub t: i64,
    pub score: Option<f64>,
    pub probe_rtt_ms: Option<f64>,
    pub success: Option<f64>,
    pub bytes_per_sec: f64,
}

/// A point of the fleet's history.
#[derive(Debug, Clone, Serialize)]
pub struct FleetPoint {
    pub t: i64,
    pub tunnels_per_sec: f64,
    pub bytes_per_sec: f64,
    /// `STATUS:token` → failures per second.
    pub errors_per_sec: BTreeMap<String, f64>,
}

/// Something that happened to an exit (ejected by the fleet, drained, ...).
#[derive(Debug, Clone, Serialize)]
pub struct ExitEvent {
    pub at: DateTime<Utc>,
    pub what: String,
}

#[derive(Default)]
struct History {
    exits: Vec<ExitNow>,
    counts: BTreeMap<(String, String), u64>,
    fleet: VecDeque<FleetPoint>,
    per_exit: HashMap<Uuid, VecDeque<ExitPoint>>,
    events: HashMap<Uuid, VecDeque<ExitEvent>>,
    last_totals: Option<(DateTime<Utc>, proxynet_store::SuperproxyStats)>,
    last_exit: HashMap<Uuid, (DateTime<Utc>, u64, u64, ExitState)>,
    /// The accounts the last sample exported `proxynet_dedicated_ips` for.
    dedicated_accounts: HashSet<Uuid>,
    sampled_at: Option<DateTime<Utc>>,
}

/// The sampled fleet, shared with the dashboard.
#[derive(Clone, Default)]
pub struct Observer {
    inner: Arc<RwLock<History>>,
}

const EVENTS_PER_EXIT: usize = 20;

/// Most accounts exported as `proxynet_dedicated_ips` series, those holding
/// most: the label set stays bounded however many accounts hold addresses.
const DEDICATED_ACCOUNTS_EXPORTED: usize = 1_000;

impl Observer {
    pub fn exits(&self) -> Vec<ExitNow> {
        self.inner
            .read()
            .map(|h| h.exits.clone())
            .unwrap_or_default()
    }

    /// Exits by (state, source type).
    pub fn counts(&self) -> BTreeMap<(String, String), u64> {
        self.inner
            .read()
            .map(|h| h.counts.clone())
            .unwrap_or_default()
    }

    pub fn fleet(&self) -> Vec<FleetPoint> {
        self.inner
            .read()
            .map(|h| h.fleet.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn exit(&self, id: Uuid) -> Option<(ExitNow, Vec<ExitPoint>, Vec<ExitEvent>)> {
        let h = self.inner.read().ok()?;
        let now = h.exits.iter().find(|e| e.id == id)?.clone();
        let points = h
            .per_exit
            .get(&id)
            .map(|p| p.iter().copied().collect())
            .unwrap_or_default();
        let events = h
            .events
            .get(&id)
            .map(|e| e.iter().cloned().collect())
            .unwrap_or_default();
        Some((now, points, events))
    }

    pub fn sampled_at(&self) -> Option<DateTime<Utc>> {
        self.inner.read().ok()?.sampled_at
    }

    /// Samples every `every`, keeping `keep` of history, exporting at most
    /// `exit_limit` exits' series.
    pub async fn run(
        self,
        projector: Projector,
        every: Duration,
        keep: Duration,
        exit_limit: usize,
        stop: proxynet_common::tasks::Stop,
    ) {
        let points = (keep.as_secs() / every.as_secs().max(1)).clamp(2, 3600) as usize;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            if let Err(e) = self.sample(&projector, points, exit_limit).await {
                counter!("proxynet_store_errors_total", "store" => "postgres_or_redis", "op" => "observe").increment(1);
                tracing::debug!(error = %e, "fleet sample failed; keeping the last one");
            }
        }
    }

    async fn sample(
        &self,
        projector: &Projector,
        points: usize,
        exit_limit: usize,
    ) -> Result<(), crate::projector::ProjectionError> {
        let rows = projector.exit_rows().await?;
        let live = projector.live_exits().await?;
        let draining = projector.agent_draining().await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let health = projector.fleet_health(&ids).await?;
        let totals = projector.superproxy_stats().await?;
        let dedicated = projector
            .dedicated_holdings(DEDICATED_ACCOUNTS_EXPORTED)
            .await?;
        let now = Utc::now();

        let mut guard = self.inner.write().map_err(|_| {
            crate::projector::ProjectionError::Internal("observer lock poisoned".into())
        })?;
        let h = &mut *guard;
        let mut exits = Vec::with_capacity(rows.len());
        let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (row, fleet) in rows.iter().zip(health) {
            let blocked = row.provenance_block(projector.strict_egress());
            let state = state_of(
                row.disabled,
                blocked.is_some(),
                live.contains(&row.id),
                &fleet,
                row.draining || draining.contains(&row.id),
            );
            let bytes = fleet.bytes_up + fleet.bytes_down;
            let bytes_per_sec = match h.last_exit.get(&row.id) {
                Some((t, up, down, _)) => {
                    let dt = (now - *t).num_milliseconds().max(1) as f64 / 1000.0;
                    bytes.saturating_sub(up + down) as f64 / dt
                }
                None => 0.0,
            };
            let before = h.last_exit.get(&row.id).map(|(_, _, _, s)| *s);
            if let Some(before) = before {
                if before != state {
                    let events = h.events.entry(row.id).or_default();
                    events.push_back(ExitEvent {
                        at: now,
                        what: format!("{} → {}", before.as_str(), state.as_str()),
                    });
                    while events.len() > EVENTS_PER_EXIT {
                        events.pop_front();
                    }
                }
            }
            h.last_exit
                .insert(row.id, (now, fleet.bytes_up, fleet.bytes_down, state));
            let point = ExitPoint {
                t: now.timestamp(),
                score: fleet.score,
                probe_rtt_ms: fleet.probe_rtt_ms,
                success: fleet.success,
                bytes_per_sec,
            };
            let series = h.per_exit.entry(row.id).or_default();
            series.push_back(point);
            while series.len() > points {
                series.pop_front();
            }
            *counts
                .entry((state.as_str().to_owned(), row.source_type.clone()))
                .or_insert(0) += 1;
            exits.push(ExitNow {
                id: row.id,
                name: row.name.clone(),
                source_type: row.source_type.clone(),
                channel: row.channel.clone(),
                country: row.country.clone(),
                owner: row.owner.clone(),
                egress_ips: row.egress_ips.clone(),
                egress_prefixes: row.egress_prefixes.clone(),
                observed_egress: {
                    // Several egress behind one NAT share one public address.
                    let mut seen = row.observed_egress.clone();
                    seen.sort_unstable();
                    seen.dedup();
                    seen
                },
                egress_verification: row.egress_verification.clone(),
                state,
                blocked: blocked.map(|b| b.as_str()),
                score: fleet.score,
                probe_rtt_ms: fleet.probe_rtt_ms,
                success: fleet.success,
                in_flight: fleet.in_flight,
                bytes_per_sec,
                last_heartbeat_at: row.last_heartbeat_at,
                superproxies_reporting: fleet.superproxies_reporting,
            });
            if exits.len() <= exit_limit {
                export_exit(row.id, row, &fleet, state, live.contains(&row.id));
            }
        }
        // Exits that are gone stop being remembered.
        let present: std::collections::HashSet<Uuid> = ids.iter().copied().collect();
        h.per_exit.retain(|id, _| present.contains(id));
        h.events.retain(|id, _| present.contains(id));
        h.last_exit.retain(|id, _| present.contains(id));

        for ((state, source_type), n) in &counts {
            gauge!("proxynet_fleet_exits", "state" => state.clone(), "source_type" => source_type.clone()).set(*n as f64);
        }
        for state in ExitState::ALL {
            for source_type in ["dc", "isp", "res", "mobile"] {
                if !counts.contains_key(&(state.as_str().to_owned(), source_type.to_owned())) {
                    gauge!("proxynet_fleet_exits", "state" => state.as_str(), "source_type" => source_type).set(0.0);
                }
            }
        }
        counter!("proxynet_fleet_tunnels_opened_total").absolute(totals.tunnels_opened);
        counter!("proxynet_fleet_bytes_total", "direction" => "up").absolute(totals.bytes_up);
        counter!("proxynet_fleet_bytes_total", "direction" => "down").absolute(totals.bytes_down);
        for (kind, n) in &totals.tunnels_failed {
            counter!("proxynet_fleet_tunnels_failed_total", "error" => kind.clone()).absolute(*n);
        }
        if let Some((t, before)) = &h.last_totals {
            let dt = (now - *t).num_milliseconds().max(1) as f64 / 1000.0;
            let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            let point = FleetPoint {
                t: now.timestamp(),
                tunnels_per_sec: rate(totals.tunnels_opened, before.tunnels_opened),
                bytes_per_sec: rate(
                    totals.bytes_up + totals.bytes_down,
                    before.bytes_up + before.bytes_down,
                ),
                errors_per_sec: totals
                    .tunnels_failed
                    .iter()
                    .map(|(k, n)| {
                        (
                            k.clone(),
                            rate(*n, before.tunnels_failed.get(k).copied().unwrap_or(0)),
                        )
                    })
                    .collect(),
            };
            h.fleet.push_back(point);
            while h.fleet.len() > points {
                h.fleet.pop_front();
            }
        }
        h.dedicated_accounts = export_dedicated(
            &dedicated,
            &h.dedicated_accounts,
            DEDICATED_ACCOUNTS_EXPORTED,
        );
        h.last_totals = Some((now, totals));
        h.exits = exits;
        h.counts = counts;
        h.sampled_at = Some(now);
        Ok(())
    }
}

fn state_of(
    disabled: bool,
    blocked: bool,
    live: bool,
    fleet: &FleetHealth,
    draining: bool,
) -> ExitState {
    if disabled {
        ExitState::Disabled
    } else if blocked {
        ExitState::Blocked
    } else if !live {
        ExitState::Down
    } else if fleet.superproxies_reporting > 0
        && fleet.superproxies_seeing_it_available * 2 <= fleet.superproxies_reporting
    {
        // Most superproxies see it unavailable: probes down or ejected.
        ExitState::Ejected
    } else if draining {
        ExitState::Draining
    } else {
        ExitState::Live
    }
}

/// `proxynet_dedicated_ips{account}` for each account in `holdings` (at
/// most `limit`, those holding most); the accounts exported now.
///
/// An account exported `before` and missing now is set to 0 when the list
/// is complete (shorter than `limit`): it holds nothing, and its last count
/// would otherwise stand for the two minutes an idle gauge lives. When the
/// list is cut at `limit` it may merely have been outranked, so its series
/// is left to expire instead.
fn export_dedicated(
    holdings: &[(Uuid, i64)],
    before: &HashSet<Uuid>,
    limit: usize,
) -> HashSet<Uuid> {
    for (account, held) in holdings {
        gauge!("proxynet_dedicated_ips", "account" => account.to_string()).set(*held as f64);
    }
    let exported: HashSet<Uuid> = holdings.iter().map(|(account, _)| *account).collect();
    if holdings.len() < limit {
        for account in before.difference(&exported) {
            gauge!("proxynet_dedicated_ips", "account" => account.to_string()).set(0.0);
        }
    }
    exported
}

/// The per-exit series (labels: the exit id only, plus one info series that
/// carries its descriptive labels for joins).
fn export_exit(
    id: Uuid,
    row: &crate::projector::ExitRow,
    fleet: &FleetHealth,
    state: ExitState,
    live: bool,
) {
    let exit = id.to_string();
    gauge!("proxynet_exit_info", "exit" => exit.clone(), "name" => row.name.clone(),
        "source_type" => row.source_type.clone(), "country" => row.country.clone(),
        "channel" => row.channel.clone().unwrap_or_default())
    .set(1.0);
    for s in ExitState::ALL {
        gauge!("proxynet_exit_state", "exit" => exit.clone(), "state" => s.as_str())
            .set(if s == state { 1.0 } else { 0.0 });
    }
    gauge!("proxynet_exit_live", "exit" => exit.clone()).set(if live { 1.0 } else { 0.0 });
    gauge!("proxynet_exit_available_ratio", "exit" => exit.clone()).set(
        if fleet.superproxies_reporting == 0 {
            0.0
        } else {
            fleet.superproxies_seeing_it_available as f64 / fleet.superproxies_reporting as f64
        },
    );
    gauge!("proxynet_exit_score", "exit" => exit.clone()).set(fleet.score.unwrap_or(0.0));
    gauge!("proxynet_exit_connect_success_ratio", "exit" => exit.clone())
        .set(fleet.success.unwrap_or(0.0));
    gauge!("proxynet_exit_probe_rtt_seconds", "exit" => exit.clone())
        .set(fleet.probe_rtt_ms.unwrap_or(0.0) / 1000.0);
    gauge!("proxynet_exit_in_flight", "exit" => exit.clone()).set(fleet.in_flight as f64);
    gauge!("proxynet_exit_ejections", "exit" => exit.clone()).set(fleet.ejections as f64);
    counter!("proxynet_exit_tunnels_total", "exit" => exit.clone()).absolute(fleet.tunnels);
    counter!("proxynet_exit_bytes_total", "exit" => exit.clone(), "direction" => "up")
        .absolute(fleet.bytes_up);
    counter!("proxynet_exit_bytes_total", "exit" => exit, "direction" => "down")
        .absolute(fleet.bytes_down);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(reporting: usize, available: usize) -> FleetHealth {
        FleetHealth {
            superproxies_reporting: reporting,
            superproxies_seeing_it_available: available,
            superproxies_ejecting_it: reporting - available,
            score: None,
            success: None,
            probe_rtt_ms: None,
            in_flight: 0,
            ejections: 0,
            tunnels: 0,
            bytes_up: 0,
            bytes_down: 0,
        }
    }

    #[test]
    fn the_worst_condition_names_the_state() {
        let seen = health(3, 3);
        let ejected = health(3, 1);
        assert_eq!(
            state_of(true, true, false, &ejected, true),
            ExitState::Disabled
        );
        assert_eq!(
            state_of(false, true, false, &ejected, true),
            ExitState::Blocked
        );
        assert_eq!(
            state_of(false, false, false, &ejected, true),
            ExitState::Down
        );
        assert_eq!(
            state_of(false, false, true, &ejected, true),
            ExitState::Ejected
        );
        assert_eq!(
            state_of(false, false, true, &seen, true),
            ExitState::Draining
        );
        assert_eq!(state_of(false, false, true, &seen, false), ExitState::Live);
    }

    #[test]
    fn a_live_exit_is_ejected_once_half_the_reporting_superproxies_lose_it() {
        let state = |h: &FleetHealth| state_of(false, false, true, h, false);
        assert_eq!(state(&health(4, 2)), ExitState::Ejected);
        assert_eq!(state(&health(4, 3)), ExitState::Live);
        assert_eq!(state(&health(1, 0)), ExitState::Ejected);
        // No superproxy reporting yet is no evidence against it.
        assert_eq!(state(&health(0, 0)), ExitState::Live);
    }

    #[test]
    fn states_sort_worst_first_and_serialize_as_their_names() {
        let mut states = ExitState::ALL;
        states.reverse();
        states.sort();
        assert_eq!(states, ExitState::ALL);
        assert_eq!(states[0], ExitState::Disabled);
        for state in ExitState::ALL {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }

    #[test]
    fn an_observer_that_never_sampled_knows_no_exit() {
        let observer = Observer::default();
        assert!(observer.exits().is_empty());
        assert!(observer.counts().is_empty());
        assert!(observer.fleet().is_empty());
        assert_eq!(observer.sampled_at(), None);
        assert!(observer.exit(Uuid::new_v4()).is_none());
    }
}
