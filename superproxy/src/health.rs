//! Exit health as this superproxy sees it: active probes, passive outcomes,
//! ejection with growing back-off, and the guards that keep a broken
//! measuring stick from emptying the pool.
//!
//! - **Active**: every `probe_interval` each linked exit gets a `GET` probe on
//!   its link, answered by the agent without dialling anything. After
//!   `unhealthy_threshold` consecutive failures (timeout `probe_timeout`) the
//!   exit is down; after `healthy_threshold` consecutive successes it is up
//!   again. Worst-case detection of a blackholed exit:
//!   `probe_interval × unhealthy_threshold + probe_timeout`.
//! - **Passive**: real tunnel outcomes that are the exit's fault (link not
//!   ready, stream refused, exit draining or full, link lost) — never a
//!   target's refusal, timeout or slowness — feed an EWMA of success;
//!   `eject_after` consecutive exit faults eject the exit for
//!   `eject_base × 2^(ejections so far)`, capped at `eject_max`.
//! - **The score measures the exit, never the target**: its latency term is
//!   the probe round trip (link and agent, no target in it), and answered
//!   probes lift the success EWMA, so an idle exit's score recovers without
//!   customer traffic. A tunnel's open time includes the target's connect time, so it
//!   is recorded for display only: customers connecting to slow targets
//!   cannot steer traffic away from an exit.
//! - **Guards**: passive ejection never takes out more than
//!   `max_ejected_percent` of the linked exits; if fewer than
//!   `panic_threshold_percent` are available, health is ignored and every
//!   linked exit is used (failing some requests beats failing all).
//! - **Load**: in-flight tunnels per exit, with a per-exit `capacity`.
//!
//! docs/health.md explains the model with its numbers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Debug, Clone, Copy)]
pub struct HealthConfig {
    pub probe_interval: Duration,
    pub probe_timeout: Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    pub eject_after: u32,
    pub eject_base: Duration,
    pub eject_max: Duration,
    pub max_ejected_percent: u32,
    pub panic_threshold_percent: u32,
    pub capacity: u32,
}

impl HealthConfig {
    /// `probe_interval × unhealthy_threshold + probe_timeout`.
    pub fn worst_case_detection(&self) -> Duration {
        self.probe_interval * self.unhealthy_threshold + self.probe_timeout
    }
}

/// EWMA weight of the newest observation.
const EWMA_ALPHA: f64 = 0.2;

/// Answered probes whose minimum round trip stands for the exit's latency.
const RTT_WINDOW: usize = 5;

/// An exit without a tunnel outcome for this long is re-measured by its
/// probes alone (they lift its success EWMA).
const PROBES_LIFT_AFTER: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct State {
    probe_up: bool,
    probe_ok_streak: u32,
    probe_fail_streak: u32,
    success_ewma: f64,
    latency_ewma_ms: f64,
    fault_streak: u32,
    ejections: u32,
    probe_rtt_ms: f64,
    /// The last few answered probes' round trips (0: none yet): their
    /// minimum is the exit's own latency in the score, so one probe that
    /// waited out a hiccup does not starve an exit, while an exit that is
    /// slow on every probe is.
    recent_rtt_ms: [f64; RTT_WINDOW],
    recent_next: usize,
    /// When a real tunnel last reported an outcome through it.
    last_outcome: Option<Instant>,
    ejected_until: Option<Instant>,
    /// Share of the superproxy fleet (this one included) that last reported
    /// the exit available; 1.0 until reports exist.
    fleet_available: f64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            // A newly linked exit is trusted until probes say otherwise: its
            // agent just proved itself with a handshake.
            probe_up: true,
            probe_ok_streak: 0,
            probe_fail_streak: 0,
            success_ewma: 1.0,
            latency_ewma_ms: 1.0,
            fault_streak: 0,
            ejections: 0,
            probe_rtt_ms: 0.0,
            recent_rtt_ms: [0.0; RTT_WINDOW],
            recent_next: 0,
            last_outcome: None,
            ejected_until: None,
            fleet_available: 1.0,
        }
    }
}

/// One exit's health.
#[derive(Debug, Default)]
pub struct ExitHealth {
    state: Mutex<State>,
    in_flight: AtomicU32,
    /// Tunnels opened through it here since it linked.
    tunnels: std::sync::atomic::AtomicU64,
}

/// A snapshot for the admin endpoint and the fleet report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HealthView {
    pub probe_up: bool,
    pub ejected: bool,
    pub available: bool,
    pub score: f64,
    pub success_ewma: f64,
    pub latency_ewma_ms: f64,
    pub in_flight: u32,
    pub ejections: u32,
    /// EWMA of active-probe round trips, ms (0 until one succeeded).
    pub probe_rtt_ms: f64,
    /// Tunnels opened through the exit here since it linked.
    pub tunnels: u64,
}

