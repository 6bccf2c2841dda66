//! A future polled only after it was woken.
//!
//! A connection's task wakes for every read and write of its requests; the futures next to the
//! connection in `conn::drive` (stop, drain, the idle watchdog) wake almost never. In a
//! `select!` they are polled at every wake-up anyway, and re-polling a `watch` change, a
//! `Notify` and a `Sleep` that have nothing new costs about 1,500 instructions per proxied
//! request (callgrind), a few percent of the proxy's user time. [`Gated`] gives its future a
//! waker of its own that records the wake-up before waking the task, and polls the future only
//! when that happened (and the first time, so that it registers).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

pin_project_lite::pin_project! {
    /// `future`, polled only after its own waker fired.
    pub(crate) struct Gated<F> {
        #[pin]
        future: F,
        signal: Arc<Signal>,
        waker: Waker,
    }
}

/// The gated future's waker: a flag and the task to pass the wake-up on to.
struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: Future> Gated<F> {
    pub(crate) fn new(future: F) -> Self {
        let signal = Arc::new(Signal {
            // The first poll goes through: the future registers its wakers then.
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Gated {
            future,
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // Registered before the flag is read: a wake-up between the two is seen now or wakes
        // the task again.
        this.signal.task.register(cx.waker());
        if !this.signal.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.future.poll(&mut Context::from_waker(this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; Ready once `ready` is set (its waker woken by whoever sets it).
    struct Probe {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn the_future_is_polled_first_and_then_only_after_its_own_wake_up() {
        let polls = Arc::new(AtomicUsize::new(0));
        let ready = Arc::new(AtomicBool::new(false));
        let slot = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let mut gated = Box::pin(Gated::new(Probe {
            polls: polls.clone(),
            ready: ready.clone(),
            waker: slot.clone(),
        }));
        let task = Arc::new(Counter::default());
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert!(gated.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the first poll registers");
        // The task woke for something else: the future is not polled.
        for _ in 0..5 {
            assert!(gated.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        // Its own waker fires: the task is woken, and the next poll reaches the future.
        ready.store(true, Ordering::SeqCst);
        slot.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was not woken");
        assert!(gated.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
