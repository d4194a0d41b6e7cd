//! The runtime: one pinned glommio executor per shard, and the few primitives the rest of the code
//! may use: spawn, sleep, tasks, the cross-shard [`Mesh`], shard-local sync ([`Notify`],
//! [`oneshot`], [`Semaphore`], [`timeout`]), TCP sockets and the process [`ShutdownSignal`].
//! Nothing outside this crate names glommio; if glommio has to be replaced, only this crate
//! changes.
//!
//! Start-up applies the fixes measured on these machines (DESIGN.md §5): about 1 MiB of io memory
//! per executor (the default 10 MiB exceeds an 8 MiB memlock limit), no spinning before park on
//! shards that fsync, and a clear error when io_uring is refused or memlock is too small.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::types::ShardId;

mod mesh;
mod net;
pub mod pool;
mod signal;
mod sync;

pub use mesh::{
    Mesh, MeshError, MeshSetup, MESH_CALLS_IN_FLIGHT_PER_PEER_MAX, MESH_CHANNEL_CAPACITY_DEFAULT,
};
pub use net::{
    accept_out_of_resources, resolve, PeerProbe, TcpListener, TcpStream, LISTEN_BACKLOG_DEFAULT,
    RESOLVE_THREADS_MAX, RESOLVE_TIMEOUT_MS,
};
pub use signal::{install_termination_handler, ShutdownSignal, ShutdownWait, SignalListener};
pub use sync::{
    oneshot, timeout, timeout_at, Elapsed, Notified, Notify, Semaphore, SemaphorePermit,
};

/// The log target of the runtime's io_uring set-up messages (glommio's), which the log writer
/// explains in plain words.
pub const URING_LOG_TARGET: &str = "glommio::sys::uring";

/// io_uring registered-buffer memory per executor.
pub const IO_MEMORY_BYTES_DEFAULT: usize = 1 << 20;
/// glommio refuses to start below this much lockable memory.
pub const MEMLOCK_BYTES_MIN: u64 = 512 << 10;

/// Called, on that shard's watcher thread, when a panic that nothing caught ended a shard (see
/// [`run`]).
pub type ShardPanicHook = Arc<dyn Fn(ShardId) + Send + Sync>;

#[derive(Clone)]
pub struct RuntimeConfig {
    /// Number of shards (executors). Defaults to the CPUs this process may run on.
    pub shards: u32,
    /// Pin executor i to the i-th allowed CPU. Off in tests that start many runtimes.
    pub pin: bool,
    pub io_memory_bytes: usize,
    /// A directory on the data filesystem: each executor first opens a non-empty file there for
    /// direct I/O (glommio issue #670, DESIGN.md §5).
    pub data_dir: PathBuf,
    /// Runs when an uncaught panic (in any task of the shard) ends a shard's executor, while the
    /// other shards still run: a node must not go on half served.
    pub on_shard_panic: Option<ShardPanicHook>,
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("shards", &self.shards)
            .field("pin", &self.pin)
            .field("io_memory_bytes", &self.io_memory_bytes)
            .field("data_dir", &self.data_dir)
            .field("on_shard_panic", &self.on_shard_panic.is_some())
            .finish()
    }
}

impl RuntimeConfig {
    pub fn new(data_dir: PathBuf) -> RuntimeConfig {
        RuntimeConfig {
            shards: available_cpus().len().max(1) as u32,
            pin: true,
            io_memory_bytes: IO_MEMORY_BYTES_DEFAULT,
            data_dir,
            on_shard_panic: None,
        }
    }
}

