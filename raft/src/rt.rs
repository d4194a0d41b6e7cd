//! openraft's `AsyncRuntime` on top of `narad_io::rt` (one single-threaded executor per shard).
//!
//! Owns the binding only: spawn with tokio-like handles (dropping a [`JoinHandle`] does not cancel
//! the task, unlike a raw `narad_io::rt::Task`), sleep, timeouts, and the small single-threaded
//! primitives openraft needs (bounded mpsc, watch, oneshot, async mutex). Everything here is
//! `!Send` on purpose: openraft is built with its `single-threaded` feature and the Raft group
//! lives on shard 0. Never names glommio; never blocks the thread.
//!
//! Wakers of pending futures are kept in keyed sets ([`WakerSet`]) so a future polled many times
//! while pending holds one slot, and its slot is freed when it is dropped: waiter memory is
//! bounded by the number of live futures.

use std::cell::{Cell, Ref, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use openraft::rt::{
    watch, AsyncRuntime, Mpsc, MpscReceiver, MpscSender, MpscWeakSender, Oneshot, OneshotSender,
    OptionalSend, OptionalSync, SendError, TryRecvError,
};

/// The runtime type named in the Raft type configuration.
#[derive(Debug, Default)]
pub struct NaradRuntime;

/// openraft's random source (election timeouts, the phase of a ticker's first wait): every draw
/// is read from the kernel through [`narad_io::sys::fill_random`], the workspace's one source of
/// randomness. openraft draws once per election attempt, so a system call per draw costs nothing
/// that matters.
#[derive(Debug, Default, Clone, Copy)]
pub struct KernelRng;

impl rand::TryRng for KernelRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0u8; 4];
        narad_io::sys::fill_random(&mut b);
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(narad_io::sys::random_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        narad_io::sys::fill_random(dst);
        Ok(())
    }
}

/// Why a spawned task produced no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// The task panicked; the payload's message when it was a string.
    Panicked(String),
    /// The task was dropped before it finished (its executor stopped).
    Cancelled,
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::Panicked(m) => write!(f, "task panicked: {m}"),
            JoinError::Cancelled => write!(f, "task cancelled"),
        }
    }
}

impl std::error::Error for JoinError {}

/// Handle to a spawned task. Dropping it lets the task run on.
pub struct JoinHandle<T> {
    rx: futures_channel::oneshot::Receiver<Result<T, JoinError>>,
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(_)) => Poll::Ready(Err(JoinError::Cancelled)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Spawns `fut` on the current shard; the task keeps running if the handle is dropped.
pub fn spawn<F: Future + 'static>(fut: F) -> JoinHandle<F::Output> {
    let (tx, rx) = futures_channel::oneshot::channel();
    narad_io::rt::spawn(async move {
        let out = AssertUnwindSafe(fut).catch_unwind().await.map_err(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            JoinError::Panicked(msg)
        });
        let _ = tx.send(out);
    })
    .detach();
    JoinHandle { rx }
}

/// A sleep that resolves to `()` (the io runtime's timer resolves to the instant it fired).
pub struct Sleep(Pin<Box<narad_io::rt::Sleep>>);

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx).map(|_| ())
    }
}

/// Sleeps for `d`.
pub fn sleep(d: Duration) -> Sleep {
    Sleep(Box::pin(narad_io::rt::sleep(d)))
}

/// The error of a future that did not finish before its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// A future bounded by a deadline. The inner future is polled first, so a future that is ready
/// at the deadline wins.
pub struct Timeout<R, F> {
    fut: Pin<Box<F>>,
    sleep: Sleep,
    _out: std::marker::PhantomData<fn() -> R>,
}

impl<R, F: Future<Output = R>> Future for Timeout<R, F> {
    type Output = Result<R, Elapsed>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(v) = self.fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Bounds `fut` by `d`.
pub fn timeout<R, F: Future<Output = R>>(d: Duration, fut: F) -> Timeout<R, F> {
    Timeout {
        fut: Box::pin(fut),
        sleep: sleep(d),
        _out: std::marker::PhantomData,
    }
}

impl AsyncRuntime for NaradRuntime {
    type JoinError = JoinError;
    type JoinHandle<T: OptionalSend + 'static> = JoinHandle<T>;
    type Sleep = Sleep;
    type Instant = Instant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<R, T>;
    type ThreadLocalRng = KernelRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        sleep(deadline.saturating_duration_since(Instant::now()))
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        timeout(deadline.saturating_duration_since(Instant::now()), future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        matches!(join_error, JoinError::Panicked(_))
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        KernelRng
    }

