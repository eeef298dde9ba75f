//! The busiest sites' success ratios, for `proxynet_site_success_ratio`
//! (docs/observability.md): of the outcomes recorded for a site over about
//! the last minute, the share that were successes (`ok` against `refused`,
//! `handshake_closed` and `banned`), for at most [`TOP_SITES`] sites — the
//! most outcomes in that window — so the series count stays bounded
//! whatever the traffic.
//!
//! A tunnel's outcome adds one to its site's count (one uncontended lock
//! and a map lookup, at the tunnel's end, never on its way in). Each
//! second the counts fold into decaying totals (a minute's time constant),
//! sites whose totals have faded are forgotten, and the top sites' ratios
//! are set. At most [`MAX_TALLIED`] sites are counted at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The most sites whose ratio is exported at once.
pub(crate) const TOP_SITES: usize = 20;

/// The most sites counted at once; a new site beyond them waits until
/// others have faded.
const MAX_TALLIED: usize = 10_000;

/// What a second's totals are worth a second later: `exp(-1/60)`, a
/// minute's time constant.
const DECAY: f64 = 0.983_471_453_821_617;

/// Totals below this are forgotten (a site quiet for some five minutes).
const FADED: f64 = 0.01;

/// One site's outcomes: since the last fold, and decayed totals.
#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
    ok_recent: f64,
    failed_recent: f64,
}

impl Tally {
    fn volume(&self) -> f64 {
        self.ok_recent + self.failed_recent
    }
}

/// Every counted site's tally.
#[derive(Default)]
pub(super) struct SuccessRatios {
    sites: Mutex<HashMap<Arc<str>, Tally>>,
}

impl SuccessRatios {
    /// One outcome for `site`: a success or not.
    pub(super) fn note(&self, site: &Arc<str>, ok: bool) {
        let Ok(mut sites) = self.sites.lock() else {
            return;
        };
        let bump = |tally: &mut Tally| {
            if ok {
                tally.ok = tally.ok.saturating_add(1);
            } else {
                tally.failed = tally.failed.saturating_add(1);
            }
        };
        // One hash of the site in the common case (it is tallied already).
        if let Some(tally) = sites.get_mut(&**site) {
            bump(tally);
            return;
        }
        if sites.len() < MAX_TALLIED {
            bump(sites.entry(site.clone()).or_default());
        }
    }

    /// Folds the last second's outcomes in and sets the busiest sites'
    /// ratios (every second, off the tunnel path).
    pub(super) fn publish(&self) {
        for (site, ratio) in self.fold() {
            crate::metrics::site_success_ratio(&site, ratio);
        }
    }

    /// Folds the last second's outcomes into the decaying totals, forgets
    /// faded sites, and returns the busiest ones' ratios, busiest first.
    fn fold(&self) -> Vec<(Arc<str>, f64)> {
        let Ok(mut sites) = self.sites.lock() else {
            return Vec::new();
        };
        sites.retain(|_, tally| {
            tally.ok_recent = tally.ok_recent * DECAY + tally.ok as f64;
            tally.failed_recent = tally.failed_recent * DECAY + tally.failed as f64;
            tally.ok = 0;
            tally.failed = 0;
            tally.volume() >= FADED
        });
        let mut busiest: Vec<(&Arc<str>, &Tally)> = sites.iter().collect();
        busiest.sort_unstable_by(|a, b| b.1.volume().total_cmp(&a.1.volume()));
        busiest
            .into_iter()
            .take(TOP_SITES)
            .map(|(site, tally)| (site.clone(), tally.ok_recent / tally.volume()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_sites_ratios_are_their_recent_successes() {
        let ratios = SuccessRatios::default();
        let (picky, fine) = (
            Arc::<str>::from("picky.test"),
            Arc::<str>::from("fine.test"),
        );
        for i in 0..100 {
            ratios.note(&picky, i % 4 == 0);
            ratios.note(&fine, true);
        }
        ratios.note(&Arc::from("quiet.test"), false);
        let top = ratios.fold();
        assert_eq!(top.len(), 3);
        let ratio = |site: &str| top.iter().find(|(s, _)| &**s == site).map(|(_, r)| *r);
        assert_eq!(ratio("picky.test"), Some(0.25));
        assert_eq!(ratio("fine.test"), Some(1.0));
        assert_eq!(ratio("quiet.test"), Some(0.0));
        assert_eq!(&*top[2].0, "quiet.test", "busiest first");
        // The site recovers: its recent successes outweigh its past.
        for _ in 0..60 {
            for _ in 0..100 {
                ratios.note(&picky, true);
            }
            ratios.fold();
        }
        assert!(ratio_of(&ratios, "picky.test") > 0.99);
    }

    #[test]
    fn only_the_top_sites_are_exported_and_faded_ones_are_forgotten() {
        let ratios = SuccessRatios::default();
        for i in 0..(TOP_SITES + 10) {
            let site: Arc<str> = Arc::from(format!("site{i}.test"));
            for _ in 0..=i {
                ratios.note(&site, true);
            }
        }
        let top = ratios.fold();
        assert_eq!(top.len(), TOP_SITES);
        assert_eq!(&*top[0].0, format!("site{}.test", TOP_SITES + 9));
        // Ten quiet minutes: everything has faded.
        for _ in 0..600 {
            ratios.fold();
        }
        assert!(ratios.fold().is_empty());
        assert!(ratios.sites.lock().unwrap().is_empty());
    }

    fn ratio_of(ratios: &SuccessRatios, site: &str) -> f64 {
        let sites = ratios.sites.lock().unwrap();
        let tally = sites.get(site).unwrap();
        tally.ok_recent / tally.volume()
    }
}
