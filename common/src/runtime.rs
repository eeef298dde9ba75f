//! The Tokio runtime of the binaries.
//!
//! Everything runs on worker threads: the binaries' main futures are spawned,
//! not run by `block_on` on the main thread. An accept loop on the main thread
//! hands every new connection to a worker through the scheduler's global
//! queue and an unpark (a cross-thread wake-up per connection, visible in
//! setup latency); on a worker, the new task goes to that worker's own queue.

use std::future::Future;

/// Builds a multi-threaded runtime with `worker_threads` workers (default:
/// the cores this process may run on) and runs `main` on it, spawned.
pub fn run<F>(worker_threads: Option<usize>, main: F) -> std::io::Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads.filter(|n| *n > 0) {
        builder.worker_threads(n);
    }
    let runtime = builder.enable_all().build()?;
    let main = runtime.spawn(main);
    runtime.block_on(main).map_err(std::io::Error::other)
}
