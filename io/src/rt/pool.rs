//! Helper threads for blocking work that must never run on a shard thread (bcrypt checks cost
//! 50-250 ms; large schema validations): a fixed pool of threads takes jobs from two queues
//! holding at most [`POOL_QUEUE_MAX`] jobs together, the urgent one first. A full queue is refused
//! at once ([`Busy`]), never waited on. A job's answer travels back in a [`Slot`]: a cross-thread
//! one-shot that any number of shard tasks may await (identical requests may share one job).
//!
//! State crosses threads here, outside the shard mesh: a mutex guards the queues and each slot's
//! value and waker list, held only to store or take them, never across an `.await`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// Jobs queued behind the running ones before new ones are refused.
pub const POOL_QUEUE_MAX: usize = 1024;
/// Wakers kept per slot; beyond it, waiters are woken at once and poll again later.
const SLOT_WAKERS_MAX: usize = 4096;
/// Longest a shard task waits for a helper thread's answer (a full queue of checks at the
/// slowest cost clears well within it).
pub const SLOT_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// A queued job. It receives the [`Ticket`] that counts it in the gauge and drops it before it
/// wakes its waiters, so a waiter that reads the gauge next no longer sees its own job.
pub type Job = Box<dyn FnOnce(Ticket) + Send + 'static>;