    type Mpsc = LocalMpsc;
    type Watch = LocalWatch;
    type Oneshot = LocalOneshot;
    type Mutex<T: OptionalSend + 'static> = LocalMutex<T>;

    fn new(_threads: usize) -> Self {
        NaradRuntime
    }

    /// Runs `future` on a fresh single executor on the calling thread (tests and tools only;
    /// must not be called from inside an executor).
    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        narad_io::rt::block_on(future)
    }
}

/// Wakers of pending futures, one slot per live future.
#[derive(Default)]
pub struct WakerSet {
    next_key: Cell<u64>,
    wakers: RefCell<BTreeMap<u64, Waker>>,
}

impl WakerSet {
    /// Stores `waker` in the slot `key` (allocating a key on first use).
    fn register(&self, key: &mut Option<u64>, waker: &Waker) {
        let k = *key.get_or_insert_with(|| {
            let k = self.next_key.get();
            self.next_key.set(k + 1);
            k
        });
        self.wakers.borrow_mut().insert(k, waker.clone());
    }

    fn remove(&self, key: Option<u64>) {
        if let Some(k) = key {
            self.wakers.borrow_mut().remove(&k);
        }
    }

    fn wake_all(&self) {
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers.into_values() {
            w.wake();
        }
    }

    /// Number of futures waiting.
    pub fn len(&self) -> usize {
        self.wakers.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// ---------------------------------------------------------------------------------------------
// Bounded mpsc

/// Bounded multi-producer single-consumer channel for one thread.
pub struct LocalMpsc;

struct Chan<T> {
    queue: RefCell<VecDeque<T>>,
    capacity: usize,
    senders: Cell<usize>,
    receiver_alive: Cell<bool>,
    receiver_waker: RefCell<Option<Waker>>,
    send_waiters: WakerSet,
}

impl<T> Chan<T> {
    fn wake_receiver(&self) {
        if let Some(w) = self.receiver_waker.borrow_mut().take() {
            w.wake();
        }
    }
}

pub struct LocalMpscSender<T>(Rc<Chan<T>>);
pub struct LocalMpscReceiver<T>(Rc<Chan<T>>);
pub struct LocalMpscWeakSender<T>(Weak<Chan<T>>);

impl<T> Clone for LocalMpscSender<T> {
    fn clone(&self) -> Self {
        self.0.senders.set(self.0.senders.get() + 1);
        LocalMpscSender(self.0.clone())
    }
}

impl<T> Drop for LocalMpscSender<T> {
    fn drop(&mut self) {
        let n = self.0.senders.get() - 1;
        self.0.senders.set(n);
        if n == 0 {
            self.0.wake_receiver();
        }
    }
}

impl<T> Clone for LocalMpscWeakSender<T> {
    fn clone(&self) -> Self {
        LocalMpscWeakSender(self.0.clone())
    }
}

impl<T> Drop for LocalMpscReceiver<T> {
    fn drop(&mut self) {
        self.0.receiver_alive.set(false);
        self.0.send_waiters.wake_all();
        // Queued messages are dropped outside the borrow: their Drop may touch this channel.
        let queued = std::mem::take(&mut *self.0.queue.borrow_mut());
        drop(queued);
    }
}

impl Mpsc for LocalMpsc {
    type Sender<T: OptionalSend> = LocalMpscSender<T>;
    type Receiver<T: OptionalSend> = LocalMpscReceiver<T>;
    type WeakSender<T: OptionalSend> = LocalMpscWeakSender<T>;

    fn channel<T: OptionalSend>(buffer: usize) -> (Self::Sender<T>, Self::Receiver<T>) {
        let chan = Rc::new(Chan {
            queue: RefCell::new(VecDeque::new()),
            capacity: buffer.max(1),
            senders: Cell::new(1),
            receiver_alive: Cell::new(true),
            receiver_waker: RefCell::new(None),
            send_waiters: WakerSet::default(),
        });
        (LocalMpscSender(chan.clone()), LocalMpscReceiver(chan))
    }
}

/// The future of one send: waits for room while the channel is full.
pub struct MpscSend<T> {
    chan: Rc<Chan<T>>,
    msg: Option<T>,
    key: Option<u64>,
}

impl<T> Unpin for MpscSend<T> {}

impl<T> Future for MpscSend<T> {
    type Output = Result<(), SendError<T>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(msg) = this.msg.take() else {
            return Poll::Ready(Ok(()));
        };
        if !this.chan.receiver_alive.get() {
            return Poll::Ready(Err(SendError(msg)));
        }
        let mut q = this.chan.queue.borrow_mut();
        if q.len() < this.chan.capacity {
            q.push_back(msg);
            drop(q);
            this.chan.send_waiters.remove(this.key.take());
            this.chan.wake_receiver();
            return Poll::Ready(Ok(()));
        }
        drop(q);
        this.msg = Some(msg);
        this.chan.send_waiters.register(&mut this.key, cx.waker());
        Poll::Pending
    }
}

impl<T> Drop for MpscSend<T> {
    fn drop(&mut self) {
        self.chan.send_waiters.remove(self.key.take());
    }
}

impl<T: OptionalSend> MpscSender<LocalMpsc, T> for LocalMpscSender<T> {
    fn send(&self, msg: T) -> impl Future<Output = Result<(), SendError<T>>> + OptionalSend {
        MpscSend {
            chan: self.0.clone(),
            msg: Some(msg),
            key: None,
        }
    }

