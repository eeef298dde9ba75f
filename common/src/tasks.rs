//! Background work of a process in one shape: each loop is a value built
//! with its dependencies and started with `run(stop)`; the process keeps them
//! in one [`Tasks`] list, fires one stop signal and waits for them under a
//! bounded drain.
//!
//! A ticking loop sees the signal at its own waiting point (its next tick),
//! so work it is in the middle of — a usage flush, a Redis write — finishes.
//! A loop that follows a stream (change events, the usage ledger) stops at
//! its next await instead, which is safe where each entry is idempotent (the
//! ledger counts a batch id once; an unacknowledged entry is read again). A loop still running at the deadline (a request stuck
//! past its own timeout) is the one case left for cancelling from outside:
//! logged as a fault, and cancelled so that, say, a withdrawn superproxy
//! cannot announce itself again after its withdrawal.

use std::future::Future;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The stop signal a loop is started with; it returns soon after it fires.
pub type Stop = CancellationToken;

/// Loops started together and stopped together.
#[derive(Default)]
pub struct Tasks {
    stop: Stop,
    running: Vec<(&'static str, JoinHandle<()>)>,
}

impl Tasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts one loop: `run` gets the shared stop signal.
    pub fn spawn<F>(&mut self, name: &'static str, run: impl FnOnce(Stop) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(run(self.stop.clone()));
        self.running.push((name, handle));
    }

    /// Fires the stop signal and waits for every loop, at most `deadline` in
    /// all. True when every one returned; the ones still running are named in
    /// the log and cancelled.
    pub async fn stop(self, deadline: Duration) -> bool {
        self.stop.cancel();
        let until = tokio::time::Instant::now() + deadline;
        let mut all_done = true;
        for (name, handle) in self.running {
            let backstop = handle.abort_handle();
            match tokio::time::timeout_at(until, handle).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    all_done = false;
                    tracing::warn!(task = name, error = %e, "background task failed");
                }
                Err(_) => {
                    all_done = false;
                    tracing::warn!(
                        task = name,
                        "background task ignored the stop signal; cancelling it"
                    );
                    backstop.abort();
                }
            }
        }
        all_done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn stop_waits_for_a_tick_in_progress_and_ends_every_loop() {
        let ticks = Arc::new(AtomicU32::new(0));
        let finished = Arc::new(AtomicU32::new(0));
        let mut tasks = Tasks::new();
        let (t, f) = (ticks.clone(), finished.clone());
        tasks.spawn("slow ticker", move |stop| async move {
            // The shape every ticking loop of the binaries has.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            while stop.run_until_cancelled(tick.tick()).await.is_some() {
                t.fetch_add(1, Ordering::SeqCst);
                // Work that takes a while: a stop arriving now waits for it.
                tokio::time::sleep(Duration::from_millis(500)).await;
                f.fetch_add(1, Ordering::SeqCst);
            }
        });
        tasks.spawn("waiter", |stop| async move { stop.cancelled().await });
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        assert!(tasks.stop(Duration::from_secs(5)).await);
        assert_eq!(
            ticks.load(Ordering::SeqCst),
            finished.load(Ordering::SeqCst)
        );
        assert!(ticks.load(Ordering::SeqCst) >= 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_ignores_the_signal_is_reported_at_the_deadline() {
        let mut tasks = Tasks::new();
        tasks.spawn("deaf", |_stop| std::future::pending());
        assert!(!tasks.stop(Duration::from_secs(1)).await);
    }
}
