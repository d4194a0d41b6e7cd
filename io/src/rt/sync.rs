//! Shard-local synchronisation: [`Notify`], [`oneshot`], [`Semaphore`] and [`timeout`].
//!
//! Everything here lives on one executor thread (`Rc`, `RefCell`, no atomics) and is `!Send`:
//! cross-shard work goes through [`super::mesh`]. No `RefCell` borrow is ever held while a waker
//! is woken or across an `.await`. None of these types names glommio, so callers do not either.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Notify
// ---------------------------------------------------------------------------------------------

/// Broadcast wake-up for tasks of one shard (long-poll consumers waiting for commits, nacks or
/// lease expiries).
///
/// A [`Notified`] future observes every [`Notify::notify_waiters`] call made after the future was
/// *created* (not first polled), so the pattern "create `notified()`, check the condition, await"
/// never loses a wake-up.
#[derive(Default)]
pub struct Notify {
    state: RefCell<NotifyState>,
}

#[derive(Default)]
struct NotifyState {
    generation: u64,
    /// Registered wakers; a slot index is valid only within one generation.
    waiters: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Notify {
    pub fn new() -> Notify {
        Notify::default()
    }

    /// Wakes every task currently waiting on (or holding a not yet completed) [`Notified`].
    pub fn notify_waiters(&self) {
        let wakers = {
            let mut s = self.state.borrow_mut();
            s.generation = s.generation.wrapping_add(1);
            s.free.clear();
            std::mem::take(&mut s.waiters)
        };
        for w in wakers.into_iter().flatten() {
            w.wake();
        }
    }

    /// A future that completes at the next [`Notify::notify_waiters`].
    pub fn notified(&self) -> Notified<'_> {
        self.notified_since(self.ticket())
    }

    /// Names this moment: [`Notify::notified_since`] with it completes at once when a
    /// [`Notify::notify_waiters`] came after it. For a check that awaits (a condition read from
    /// several places): take the ticket before the check starts, park with it after.
    pub fn ticket(&self) -> u64 {
        self.state.borrow().generation
    }

    /// A future that completes at the first [`Notify::notify_waiters`] after `ticket` was taken
    /// (at once if one already came).
    pub fn notified_since(&self, ticket: u64) -> Notified<'_> {
        Notified {
            notify: self,
            generation: ticket,
            slot: None,
        }
    }

    /// Number of registered waiters (for metrics and tests).
    pub fn waiter_count(&self) -> usize {
        let s = self.state.borrow();
        s.waiters.len() - s.free.len()
    }
}

/// Future returned by [`Notify::notified`].
pub struct Notified<'a> {
    notify: &'a Notify,
    generation: u64,
    slot: Option<usize>,
}

impl Future for Notified<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.notify.state.borrow_mut();
        if s.generation != self.generation {
            drop(s);
            self.slot = None;
            return Poll::Ready(());
        }
        match self.slot {
            Some(i) => s.waiters[i] = Some(cx.waker().clone()),
            None => {
                let i = match s.free.pop() {
                    Some(i) => {
                        s.waiters[i] = Some(cx.waker().clone());
                        i
                    }
                    None => {
                        s.waiters.push(Some(cx.waker().clone()));
                        s.waiters.len() - 1
                    }
                };
                drop(s);
                self.slot = Some(i);
            }
        }
        Poll::Pending
    }
}