    fn downgrade(&self) -> LocalMpscWeakSender<T> {
        LocalMpscWeakSender(Rc::downgrade(&self.0))
    }
}

impl<T: OptionalSend> MpscWeakSender<LocalMpsc, T> for LocalMpscWeakSender<T> {
    fn upgrade(&self) -> Option<LocalMpscSender<T>> {
        let chan = self.0.upgrade()?;
        if chan.senders.get() == 0 {
            return None;
        }
        chan.senders.set(chan.senders.get() + 1);
        Some(LocalMpscSender(chan))
    }
}

impl<T> LocalMpscReceiver<T> {
    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let item = self.0.queue.borrow_mut().pop_front();
        if let Some(v) = item {
            self.0.send_waiters.wake_all();
            return Poll::Ready(Some(v));
        }
        if self.0.senders.get() == 0 {
            return Poll::Ready(None);
        }
        *self.0.receiver_waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T: OptionalSend> MpscReceiver<T> for LocalMpscReceiver<T> {
    fn recv(&mut self) -> impl Future<Output = Option<T>> + OptionalSend {
        std::future::poll_fn(move |cx| self.poll_recv(cx))
    }

    fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let item = self.0.queue.borrow_mut().pop_front();
        match item {
            Some(v) => {
                self.0.send_waiters.wake_all();
                Ok(v)
            }
            None if self.0.senders.get() == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Watch

/// Single-value broadcast channel with "seen" tracking, for one thread.
pub struct LocalWatch;

struct WatchShared<T> {
    value: RefCell<T>,
    version: Cell<u64>,
    senders: Cell<usize>,
    receivers: Cell<usize>,
    waiters: WakerSet,
}

pub struct LocalWatchSender<T>(Rc<WatchShared<T>>);

pub struct LocalWatchReceiver<T> {
    shared: Rc<WatchShared<T>>,
    seen: u64,
}

impl<T> Clone for LocalWatchSender<T> {
    fn clone(&self) -> Self {
        self.0.senders.set(self.0.senders.get() + 1);
        LocalWatchSender(self.0.clone())
    }
}

impl<T> Drop for LocalWatchSender<T> {
    fn drop(&mut self) {
        let n = self.0.senders.get() - 1;
        self.0.senders.set(n);
        if n == 0 {
            self.0.waiters.wake_all();
        }
    }
}

impl<T> Clone for LocalWatchReceiver<T> {
    fn clone(&self) -> Self {
        self.shared.receivers.set(self.shared.receivers.get() + 1);
        LocalWatchReceiver {
            shared: self.shared.clone(),
            seen: self.seen,
        }
    }
}

impl<T> Drop for LocalWatchReceiver<T> {
    fn drop(&mut self) {
        self.shared.receivers.set(self.shared.receivers.get() - 1);
    }
}

impl watch::Watch for LocalWatch {
    type Sender<T: OptionalSend + OptionalSync> = LocalWatchSender<T>;
    type Receiver<T: OptionalSend + OptionalSync> = LocalWatchReceiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = Ref<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (Self::Sender<T>, Self::Receiver<T>) {
        let shared = Rc::new(WatchShared {
            value: RefCell::new(init),
            version: Cell::new(0),
            senders: Cell::new(1),
            receivers: Cell::new(1),
            waiters: WakerSet::default(),
        });
        (
            LocalWatchSender(shared.clone()),
            LocalWatchReceiver { shared, seen: 0 },
        )
    }
}

impl<T: OptionalSend + OptionalSync> watch::WatchSender<LocalWatch, T> for LocalWatchSender<T> {
    fn send(&self, value: T) -> Result<(), watch::SendError<T>> {
        if self.0.receivers.get() == 0 {
            return Err(watch::SendError(value));
        }
        let old = std::mem::replace(&mut *self.0.value.borrow_mut(), value);
        self.0.version.set(self.0.version.get() + 1);
        self.0.waiters.wake_all();
        drop(old);
        Ok(())
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        let modified = modify(&mut self.0.value.borrow_mut());
        if modified {
            self.0.version.set(self.0.version.get() + 1);
            self.0.waiters.wake_all();
        }
        modified
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        self.0.value.borrow()
    }

    fn subscribe(&self) -> LocalWatchReceiver<T> {
        self.0.receivers.set(self.0.receivers.get() + 1);
        LocalWatchReceiver {
            shared: self.0.clone(),
            seen: self.0.version.get(),
        }
    }
}

/// The future of [`watch::WatchReceiver::changed`].
struct Changed<'a, T> {
    rx: &'a mut LocalWatchReceiver<T>,
    key: Option<u64>,
}

impl<T> Future for Changed<'_, T> {
    type Output = Result<(), watch::RecvError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let shared = this.rx.shared.clone();
        let version = shared.version.get();
        if version != this.rx.seen {
            this.rx.seen = version;
            shared.waiters.remove(this.key.take());
            return Poll::Ready(Ok(()));
        }
        if shared.senders.get() == 0 {
            shared.waiters.remove(this.key.take());
            return Poll::Ready(Err(watch::RecvError(())));
        }
        shared.waiters.register(&mut this.key, cx.waker());
        Poll::Pending
    }
}

impl<T> Drop for Changed<'_, T> {
    fn drop(&mut self) {
        self.rx.shared.waiters.remove(self.key.take());
    }
}

