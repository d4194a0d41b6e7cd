//! The connection engine: one OS thread drives many keep-alive HTTP/1.1 connections with a
//! level-triggered epoll loop (the design of wrk), one request in flight per connection, no
//! pipelining. What to send next and what a response means is the business of a [`Driver`] per
//! connection; the engine owns sockets, timing, latency histograms, status counts and the
//! measurement window.
//!
//! Why epoll on plain threads and not the broker's glommio runtime: the generator shares two cores
//! with the broker, so it must cost as few cycles per request as possible (one `write` and
//! usually one `read` per request, no wake-ups of other threads), it must not need locked memory
//! or io_uring, and its figures are compared with wrk's against nginx, which works the same way.
//!
//! Bounds: `RECONNECTS_PER_CONN_MAX` reconnects per connection, responses of at most
//! `http::RESPONSE_BYTES_MAX`, every request times out after `request_timeout`, and the loop ends
//! at `hard_deadline` whatever the drivers do. Never decides what a workload sends.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hist::Histogram;
use crate::http::{parse_response, Target, RESPONSE_BYTES_MAX};

/// A connection that failed this many times is given up (its driver ends).
pub const RECONNECTS_PER_CONN_MAX: u32 = 100;
/// Epoll events taken per wait.
const EVENTS_PER_WAIT_MAX: usize = 256;
/// The loop wakes at least this often to check request timeouts and the deadline.
const TICK: Duration = Duration::from_millis(50);
/// Wait before reconnecting after a failed connect.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Initial read buffer per connection; it doubles up to the response maximum when needed.
const READ_BUFFER_BYTES: usize = 16 << 10;
const TIMER_TOKEN: u64 = u64::MAX;
/// Scheduled sends wake the thread at most once per this interval; all sends due by then go
/// together. Each wake-up costs a timer reprogramming and a context switch (expensive in a VM),
/// so without it the open-loop generator burns a core at 50k msg/s. A request may thus leave up
/// to this late; its latency is still measured from its scheduled time (the error is
/// conservative: latency is over-, never under-stated).
pub const TIMER_SLACK: Duration = Duration::from_micros(100);

/// What a request is, for separate latency histograms and status counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Produce = 0,
    Consume = 1,
    Ack = 2,
}

pub const KINDS: usize = 3;

/// A driver's decision when its connection is free.
pub enum Step {
    /// The request was written into the buffer; latency is measured from `origin` (the send time,
    /// or the scheduled send time in open-loop workloads).
    Send { origin: Instant, kind: Kind },
    /// Ask again at this time.
    Sleep(Instant),
    /// This connection has nothing more to do.
    Done,
}

/// Messages a response completed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completed {
    pub produced: u64,
    pub consumed: u64,
    pub acked: u64,
}

impl std::ops::AddAssign for Completed {
    fn add_assign(&mut self, o: Completed) {
        self.produced += o.produced;
        self.consumed += o.consumed;
        self.acked += o.acked;
    }
}

/// Message ids a driver saw, for the end-of-run check. Ranges are (first id, count).
#[derive(Debug, Default)]
pub struct Tracking {
    pub accepted: Vec<(u64, u32)>,
    pub rejected: Vec<(u64, u32)>,
    pub uncertain: Vec<(u64, u32)>,
    pub consumed: Vec<u64>,
    pub acked: Vec<u64>,
    /// Messages from other runs or without an id, consumed (and acked) to clear the topic.
    pub foreign: u64,
}

/// The workload logic of one connection.
pub trait Driver: Send {
    /// Called once, when the run starts, before the first `next`.
    fn begin(&mut self, start: Instant);
    /// The connection is free: write the next request into `req` (empty on entry) or say when
    /// to ask again, or that this connection is finished.
    fn next(&mut self, now: Instant, req: &mut Vec<u8>) -> Step;
    /// The response to the request last sent.
    fn on_response(&mut self, status: u16, body: &[u8], now: Instant) -> Completed;
    /// The request last sent has no answer (connection failed, timed out or the run ended):
    /// it may or may not have been applied.
    fn on_lost_request(&mut self);
    fn finish(self: Box<Self>) -> Tracking;
}

/// One connection of a run: the node it goes to and its workload logic.
pub type Connection = (Arc<Target>, Box<dyn Driver>);

/// Timing of one run, shared by every thread.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Completions before this are warm-up: not counted in rates or latency.
    pub measure_from: Instant,
    /// Completions after this are not counted in rates (drain phase).
    pub measure_to: Instant,
    /// The loop stops here whatever the drivers want.
    pub hard_deadline: Instant,
    pub request_timeout: Duration,
}