impl Drop for Notified<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let mut s = self.notify.state.borrow_mut();
            if s.generation == self.generation && i < s.waiters.len() {
                s.waiters[i] = None;
                s.free.push(i);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// oneshot
// ---------------------------------------------------------------------------------------------

/// A single-value channel between two tasks of the same shard.
pub mod oneshot {
    use super::*;

    struct Shared<T> {
        value: Option<T>,
        rx_waker: Option<Waker>,
        tx_alive: bool,
        rx_alive: bool,
    }

    /// Sending half; dropping it without sending completes the receiver with [`Canceled`].
    pub struct Sender<T>(Rc<RefCell<Shared<T>>>);
    /// Receiving half: a future of `Result<T, Canceled>`.
    pub struct Receiver<T>(Rc<RefCell<Shared<T>>>);

    /// The sender was dropped without sending.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Canceled;

    impl fmt::Display for Canceled {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("oneshot sender dropped")
        }
    }
    impl std::error::Error for Canceled {}

    pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
        let s = Rc::new(RefCell::new(Shared {
            value: None,
            rx_waker: None,
            tx_alive: true,
            rx_alive: true,
        }));
        (Sender(s.clone()), Receiver(s))
    }

    impl<T> Sender<T> {
        /// Delivers `v`; gives it back when the receiver is gone.
        pub fn send(self, v: T) -> Result<(), T> {
            let waker = {
                let mut s = self.0.borrow_mut();
                if !s.rx_alive {
                    return Err(v);
                }
                s.value = Some(v);
                s.rx_waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
            Ok(())
        }

        /// True when the receiver was dropped (nobody waits for the answer any more).
        pub fn is_closed(&self) -> bool {
            !self.0.borrow().rx_alive
        }
    }

    impl<T> Drop for Sender<T> {
        fn drop(&mut self) {
            let waker = {
                let mut s = self.0.borrow_mut();
                s.tx_alive = false;
                s.rx_waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    impl<T> Receiver<T> {
        /// Takes the value if it has arrived.
        pub fn try_recv(&mut self) -> Option<Result<T, Canceled>> {
            let mut s = self.0.borrow_mut();
            match s.value.take() {
                Some(v) => Some(Ok(v)),
                None if !s.tx_alive => Some(Err(Canceled)),
                None => None,
            }
        }
    }

    impl<T> Future for Receiver<T> {
        type Output = Result<T, Canceled>;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut s = self.0.borrow_mut();
            if let Some(v) = s.value.take() {
                return Poll::Ready(Ok(v));
            }
            if !s.tx_alive {
                return Poll::Ready(Err(Canceled));
            }
            s.rx_waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    impl<T> Drop for Receiver<T> {
        fn drop(&mut self) {
            let mut s = self.0.borrow_mut();
            s.rx_alive = false;
            s.rx_waker = None;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Semaphore
// ---------------------------------------------------------------------------------------------

/// A bounded, FIFO-fair, shard-local counting semaphore (connections per shard, requests in
/// flight, bytes in flight). Cloning gives another handle to the same permits.
#[derive(Clone)]
pub struct Semaphore(Rc<RefCell<SemState>>);

struct SemState {
    available: usize,
    capacity: usize,
    next_waiter_id: u64,
    /// (waiter id, permits wanted, waker): served strictly in order.
    waiters: VecDeque<(u64, usize, Option<Waker>)>,
}

/// Permits held; released (and the next waiter woken) on drop.
pub struct SemaphorePermit {
    sem: Rc<RefCell<SemState>>,
    n: usize,
}

impl fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SemaphorePermit({})", self.n)
    }
}

impl Semaphore {
    /// A semaphore with `capacity` permits.
    pub fn new(capacity: usize) -> Semaphore {
        Semaphore(Rc::new(RefCell::new(SemState {
            available: capacity,
            capacity,
            next_waiter_id: 0,
            waiters: VecDeque::new(),
        })))
    }

    pub fn available(&self) -> usize {
        self.0.borrow().available
    }

    pub fn capacity(&self) -> usize {
        self.0.borrow().capacity
    }

    /// Tasks waiting in [`Semaphore::acquire`].
    pub fn waiter_count(&self) -> usize {
        self.0.borrow().waiters.len()
    }

    /// One permit now, or `None` when none is free or others are already queued.
    pub fn try_acquire(&self) -> Option<SemaphorePermit> {
        self.try_acquire_n(1)
    }

    /// `n` permits now, or `None`.
    pub fn try_acquire_n(&self, n: usize) -> Option<SemaphorePermit> {
        let mut s = self.0.borrow_mut();
        if s.waiters.is_empty() && s.available >= n {
            s.available -= n;
            drop(s);
            Some(SemaphorePermit {
                sem: self.0.clone(),
                n,
            })
        } else {
            None
        }
    }

    /// Waits for one permit (FIFO).
    pub async fn acquire(&self) -> SemaphorePermit {
        match self.acquire_n(1).await {
            Some(p) => p,
            // capacity 0: nothing will ever be released, wait forever as a zero-capacity
            // semaphore means.
            None => std::future::pending().await,
        }
    }

    /// Waits for `n` permits (FIFO). `None` at once when `n` exceeds the capacity, since such a
    /// request could never be served.
    pub async fn acquire_n(&self, n: usize) -> Option<SemaphorePermit> {
        if n > self.capacity() {
            return None;
        }
        if let Some(p) = self.try_acquire_n(n) {
            return Some(p);
        }
        let id = {
            let mut s = self.0.borrow_mut();
            let id = s.next_waiter_id;
            s.next_waiter_id += 1;
            s.waiters.push_back((id, n, None));
            id
        };
        Acquire {
            sem: self.0.clone(),
            id,
            n,
            done: false,
        }
        .await;
        Some(SemaphorePermit {
            sem: self.0.clone(),
            n,
        })
    }
}

struct Acquire {
    sem: Rc<RefCell<SemState>>,
    id: u64,
    n: usize,
    done: bool,
}

impl Future for Acquire {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.sem.borrow_mut();
        let front = s.waiters.front().map(|w| w.0);
        if front == Some(self.id) && s.available >= self.n {
            s.available -= self.n;
            s.waiters.pop_front();
            let next = if s.available > 0 {
                s.waiters.front_mut().and_then(|w| w.2.take())
            } else {
                None
            };
            drop(s);
            self.done = true;
            if let Some(w) = next {
                w.wake();
            }
            return Poll::Ready(());
        }
        if let Some(w) = s.waiters.iter_mut().find(|w| w.0 == self.id) {
            w.2 = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let next = {
            let mut s = self.sem.borrow_mut();
            let was_front = s.waiters.front().map(|w| w.0) == Some(self.id);
            s.waiters.retain(|w| w.0 != self.id);
            if was_front {
                s.waiters.front_mut().and_then(|w| w.2.take())
            } else {
                None
            }
        };
        if let Some(w) = next {
            w.wake();
        }
    }
}

impl SemaphorePermit {
    /// Number of permits this guard holds.
    pub fn count(&self) -> usize {
        self.n
    }
}

impl Drop for SemaphorePermit {
    fn drop(&mut self) {
        let next = {
            let mut s = self.sem.borrow_mut();
            s.available += self.n;
            debug_assert!(s.available <= s.capacity);
            s.waiters.front_mut().and_then(|w| w.2.take())
        };
        if let Some(w) = next {
            w.wake();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// timeout
// ---------------------------------------------------------------------------------------------

/// The deadline of a [`timeout`] passed before the future completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline elapsed")
    }
}
impl std::error::Error for Elapsed {}

impl From<Elapsed> for std::io::Error {
    fn from(_: Elapsed) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline elapsed")
    }
}

/// Runs `fut` for at most `dur`; the future is dropped (cancelled) when time runs out.
pub async fn timeout<F: Future>(dur: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    let mut timer = glommio::timer::Timer::new(dur);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        if Pin::new(&mut timer).poll(cx).is_ready() {
            return Poll::Ready(Err(Elapsed));
        }
        Poll::Pending
    })
    .await
}

/// Runs `fut` until `deadline` at the latest.
pub async fn timeout_at<F: Future>(deadline: Instant, fut: F) -> Result<F::Output, Elapsed> {
    timeout(deadline.saturating_duration_since(Instant::now()), fut).await
}