impl<T: OptionalSend + OptionalSync> watch::WatchReceiver<LocalWatch, T> for LocalWatchReceiver<T> {
    async fn changed(&mut self) -> Result<(), watch::RecvError> {
        Changed {
            rx: self,
            key: None,
        }
        .await
    }

    fn borrow_watched(&self) -> Ref<'_, T> {
        self.shared.value.borrow()
    }

    fn borrow_and_update(&mut self) -> Ref<'_, T> {
        self.seen = self.shared.version.get();
        self.shared.value.borrow()
    }
}

// ---------------------------------------------------------------------------------------------
// Oneshot and mutex

/// One-value channel (futures-channel's, which is runtime independent).
pub struct LocalOneshot;

pub struct LocalOneshotSender<T>(futures_channel::oneshot::Sender<T>);

impl Oneshot for LocalOneshot {
    type Sender<T: OptionalSend> = LocalOneshotSender<T>;
    type Receiver<T: OptionalSend> = futures_channel::oneshot::Receiver<T>;
    type ReceiverError = futures_channel::oneshot::Canceled;

    fn channel<T>() -> (Self::Sender<T>, Self::Receiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = futures_channel::oneshot::channel();
        (LocalOneshotSender(tx), rx)
    }
}

impl<T: OptionalSend> OneshotSender<T> for LocalOneshotSender<T> {
    fn send(self, t: T) -> Result<(), T> {
        self.0.send(t)
    }
}

