//! One thread, at a lower scheduling priority, for the work of a reload that serving must not
//! wait for: loading and compiling a config (hundreds of milliseconds of CPU at 10,000
//! Backends) and freeing the config it replaced.
//!
//! On a worker it would stall every connection of that worker; on tokio's blocking pool it
//! would still take a core at the workers' priority, and a p99 spike on a busy machine is the
//! result. This thread runs at nice [`NICENESS`]: when the workers (and whatever else the
//! machine runs at the default priority) want the CPU, they get it first; when they do not, the
//! reload runs at full speed. Under full load a reload takes longer instead of traffic
//! waiting (CFS gives a nice-10 thread about a tenth of a nice-0 one's share). One long-lived
//! thread, not one per reload: the memory it allocates stays in one allocator arena.

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// The nice value added to the thread (Linux keeps one per thread; raising it needs no
/// privilege).
pub(crate) const NICENESS: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// Why background work gave no result.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackgroundError {
    #[error("the background thread could not be started: {0}")]
    Spawn(std::io::Error),
    #[error("the background work panicked")]
    Panicked,
    #[error("the background work did not finish within {0:?} (reload timeout)")]
    TimedOut(std::time::Duration),
}

/// Runs `work` on the background thread and waits for its result without blocking a worker.
pub(crate) async fn run<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BackgroundError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    submit(Box::new(move || {
        // A panic drops `tx`: the caller sees `Panicked`, and the thread goes on.
        let _ = tx.send(work());
    }))?;
    rx.await.map_err(|_| BackgroundError::Panicked)
}

/// [`run`], giving up after `limit`: a job that hangs (a config file on a stuck network
/// mount) fails the reload instead of wedging every later one. The thread that runs it is
/// left to finish on its own, and later jobs go to a new thread. A zero `limit` waits as long
/// as the job takes.
pub(crate) async fn run_within<T: Send + 'static>(
    limit: std::time::Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BackgroundError> {
    if limit.is_zero() {
        return run(work).await;
    }
    match tokio::time::timeout(limit, run(work)).await {
        Ok(result) => result,
        Err(_) => {
            // Dropping the sender ends the stuck thread once its job returns (its queue is
            // then closed); the next job starts a fresh one.
            *queue().lock().unwrap_or_else(|p| p.into_inner()) = None;
            Err(BackgroundError::TimedOut(limit))
        }
    }
}

fn queue() -> &'static Mutex<Option<mpsc::Sender<Job>>> {
    static QUEUE: OnceLock<Mutex<Option<mpsc::Sender<Job>>>> = OnceLock::new();
    QUEUE.get_or_init(Mutex::default)
}

/// Runs `work` on the background thread without waiting for it (freeing a replaced config).
pub(crate) fn detach(work: impl FnOnce() + Send + 'static) {
    if let Err(e) = submit(Box::new(work)) {
        tracing::warn!("{e}");
    }
}

fn submit(job: Job) -> Result<(), BackgroundError> {
    let mut sender = queue().lock().unwrap_or_else(|p| p.into_inner());
    let job = match sender.as_ref() {
        Some(running) => match running.send(job) {
            Ok(()) => return Ok(()),
            // The thread is gone (it could not survive a job): another takes this job.
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("egressd-reload".into())
        .spawn(move || serve(rx))
        .map_err(BackgroundError::Spawn)?;
    // The receiver is alive (the thread just started and holds it).
    let _ = tx.send(job);
    *sender = Some(tx);
    Ok(())
}

fn serve(jobs: mpsc::Receiver<Job>) {
    if let Err(e) = rustix::process::nice(NICENESS) {
        tracing::debug!("cannot lower the reload thread's priority: {e}");
    }
    for job in jobs {
        // A panicking job must not take the queue down with it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    /// Results come back in order, a panic in one job is reported and the next still runs.
    #[tokio::test]
    async fn runs_jobs_and_survives_a_panic() {
        assert_eq!(super::run(|| 41 + 1).await.unwrap(), 42);
        let nice = super::run(|| rustix::process::getpriority_process(None)).await;
        assert_eq!(nice.unwrap().unwrap(), super::NICENESS);
        let failed = super::run(|| -> u8 { panic!("a bug in a job") }).await;
        assert!(matches!(failed, Err(super::BackgroundError::Panicked)));
        let (tx, rx) = tokio::sync::oneshot::channel();
        super::detach(move || {
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        });
        assert_eq!(rx.await.unwrap().as_deref(), Some("egressd-reload"));
    }

    /// A job that hangs fails its caller at the limit; the next job runs on a new thread.
    #[tokio::test]
    async fn a_hung_job_times_out_and_the_next_runs() {
        let (release, hang) = std::sync::mpsc::channel::<()>();
        let limit = std::time::Duration::from_millis(50);
        let hung = super::run_within(limit, move || {
            let _ = hang.recv();
        });
        assert!(matches!(
            hung.await,
            Err(super::BackgroundError::TimedOut(_))
        ));
        let next = super::run_within(std::time::Duration::from_secs(30), || 7);
        assert_eq!(next.await.unwrap(), 7);
        drop(release);
    }
}