/// What one engine thread measured.
#[derive(Debug, Default)]
pub struct ThreadStats {
    pub latency: [Histogram; KINDS],
    /// Responses by status, whole run.
    pub statuses: [BTreeMap<u16, u64>; KINDS],
    /// Failures without a status: timeout, closed, reset, connect, protocol, unfinished.
    pub transport: BTreeMap<String, u64>,
    pub requests_in_window: [u64; KINDS],
    pub window: Completed,
    pub total: Completed,
    /// Last completion inside the window (the window's real end for count-limited runs).
    pub last_in_window: Option<Instant>,
}

impl ThreadStats {
    pub fn merge(&mut self, o: &ThreadStats) {
        for k in 0..KINDS {
            self.latency[k].merge(&o.latency[k]);
            for (s, n) in &o.statuses[k] {
                *self.statuses[k].entry(*s).or_default() += n;
            }
            self.requests_in_window[k] += o.requests_in_window[k];
        }
        for (e, n) in &o.transport {
            *self.transport.entry(e.clone()).or_default() += n;
        }
        self.window += o.window;
        self.total += o.total;
        self.last_in_window = match (self.last_in_window, o.last_in_window) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Transient: about to ask the driver.
    Idle,
    Sleeping(Instant),
    Writing,
    Reading,
    Done,
}

struct Conn {
    /// Where this connection goes (a run may spread its connections over several nodes).
    target: Arc<Target>,
    sock: Option<TcpStream>,
    driver: Box<dyn Driver>,
    state: State,
    wbuf: Vec<u8>,
    wpos: usize,
    rbuf: Vec<u8>,
    rlen: usize,
    origin: Instant,
    sent_at: Instant,
    kind: Kind,
    reconnects: u32,
    want_write: bool,
}

fn cvt(rc: libc::c_int) -> std::io::Result<libc::c_int> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

struct Epoll(OwnedFd);

impl Epoll {
    fn new() -> std::io::Result<Epoll> {
        // SAFETY: epoll_create1 returns a new descriptor that we own from here on.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fd is valid and owned by nobody else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: both descriptors are open; ev lives for the call.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    fn wait(&self, events: &mut [libc::epoll_event], timeout: Duration) -> usize {
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: events is a valid buffer of events.len() entries.
        let n = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                ms,
            )
        };
        // EINTR and other failures: treat as no events; the loop re-checks its deadlines.
        n.max(0) as usize
    }
}

/// A timerfd for sub-millisecond wake-ups (epoll_wait's timeout is in milliseconds, too coarse
/// for open-loop schedules).
struct Timer {
    fd: OwnedFd,
    armed_for: Option<Instant>,
}