impl ExitHealth {
    fn ejected(state: &State, now: Instant) -> bool {
        state.ejected_until.is_some_and(|t| t > now)
    }

    pub fn available(&self, now: Instant) -> bool {
        self.state
            .lock()
            .map(|s| s.probe_up && !Self::ejected(&s, now))
            .unwrap_or(true)
    }

    /// Higher is better: local success rate discounted by connect latency,
    /// weighted by how much of the fleet sees the exit available. A blip seen
    /// by one superproxy moves the score a little; what everyone sees moves it
    /// a lot; nothing is ejected by the fleet score alone.
    pub fn score(&self) -> f64 {
        self.state.lock().map(|s| score_of(&s)).unwrap_or(0.0)
    }

    pub fn set_fleet_available(&self, share: f64) {
        if let Ok(mut s) = self.state.lock() {
            s.fleet_available = share.clamp(0.0, 1.0);
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn view(&self, now: Instant) -> HealthView {
        let s = self.state.lock().map(|s| *s).unwrap_or_default();
        let ejected = Self::ejected(&s, now);
        HealthView {
            probe_up: s.probe_up,
            ejected,
            available: s.probe_up && !ejected,
            score: score_of(&s),
            success_ewma: s.success_ewma,
            latency_ewma_ms: s.latency_ewma_ms,
            in_flight: self.in_flight(),
            ejections: s.ejections,
            probe_rtt_ms: s.probe_rtt_ms,
            tunnels: self.tunnels.load(Ordering::Relaxed),
        }
    }
}

/// Counts a tunnel against its exit until dropped.
pub struct InFlight(Arc<ExitHealth>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct HealthBook {
    pub config: HealthConfig,
    exits: RwLock<HashMap<Uuid, Arc<ExitHealth>>>,
    /// Recomputed each probe round, read on every pick.
    panic: std::sync::atomic::AtomicBool,
}

impl HealthBook {
    pub fn new(config: HealthConfig) -> Self {
        Self {
            config,
            exits: RwLock::new(HashMap::new()),
            panic: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn exit(&self, id: Uuid) -> Arc<ExitHealth> {
        if let Some(h) = self.exits.read().ok().and_then(|m| m.get(&id).cloned()) {
            return h;
        }
        match self.exits.write() {
            Ok(mut m) => m.entry(id).or_default().clone(),
            Err(_) => Arc::new(ExitHealth::default()),
        }
    }

    /// Forgets exits that are no longer linked.
    pub fn retain(&self, linked: &[Uuid]) {
        if let Ok(mut m) = self.exits.write() {
            m.retain(|id, _| linked.contains(id));
        }
    }

    pub fn start_tunnel(&self, id: Uuid) -> InFlight {
        let h = self.exit(id);
        h.in_flight.fetch_add(1, Ordering::Relaxed);
        h.tunnels.fetch_add(1, Ordering::Relaxed);
        InFlight(h)
    }

    pub fn at_capacity(&self, id: Uuid) -> bool {
        self.exit(id).in_flight() >= self.config.capacity
    }

    pub fn record_probe(&self, id: Uuid, rtt: Option<Duration>) {
        let ok = rtt.is_some();
        let h = self.exit(id);
        let Ok(mut s) = h.state.lock() else { return };
        if let Some(rtt) = rtt {
            let ms = rtt.as_secs_f64() * 1000.0;
            let slot = s.recent_next % RTT_WINDOW;
            s.recent_rtt_ms[slot] = ms.max(f64::MIN_POSITIVE);
            s.recent_next = s.recent_next.wrapping_add(1);
            s.probe_rtt_ms = if s.probe_rtt_ms == 0.0 {
                ms
            } else {
                EWMA_ALPHA * ms + (1.0 - EWMA_ALPHA) * s.probe_rtt_ms
            };
        }
        // An answered probe of an exit no tunnel has used lately lifts the
        // success EWMA, so an idle exit recovers without customer traffic;
        // while real tunnels report, they are the signal (probes must not
        // hide intermittent faults). A failed probe is the probes' own
        // business (`probe_up`): counting it here too would keep a
        // readmitted exit starved long after it answers again.
        if ok
            && s.last_outcome
                .is_none_or(|t| t.elapsed() >= PROBES_LIFT_AFTER)
        {
            s.success_ewma = ewma(s.success_ewma, 1.0);
        }
        if ok {
            s.probe_ok_streak += 1;
            s.probe_fail_streak = 0;
            if !s.probe_up && s.probe_ok_streak >= self.config.healthy_threshold {
                s.probe_up = true;
                tracing::info!(exit = %id, "exit passed its probes; readmitted");
            }
        } else {
            s.probe_fail_streak += 1;
            s.probe_ok_streak = 0;
            if s.probe_up && s.probe_fail_streak >= self.config.unhealthy_threshold {
                s.probe_up = false;
                tracing::warn!(exit = %id, "exit failed its probes; marked down");
            }
        }
    }

    /// A real tunnel's outcome. `exit_fault` is false for successes and for
    /// failures that are the target's (refused, timed out, DNS). `latency`
    /// (stream open to answer, the target's connect included) is kept for
    /// display; it does not move the score.
    pub fn record_outcome(
        &self,
        id: Uuid,
        exit_fault: bool,
        latency: Option<Duration>,
        linked: usize,
    ) {
        let h = self.exit(id);
        let now = Instant::now();
        let eject = {
            let Ok(mut s) = h.state.lock() else { return };
            s.last_outcome = Some(now);
            s.success_ewma = ewma(s.success_ewma, if exit_fault { 0.0 } else { 1.0 });
            if let Some(l) = latency {
                s.latency_ewma_ms = ewma(s.latency_ewma_ms, l.as_secs_f64() * 1000.0);
            }
            if !exit_fault {
                s.fault_streak = 0;
                // Forgiveness: a clean run after an ejection shortens the next one.
                if !ExitHealth::ejected(&s, now) && s.ejected_until.is_some() {
                    s.ejections = s.ejections.saturating_sub(1);
                    s.ejected_until = None;
                }
                return;
            }
            s.fault_streak += 1;
            s.fault_streak >= self.config.eject_after && !ExitHealth::ejected(&s, now)
        };
        // The guard counts this ejection too: never above the share.
        let within_share = (self.ejected_count(now) + 1) * 100
            <= self.config.max_ejected_percent as usize * linked.max(1);
        if eject && within_share {
            if let Ok(mut s) = h.state.lock() {
                let backoff = self
                    .config
                    .eject_base
                    .saturating_mul(1u32 << s.ejections.min(16))
                    .min(self.config.eject_max);
                s.ejected_until = Some(now + backoff);
                s.ejections += 1;
                s.fault_streak = 0;
                tracing::warn!(exit = %id, backoff_ms = backoff.as_millis() as u64, "exit ejected after repeated faults");
            }
        } else if eject {
            tracing::warn!(exit = %id, "not ejecting: the max-ejected share is reached");
        }
    }

    fn ejected_count(&self, now: Instant) -> usize {
        self.exits
            .read()
            .map(|m| {
                m.values()
                    .filter(|h| {
                        h.state
                            .lock()
                            .map(|s| ExitHealth::ejected(&s, now))
                            .unwrap_or(false)
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// Panic mode as of the last probe round.
    pub fn in_panic(&self) -> bool {
        self.panic.load(Ordering::Relaxed)
    }

    /// Recomputes panic mode for the current linked set (once per probe round).
    pub fn update_panic(&self, linked: &[Uuid]) {
        let panicking = self.panicking(linked, Instant::now());
        if panicking != self.panic.swap(panicking, Ordering::Relaxed) {
            if panicking {
                tracing::warn!("panic mode: too few exits look healthy; ignoring health");
            } else {
                tracing::info!("panic mode over");
            }
        }
    }

    /// True when fewer than `panic_threshold_percent` of `linked` exits are
    /// available: then health is ignored.
    pub fn panicking(&self, linked: &[Uuid], now: Instant) -> bool {
        if linked.is_empty() {
            return false;
        }
        let available = linked
            .iter()
            .filter(|id| self.exit(**id).available(now))
            .count();
        available * 100 < self.config.panic_threshold_percent as usize * linked.len()
    }
}

/// Success discounted by the exit's own round trip (the least of its recent
/// probes': link and agent, no target), weighted by how much of the fleet
/// sees it available.
fn score_of(s: &State) -> f64 {
    let own_rtt = s
        .recent_rtt_ms
        .iter()
        .copied()
        .filter(|ms| *ms > 0.0)
        .fold(f64::INFINITY, f64::min);
    let own_rtt = if own_rtt.is_finite() { own_rtt } else { 0.0 };
    s.success_ewma / (1.0 + own_rtt / 50.0) * (0.5 + 0.5 * s.fleet_available)
}

fn ewma(old: f64, new: f64) -> f64 {
    EWMA_ALPHA * new + (1.0 - EWMA_ALPHA) * old
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> HealthConfig {
        HealthConfig {
            probe_interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            eject_after: 3,
            eject_base: Duration::from_secs(5),
            eject_max: Duration::from_secs(60),
            max_ejected_percent: 50,
            panic_threshold_percent: 30,
            capacity: 2,
        }
    }

    #[test]
    fn probes_need_their_thresholds_both_ways() {
        let book = HealthBook::new(config());
        let id = Uuid::new_v4();
        let now = Instant::now();
        book.record_probe(id, None);
        book.record_probe(id, None);
        assert!(book.exit(id).available(now), "two failures are not three");
        book.record_probe(id, None);
        assert!(!book.exit(id).available(now));
        book.record_probe(id, Some(Duration::from_millis(1)));
        assert!(!book.exit(id).available(now), "one success is not two");
        book.record_probe(id, Some(Duration::from_millis(1)));
        assert!(book.exit(id).available(now));
        assert_eq!(config().worst_case_detection(), Duration::from_secs(7));
    }

    #[test]
    fn exit_faults_eject_with_growing_backoff_and_target_faults_do_not() {
        let book = HealthBook::new(config());
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        for _ in 0..10 {
            book.record_outcome(a, false, None, 3); // target refusals etc.
        }
        assert!(book.exit(a).available(Instant::now()));
        for _ in 0..3 {
            book.record_outcome(a, true, None, 3);
        }
        let first = book.exit(a).state.lock().unwrap().ejected_until.unwrap();
        assert!(!book.exit(a).available(Instant::now()));
        assert!(first - Instant::now() <= Duration::from_secs(5));
        // Once the ejection ends, renewed faults eject for twice as long.
        book.exit(a).state.lock().unwrap().ejected_until =
            Some(Instant::now() - Duration::from_millis(1));
        for _ in 0..3 {
            book.record_outcome(a, true, None, 3);
        }
        let second = book.exit(a).state.lock().unwrap().ejected_until.unwrap();
        assert!(
            second - Instant::now() > Duration::from_secs(9),
            "back-off grows"
        );
        // The guard: a second ejection among three exits would exceed 50%.
        for _ in 0..3 {
            book.record_outcome(b, true, None, 3);
        }
        assert!(
            book.exit(b).available(Instant::now()),
            "max-ejected share protects b"
        );
        let _ = c;
    }

    #[test]
    fn a_slow_target_never_lowers_the_score_and_an_idle_exit_recovers() {
        let book = HealthBook::new(config());
        let (slow, fine) = (Uuid::new_v4(), Uuid::new_v4());
        for id in [slow, fine] {
            book.record_probe(id, Some(Duration::from_millis(2)));
        }
        let before = book.exit(slow).score();
        // Tunnels to a target that takes two seconds to accept: successes
        // as far as the exit goes, however long they took.
        for _ in 0..3 {
            book.record_outcome(slow, false, Some(Duration::from_secs(2)), 2);
        }
        assert_eq!(book.exit(slow).score(), before);
        assert_eq!(book.exit(slow).score(), book.exit(fine).score());
        // Exit faults lower it; probes alone, with no traffic, bring it back.
        for _ in 0..2 {
            book.record_outcome(slow, true, None, 2);
        }
        let hurt = book.exit(slow).score();
        assert!(hurt < before * 0.7, "{hurt} vs {before}");
        // While tunnels report, probes do not paper over their faults.
        for _ in 0..20 {
            book.record_probe(slow, Some(Duration::from_millis(2)));
        }
        assert_eq!(book.exit(slow).score(), hurt);
        // Idle for a while: probes alone bring it back.
        book.exit(slow).state.lock().unwrap().last_outcome =
            Some(Instant::now() - PROBES_LIFT_AFTER);
        for _ in 0..20 {
            book.record_probe(slow, Some(Duration::from_millis(2)));
        }
        let healed = book.exit(slow).score();
        assert!(healed > before * 0.95, "{healed} vs {before}");
        // One probe that waited out a hiccup does not starve the exit; one
        // that is slow on every probe loses traffic.
        book.record_probe(slow, Some(Duration::from_millis(250)));
        assert!(book.exit(slow).score() > before * 0.95);
        for _ in 0..RTT_WINDOW {
            book.record_probe(slow, Some(Duration::from_millis(100)));
        }
        assert!(book.exit(slow).score() < before * 0.5);
    }

    #[test]
    fn panic_threshold_ignores_health_when_too_few_are_up() {
        let book = HealthBook::new(config());
        let ids: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        let now = Instant::now();
        for id in &ids[..3] {
            for _ in 0..3 {
                book.record_probe(*id, None);
            }
        }
        assert!(book.panicking(&ids, now), "1 of 4 available is under 30%");
        book.record_probe(ids[0], Some(Duration::from_millis(1)));
        book.record_probe(ids[0], Some(Duration::from_millis(1)));
        assert!(!book.panicking(&ids, now), "2 of 4 is not");
    }

    #[test]
    fn in_flight_counts_and_capacity() {
        let book = HealthBook::new(config());
        let id = Uuid::new_v4();
        let a = book.start_tunnel(id);
        assert!(!book.at_capacity(id));
        let b = book.start_tunnel(id);
        assert!(book.at_capacity(id));
        drop(a);
        drop(b);
        assert_eq!(book.exit(id).in_flight(), 0);
    }
}