/// One job's place in the pool's [`Pool::queued`] gauge, given back when dropped.
pub struct Ticket(Arc<AtomicUsize>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The queue is full: refused at once, never waited on (the caller answers `503`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

#[derive(Default)]
struct Queues {
    urgent: VecDeque<Job>,
    later: VecDeque<Job>,
}

impl Queues {
    fn len(&self) -> usize {
        self.urgent.len() + self.later.len()
    }
}

#[derive(Default)]
struct Shared {
    queues: Mutex<Queues>,
    ready: Condvar,
}

pub struct Pool {
    shared: Arc<Shared>,
    queued: Arc<AtomicUsize>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Pool {
    /// Starts `threads` helper threads named `<name>-<i>`. A thread that cannot start leaves
    /// the pool smaller (at least one must start, or jobs are never run and every waiter times
    /// out).
    pub fn with_threads(threads: usize, name: &str) -> Pool {
        let shared = Arc::new(Shared::default());
        let queued = Arc::new(AtomicUsize::new(0));
        for i in 0..threads.max(1) {
            let (shared, queued) = (shared.clone(), queued.clone());
            let r = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || worker(&shared, &queued));
            if let Err(e) = r {
                tracing::error!(error = %e, "starting a {name} helper thread failed");
            }
        }
        Pool { shared, queued }
    }

    /// Jobs waiting or running.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Queues `f`; its result completes the returned slot.
    pub fn submit<T, F>(&self, f: F) -> Result<Arc<Slot<T>>, Busy>
    where
        T: Clone + Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let slot = Arc::new(Slot::new());
        let s2 = slot.clone();
        self.submit_job(
            true,
            Box::new(move |ticket| {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
                drop(ticket);
                match r {
                    Ok(v) => s2.complete(v),
                    // A bug in the job: its waiters get `None` instead of waiting forever.
                    Err(_) => s2.abandon(),
                }
            }),
        )?;
        Ok(slot)
    }

    /// Queues a job that completes its own slot; `urgent` jobs run before the others.
    pub fn submit_job(&self, urgent: bool, job: Job) -> Result<(), Busy> {
        {
            let mut q = lock(&self.shared.queues);
            if q.len() >= POOL_QUEUE_MAX {
                return Err(Busy);
            }
            if urgent {
                q.urgent.push_back(job);
            } else {
                q.later.push_back(job);
            }
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.shared.ready.notify_one();
        Ok(())
    }
}

fn worker(shared: &Shared, queued: &Arc<AtomicUsize>) {
    loop {
        let job: Job = {
            let mut q = lock(&shared.queues);
            loop {
                if let Some(j) = q.urgent.pop_front().or_else(|| q.later.pop_front()) {
                    break j;
                }
                q = match shared.ready.wait(q) {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
            }
        };
        // A panicking job (a bug in the work it runs) must not kill the thread: its slot is dropped
        // uncompleted and its waiters see `None`; the ticket is given back while unwinding.
        let ticket = Ticket(queued.clone());
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || job(ticket)));
    }
}

/// A value computed on another thread, awaited by any number of shard tasks.
pub struct Slot<T> {
    inner: Mutex<SlotState<T>>,
}

struct SlotState<T> {
    value: Option<T>,
    /// Set when the producer dropped without a value.
    abandoned: bool,
    wakers: Vec<Waker>,
}

impl<T: Clone> Slot<T> {
    pub fn new() -> Slot<T> {
        Slot {
            inner: Mutex::new(SlotState {
                value: None,
                abandoned: false,
                wakers: Vec::new(),
            }),
        }
    }

    pub fn complete(&self, v: T) {
        let wakers = {
            let mut s = lock(&self.inner);
            s.value = Some(v);
            std::mem::take(&mut s.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Marks the slot as never to be completed (waiters get `None`).
    pub fn abandon(&self) {
        let wakers = {
            let mut s = lock(&self.inner);
            s.abandoned = true;
            std::mem::take(&mut s.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Waits for the value; `None` if the job was abandoned.
    pub fn wait(self: &Arc<Self>) -> SlotWait<T> {
        SlotWait(self.clone())
    }

    /// Waits at most [`SLOT_WAIT_MAX`]; `None` if the job was abandoned or is that late.
    pub async fn wait_bounded(self: &Arc<Self>) -> Option<T> {
        super::timeout(SLOT_WAIT_MAX, self.wait())
            .await
            .ok()
            .flatten()
    }
}

impl<T: Clone> Default for Slot<T> {
    fn default() -> Slot<T> {
        Slot::new()
    }
}

pub struct SlotWait<T>(Arc<Slot<T>>);

impl<T: Clone> Future for SlotWait<T> {
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = lock(&self.0.inner);
        if let Some(v) = &s.value {
            return Poll::Ready(Some(v.clone()));
        }
        if s.abandoned {
            return Poll::Ready(None);
        }
        if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            if s.wakers.len() >= SLOT_WAKERS_MAX {
                drop(s);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            s.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREADS: usize = 4;

    #[test]
    fn pool_runs_jobs_and_slots_deliver() {
        // Proves a job runs on a helper thread and its slot delivers the value to a waiter.
        let pool = Pool::with_threads(THREADS, "pool-test");
        let slot = pool.submit(|| 6 * 7).unwrap();
        let v = futures_lite::future::block_on(slot.wait());
        assert_eq!(v, Some(42));
    }

    #[test]
    fn a_finished_job_has_left_the_gauge_before_its_waiter_wakes() {
        // Proves the gauge is given back before the slot completes: a waiter that reads the
        // gauge right after its answer sees no job of its own (the metrics scrape relies on
        // it). Before the ticket, the helper thread decremented after completing, and this
        // loop saw 1 within a few rounds.
        let pool = Pool::with_threads(THREADS, "pool-test");
        for i in 0..300 {
            let slot = pool.submit(move || i).unwrap();
            assert_eq!(futures_lite::future::block_on(slot.wait()), Some(i));
            assert_eq!(pool.queued(), 0, "round {i}");
        }
    }

    #[test]
    fn urgent_jobs_run_first_and_the_queue_is_bounded() {
        // Proves the queue order (urgent before later) and the bound: past POOL_QUEUE_MAX
        // queued jobs, submit answers Busy at once. Every helper is held busy while the queue
        // fills, then one is freed so it alone takes the queue in order.
        type Gate = Arc<(Mutex<bool>, Condvar)>;
        let pool = Pool::with_threads(THREADS, "pool-test");
        let gates: Vec<Gate> = (0..THREADS)
            .map(|_| Arc::new((Mutex::new(false), Condvar::new())))
            .collect();
        let open = |g: &Gate| {
            *lock(&g.0) = true;
            g.1.notify_all();
        };
        let blockers: Vec<_> = gates
            .iter()
            .map(|g| {
                let g = g.clone();
                pool.submit(move || {
                    let mut o = lock(&g.0);
                    while !*o {
                        o = g.1.wait(o).unwrap_or_else(|p| p.into_inner());
                    }
                })
                .unwrap()
            })
            .collect();
        while lock(&pool.shared.queues).len() > 0 {
            std::thread::yield_now();
        }
        let order = Arc::new(Mutex::new(Vec::new()));
        let (o1, o2) = (order.clone(), order.clone());
        pool.submit_job(false, Box::new(move |_| lock(&o1).push("later")))
            .unwrap();
        pool.submit_job(true, Box::new(move |_| lock(&o2).push("urgent")))
            .unwrap();
        for _ in 0..POOL_QUEUE_MAX - 2 {
            pool.submit_job(false, Box::new(|_| {})).unwrap();
        }
        assert_eq!(pool.submit_job(true, Box::new(|_| {})), Err(Busy));
        open(&gates[0]);
        while lock(&order).len() < 2 {
            std::thread::yield_now();
        }
        assert_eq!(*lock(&order), vec!["urgent", "later"]);
        gates.iter().for_each(open);
        for b in blockers {
            futures_lite::future::block_on(b.wait());
        }
    }
}