impl Timer {
    fn new() -> std::io::Result<Timer> {
        // SAFETY: timerfd_create returns a new descriptor that we own from here on.
        let fd = cvt(unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        })?;
        // SAFETY: fd is valid and owned by nobody else.
        Ok(Timer {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed_for: None,
        })
    }

    fn arm(&mut self, at: Instant, now: Instant) {
        if self.armed_for == Some(at) {
            return;
        }
        let d = at
            .saturating_duration_since(now)
            .max(Duration::from_micros(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: valid timerfd and a fully initialised itimerspec; old value not requested.
        unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        self.armed_for = Some(at);
    }

    fn clear(&mut self) {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a stack buffer from a non-blocking timerfd.
        unsafe { libc::read(self.fd.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 8) };
        self.armed_for = None;
    }
}

/// Runs one engine thread over `drivers`, each with the target its connection goes to, until
/// they are all done or the hard deadline passes. `window_of` is called once every connection
/// has been attempted, and must return the run's start.
pub fn run_thread(
    drivers: Vec<Connection>,
    window_of: impl FnOnce() -> (Instant, Window),
) -> Result<(ThreadStats, Vec<Tracking>), String> {
    let ep = Epoll::new().map_err(|e| format!("epoll: {e}"))?;
    let mut timer = Timer::new().map_err(|e| format!("timerfd: {e}"))?;
    ep.ctl(
        libc::EPOLL_CTL_ADD,
        timer.fd.as_raw_fd(),
        libc::EPOLLIN as u32,
        TIMER_TOKEN,
    )
    .map_err(|e| format!("epoll add timer: {e}"))?;
    let now = Instant::now();
    let mut conns: Vec<Conn> = drivers
        .into_iter()
        .map(|(target, driver)| Conn {
            target,
            sock: None,
            driver,
            state: State::Idle,
            wbuf: Vec::with_capacity(1024),
            wpos: 0,
            rbuf: vec![0; READ_BUFFER_BYTES],
            rlen: 0,
            origin: now,
            sent_at: now,
            kind: Kind::Produce,
            reconnects: 0,
            want_write: false,
        })
        .collect();
    let mut stats = ThreadStats::default();
    for (i, c) in conns.iter_mut().enumerate() {
        if let Err(e) = connect(&ep, c, i) {
            return Err(format!("connect to {}: {e}", c.target.addr));
        }
    }
    let (start, win) = window_of();
    let mut eng = Engine {
        ep,
        win,
        heap: BinaryHeap::new(),
        stats: &mut stats,
    };
    for c in conns.iter_mut() {
        c.driver.begin(start);
    }
    for (i, c) in conns.iter_mut().enumerate() {
        eng.kick(c, i);
    }
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT_MAX];
    let mut last_tick = Instant::now();
    let mut last_timer_wake = Instant::now();
    loop {
        let now = Instant::now();
        if now >= eng.win.hard_deadline {
            break;
        }
        while let Some(Reverse((t, i))) = eng.heap.peek().copied() {
            if t > now {
                break;
            }
            eng.heap.pop();
            if conns[i].state == State::Sleeping(t) {
                conns[i].state = State::Idle;
                eng.kick(&mut conns[i], i);
            }
        }
        if now.duration_since(last_tick) >= TICK {
            last_tick = now;
            for (i, c) in conns.iter_mut().enumerate() {
                if matches!(c.state, State::Reading | State::Writing)
                    && now.duration_since(c.sent_at) > eng.win.request_timeout
                {
                    eng.fail(c, i, "timeout");
                }
            }
        }
        if conns.iter().all(|c| c.state == State::Done) {
            break;
        }
        let mut wait = TICK.min(eng.win.hard_deadline.saturating_duration_since(now));
        if let Some(Reverse((t, _))) = eng.heap.peek().copied() {
            let t = t.max(last_timer_wake + TIMER_SLACK);
            timer.arm(t, now);
            wait = wait.min(t.saturating_duration_since(now) + Duration::from_millis(1));
        }
        let n = eng.ep.wait(&mut events, wait);
        for ev in &events[..n] {
            let (flags, token) = (ev.events, ev.u64);
            if token == TIMER_TOKEN {
                timer.clear();
                last_timer_wake = Instant::now();
                continue;
            }
            let i = token as usize;
            let Some(c) = conns.get_mut(i) else { continue };
            if flags & (libc::EPOLLOUT as u32) != 0 && c.state == State::Writing {
                eng.write(c, i);
            }
            if flags & ((libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32) != 0 {
                eng.read(c, i);
            }
        }
    }
    for c in conns.iter_mut() {
        if matches!(c.state, State::Reading | State::Writing) {
            eng.count("unfinished");
            c.driver.on_lost_request();
            c.state = State::Done;
        }
    }
    drop(eng);
    let tracking = conns.into_iter().map(|c| c.driver.finish()).collect();
    Ok((stats, tracking))
}

fn connect(ep: &Epoll, c: &mut Conn, token: usize) -> std::io::Result<()> {
    let s = TcpStream::connect_timeout(&c.target.addr, CONNECT_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    ep.ctl(
        libc::EPOLL_CTL_ADD,
        s.as_raw_fd(),
        libc::EPOLLIN as u32,
        token as u64,
    )?;
    c.sock = Some(s);
    c.want_write = false;
    c.rlen = 0;
    Ok(())
}

struct Engine<'a> {
    ep: Epoll,
    win: Window,
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
    stats: &'a mut ThreadStats,
}

impl Engine<'_> {
    fn count(&mut self, what: &str) {
        *self.stats.transport.entry(what.to_string()).or_default() += 1;
    }

    fn sleep(&mut self, c: &mut Conn, i: usize, until: Instant) {
        c.state = State::Sleeping(until);
        self.heap.push(Reverse((until, i)));
    }

    /// Drops the socket after a failure; an in-flight request is reported lost.
    fn fail(&mut self, c: &mut Conn, i: usize, what: &str) {
        self.count(what);
        if let Some(s) = c.sock.take() {
            let _ = self.ep.ctl(libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, i as u64);
        }
        c.rlen = 0;
        if matches!(c.state, State::Reading | State::Writing) {
            c.driver.on_lost_request();
        }
        c.reconnects += 1;
        if c.reconnects > RECONNECTS_PER_CONN_MAX {
            self.count("gave_up");
            c.state = State::Done;
            return;
        }
        c.state = State::Idle;
        self.kick(c, i);
    }

    /// Asks the driver what to do next and starts it.
    fn kick(&mut self, c: &mut Conn, i: usize) {
        debug_assert_eq!(c.state, State::Idle);
        let now = Instant::now();
        c.wbuf.clear();
        c.wpos = 0;
        match c.driver.next(now, &mut c.wbuf) {
            Step::Done => {
                c.state = State::Done;
                if let Some(s) = c.sock.take() {
                    let _ = self.ep.ctl(libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, i as u64);
                }
            }
            Step::Sleep(t) => self.sleep(c, i, t),
            Step::Send { origin, kind } => {
                if c.sock.is_none() {
                    if let Err(e) = connect(&self.ep, c, i) {
                        // The request was not sent: tell the driver, retry later.
                        c.driver.on_lost_request();
                        self.count(&format!("connect: {}", e.kind()));
                        c.reconnects += 1;
                        if c.reconnects > RECONNECTS_PER_CONN_MAX {
                            self.count("gave_up");
                            c.state = State::Done;
                        } else {
                            self.sleep(c, i, now + RECONNECT_BACKOFF);
                        }
                        return;
                    }
                }
                c.origin = origin;
                c.sent_at = now;
                c.kind = kind;
                c.state = State::Writing;
                self.write(c, i);
            }
        }
    }

    fn write(&mut self, c: &mut Conn, i: usize) {
        let Some(s) = c.sock.as_mut() else { return };
        while c.wpos < c.wbuf.len() {
            match s.write(&c.wbuf[c.wpos..]) {
                Ok(0) => return self.fail(c, i, "closed"),
                Ok(n) => c.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if !c.want_write {
                        c.want_write = true;
                        let fd = s.as_raw_fd();
                        let _ = self.ep.ctl(
                            libc::EPOLL_CTL_MOD,
                            fd,
                            (libc::EPOLLIN | libc::EPOLLOUT) as u32,
                            i as u64,
                        );
                    }
                    return;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.fail(c, i, "reset"),
            }
        }
        if c.want_write {
            c.want_write = false;
            let fd = s.as_raw_fd();
            let _ = self
                .ep
                .ctl(libc::EPOLL_CTL_MOD, fd, libc::EPOLLIN as u32, i as u64);
        }
        // An early answer (e.g. 413 before the body was read) may already be buffered.
        c.state = State::Reading;
        if c.rlen > 0 {
            self.try_complete(c, i);
        }
    }

    fn read(&mut self, c: &mut Conn, i: usize) {
        let Some(s) = c.sock.as_mut() else { return };
        loop {
            if c.rlen == c.rbuf.len() {
                if c.rbuf.len() >= RESPONSE_BYTES_MAX + READ_BUFFER_BYTES {
                    return self.fail(c, i, "protocol: response too large");
                }
                let n = c.rbuf.len() * 2;
                c.rbuf.resize(n, 0);
            }
            match s.read(&mut c.rbuf[c.rlen..]) {
                Ok(0) => {
                    // The server closed the connection. Between requests that is not an error
                    // (idle timeout): reconnect when the driver next sends.
                    if matches!(c.state, State::Reading | State::Writing) {
                        return self.fail(c, i, "closed");
                    }
                    if let Some(s) = c.sock.take() {
                        let _ = self.ep.ctl(libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, i as u64);
                    }
                    c.rlen = 0;
                    return;
                }
                Ok(n) => {
                    c.rlen += n;
                    if c.rlen < c.rbuf.len() {
                        // A short read drained the socket: save the syscall that would say so.
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.fail(c, i, "reset"),
            }
        }
        match c.state {
            State::Reading | State::Writing => self.try_complete(c, i),
            _ => self.fail(c, i, "protocol: unsolicited bytes"),
        }
    }

    fn try_complete(&mut self, c: &mut Conn, i: usize) {
        let parsed = match parse_response(&c.rbuf[..c.rlen], false) {
            Ok(None) => return,
            Ok(Some(p)) => p,
            Err(_) => return self.fail(c, i, "protocol: bad response"),
        };
        if c.state == State::Writing {
            // Answered before the whole request was sent: the rest is not wanted.
            c.wpos = c.wbuf.len();
        }
        let now = Instant::now();
        let k = c.kind as usize;
        if c.origin >= self.win.measure_from && c.origin <= self.win.measure_to {
            let ns = now
                .duration_since(c.origin)
                .as_nanos()
                .min(u64::MAX as u128) as u64;
            self.stats.latency[k].record(ns);
        }
        *self.stats.statuses[k].entry(parsed.status).or_default() += 1;
        let done = c
            .driver
            .on_response(parsed.status, parsed.body(&c.rbuf[..c.rlen]), now);
        self.stats.total += done;
        if now >= self.win.measure_from && now <= self.win.measure_to {
            self.stats.window += done;
            self.stats.requests_in_window[k] += 1;
            self.stats.last_in_window = Some(now);
        }
        let leftover = c.rlen - parsed.consumed;
        c.rlen = 0;
        c.state = State::Idle;
        if leftover > 0 {
            return self.fail(c, i, "protocol: unsolicited bytes");
        }
        if parsed.close {
            if let Some(s) = c.sock.take() {
                let _ = self.ep.ctl(libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, i as u64);
            }
        }
        self.kick(c, i);
    }
}
