//! Blocking work (the audit log's and the stores' fsyncs and reads) from the gate's async code,
//! with as little thread hand-off as the runtime allows.
//!
//! On a multi-thread tokio runtime, [`tokio::task::block_in_place`] runs the work on the calling
//! task's own thread and moves the worker's other tasks to another thread, so the caller does not
//! wait for a blocking-pool thread to wake up and then for its own thread to be woken again
//! (measured in `benches/gate_cost.rs`: about 3 thread wake-ups per call on the critical path).
//! Everywhere else (a current-thread runtime, or a `LocalSet`, where `block_in_place` refuses to
//! run) the work goes to the blocking pool with [`tokio::task::spawn_blocking`].
//!
//! `block_in_place` refuses by panicking, before it runs anything, and no public API tells a
//! `LocalSet` apart beforehand: the refusal is caught, remembered for the thread, and the work goes
//! to the pool. That first refusal still passes through the process's panic hook (the default one
//! prints a line on stderr). A build with `panic = "abort"` cannot catch it, so there every piece
//! of work goes to the pool.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    /// `block_in_place` refused to run on this thread (it panics, before running anything, inside
    /// a `LocalSet`, which no public API can detect beforehand, and a `LocalSet` stays on the
    /// thread that runs it); from then on this thread uses the blocking pool.
    static IN_PLACE_REFUSED: Cell<bool> = const { Cell::new(false) };
}

/// The work did not finish: it panicked, or the blocking pool dropped it (the runtime is shutting
/// down).
#[derive(Debug, thiserror::Error)]
#[error(
    "the blocking task did not finish (it panicked, or the runtime is shutting down); retry the call"
)]
pub struct Cancelled;

/// Runs `work`, which may block (file I/O, fsyncs), without blocking other tasks of the runtime:
/// in place on a multi-thread runtime's worker thread (`block_in_place`: no thread hand-off),
/// else on the blocking pool. The gate runs its stores through it; handlers may too.
pub async fn run<F, R>(work: F) -> Result<R, Cancelled>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let mut work = Some(work);
    if cfg!(panic = "unwind") && on_multi_thread_runtime() && !IN_PLACE_REFUSED.get() {
        let attempt = catch_unwind(AssertUnwindSafe(|| {
            tokio::task::block_in_place(|| work.take().map(|work| work()))
        }));
        match attempt {
            Ok(Some(result)) => return Ok(result),
            Ok(None) => unreachable!("the work is taken once"),
            // `work` is still here: `block_in_place` refused before running it.
            Err(_) if work.is_some() => IN_PLACE_REFUSED.set(true),
            // The work itself panicked: reported as `spawn_blocking` reports it.
            Err(_) => return Err(Cancelled),
        }
    }
    let Some(work) = work else {
        unreachable!("the work only leaves `work` when it ran in place");
    };
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| Cancelled)
}

/// Whether the calling task runs on a multi-thread tokio runtime (where `block_in_place` is
/// allowed outside a `LocalSet`).
fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|handle| {
        matches!(
            handle.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::MultiThread
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_multi_thread_runtime_the_work_runs_on_the_calling_thread() {
        let caller = std::thread::current().id();
        let ran_on = run(move || std::thread::current().id()).await.unwrap();
        assert_eq!(ran_on, caller);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn on_a_current_thread_runtime_the_work_goes_to_the_blocking_pool() {
        let caller = std::thread::current().id();
        let ran_on = run(move || std::thread::current().id()).await.unwrap();
        assert_ne!(ran_on, caller);
    }

    #[test]
    fn inside_a_local_set_the_refusal_falls_back_to_the_blocking_pool() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        let caller = std::thread::current().id();
        let ran_on = runtime.block_on(
            local.run_until(async { run(move || std::thread::current().id()).await.unwrap() }),
        );
        assert_ne!(ran_on, caller);
        assert!(
            IN_PLACE_REFUSED.get(),
            "the refusal is remembered on this thread"
        );
        // And the next call on this thread goes straight to the pool.
        let again = runtime.block_on(local.run_until(async { run(|| 42).await.unwrap() }));
        assert_eq!(again, 42);
    }
}