/// Async mutex (futures-util's, which is runtime independent and FIFO-fair enough for openraft's
/// few uses).
pub struct LocalMutex<T>(futures_util::lock::Mutex<T>);

impl<T: OptionalSend + 'static> openraft::rt::Mutex<T> for LocalMutex<T> {
    type Guard<'a>
        = futures_util::lock::MutexGuard<'a, T>
    where
        Self: 'a;

    fn new(value: T) -> Self {
        LocalMutex(futures_util::lock::Mutex::new(value))
    }

    fn lock(&self) -> impl Future<Output = Self::Guard<'_>> + OptionalSend {
        self.0.lock()
    }
}

#[cfg(test)]
mod tests {
    use std::task::Wake;

    use openraft::rt::watch::{Watch, WatchReceiver, WatchSender};

    use super::*;

    #[test]
    fn election_timeouts_are_drawn_from_the_kernel_within_their_range() {
        // Proves the RNG openraft samples election timeouts with (as
        // `Config::new_rand_election_timeout` does) stays inside the range and is not constant.
        use rand::RngExt;
        let draws: Vec<u64> = (0..200)
            .map(|_| NaradRuntime::thread_rng().random_range(150..300u64))
            .collect();
        assert!(draws.iter().all(|d| (150..300).contains(d)), "{draws:?}");
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert!(distinct.len() > 50, "{} distinct of 200", distinct.len());
    }

    #[test]
    fn openraft_runtime_suite_passes() {
        // Proves the binding satisfies openraft's own runtime contract: spawn/join, sleep,
        // instants, timeouts, selects, mpsc backpressure and closing, watch seen-tracking,
        // oneshot, mutex, task locals and the deterministic RNG wrapper.
        openraft::rt::testing::Suite::<NaradRuntime>::test_all();
    }

    struct CountWake;
    impl Wake for CountWake {
        fn wake(self: std::sync::Arc<Self>) {}
    }

    #[test]
    fn pending_futures_hold_one_waker_slot_each() {
        // Proves the waiter sets stay bounded: re-polling a pending send or changed() future
        // does not add slots, and dropping it frees its slot.
        NaradRuntime.block_on(async {
            let waker = Waker::from(std::sync::Arc::new(CountWake));
            let mut cx = Context::from_waker(&waker);
            let (tx, _rx) = LocalMpsc::channel::<u32>(1);
            tx.send(1).await.expect("room for one");
            let mut send = Box::pin(tx.send(2));
            for _ in 0..100 {
                assert!(send.as_mut().poll(&mut cx).is_pending());
            }
            assert_eq!(tx.0.send_waiters.len(), 1);
            drop(send);
            assert_eq!(tx.0.send_waiters.len(), 0);

            let (wtx, mut wrx) = LocalWatch::channel(0u32);
            {
                let mut changed = Box::pin(wrx.changed());
                for _ in 0..100 {
                    assert!(changed.as_mut().poll(&mut cx).is_pending());
                }
                assert_eq!(wtx.0.waiters.len(), 1);
            }
            assert_eq!(wtx.0.waiters.len(), 0);
            wtx.send(1).expect("a receiver exists");
            assert_eq!(*wrx.borrow_and_update(), 1);
        });
    }

    #[test]
    fn panicking_task_reports_a_join_error() {
        // Proves a panic inside a spawned task reaches its handle as JoinError::Panicked instead
        // of tearing down the executor.
        NaradRuntime.block_on(async {
            let h = spawn(async {
                if std::hint::black_box(true) {
                    panic!("boom");
                }
                1
            });
            let e = h.await.expect_err("the task panicked");
            assert!(NaradRuntime::is_panic(&e), "{e}");
            assert_eq!(spawn(async { 7 }).await, Ok(7));
        });
    }
}