#[derive(Debug)]
pub enum StartError {
    /// io_uring_setup was refused (seccomp profile of a container runtime, or a disabled kernel).
    IoUringRefused(String),
    MemlockTooLow {
        limit_bytes: u64,
    },
    Other(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::IoUringRefused(e) => write!(
                f,
                "io_uring is not available ({e}). Narad needs io_uring: allow the syscalls \
                 io_uring_setup, io_uring_enter and io_uring_register (container seccomp profile) \
                 and make sure /proc/sys/kernel/io_uring_disabled is 0"
            ),
            StartError::MemlockTooLow { limit_bytes } => write!(
                f,
                "the locked-memory limit (ulimit -l) is {limit_bytes} bytes; Narad needs at least \
                 {MEMLOCK_BYTES_MIN} bytes. Raise it (ulimit -l, LimitMEMLOCK= in systemd, or the \
                 container's memlock ulimit)"
            ),
            StartError::Other(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// CPUs this process may run on, in order.
pub fn available_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most sizeof(cpu_set_t) bytes.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

fn memlock_limit_bytes() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    (rc == 0).then_some(r.rlim_cur)
}

/// Raises the soft limit of `resource` to its hard limit (as Go's runtime does for open files)
/// and answers the soft limit in force afterwards; `None` when it cannot be read.
fn raise_soft_limit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    if unsafe { libc::getrlimit(resource, &mut r) } != 0 {
        return None;
    }
    if r.rlim_cur < r.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit struct we own; raising a soft limit up to the hard
        // one needs no privilege. On failure the old limit stays.
        if unsafe { libc::setrlimit(resource, &raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(r.rlim_cur)
}

/// Raises this process's soft limits on open files and locked memory to their hard limits, so
/// that a shell's or unit's low default (often 1024 files) does not cap connections and files
/// below what the configuration allows. Answers the open-files limit now in force.
pub fn raise_process_limits() -> Option<u64> {
    let _ = raise_soft_limit(libc::RLIMIT_MEMLOCK);
    raise_soft_limit(libc::RLIMIT_NOFILE)
}

/// Checks that io_uring can be set up at all, so that a refused syscall becomes a clear message
/// rather than a panic inside an executor thread.
fn probe_io_uring() -> Result<(), StartError> {
    #[repr(C)]
    struct Params {
        fields: [u32; 30],
    }
    let mut p = Params { fields: [0; 30] };
    // SAFETY: io_uring_setup(entries, params) writes into a zeroed params struct of the kernel's
    // size (120 bytes); the returned fd is closed right away.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, &mut p as *mut Params) };
    if fd < 0 {
        return Err(StartError::IoUringRefused(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    // SAFETY: fd was just returned by the kernel and is owned here.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

/// Creates (once) a non-empty probe file in the data directory and opens it for direct I/O on the
/// calling executor. glommio decides on polled I/O with the first DMA file it opens on a device; on
/// an empty file that probe wrongly succeeds and every later read fails with EOPNOTSUPP.
async fn open_probe_file(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(".io-probe");
    // Every shard probes this same file at start, at the same moment.
    crate::file::ensure_probe_file(&path, 4096)?;
    let f = glommio::io::DmaFile::open(&path)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let _ = f
        .read_at_aligned(0, 4096)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    f.close()
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(())
}

/// Starts `cfg.shards` executors, runs `f(shard_id)` on each and blocks until all return.
/// Results are returned in shard order.
pub fn run<F, Fut, T>(cfg: RuntimeConfig, f: F) -> Result<Vec<T>, StartError>
where
    F: Fn(ShardId) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    if let Some(limit) = memlock_limit_bytes() {
        if limit < MEMLOCK_BYTES_MIN {
            return Err(StartError::MemlockTooLow { limit_bytes: limit });
        }
    }
    probe_io_uring()?;
    let cpus = available_cpus();
    let mut handles = Vec::with_capacity(cfg.shards as usize);
    for i in 0..cfg.shards {
        let placement = if cfg.pin && !cpus.is_empty() {
            glommio::Placement::Fixed(cpus[i as usize % cpus.len()])
        } else {
            glommio::Placement::Unbound
        };
        let f = f.clone();
        let dir = cfg.data_dir.clone();
        let h = glommio::LocalExecutorBuilder::new(placement)
            .name(&format!("shard-{i}"))
            .io_memory(cfg.io_memory_bytes)
            .spawn(move || async move {
                if let Err(e) = open_probe_file(&dir).await {
                    tracing::warn!(error = %e, "direct-I/O probe file could not be opened");
                }
                f(ShardId(i)).await
            })
            .map_err(|e| classify(e.to_string()))?;
        // A panic in a detached task unwinds the whole executor, not only that task. Each
        // shard's thread is joined by a watcher of its own, so that the hook runs as soon as
        // that shard ends, not once the shards before it in the join order have returned.
        let hook = cfg.on_shard_panic.clone();
        let watcher = std::thread::Builder::new()
            .name(format!("shard-{i}-watch"))
            .stack_size(256 << 10)
            .spawn(move || {
                let r = h
                    .join()
                    .map_err(|e| format!("shard {i} ended by a panic ({e})"));
                if r.is_err() {
                    if let Some(hook) = hook {
                        hook(ShardId(i));
                    }
                }
                r
            })
            .map_err(|e| StartError::Other(e.to_string()))?;
        handles.push(watcher);
    }
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        let r = h
            .join()
            .map_err(|_| StartError::Other("a shard watcher panicked".into()))?;
        out.push(r.map_err(classify)?);
    }
    Ok(out)
}

/// Like [`run`], with a cross-shard [`Mesh`] joined on every shard before `f` runs: `f` gets its
/// shard's end. Each mesh channel holds at most `mesh_capacity` messages. Create more meshes (for
/// other message types) with [`MeshSetup`] and join them inside `f` the same way.
pub fn run_with_mesh<Req, Resp, F, Fut, T>(
    cfg: RuntimeConfig,
    mesh_capacity: usize,
    f: F,
) -> Result<Vec<T>, StartError>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    F: Fn(ShardId, Mesh<Req, Resp>) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let setup: MeshSetup<Req, Resp> = MeshSetup::new(cfg.shards, mesh_capacity);
    run(cfg, move |id| {
        let setup = setup.clone();
        let f = f.clone();
        async move {
            // `run` calls this exactly once per shard id below `cfg.shards`, so join cannot
            // find its slot taken.
            let mesh = setup
                .join(id)
                .await
                .expect("each shard joins the mesh exactly once");
            let out = f(id, mesh.clone()).await;
            mesh.close();
            out
        }
    })
}

fn classify(e: String) -> StartError {
    if e.contains("io_uring") || e.contains("Operation not permitted") {
        StartError::IoUringRefused(e)
    } else if e.contains("memlock") || e.contains("Cannot allocate memory") {
        StartError::MemlockTooLow {
            limit_bytes: memlock_limit_bytes().unwrap_or(0),
        }
    } else {
        StartError::Other(e)
    }
}

/// A spawned task. Dropping it cancels the task; call [`Task::detach`] to let it run on.
pub struct Task<T>(glommio::Task<T>);

impl<T> Task<T> {
    pub fn detach(self) {
        self.0.detach();
    }
}

impl<T> Future for Task<T> {
    type Output = T;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// Spawns a task on the current shard's executor.
pub fn spawn<T: 'static>(fut: impl Future<Output = T> + 'static) -> Task<T> {
    Task(glommio::spawn_local(fut))
}

/// A nameable sleep future.
pub type Sleep = glommio::timer::Timer;

pub fn sleep(d: Duration) -> Sleep {
    glommio::timer::Timer::new(d)
}

/// Yields to other tasks of this shard if the executor wants to preempt.
pub async fn yield_if_needed() {
    glommio::yield_if_needed().await
}

/// Runs a single executor (unpinned, shard 0 of 1) on the calling thread: for tests and tools.
pub fn block_on<T>(fut: impl Future<Output = T>) -> T {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(IO_MEMORY_BYTES_DEFAULT)
        .make()
        .expect("start a glommio executor")
        .run(fut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_starts_every_shard_and_returns_in_order() {
        // Proves `run` starts one executor per shard, passes each its id and collects results in
        // shard order, with timers working inside the executors.
        let dir = std::env::temp_dir().join(format!("narad-rt-{}", std::process::id()));
        let cfg = RuntimeConfig {
            shards: 2,
            pin: false,
            ..RuntimeConfig::new(dir.clone())
        };
        let out = run(cfg, |id| async move {
            sleep(Duration::from_millis(5)).await;
            id.0 * 10
        })
        .expect("runtime starts");
        assert_eq!(out, vec![0, 10]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_panic_in_a_detached_task_calls_the_hook_while_other_shards_run() {
        // Proves a panic escaping a detached task on shard 1 ends that shard and calls the
        // shard-panic hook with its id, so shard 0 (which waits for that signal, at most 10 s)
        // can stop; and `run` then reports the ended shard as an error.
        use std::sync::atomic::{AtomicU32, Ordering};
        let dir = std::env::temp_dir().join(format!("narad-rt-panic-{}", std::process::id()));
        let seen = Arc::new(AtomicU32::new(u32::MAX));
        let s2 = seen.clone();
        let cfg = RuntimeConfig {
            shards: 2,
            pin: false,
            on_shard_panic: Some(Arc::new(move |id: ShardId| {
                s2.store(id.0, Ordering::SeqCst)
            })),
            ..RuntimeConfig::new(dir.clone())
        };
        let seen2 = seen.clone();
        let r = run(cfg, move |id| {
            let seen = seen2.clone();
            async move {
                if id.0 == 1 {
                    spawn(async {
                        sleep(Duration::from_millis(20)).await;
                        panic!("test panic in a detached task");
                    })
                    .detach();
                    sleep(Duration::from_secs(30)).await;
                    return false;
                }
                let start = std::time::Instant::now();
                while seen.load(Ordering::SeqCst) == u32::MAX {
                    if start.elapsed() > Duration::from_secs(10) {
                        return false;
                    }
                    sleep(Duration::from_millis(5)).await;
                }
                true
            }
        });
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the hook names shard 1");
        assert!(r.is_err(), "the ended shard is an error: {r:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
